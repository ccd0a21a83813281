//! Single-copy reads from a peer process on the same node: Linux's cross
//! memory attach (`process_vm_readv`), the mechanism Open MPI's `vader`
//! transport uses for large messages. The kernel copies straight from the
//! peer's buffer into this rank's, where a shared window costs two copies
//! (into the window, out of it).
//!
//! The kernel may refuse: Yama's `ptrace_scope`, a container's seccomp
//! profile, ranks under different users. A refusal is an `Err` here; the
//! caller falls back to the window (see `shm`).
//!
//! Whether one copy by the kernel beats two by the CPU is the machine's
//! to say, not a constant's: on one VM a 16 KiB block read once was 1.12×
//! the window, on another (a Firecracker guest, where the kernel pins each
//! page at about 300 ns) a read is 2-4× the cost of two copies at every
//! size. [`pays_from`] times both at start.

use super::copy::copy_bytes;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Set once a read was refused anywhere in this process (the refusal is
/// the kernel's answer for the process, not for one group).
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether a read was refused in this process already.
pub(crate) fn refused() -> bool {
    REFUSED.load(Ordering::Relaxed)
}

/// Records that this process's single copies are refused; `true` the
/// first time (the caller logs then, once).
pub(crate) fn mark_refused() -> bool {
    !REFUSED.swap(true, Ordering::Relaxed)
}

/// Most segments one `process_vm_readv` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// One contiguous piece of a read: `len` bytes at `remote` (an address in
/// the peer) into `local`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub local: *mut u8,
    pub remote: usize,
    pub len: usize,
}

/// Lets any process of this user read this one's memory, as Open MPI does
/// for its own single-copy transfers: under Yama's `ptrace_scope = 1` only
/// ancestors may otherwise, and a rank's peers are its siblings. Without
/// Yama the call fails and changes nothing.
pub(crate) fn allow_peer_reads() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
}

/// Reads every segment from process `pid`, at most [`IOV_MAX`] per system
/// call. A short read (the kernel stops at the first segment it cannot
/// touch) is an error like a refusal.
///
/// # Safety
/// Every `local` range must be writable memory of this process that nothing
/// else touches during the call.
pub(crate) unsafe fn read_from(pid: u32, segments: &[Segment]) -> io::Result<()> {
    for batch in segments.chunks(IOV_MAX) {
        let local: Vec<libc::iovec> = batch
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.local.cast(),
                iov_len: s.len,
            })
            .collect();
        let remote: Vec<libc::iovec> = batch
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.remote as *mut libc::c_void,
                iov_len: s.len,
            })
            .collect();
        let want: usize = batch.iter().map(|s| s.len).sum();
        // SAFETY: both lists hold `batch.len()` (<= IOV_MAX) valid iovecs;
        // the local ranges are writable (the caller's promise).
        let got = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if got as usize != want {
            return Err(io::Error::other(format!(
                "process_vm_readv read {got} of {want} bytes"
            )));
        }
    }
    Ok(())
}

/// The two block sizes [`pays_from`] times: a small one, where the system
/// call's fixed cost shows, and one large enough for the rate.
const PROBE_BYTES: [usize; 2] = [16 << 10, 1 << 20];
/// Timings of each probe; the fastest counts (noise only slows a copy).
const PROBE_REPS: usize = 7;
/// Largest block [`crossover`] considers.
const LARGEST: usize = 1 << 30;

/// The fastest time, in seconds, of a read of this process's own memory
/// (`cma`) and of a copy (`copy`), at each of [`PROBE_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Probe {
    pub cma: [f64; 2],
    pub copy: [f64; 2],
}

/// Times a read of this process's own memory against a plain copy, at
/// each of [`PROBE_BYTES`] (about 1 ms; no peer needed: the kernel pins
/// and copies the same way whoever the reader is). An `Err` is the
/// kernel's refusal.
pub(crate) fn probe() -> io::Result<Probe> {
    let big = PROBE_BYTES[1];
    let src = vec![1u8; big];
    let mut dst = vec![2u8; big];
    let pid = std::process::id();
    let mut p = Probe {
        cma: [f64::INFINITY; 2],
        copy: [f64::INFINITY; 2],
    };
    for _ in 0..PROBE_REPS {
        for (i, &n) in PROBE_BYTES.iter().enumerate() {
            let read = Segment {
                local: dst.as_mut_ptr(),
                remote: src.as_ptr() as usize,
                len: n,
            };
            let t = Instant::now();
            // SAFETY: `dst` is this function's own buffer, `n` <= its length.
            unsafe { read_from(pid, &[read])? };
            p.cma[i] = p.cma[i].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            copy_bytes(&mut dst[..n], &src[..n]);
            std::hint::black_box(&mut dst);
            p.copy[i] = p.copy[i].min(t.elapsed().as_secs_f64());
        }
    }
    Ok(p)
}

/// The smallest block, a power of two from `floor`, that one read costs
/// less to move than the window's two copies, by the lines through the
/// probe's two sizes; `None` where no block up to 1 GiB does.
pub(crate) fn crossover(p: &Probe, floor: usize) -> Option<usize> {
    let [small, large] = PROBE_BYTES.map(|n| n as f64);
    let line = |t: [f64; 2]| {
        let rate = ((t[1] - t[0]) / (large - small)).max(0.0);
        move |n: f64| t[0] + rate * (n - small)
    };
    let (read, copy) = (line(p.cma), line(p.copy));
    std::iter::successors(Some(floor.next_power_of_two()), |n| n.checked_mul(2))
        .take_while(|n| *n <= LARGEST)
        .find(|&n| read(n as f64) < 2.0 * copy(n as f64))
}

