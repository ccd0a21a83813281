//! The hang watchdog: a thread that notices a rank waiting too long for its
//! peers to enter a call and ends the job with a message naming the call.
//!
//! The hot path only stores a few atomics around the agreement step (MPI
//! calls stay blocking and fast); the watchdog thread never calls MPI. When
//! it fires it prints what the rank was waiting in and aborts the process,
//! and the launcher then ends the job: a loud, attributed failure instead of
//! a silent hang (a pending MPI request cannot be abandoned safely).

use crate::dispatch::Op;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct Shared {
    epoch: Instant,
    /// Nanoseconds since `epoch` + 1 when the current wait began; 0: idle.
    since: AtomicU64,
    op: AtomicU32,
    seq: AtomicU64,
    group: AtomicU32,
    names: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// Watches one process's waits (owned by the `Runtime`).
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Marks a wait in progress until dropped.
pub(crate) struct Waiting<'a>(&'a Shared);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.since.store(0, Ordering::Release);
    }
}

impl Watchdog {
    /// Starts the thread for world rank `rank` (none when `timeout` is `None`).
    pub fn start(rank: usize, timeout: Option<Duration>) -> Watchdog {
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
            op: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            group: AtomicU32::new(0),
            names: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let thread = timeout.map(|limit| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("rankmesh-watchdog".into())
                .spawn(move || watch(&s, rank, limit))
                .expect("cannot start the watchdog thread")
        });
        Watchdog { shared, thread }
    }

    /// Registers a group name; the id goes into [`Watchdog::wait`].
    pub fn register(&self, name: &str) -> u32 {
        let mut names = self.shared.names.lock().unwrap_or_else(|e| e.into_inner());
        names.push(name.to_string());
        (names.len() - 1) as u32
    }

    /// Marks this rank as waiting in `op` (call `seq`) on group `group`.
    pub fn wait(&self, group: u32, op: Op, seq: u64) -> Waiting<'_> {
        let s = &*self.shared;
        s.op.store(op as u32, Ordering::Relaxed);
        s.seq.store(seq, Ordering::Relaxed);
        s.group.store(group, Ordering::Relaxed);
        s.since
            .store(s.epoch.elapsed().as_nanos() as u64 + 1, Ordering::Release);
        Waiting(s)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn watch(s: &Shared, rank: usize, limit: Duration) {
    let tick = (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    while !s.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(tick);
        let since = s.since.load(Ordering::Acquire);
        if since == 0 {
            continue;
        }
        let waited = s
            .epoch
            .elapsed()
            .saturating_sub(Duration::from_nanos(since - 1));
        if waited > limit && s.since.load(Ordering::Acquire) == since {
            let names = s.names.lock().unwrap_or_else(|e| e.into_inner());
            let group = names
                .get(s.group.load(Ordering::Relaxed) as usize)
                .cloned()
                .unwrap_or_default();
            let op = Op::from_code(s.op.load(Ordering::Relaxed)).map_or("a call", Op::name);
            let msg = format!(
                "rankmesh: rank {rank} waited {:.0} s in {op} on {group} (call #{}) for its peers to enter the same call: \
                 ranks are in mismatched calls, or a peer is stuck or gone; aborting (RANKMESH_TIMEOUT={} s)\n",
                waited.as_secs_f64(),
                s.seq.load(Ordering::Relaxed),
                limit.as_secs_f64()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_finished_waits_do_not_fire() {
        let w = Watchdog::start(0, Some(Duration::from_millis(50)));
        let g = w.register("world");
        for seq in 0..5 {
            let _waiting = w.wait(g, Op::AllReduce, seq);
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(120));
        drop(w); // returns promptly: the thread is unparked
    }
}
