//! The node's status board: one slot per local rank in an MPI shared-memory
//! window, saying what the rank is doing (op, group, call number, since
//! when, last progress). A rank writes only its own slot, with plain atomic
//! stores (no system call, no MPI), and rings the others' bells when it
//! leaves; any rank of the node reads every slot,
//! even one whose owner is stopped, which is what lets a stuck rank name
//! where its peers are. MPI owns the segment, so a killed job leaves nothing
//! in `/dev/shm`.

use super::clock::now_ns;
use crate::mpi_ext::allocate_shared;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes of a group name a slot keeps (longer names are cut).
const NAME_WORDS: usize = 8;
/// Bytes of a leaving rank's error a slot keeps, and of a notice's.
const REASON_WORDS: usize = 48;

const IDLE: u64 = 0;
const IN_CALL: u64 = 1;
const FINISHED: u64 = 2;
/// The runtime was dropped after an error or a panic (its text in `reason`).
const LEFT: u64 = 3;
/// Its watchdog found a call that cannot complete and is ending the job.
const ENDING: u64 = 4;

/// One rank's state. Written only by its owner; `gen` is a sequence lock
/// (odd while the owner rewrites the call fields).
#[repr(C, align(64))]
pub(crate) struct Slot {
    gen: AtomicU64,
    /// World rank + 1; 0 until the owner has written its slot.
    rank: AtomicU64,
    pid: AtomicU64,
    state: AtomicU64,
    op: AtomicU64,
    seq: AtomicU64,
    /// When the current or last call began (start-up before the first
    /// call, shut-down once finished), in `now_ns`.
    since: AtomicU64,
    /// The last sign of progress in a call (the current one when later
    /// than `since`).
    beat: AtomicU64,
    name_len: AtomicU64,
    name: [AtomicU64; NAME_WORDS],
    reason_len: AtomicU64,
    reason: [AtomicU64; REASON_WORDS],
    /// A notice this rank's status service took for the node: world rank + 1
    /// of a rank on another node that left (0: none), published after
    /// `notice_reason`. Written once, by the service thread, outside the
    /// sequence lock (the main thread owns that).
    notice_rank: AtomicU64,
    notice_len: AtomicU64,
    notice_reason: [AtomicU64; REASON_WORDS],
    /// Rung by any rank of the node when a rank leaves (or a notice says
    /// one did elsewhere): the owner's watchdog dozes on it between ticks,
    /// so every peer looks at once rather than a tick later (ticks are out
    /// of phase, and a peer that ends the job first used to kill the others
    /// before they named the cause).
    bell: AtomicU64,
}

/// Stores `text` (cut at the words' size) in `words`, its length in `len`.
fn store_text(words: &[AtomicU64], len: &AtomicU64, text: &str) {
    let cap = words.len() * 8;
    let mut n = text.len().min(cap);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    let mut buf = vec![0u8; cap];
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    for (w, chunk) in words.iter().zip(buf.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(chunk.try_into().unwrap_or_default()),
            Ordering::Relaxed,
        );
    }
    len.store(n as u64, Ordering::Relaxed);
}

