//! One clock every process on a node shares: `CLOCK_MONOTONIC` in
//! nanoseconds, so a rank can tell how long a neighbour has been in a state
//! from the timestamps it left on the status board.

/// Nanoseconds of `CLOCK_MONOTONIC` (never 0 on a running system).
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// `ns` as seconds with one decimal, for messages.
pub(crate) fn secs(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}
