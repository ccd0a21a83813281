//! The flight recorder: the last calls of this rank (op, group, call number,
//! shape, start, outcome), kept in a ring. As with PyTorch's NCCL flight
//! recorder, a hang or a failure can then be explained after the fact. A
//! call's end is not timed: a device call's host-side end is only when its
//! work was enqueued, not when the GPU finished it, and the clock read cost a
//! small device call as much as the rest of the recorder.

use super::clock::{now_ns, resolution_ns};
use crate::agree::Descriptor;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// A slot's outcome while its call runs, and once it ended.
const RUNNING: u8 = 0;
const OK: u8 = 1;
const FAILED: u8 = 2;

/// Calls the ring keeps.
pub(crate) const CAPACITY: usize = 64;
const WORDS: usize = std::mem::size_of::<Descriptor>() / 8;
const _: () = assert!(std::mem::size_of::<Descriptor>().is_multiple_of(8));

/// One call's record. Written only by the thread that owns the runtime,
/// read by the watchdog thread when it dumps: the fields are atomics under
/// a sequence lock (`version` odd while written), so recording a call
/// takes no lock and no atomic read-modify-write.
struct Slot {
    version: AtomicU64,
    /// The call's number + 1 (0: never used).
    number: AtomicU64,
    group: AtomicU64,
    start: AtomicU64,
    /// [`RUNNING`], [`OK`] or [`FAILED`]; outside the sequence lock, read
    /// by itself.
    outcome: AtomicU8,
    desc: [AtomicU64; WORDS],
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            version: AtomicU64::new(0),
            number: AtomicU64::new(0),
            // No group's id: a slot's first call names its group.
            group: AtomicU64::new(u64::MAX),
            start: AtomicU64::new(0),
            outcome: AtomicU8::new(RUNNING),
            desc: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The last [`CAPACITY`] calls of this rank, shared with the watchdog
/// thread (which dumps them).
pub(crate) struct Recorder {
    slots: Box<[Slot]>,
    /// Calls recorded so far (the next call's number).
    total: AtomicU64,
    /// By slot: the id and name of its call's group, changed (under the
    /// lock, before the slot's sequence lock is taken) only when the
    /// group differs from the slot's last: a loop over a few groups
    /// rarely takes it.
    names: Mutex<Vec<(u64, Arc<str>)>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            slots: (0..CAPACITY).map(|_| Slot::default()).collect(),
            total: AtomicU64::new(0),
            names: Mutex::new(vec![(u64::MAX, Arc::from("")); CAPACITY]),
        }
    }
}

/// A slot as read by the dump.
struct Record {
    number: u64,
    group: u64,
    start: u64,
    desc: Descriptor,
}

