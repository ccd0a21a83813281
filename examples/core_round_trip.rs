//! How far apart two CPUs are, for classifying benchmark runs: two threads
//! pinned to CPUs A and B (default 0 and 1) bounce one cache line 200,000
//! times, then one reads 1 MiB the other wrote, 200 times. On the
//! development VM the two vCPUs sometimes sit in one core complex (round
//! trip 50-130 ns, 1 MiB in 16-21 µs) and sometimes in two (490-520 ns,
//! 26-28 µs): the "slow spells" of docs/BENCHMARKS.md.
//!
//! `cargo run --release --example core_round_trip [A B]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, `cpu` is below
    // CPU_SETSIZE (checked by the caller's parse), and the call reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("core_round_trip: cannot pin to CPU {cpu}");
            std::process::exit(2);
        }
    }
}

/// A counter alone on its cache lines.
#[repr(align(128))]
struct Line(AtomicU64);

fn main() {
    let cpus: Option<Vec<usize>> = std::env::args().skip(1).map(|a| a.parse().ok()).collect();
    // Two different CPUs: on one, each bounce would wait for a time slice.
    let (a, b) = match cpus.as_deref() {
        Some([a, b]) if a != b && *a < 1024 && *b < 1024 => (*a, *b),
        Some([]) => (0, 1),
        _ => {
            eprintln!("usage: core_round_trip [CPU_A CPU_B] (two different CPU numbers)");
            std::process::exit(2);
        }
    };
    let lines = Arc::new([Line(AtomicU64::new(0)), Line(AtomicU64::new(0))]);
    let theirs = lines.clone();
    let n = 200_000u64;
    let bouncer = std::thread::spawn(move || {
        pin(b);
        for i in 1..=n {
            while theirs[0].0.load(Ordering::Acquire) != i {}
            theirs[1].0.store(i, Ordering::Release);
        }
    });
    pin(a);
    let start = Instant::now();
    for i in 1..=n {
        lines[0].0.store(i, Ordering::Release);
        while lines[1].0.load(Ordering::Acquire) != i {}
    }
    let round_trip = start.elapsed().as_nanos() as f64 / n as f64;
    bouncer.join().unwrap();

    let words = Arc::new(
        (0..(1 << 20) / 8)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let turn = Arc::new(AtomicU64::new(0));
    let (w, t) = (words.clone(), turn.clone());
    let rounds = 200u64;
    let writer = std::thread::spawn(move || {
        pin(b);
        for r in 0..rounds {
            while t.load(Ordering::Acquire) != 2 * r {}
            for x in w.iter() {
                x.store(r, Ordering::Relaxed);
            }
            t.store(2 * r + 1, Ordering::Release);
        }
    });
    let (mut reading, mut sum) = (0.0, 0u64);
    for r in 0..rounds {
        turn.store(2 * r, Ordering::Release);
        while turn.load(Ordering::Acquire) != 2 * r + 1 {}
        let start = Instant::now();
        for x in words.iter() {
            sum = sum.wrapping_add(x.load(Ordering::Relaxed));
        }
        reading += start.elapsed().as_secs_f64();
    }
    writer.join().unwrap();
    std::hint::black_box(sum);
    let per = reading / rounds as f64;
    println!(
        "CPUs {a} and {b}: cache-line round trip {round_trip:.0} ns; 1 MiB written by CPU {b} read on CPU {a} in {:.1} us ({:.1} GB/s)",
        per * 1e6,
        (1 << 20) as f64 / per / 1e9
    );
}
