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
//! page at about 300 ns) a read was 2-4× the cost of two hot copies at
//! every size, yet the same guest later ran the window's copies, whose
//! lines cross between cores, at half a read's speed. [`pays_from`] times
//! both at start, between two ranks of the node, as a call moves them.

use super::copy::copy_bytes;
use crate::mpi_ext::allocate_shared;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
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

/// Takes [`allow_peer_reads`] back (Yama's default again).
fn deny_peer_reads() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, 0, 0, 0, 0) };
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

/// The fastest time, in seconds, at each of [`PROBE_BYTES`], of one read
/// of a peer's freshly written buffer (`cma`) and of the window's two
/// copies of one (`window`: the writer's in, the reader's out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Probe {
    pub cma: [f64; 2],
    pub window: [f64; 2],
}

/// Times, between local ranks 0 (the reader) and 1 (the writer) of
/// `node`, both ways of moving a block the writer has just written: one
/// read of its buffer, and a copy into a shared window then out of it.
/// Collective over `node` (at least two ranks; the others only take part
/// in the synchronisations); about 1 ms on an idle node. Both ranks of the
/// pair time it as a call would run: on their own cores, with the lines
/// crossing between them (a probe inside one process timed hot copies, and
/// chose the window on a VM where its copies ran at half a read's speed).
/// An `Err` on every rank alike is the kernel's refusal.
pub(crate) fn probe_pair(node: &SimpleCommunicator) -> io::Result<Probe> {
    let big = PROBE_BYTES[1];
    let me = node.rank();
    let (reader, writer) = (me == 0, me == 1);
    let (mut win, slots) = allocate_shared(node, if writer { big } else { 0 }, 64);
    let shared = slots[1];
    let mut own = vec![0u8; if reader || writer { big } else { 0 }];
    let mut fill = vec![0u8; if writer { big } else { 0 }];
    // Under Yama's `ptrace_scope = 1` the reader is refused otherwise; the
    // grant is taken back below (a group's plane makes it again where
    // single copies are on).
    if writer {
        allow_peer_reads();
    }
    // The writer's pid and the address of the buffer the reader reads.
    let mut whose = [u64::from(std::process::id()), own.as_ptr() as u64];
    node.process_at_rank(1).broadcast_into(&mut whose[..]);
    // Fastest times: reads, the writer's copies in, the reader's copies out.
    let mut t = [f64::INFINITY; 6];
    let mut refused: Option<io::Error> = None;
    let timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    for rep in 0..PROBE_REPS {
        for (i, &n) in PROBE_BYTES.iter().enumerate() {
            let stamp = (rep * 2 + i) as u8;
            if writer {
                own[..n].fill(stamp);
            }
            node.barrier();
            if reader && refused.is_none() {
                let read = Segment {
                    local: own.as_mut_ptr(),
                    remote: whose[1] as usize,
                    len: n,
                };
                let took = timed(&mut || {
                    // SAFETY: `own` is this function's buffer, `n` <= its length.
                    if let Err(e) = unsafe { read_from(whose[0] as u32, &[read]) } {
                        refused = Some(e);
                    }
                });
                t[i] = t[i].min(took);
            }
            if writer {
                fill[..n].fill(stamp.wrapping_add(1));
                // SAFETY: the writer's slot of the window, `big` bytes; the
                // reader reads it only after the next barrier.
                let window = unsafe { std::slice::from_raw_parts_mut(shared, n) };
                t[2 + i] = t[2 + i].min(timed(&mut || copy_bytes(window, &fill[..n])));
            }
            node.barrier();
            if reader {
                // SAFETY: written before the barrier; rewritten only after
                // the next one.
                let window = unsafe { std::slice::from_raw_parts(shared as *const u8, n) };
                t[4 + i] = t[4 + i].min(timed(&mut || copy_bytes(&mut own[..n], window)));
                std::hint::black_box(&mut own);
            }
            node.barrier();
        }
    }
    let shared = share_figures(node, t, refused);
    if writer {
        deny_peer_reads();
    }
    // SAFETY: every rank is past its last access to the window.
    unsafe { mpi::ffi::MPI_Win_free(&mut win) };
    let all = shared?;
    Ok(Probe {
        cma: [all[0], all[1]],
        window: [all[2] + all[4], all[3] + all[5]],
    })
}

/// Every rank's figures of [`probe_pair`] (a rank that timed nothing gives
/// 0), or the reader's refusal on every rank alike (its errno; EIO for a
/// short read). Collective over `node`.
fn share_figures(
    node: &SimpleCommunicator,
    t: [f64; 6],
    refused: Option<io::Error>,
) -> io::Result<[f64; 6]> {
    let mine = t.map(|x| if x.is_finite() { x } else { 0.0 });
    let mut all = [0.0f64; 6];
    node.all_reduce_into(&mine[..], &mut all[..], SystemOperation::max());
    let code = refused
        .as_ref()
        .map_or(0, |e| e.raw_os_error().unwrap_or(libc::EIO).max(1));
    let mut any = 0i32;
    node.all_reduce_into(&code, &mut any, SystemOperation::max());
    match refused {
        _ if any == 0 => Ok(all),
        Some(e) => Err(e),
        None => Err(io::Error::from_raw_os_error(any)),
    }
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
    let (read, window) = (line(p.cma), line(p.window));
    std::iter::successors(Some(floor.next_power_of_two()), |n| n.checked_mul(2))
        .take_while(|n| *n <= LARGEST)
        .find(|&n| read(n as f64) < window(n as f64))
}

/// Where single copies pay on this node: [`crossover`] of a fresh
/// [`probe_pair`], the same on every rank; `None` where they never do or
/// the kernel refuses. Collective over `node`.
pub(crate) fn pays_from(node: &SimpleCommunicator, floor: usize) -> Option<usize> {
    match probe_pair(node) {
        Ok(p) => {
            let from = crossover(&p, floor);
            let us = |t: [f64; 2]| format!("{:.2} / {:.2} us", t[0] * 1e6, t[1] * 1e6);
            let [small, large] = PROBE_BYTES.map(|n| n >> 10);
            tracing::debug!(
                "single copies timed at {small} / {large} KiB between local ranks 0 and 1: \
                 a read {}, the window's two copies {}: {}",
                us(p.cma),
                us(p.window),
                match from {
                    Some(n) => format!("one read beats them from {} KiB", n >> 10),
                    None => "one read never beats them here".into(),
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

    /// Read and copy times (µs at 16 KiB and 1 MiB; the window costs two
    /// copies): a machine that pins pages cheaply (synthetic) pays from the
    /// floor; the Firecracker CI guest's hot copies never do; a costly call
    /// at a good rate pays from where the saved copy repays the call.
    #[test]
    fn single_copies_pay_where_one_read_beats_two_copies() {
        let us = |cma: [f64; 2], copy: [f64; 2]| Probe {
            cma: cma.map(|t| t * 1e-6),
            window: copy.map(|t| 2.0 * t * 1e-6),
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
