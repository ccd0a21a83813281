//! Calls longer than a data area, streamed through the writers' data areas
//! (broadcasts, scatters, gathers and all-gathers, all-to-alls that take no
//! single copy). After the call's first phase (the agreement, which carries
//! the first piece), each writer fills a ring of [`STREAM_PIECE`] slots over
//! both of its areas, publishing a written-piece counter; each reader takes a
//! piece from every writer as soon as they have written it, then publishes a
//! read-piece counter.
//!
//! Why not a phase per piece: a phase is a rendezvous of every rank, so a
//! writer waits for the slowest reader at each piece, and a rank that is
//! descheduled (a busy node) stalls every piece. Here a writer waits for
//! room in its ring only for the piece its peers need next, writes further
//! (up to an area ahead of its own reads) only where there is room already,
//! and does not wait at all at the end: it returns once it has written, and
//! the next write to its areas (any later phase's, in
//! [`ShmExec::await_drained`]) first waits for the readers to have read.
//! Small pieces keep each piece's lines in the writer's cache until the
//! reader takes them: on this project's VM, whole 1 MiB pieces took 2-4×
//! longer to cross between cores for minutes at a time
//! (docs/bench-log/2026-11-27-to-29.md, "Streamed broadcasts"). A call of
//! one area or less keeps its phases.
//!
//! The counters hold totals over the group's life ([`ShmExec::streamed`],
//! the same on every member, is where this call's pieces start), so they
//! only grow, and a waiter compares them with the total it needs.
//!
//! **No deadlock.** A writer at read step `i` must have written piece `i`
//! (which needs every reader to have read piece `i - ring`), and writes
//! further only where its ring has room already. The rank at the lowest
//! step can always go on: every other rank has read the pieces before it,
//! and has written the piece it reads.

use super::{Place, ShmExec, STREAM_AT};
use crate::wait;
use crate::watch::Pulse;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one streamed piece's slot (at most a data area): small enough
/// that a piece is still in the writer's cache when its reader copies it
/// (docs/BENCHMARKS.md, "Tuned constants").
const STREAM_PIECE: usize = 256 << 10;

/// Which of a slot's stream counters.
#[derive(Clone, Copy)]
enum Counter {
    /// Pieces of streamed calls this rank has written.
    Written = 0,
    /// Pieces of streamed calls this rank has read (from every writer).
    Read = 1,
}

/// Group ranks that take a role (writing, reading) in a streamed call;
/// the same on every rank.
#[derive(Clone, Copy)]
pub(super) enum Ranks {
    All,
    Only(usize),
    AllBut(usize),
}

impl Ranks {
    fn has(self, r: usize) -> bool {
        match self {
            Ranks::All => true,
            Ranks::Only(o) => r == o,
            Ranks::AllBut(o) => r != o,
        }
    }
}

