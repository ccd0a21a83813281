//! One clock every process on a node shares: `CLOCK_MONOTONIC_COARSE` in
//! nanoseconds. With it a rank can tell how long a neighbour has been in a
//! state from the timestamps it left on the status board.
//!
//! Coarse because every call reads it once and the watchdog's limits are
//! seconds: it costs 6.5 ns a read on this VM against 30 ns for
//! `CLOCK_MONOTONIC`, which was a quarter of the dispatch path of a small
//! device call. Its resolution is the kernel tick (1–10 ms), so the flight
//! recorder's start times are to that resolution.

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE` (never 0 on a running system).
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC_COARSE exists on Linux
    // since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// `ns` as seconds with one decimal, for messages.
pub(crate) fn secs(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

/// The clock's resolution in nanoseconds (the kernel tick).
pub(crate) fn resolution_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