/// Where single copies pay on this machine: [`crossover`] of a fresh
/// [`probe`], `None` where they never do or the kernel refuses.
pub(crate) fn pays_from(floor: usize) -> Option<usize> {
    match probe() {
        Ok(p) => {
            let from = crossover(&p, floor);
            let us = |t: [f64; 2]| format!("{:.2} / {:.2} us", t[0] * 1e6, t[1] * 1e6);
            let [small, large] = PROBE_BYTES.map(|n| n >> 10);
            tracing::debug!(
                "single copies timed at {small} / {large} KiB: a read {}, a copy {}: {}",
                us(p.cma),
                us(p.copy),
                match from {
                    Some(n) => format!("one read beats two copies from {} KiB", n >> 10),
                    None => "one read never beats two copies here".into(),
                }
            );
            from
        }
        Err(e) => {
            tracing::debug!("single copies refused at start: {e}");
            None
        }
    }
}

/// The segments of one block: `local` and `remote` are its runs as
/// `(address, position in the block, length)`, each in position order and
/// covering the same bytes; a segment is where a run of each overlaps.
pub(crate) fn pair_runs(
    local: impl IntoIterator<Item = (*mut u8, usize, usize)>,
    remote: impl IntoIterator<Item = (usize, usize, usize)>,
    out: &mut Vec<Segment>,
) {
    let mut remote = remote.into_iter();
    let mut theirs: Option<(usize, usize, usize)> = None;
    for (at, pos, len) in local {
        let mut done = 0;
        while done < len {
            let (r_at, r_pos, r_len) = match theirs {
                Some(run) if run.1 + run.2 > pos + done => run,
                _ => match remote.next() {
                    Some(run) => {
                        theirs = Some(run);
                        continue;
                    }
                    None => return,
                },
            };
            let from = pos + done;
            let n = (len - done).min(r_pos + r_len - from);
            out.push(Segment {
                // SAFETY (of the later write): inside the local run.
                local: at.wrapping_add(done),
                remote: r_at + (from - r_pos),
                len: n,
            });
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read and copy times (µs at 16 KiB and 1 MiB): a machine that pins
    /// pages cheaply (synthetic) pays from the floor; the Firecracker CI
    /// guest's own timings never do; a costly call at a good rate pays
    /// from where the saved copy repays the call.
    #[test]
    fn single_copies_pay_where_one_read_beats_two_copies() {
        let us = |cma: [f64; 2], copy: [f64; 2]| Probe {
            cma: cma.map(|t| t * 1e-6),
            copy: copy.map(|t| t * 1e-6),
        };
        let cheap = us([0.6, 20.0], [0.4, 14.0]);
        assert_eq!(crossover(&cheap, 16 << 10), Some(16 << 10));
        let firecracker = us([1.7, 63.7], [0.13, 13.8]);
        assert_eq!(crossover(&firecracker, 16 << 10), None);
        // Copies at 0.1 µs + 0.01 µs/KiB; a read at one copy's rate after
        // a 2 µs call: 2 + 0.01k < 0.2 + 0.02k from k = 180, so 256 KiB.
        let costly_call = us([2.16, 12.24], [0.26, 10.34]);
        assert_eq!(crossover(&costly_call, 16 << 10), Some(256 << 10));
        assert_eq!(crossover(&costly_call, 1 << 20), Some(1 << 20));
    }

    #[test]
    fn the_probe_times_both_and_reads_what_it_copies() {
        let p = probe().expect("a process may read its own memory");
        for t in p.cma.iter().chain(&p.copy) {
            assert!(t.is_finite() && *t > 0.0, "{p:?}");
        }
    }

    #[test]
    fn runs_pair_where_they_overlap() {
        // A 10-byte block: locally runs of 4 and 6, remotely 3, 3 and 4.
        let base = std::ptr::null_mut::<u8>();
        let local = [
            (base.wrapping_add(100), 0, 4),
            (base.wrapping_add(200), 4, 6),
        ];
        let remote = [(1000, 0, 3), (2000, 3, 3), (3000, 6, 4)];
        let mut got = Vec::new();
        pair_runs(local, remote, &mut got);
        let got: Vec<(usize, usize, usize)> = got
            .iter()
            .map(|s| (s.local as usize, s.remote, s.len))
            .collect();
        assert_eq!(
            got,
            [
                (100, 1000, 3),
                (103, 2000, 1),
                (200, 2001, 2),
                (202, 3000, 4)
            ]
        );
    }

    #[test]
    fn reads_from_this_process_and_refuses_a_bad_address() {
        let src: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let mut dst = vec![0u8; 5000];
        // Two thousand 2-byte segments, past one call's IOV_MAX, then the rest.
        let mut segs: Vec<Segment> = (0..2000)
            .map(|i| Segment {
                local: dst.as_mut_ptr().wrapping_add(2 * i),
                remote: src.as_ptr() as usize + 2 * i,
                len: 2,
            })
            .collect();
        segs.push(Segment {
            local: dst.as_mut_ptr().wrapping_add(4000),
            remote: src.as_ptr() as usize + 4000,
            len: 1000,
        });
        // SAFETY: `dst` is this test's, untouched during the call.
        unsafe { read_from(std::process::id(), &segs) }.unwrap();
        assert_eq!(dst, src);
        let bad = [Segment {
            local: dst.as_mut_ptr(),
            remote: 8,
            len: 16,
        }];
        // SAFETY: as above.
        let err = unsafe { read_from(std::process::id(), &bad) }.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    }
}