/// What a streamed call asks its op to do with piece `i` (the first is 1:
/// piece 0 went with the call's first phase).
pub(super) enum Piece<'a> {
    /// Fill this rank's slot for piece `i` (it is a writer).
    Write(u64, &'a mut [u8]),
    /// Take piece `i` from writer `s`'s slot (this rank is a reader).
    Read(u64, usize, &'a [u8]),
}

impl ShmExec {
    /// Bytes of a streamed call's slot (and of its first phase's data).
    pub(super) fn stream_slot(&self) -> usize {
        STREAM_PIECE.min(self.window.chunk)
    }

    /// Rank `r`'s stream counter `which`.
    fn stream_counter(&self, r: usize, which: Counter) -> &AtomicU64 {
        // SAFETY: inside slot `r` (STREAM_AT + 128 <= DATA_AT), a line
        // each, 64-aligned; only atomics touch them.
        unsafe { &*(self.window.slots[r].add(STREAM_AT + 64 * which as usize) as *const AtomicU64) }
    }

    /// Before this rank writes its data areas: waits until every peer has
    /// read the pieces of the last stream this rank wrote.
    pub(super) fn await_drained(&self) {
        let due = self.drain_due.take();
        if due != 0 {
            self.until_read_by_peers(due);
        }
    }

    /// Whether every peer's read-piece counter has reached `total`.
    fn read_by_peers(&self, total: u64) -> bool {
        (0..self.size).filter(|r| *r != self.me).all(|r| {
            self.stream_counter(r, Counter::Read)
                .load(Ordering::Acquire)
                >= total
        })
    }

    /// Waits until every peer's read-piece counter reaches `total`.
    fn until_read_by_peers(&self, total: u64) {
        for r in (0..self.size).filter(|r| *r != self.me) {
            let read = self.stream_counter(r, Counter::Read);
            // No deadline: a missing peer is the watchdog's to name.
            wait::until_at_least(read, total, self.sleepers(r), None);
        }
    }

    /// Streams pieces `1..count` of a call whose first phase wrote and
    /// read piece 0 at `first` (a data area, with [`Self::stream_slot`]
    /// bytes per rank): `each` fills this rank's slots where it is one of
    /// the `writers` and takes every other writer's where it is one of the
    /// `readers`. Readers need not wait for anything else: a piece is
    /// theirs once its writer's counter says so.
    pub(super) fn stream(
        &self,
        pulse: &Pulse,
        first: Place,
        count: u64,
        (writers, readers): (Ranks, Ranks),
        mut each: impl FnMut(Piece),
    ) {
        let me = self.me;
        let base = self.streamed.get();
        self.streamed.set(base + count);
        let slot = self.stream_slot();
        let per_area = (self.window.chunk / slot) as u64;
        let ring = 2 * per_area;
        let at = |i: u64| ring_place(first, per_area, slot, i);
        let writes = writers.has(me);
        let written = self.stream_counter(me, Counter::Written);
        let next = Cell::new(1);
        // Writes the next piece, waiting for room in the ring where
        // `wait`; without it, writes only where there is room already.
        let write_next = |wait: bool, each: &mut dyn FnMut(Piece)| {
            let n = next.get();
            if n >= ring {
                // Position `n % ring` held piece `n - ring`.
                let due = base + n - ring + 1;
                if !wait && !self.read_by_peers(due) {
                    return false;
                }
                self.until_read_by_peers(due);
                pulse.beat();
            }
            let (place, off) = at(n);
            each(Piece::Write(n, self.own(place, off, slot)));
            wait::publish(written, base + n + 1, self.sleepers(me));
            next.set(n + 1);
            true
        };
        let read = self.stream_counter(me, Counter::Read);
        if !readers.has(me) {
            // Nothing to read: no writer waits for this rank (every
            // writer's ring-full wait looks at every peer).
            wait::publish(read, base + count, self.sleepers(me));
            while writes && next.get() < count {
                write_next(true, &mut each);
            }
        } else {
            wait::publish(read, base + 1, self.sleepers(me));
            let from: Vec<usize> = (0..self.size)
                .filter(|s| *s != me && writers.has(*s))
                .collect();
            for i in 1..count {
                // Piece `i` before reading it (a peer at step `i` waits
                // for it), and more as long as the ring has room, up to an
                // area ahead: waiting for room here would make every piece
                // a rendezvous, and further ahead the pieces leave the
                // writer's cache before their readers come (2 MiB of L2
                // here; docs/bench-log/2026-11-27-to-29.md, "Streamed calls").
                while writes && next.get() <= i {
                    write_next(true, &mut each);
                }
                let ahead = count.min(i + 1 + per_area);
                while writes && next.get() < ahead && write_next(false, &mut each) {}
                for &s in &from {
                    let theirs = self.stream_counter(s, Counter::Written);
                    wait::until_at_least(theirs, base + i + 1, self.sleepers(s), None);
                    let (place, off) = at(i);
                    each(Piece::Read(i, s, self.peer(s, place, off, slot)));
                }
                wait::publish(read, base + i + 1, self.sleepers(me));
                pulse.beat();
            }
        }
        if writes {
            self.drain_due.set(base + count);
        }
    }
}

/// Where piece `i` of a stream lies, with `per_area` slots of `slot` bytes
/// in each data area: at ring position `i % (2 × per_area)`, the positions
/// of the first phase's area (`first`), then the other's.
#[inline(always)]
fn ring_place(first: Place, per_area: u64, slot: usize, i: u64) -> (Place, usize) {
    let pos = i % (2 * per_area);
    let area = (first.area + (pos / per_area) as usize) % 2;
    let place = Place {
        area,
        inline: false,
    };
    (place, (pos % per_area) as usize * slot)
}
