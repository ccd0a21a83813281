//! What this machine's memory allows a 2-rank collective: two processes,
//! one per core, with every buffer in one shared mapping, so each moves
//! exactly the bytes an ideal single-copy implementation must move, with no
//! window, no protocol and one spin barrier per call, every output written
//! with streaming stores. Its times are the floor for the shared-memory
//! executor (`docs/BENCHMARKS.md`).
//!
//! `cargo run --release --example memory_bound -- [SIZE_BYTES] [ITERS]`
//! (default 64 MiB, 20): one line per pattern, the median of the slower
//! process's time per call. Linux only (fork, shared anonymous memory).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A two-party sense-reversing barrier in the shared mapping.
struct Barrier<'a> {
    arrived: &'a AtomicU64,
    generation: &'a AtomicU64,
    mine: u64,
}

impl Barrier<'_> {
    fn wait(&mut self) {
        self.mine += 1;
        if self.arrived.fetch_add(1, Ordering::AcqRel) == 1 {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(self.mine, Ordering::Release);
        } else {
            while self.generation.load(Ordering::Acquire) < self.mine {
                std::hint::spin_loop();
            }
        }
    }
}

/// The patterns timed, each as rank `r`'s part of one call on N bytes.
const PATTERNS: [&str; 7] = [
    "memcpy N, one core (the other idle)",
    "memcpy N on both cores at once",
    "broadcast N: each copies half of the root's input to the other's output",
    "all_gather N: each copies its N/2 into both outputs",
    "all_reduce f32 N: each sums its half of both inputs into both outputs",
    "reduce_scatter f32 N: each sums its half of both inputs into its output",
    "all_to_all N: each copies its own block and the other's block for it into its output",
];

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map_or(64 << 20, |s| s.parse().expect("SIZE_BYTES"));
    let iters: usize = args.next().map_or(20, |s| s.parse().expect("ITERS"));
    let n = n.next_multiple_of(64);
    let half = n / 2;
    // [control page][in0][in1][out0][out1][private0][private1], then times.
    let times_at = 4096 + 6 * n;
    let total = times_at + 2 * iters * 8;
    // SAFETY: a fresh shared anonymous mapping, checked below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(base != libc::MAP_FAILED, "mmap of {total} bytes failed");
    let base = base as *mut u8;
    // SAFETY: the mapping is `total` bytes; every region below lies in it.
    let region = |i: usize| unsafe { base.add(4096 + i * n) };
    for i in 0..6 {
        // Fault every page in before timing (1.0f32 everywhere).
        // SAFETY: region i is n bytes inside the mapping.
        let s = unsafe { std::slice::from_raw_parts_mut(region(i) as *mut f32, n / 4) };
        s.fill(1.0);
    }
    // SAFETY: 8-aligned words in the control page, used only atomically.
    let (arrived, generation) = unsafe {
        (
            &*(base as *const AtomicU64),
            &*(base.add(64) as *const AtomicU64),
        )
    };
    // SAFETY: fork in a single-threaded process; the child only computes.
    let rank = match unsafe { libc::fork() } {
        0 => 1,
        pid if pid > 0 => 0,
        _ => panic!("fork failed"),
    };
    pin_to_cpu(rank);
    let mut barrier = Barrier {
        arrived,
        generation,
        mine: 0,
    };
    // SAFETY: the timing area holds `iters` f64s per process after `times_at`.
    let times = |r: usize| unsafe { base.add(times_at + r * iters * 8) as *mut f64 };
    if rank == 0 {
        println!("# memory_bound: {n} bytes, {iters} calls each, 2 processes pinned to cores 0 and 1; median of the slower one");
    }
    for (p, name) in PATTERNS.iter().enumerate() {
        for it in 0..iters {
            barrier.wait();
            let start = Instant::now();
            // SAFETY: every range below is inside its n-byte region, and
            // the two processes write disjoint halves.
            unsafe { run(p, rank, region, half) };
            let secs = start.elapsed().as_secs_f64();
            // SAFETY: call `it` of this process's `iters` slots.
            unsafe { times(rank).add(it).write(secs) };
            barrier.wait();
        }
        if rank == 0 {
            let mut slower: Vec<f64> = (0..iters)
                // SAFETY: slot `it` of both processes, written before the barrier.
                .map(|it| unsafe { times(0).add(it).read().max(times(1).add(it).read()) })
                .collect();
            slower.sort_by(f64::total_cmp);
            println!("{:>10.1} us  {name}", slower[iters / 2] * 1e6);
        }
    }
    if rank == 0 {
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::wait(&mut status) };
    } else {
        std::process::exit(0);
    }
}

