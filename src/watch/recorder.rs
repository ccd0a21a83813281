//! The flight recorder: the last calls of this rank (op, group, call number,
//! shape, start, duration, outcome), kept in a ring so a hang or a failure
//! can be explained after the fact, as PyTorch's NCCL flight recorder does.

use super::clock::{now_ns, resolution_ns};
use crate::dispatch::Descriptor;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Calls the ring keeps.
pub(crate) const CAPACITY: usize = 64;

#[derive(Clone)]
struct Entry {
    number: u64,
    group: Arc<str>,
    desc: Descriptor,
    start: u64,
}

#[derive(Default)]
struct Ring {
    entries: Vec<Entry>,
    /// Calls recorded so far (the next call's number).
    total: u64,
}

/// The ring, shared with the watchdog thread (which dumps it). How each
/// call ended is kept beside it in atomics: the owning thread records it
/// without taking the lock again (one lock per call, not two).
pub(crate) struct Recorder {
    ring: Mutex<Ring>,
    /// By slot: the call number the outcome belongs to (+1; 0 for none).
    ended_call: [AtomicU64; CAPACITY],
    /// By slot: when the call ended (0 while it runs).
    end: [AtomicU64; CAPACITY],
    ok: [AtomicBool; CAPACITY],
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            ring: Mutex::default(),
            ended_call: std::array::from_fn(|_| AtomicU64::new(0)),
            end: std::array::from_fn(|_| AtomicU64::new(0)),
            ok: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }
}

impl Recorder {
    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the start of a call; returns its number for [`end`](Self::end).
    pub fn begin(&self, group: &Arc<str>, desc: &Descriptor, now: u64) -> u64 {
        let mut ring = self.ring();
        let number = ring.total;
        ring.total += 1;
        let entry = Entry {
            number,
            group: group.clone(),
            desc: *desc,
            start: now,
        };
        let slot = (number % CAPACITY as u64) as usize;
        self.end[slot].store(0, Ordering::Relaxed);
        self.ended_call[slot].store(number + 1, Ordering::Relaxed);
        if ring.entries.len() < CAPACITY {
            ring.entries.push(entry);
        } else {
            ring.entries[(number % CAPACITY as u64) as usize] = entry;
        }
        number
    }

    /// Records how call `number` ended (from the thread that began it).
    pub fn end(&self, number: u64, ok: bool, now: u64) {
        let slot = (number % CAPACITY as u64) as usize;
        if self.ended_call[slot].load(Ordering::Relaxed) == number + 1 {
            self.ok[slot].store(ok, Ordering::Relaxed);
            self.end[slot].store(now, Ordering::Release);
        }
    }

    /// The ring as text, oldest call first.
    pub fn dump(&self, header: &str) -> String {
        let now = now_ns();
        // The owner may be stopped inside `begin`; never wait for it forever.
        let ring = match self.ring.try_lock() {
            Ok(r) => r,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                match self.ring.try_lock() {
                    Ok(r) => r,
                    Err(_) => return format!("{header}: flight recorder busy\n"),
                }
            }
        };
        let mut entries: Vec<&Entry> = ring.entries.iter().collect();
        entries.sort_by_key(|e| e.number);
        let mut out = format!(
            "{header}: flight recorder, last {} of {} calls (oldest first; times to {} ms)\n",
            entries.len(),
            ring.total,
            resolution_ns() as f64 / 1e6
        );
        for e in entries {
            let ago = (now.saturating_sub(e.start)) as f64 / 1e9;
            let slot = (e.number % CAPACITY as u64) as usize;
            let end = self.end[slot].load(Ordering::Acquire);
            let state = if end == 0 {
                format!("running for {:.3} s", ago)
            } else {
                let took = end.saturating_sub(e.start) as f64 / 1e6;
                let ok = self.ok[slot].load(Ordering::Relaxed);
                format!("{} in {took:.3} ms", if ok { "ok" } else { "failed" })
            };
            out.push_str(&format!(
                "  #{} {} call #{} {}: started {ago:.3} s ago, {state}\n",
                e.number,
                e.group,
                e.desc.seq,
                e.desc.describe()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Op;
    use crate::tensor::DType;

    #[test]
    fn ring_keeps_the_newest_calls_in_order() {
        let r = Recorder::default();
        let g: Arc<str> = Arc::from("tp:0");
        for i in 0..(CAPACITY as u64 + 3) {
            let mut d = Descriptor::for_tensor(Op::AllReduce, DType::F32, &[4], &[0]);
            d.seq = i;
            let n = r.begin(&g, &d, 10);
            if i != CAPACITY as u64 + 2 {
                r.end(n, i % 2 == 0, 20);
            }
        }
        let text = r.dump("rank 0");
        assert!(text.starts_with("rank 0: flight recorder, last 64 of 67 calls"));
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), CAPACITY);
        assert!(lines[0].starts_with("  #3 tp:0 call #3 all_reduce(shape [4] f32, op sum)"));
        assert!(lines[0].ends_with("failed in 0.000 ms"), "{}", lines[0]);
        assert!(lines[1].ends_with("ok in 0.000 ms"), "{}", lines[1]);
        assert!(lines[63].contains("#66 tp:0 call #66"));
        assert!(lines[63].contains("running for"), "{}", lines[63]);
    }
}