impl Recorder {
    fn names(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Arc<str>)>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the start of a call of group `group_id` (named `group`);
    /// returns its number for [`end`](Self::end). Only the runtime's
    /// thread calls it.
    pub fn begin(&self, group_id: u64, group: &Arc<str>, desc: &Descriptor, now: u64) -> u64 {
        let number = self.total.load(Ordering::Relaxed);
        self.total.store(number + 1, Ordering::Relaxed);
        let s = &self.slots[(number % CAPACITY as u64) as usize];
        if s.group.load(Ordering::Relaxed) != group_id {
            self.names()[(number % CAPACITY as u64) as usize] = (group_id, group.clone());
        }
        let v = s.version.load(Ordering::Relaxed);
        s.version.store(v + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        s.outcome.store(RUNNING, Ordering::Relaxed);
        s.number.store(number + 1, Ordering::Relaxed);
        s.group.store(group_id, Ordering::Relaxed);
        s.start.store(now, Ordering::Relaxed);
        // Only the words in use (a 1-d call's 10, not 25); `read` clears
        // the dims left over from the slot's earlier calls.
        for (w, d) in s.desc.iter().zip(desc.used_words()) {
            w.store(*d, Ordering::Relaxed);
        }
        s.version.store(v + 2, Ordering::Release);
        number
    }

    /// Records how call `number` ended (from the thread that began it).
    pub fn end(&self, number: u64, ok: bool) {
        let s = &self.slots[(number % CAPACITY as u64) as usize];
        if s.number.load(Ordering::Relaxed) == number + 1 {
            s.outcome
                .store(if ok { OK } else { FAILED }, Ordering::Release);
        }
    }

    /// The number of this rank's latest call if it failed.
    pub fn last_failed(&self) -> Option<u64> {
        let last = self.total.load(Ordering::Relaxed).checked_sub(1)?;
        let s = &self.slots[(last % CAPACITY as u64) as usize];
        (s.outcome.load(Ordering::Acquire) == FAILED).then_some(last)
    }

    /// Slot `s` consistently, or `None` when it was never used or its
    /// owner keeps rewriting it (a stopped owner is never inside a write
    /// for long: it takes no lock there).
    fn read(s: &Slot) -> Option<Record> {
        for _ in 0..1000 {
            let v = s.version.load(Ordering::Acquire);
            if v % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words: [u64; WORDS] = std::array::from_fn(|i| s.desc[i].load(Ordering::Relaxed));
            let record = Record {
                number: s.number.load(Ordering::Relaxed),
                group: s.group.load(Ordering::Relaxed),
                start: s.start.load(Ordering::Relaxed),
                desc: bytemuck::cast::<_, Descriptor>(words).without_stale_dims(),
            };
            fence(Ordering::Acquire);
            if s.version.load(Ordering::Relaxed) == v {
                return (record.number > 0).then(|| Record {
                    number: record.number - 1,
                    ..record
                });
            }
        }
        None
    }

    /// The ring as text, oldest call first.
    pub fn dump(&self, header: &str) -> String {
        let now = now_ns();
        let total = self.total.load(Ordering::Relaxed);
        let names = self.names().clone();
        let mut records: Vec<(usize, Record)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Self::read(s).map(|r| (i, r)))
            .collect();
        records.sort_by_key(|(_, r)| r.number);
        let mut out = format!(
            "{header}: flight recorder, last {} of {total} calls (oldest first; start times to {} ms)\n",
            records.len(),
            resolution_ns() as f64 / 1e6
        );
        for (i, r) in records {
            let s = &self.slots[i];
            let ago = (now.saturating_sub(r.start)) as f64 / 1e9;
            let state = match s.outcome.load(Ordering::Acquire) {
                OK => "ok".to_string(),
                FAILED => "failed".to_string(),
                _ => format!("running for {ago:.3} s"),
            };
            let group = match &names[i] {
                (id, name) if *id == r.group => name.to_string(),
                _ => format!("group #{}", r.group),
            };
            out.push_str(&format!(
                "  #{} {group} call #{} {}: started {ago:.3} s ago, {state}\n",
                r.number,
                r.desc.seq,
                r.desc.describe()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::op::Op;

    #[test]
    fn ring_keeps_the_newest_calls_in_order() {
        let r = Recorder::default();
        let g: Arc<str> = Arc::from("tp:0");
        for i in 0..(CAPACITY as u64 + 3) {
            let mut d = Descriptor::for_tensor(Op::AllReduce, DType::F32, &[4], &[0]);
            d.seq = i;
            let n = r.begin(7, &g, &d, 10);
            if i != CAPACITY as u64 + 2 {
                r.end(n, i % 2 == 0);
            }
        }
        let text = r.dump("rank 0");
        assert!(text.starts_with("rank 0: flight recorder, last 64 of 67 calls"));
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), CAPACITY);
        assert!(lines[0].starts_with("  #3 tp:0 call #3 all_reduce(shape [4] f32, op sum)"));
        assert!(lines[0].ends_with(", failed"), "{}", lines[0]);
        assert!(lines[1].ends_with(", ok"), "{}", lines[1]);
        assert!(lines[63].contains("#66 tp:0 call #66"));
        assert!(lines[63].contains("running for"), "{}", lines[63]);
    }

    #[test]
    fn each_call_keeps_its_group_name() {
        let r = Recorder::default();
        let (tp, dp): (Arc<str>, Arc<str>) = (Arc::from("tp:0"), Arc::from("dp:1"));
        let d = Descriptor::for_tensor(Op::AllReduce, DType::F32, &[4], &[0]);
        // Group 0 first (a fresh slot's group must still be named), then
        // groups alternating with a period that shifts against the ring.
        for i in 0..(3 * CAPACITY as u64 + 5) {
            let (id, name) = if i % 3 == 0 { (0, &tp) } else { (1, &dp) };
            let n = r.begin(id, name, &d, 10);
            r.end(n, true);
        }
        let text = r.dump("rank 0");
        for line in text.lines().skip(1) {
            let number: u64 = line.trim_start()[1..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let want = if number.is_multiple_of(3) {
                "tp:0"
            } else {
                "dp:1"
            };
            assert!(line.contains(&format!(" {want} call")), "{line}");
        }
        assert_eq!(text.lines().count(), CAPACITY + 1);
    }
}