/// Rank `r`'s part of pattern `p`; `region(i)` is buffer i (in0, in1,
/// out0, out1, private0, private1).
unsafe fn run(p: usize, r: usize, region: impl Fn(usize) -> *mut u8, half: usize) {
    let n = 2 * half;
    // SAFETY: every range the patterns below name lies inside its n-byte
    // region (the caller's promise); likewise for `sum` and `at`.
    let copy = |dst: *mut u8, src: *const u8, len: usize| unsafe { stream(dst, src, None, len) };
    // SAFETY: as for `copy`.
    let sum = |dst: *mut u8, a: *const u8, b: *const u8| unsafe { stream(dst, a, Some(b), half) };
    // SAFETY: as for `copy`.
    let at = |i: usize, off: usize| unsafe { region(i).add(off) };
    match p {
        0 if r == 0 => copy(at(4, 0), at(0, 0), n),
        0 => {}
        1 => copy(at(4 + r, 0), at(r, 0), n),
        2 => copy(at(3, r * half), at(0, r * half), half),
        3 => {
            copy(at(2, r * half), at(r, 0), half);
            copy(at(3, r * half), at(r, 0), half);
        }
        4 => {
            sum(at(2 + r, r * half), at(0, r * half), at(1, r * half));
            copy(at(3 - r, r * half), at(2 + r, r * half), half);
        }
        5 => sum(at(2 + r, 0), at(0, r * half), at(1, r * half)),
        _ => {
            copy(at(2 + r, r * half), at(r, r * half), half);
            copy(at(2 + r, (1 - r) * half), at(1 - r, r * half), half);
        }
    }
}

/// `dst = a` (or `a + b` as f32) over `len` bytes with streaming stores,
/// as the shared-memory executor writes large outputs: no read of each
/// destination line first. Region offsets are 64-byte multiples.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(dst: *mut u8, a: *const u8, b: Option<*const u8>, len: usize) {
    use std::arch::x86_64::*;
    assert!(
        std::arch::is_x86_feature_detected!("avx")
            && (dst as usize).is_multiple_of(32)
            && len.is_multiple_of(32)
    );
    #[target_feature(enable = "avx")]
    unsafe fn go(dst: *mut u8, a: *const u8, b: Option<*const u8>, len: usize) {
        for i in (0..len).step_by(32) {
            // SAFETY: i + 32 <= len; dst + i is 32-aligned.
            unsafe {
                let x = _mm256_loadu_ps(a.add(i) as *const f32);
                let v = match b {
                    Some(b) => _mm256_add_ps(x, _mm256_loadu_ps(b.add(i) as *const f32)),
                    None => x,
                };
                _mm256_stream_ps(dst.add(i) as *mut f32, v);
            }
        }
        _mm_sfence();
    }
    // SAFETY: AVX checked above; the caller passes ranges inside the mapping.
    unsafe { go(dst, a, b, len) }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream(dst: *mut u8, a: *const u8, b: Option<*const u8>, len: usize) {
    // SAFETY: the caller passes ranges inside the mapping.
    unsafe {
        let d = std::slice::from_raw_parts_mut(dst as *mut f32, len / 4);
        let x = std::slice::from_raw_parts(a as *const f32, len / 4);
        match b {
            Some(b) => {
                let y = std::slice::from_raw_parts(b as *const f32, len / 4);
                d.iter_mut()
                    .zip(x.iter().zip(y))
                    .for_each(|(d, (x, y))| *d = x + y);
            }
            None => d.copy_from_slice(x),
        }
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and the call take it by pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