fn load_text(words: &[AtomicU64], len: &AtomicU64) -> String {
    let n = (len.load(Ordering::Relaxed) as usize).min(words.len() * 8);
    let mut buf = Vec::with_capacity(words.len() * 8);
    for w in words {
        buf.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    buf.truncate(n);
    String::from_utf8_lossy(&buf).into_owned()
}

/// What a slot said when it was read, with ages measured on its node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Status {
    pub rank: usize,
    pub pid: u32,
    pub state: State,
    pub op: u32,
    pub seq: u64,
    pub group: String,
    /// Nanoseconds since `since`: in a call, how long it has been in it;
    /// between calls, since its last call began (a call's end is not
    /// timed); finished, since it shut down.
    pub for_ns: u64,
    /// Nanoseconds since the last progress.
    pub quiet_ns: u64,
    /// The process state letter from `/proc` (`T`: stopped), `None` if the
    /// process is gone.
    pub process: Option<char>,
    /// Why it left ([`State::Left`]): its error or panic.
    pub reason: String,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum State {
    Idle,
    InCall,
    /// Its runtime was dropped with no error.
    Finished,
    /// Its runtime was dropped after an error or a panic.
    Left,
    /// Its watchdog is ending the job (a call of it cannot complete).
    Ending,
}

/// The slots of every rank on this node, readable from any thread.
pub(crate) struct BoardView {
    slots: Vec<*const Slot>,
    me: usize,
    /// Cleared before the window is freed, so late readers skip it.
    live: AtomicBool,
}

// SAFETY: the slots are shared memory touched only through atomics; the
// window outlives every reader (see `Board::drop`).
unsafe impl Send for BoardView {}
// SAFETY: as for `Send`: every access is atomic.
unsafe impl Sync for BoardView {}

impl BoardView {
    /// The view of `slots`, slot `me` this rank's (zeroed), which it fills:
    /// its pid, its start, and last its world rank (what makes it readable).
    fn over(slots: Vec<*const Slot>, me: usize, world_rank: usize) -> BoardView {
        let view = BoardView {
            slots,
            me,
            live: AtomicBool::new(true),
        };
        let own = view.own();
        own.pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        own.since.store(now_ns(), Ordering::Relaxed);
        own.rank.store(world_rank as u64 + 1, Ordering::Release);
        view
    }

    fn own(&self) -> &Slot {
        // SAFETY: pointers come from MPI_Win_shared_query and stay valid
        // while `live` (the owner's slot is never read after the free).
        unsafe { &*self.slots[self.me] }
    }

    /// Rewrites this rank's slot under the sequence lock (the generation is
    /// odd while `f` writes, so readers retry).
    fn write(&self, f: impl FnOnce(&Slot)) {
        let s = self.own();
        let g = s.gen.load(Ordering::Relaxed);
        s.gen.store(g + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        f(s);
        s.gen.store(g + 2, Ordering::Release);
    }

    /// Marks this rank as in `op` call `seq` of group `name`.
    pub fn enter(&self, op: u32, seq: u64, name: Option<&str>, now: u64) {
        self.write(|s| {
            if let Some(name) = name {
                let bytes = name.as_bytes();
                let n = bytes.len().min(NAME_WORDS * 8);
                let mut buf = [0u8; NAME_WORDS * 8];
                buf[..n].copy_from_slice(&bytes[..n]);
                for (w, chunk) in s.name.iter().zip(buf.chunks_exact(8)) {
                    w.store(
                        u64::from_le_bytes(chunk.try_into().unwrap_or_default()),
                        Ordering::Relaxed,
                    );
                }
                s.name_len.store(n as u64, Ordering::Relaxed);
            }
            s.op.store(u64::from(op), Ordering::Relaxed);
            s.seq.store(seq, Ordering::Relaxed);
            // `beat` keeps the last call's progress, older than `now`:
            // readers take the later of the two.
            s.since.store(now, Ordering::Relaxed);
            s.state.store(IN_CALL, Ordering::Relaxed);
        });
    }

    /// Records progress in the current call.
    pub fn beat(&self, now: u64) {
        self.own().beat.store(now, Ordering::Relaxed);
    }

    /// Marks this rank as between calls: one store, no clock read and no
    /// sequence lock (a reader sees the call fields of the call that just
    /// ended with either state, both true at some instant). `since` stays
    /// the start of that call: a call's end is not timed.
    pub fn leave(&self) {
        self.own().state.store(IDLE, Ordering::Release);
    }

    /// Marks this rank as gone after an error or a panic, with its text;
    /// final (the board's drop keeps it).
    pub fn set_left(&self, reason: &str, now: u64) {
        self.write(|s| {
            store_text(&s.reason, &s.reason_len, reason);
            s.since.store(now, Ordering::Relaxed);
            s.state.store(LEFT, Ordering::Relaxed);
        });
        self.ring_all();
    }

    /// Takes a notice that world rank `rank`, on another node, left with
    /// `reason`, into this rank's slot for the whole node to see; false if
    /// the slot holds a notice already (the sender tries the node's next rank).
    pub fn take_notice(&self, rank: usize, reason: &str) -> bool {
        let s = self.own();
        if s.notice_rank.load(Ordering::Acquire) != 0 {
            return s.notice_rank.load(Ordering::Acquire) == rank as u64 + 1;
        }
        store_text(&s.notice_reason, &s.notice_len, reason);
        s.notice_rank.store(rank as u64 + 1, Ordering::Release);
        self.ring_all();
        true
    }

    /// Rings every slot's bell: each watchdog of the node looks now.
    pub fn ring_all(&self) {
        if !self.live.load(Ordering::Acquire) {
            return;
        }
        for p in &self.slots {
            // SAFETY: as in `own`, for every rank's slot.
            crate::wait::ring(unsafe { &(**p).bell });
        }
    }

    /// Rings this rank's own bell (its watchdog is to stop).
    pub fn ring_own(&self) {
        crate::wait::ring(&self.own().bell);
    }

    /// This rank's bell as it reads now, for [`doze`](Self::doze).
    pub fn bell(&self) -> u64 {
        self.own().bell.load(Ordering::SeqCst)
    }

    /// Sleeps `timeout` at most, or until this rank's bell rings past
    /// `seen`.
    pub fn doze(&self, seen: u64, timeout: std::time::Duration) {
        crate::wait::doze(&self.own().bell, seen, timeout);
    }

    /// Marks this rank as ending the job.
    pub fn set_ending(&self) {
        self.set_state(ENDING, now_ns());
    }

    /// The departures of ranks on other nodes that this node's services
    /// took: (world rank, reason).
    pub fn notices(&self) -> Vec<(usize, String)> {
        if !self.live.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.slots
            .iter()
            .filter_map(|p| {
                // SAFETY: as in `own`, for every rank's slot.
                let s = unsafe { &**p };
                let r = s.notice_rank.load(Ordering::Acquire);
                (r != 0).then(|| (r as usize - 1, load_text(&s.notice_reason, &s.notice_len)))
            })
            .collect()
    }

    fn set_state(&self, state: u64, now: u64) {
        self.write(|s| {
            s.since.store(now, Ordering::Relaxed);
            s.state.store(state, Ordering::Relaxed);
        });
    }

    /// This rank's own slot (the watchdog's tick: no `/proc` lookup).
    pub fn read_own(&self) -> Option<Status> {
        read(self.own(), now_ns())
    }

    /// Every written slot of the node, read consistently, with each owner's
    /// process state.
    pub fn read_all(&self) -> Vec<Status> {
        if !self.live.load(Ordering::Acquire) {
            return Vec::new();
        }
        let now = now_ns();
        self.slots
            .iter()
            // SAFETY: as in `own`, for every rank's slot.
            .filter_map(|p| read(unsafe { &**p }, now))
            .map(|mut st| {
                st.process = process_state(st.pid);
                st
            })
            .collect()
    }
}

/// A consistent copy of `s` (retried while its owner writes; a writer
/// stopped mid-write still yields its fields after a bounded number of
/// tries), without the process state.
fn read(s: &Slot, now: u64) -> Option<Status> {
    for attempt in 0..1000 {
        let g = s.gen.load(Ordering::Acquire);
        if g % 2 == 1 && attempt < 999 {
            std::hint::spin_loop();
            continue;
        }
        let rank = s.rank.load(Ordering::Relaxed);
        let pid = s.pid.load(Ordering::Relaxed) as u32;
        let state = match s.state.load(Ordering::Relaxed) {
            IN_CALL => State::InCall,
            FINISHED => State::Finished,
            LEFT => State::Left,
            ENDING => State::Ending,
            _ => State::Idle,
        };
        let reason = if state == State::Left {
            load_text(&s.reason, &s.reason_len)
        } else {
            String::new()
        };
        let op = s.op.load(Ordering::Relaxed) as u32;
        let seq = s.seq.load(Ordering::Relaxed);
        let since = s.since.load(Ordering::Relaxed);
        let beat = s.beat.load(Ordering::Relaxed);
        let n = (s.name_len.load(Ordering::Relaxed) as usize).min(NAME_WORDS * 8);
        let mut buf = Vec::with_capacity(NAME_WORDS * 8);
        for w in &s.name {
            buf.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if s.gen.load(Ordering::Relaxed) != g && attempt < 999 {
            continue;
        }
        if rank == 0 {
            return None;
        }
        buf.truncate(n);
        return Some(Status {
            rank: rank as usize - 1,
            pid,
            state,
            op,
            seq,
            group: String::from_utf8_lossy(&buf).into_owned(),
            for_ns: now.saturating_sub(since),
            quiet_ns: now.saturating_sub(beat.max(since)),
            process: None,
            reason,
        });
    }
    None
}

/// The state letter of process `pid` in `/proc` (`R`, `S`, `T`, `Z`, …).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state
    // follows the last `)`.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The board's owner: the node communicator and its window. Collective to
/// create and to drop (over the node's ranks).
pub(crate) struct Board {
    view: std::sync::Arc<BoardView>,
    win: ffi::MPI_Win,
    _node_comm: SimpleCommunicator,
}

impl Board {
    /// Allocates one slot per rank of `node_comm` and fills this rank's.
    pub fn create(node_comm: SimpleCommunicator, world_rank: usize) -> Board {
        let size = std::mem::size_of::<Slot>();
        let me = node_comm.rank() as usize;
        let (win, slots) = allocate_shared(&node_comm, size, std::mem::align_of::<Slot>());
        let slots: Vec<*const Slot> = slots.into_iter().map(|p| p as *const Slot).collect();
        // SAFETY: this rank's own slot, `size` bytes, not yet read by anyone.
        unsafe { std::ptr::write_bytes(slots[me] as *mut u8, 0, size) };
        let view = BoardView::over(slots, me, world_rank);
        // Every slot is written before anyone reads it.
        node_comm.barrier();
        Board {
            view: std::sync::Arc::new(view),
            win,
            _node_comm: node_comm,
        }
    }

    /// The slots, for the writer and the readers.
    pub fn view(&self) -> &std::sync::Arc<BoardView> {
        &self.view
    }
}

impl Drop for Board {
    /// Collective over the node (like MPI finalisation that follows it).
    fn drop(&mut self) {
        // A rank that left says so to the end.
        if self.view.own().state.load(Ordering::Relaxed) != LEFT {
            self.view.set_state(FINISHED, now_ns());
        }
        self.view.live.store(false, Ordering::Release);
        // As for a group's window: a peer of a call given up may never free
        // its part.
        if crate::wait::give_up::gave_up() {
            return;
        }
        // SAFETY: the window is valid and freed once; readers check `live`.
        unsafe { ffi::MPI_Win_free(&mut self.win) };
    }
}

#[cfg(test)]
impl BoardView {
    /// A board of one slot in this process's heap (no MPI), for tests of
    /// its readers; the slot is leaked.
    pub(crate) fn in_memory(world_rank: usize) -> BoardView {
        let layout = std::alloc::Layout::new::<Slot>();
        // SAFETY: a zeroed Slot is valid (atomics), and it is never freed.
        let slot = unsafe { std::alloc::alloc_zeroed(layout) } as *const Slot;
        BoardView::over(vec![slot], 0, world_rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_that_left_keeps_its_reason_and_notices_are_taken_once() {
        let b = BoardView::in_memory(5);
        b.enter(1, 7, Some("tp:0"), now_ns());
        b.set_left("all_reduce on tp:0: ranks are in different calls", now_ns());
        let st = b.read_all().remove(0);
        assert_eq!((st.rank, st.state), (5, State::Left));
        assert_eq!(
            st.reason,
            "all_reduce on tp:0: ranks are in different calls"
        );
        assert_eq!((st.group.as_str(), st.seq), ("tp:0", 7));
        let long = "é".repeat(400);
        assert!(b.take_notice(9, &long));
        assert!(b.take_notice(9, "again"), "the same rank again: taken");
        assert!(!b.take_notice(3, "another"), "one notice per slot");
        let notices = b.notices();
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].0, 9);
        assert!(long.starts_with(&notices[0].1) && notices[0].1.len() >= 380);
    }
}
