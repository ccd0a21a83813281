//! Broadcasts longer than a data area, streamed through the root's data
//! areas: after the call's first phase (the agreement, which carries the
//! first piece), the root
//! writes the rest in pieces of [`STREAM_PIECE`] into a ring over both of
//! its areas, publishing a written-piece counter; each reader copies a
//! piece out as soon as it is written and publishes a read-piece counter.
//!
//! Why not a phase per piece: a phase is a rendezvous of every rank, so a
//! root waits for the slowest reader at each piece, and a rank that is
//! descheduled (a busy node) stalls every piece. Here the root waits only
//! when the ring is full, and not at all at the end: it returns once it has
//! written, and the next write to its areas (any later phase's, in
//! [`ShmExec::await_drained`]) first waits for the readers to have read.
//! Small pieces keep each piece's lines in the writer's cache until the
//! reader takes them: on this project's VM, whole 1 MiB pieces took 2-4×
//! longer to cross between cores for minutes at a time (docs/BENCHMARKS.md,
//! "Streamed broadcasts"). A call of one area or less keeps one phase.
//!
//! The counters hold totals over the group's life ([`ShmExec::streamed`],
//! the same on every member, is where this call's pieces start), so they
//! only grow, and a waiter compares them with the total it needs.

use super::{Place, ShmExec, STREAM_AT};
use crate::error::Fault;
use crate::exec::copy::copy_bytes;
use crate::wait;
use crate::watch::Pulse;
use std::sync::atomic::AtomicU64;

/// Bytes of one streamed piece (at most a data area): small enough that a
/// piece is still in the root's cache when its reader copies it
/// (docs/BENCHMARKS.md, "Tuned constants").
const STREAM_PIECE: usize = 256 << 10;

/// Which of a slot's stream counters.
#[derive(Clone, Copy)]
enum Counter {
    /// Pieces of streamed calls this rank has written (as their root).
    Written = 0,
    /// Pieces of streamed calls this rank has read.
    Read = 1,
}

impl ShmExec {
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

    /// Waits until every peer's read-piece counter reaches `total`.
    fn until_read_by_peers(&self, total: u64) {
        for r in (0..self.size).filter(|r| *r != self.me) {
            let read = self.stream_counter(r, Counter::Read);
            // No deadline: a missing peer is the watchdog's to name.
            wait::until_at_least(read, total, self.sleepers(r), None);
        }
    }

    /// Broadcast of `buf` from `root` (the body of the executor's
    /// `broadcast`): the first piece through the call's first phase, the
    /// rest streamed.
    pub(super) fn broadcast(
        &self,
        pulse: &Pulse,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), Fault> {
        // A call that fits one data area keeps its single phase: streamed,
        // a 1 MiB broadcast took 7-13% longer on an idle node (the readers'
        // copies bound it, and the next call's first piece waits for them).
        let chunk = self.window.chunk;
        let piece = match buf.len() <= chunk {
            true => chunk,
            false => STREAM_PIECE.min(chunk),
        };
        let first = buf.len().min(piece);
        let place = self.begin_phase(first);
        let me = self.me;
        if me == root {
            copy_bytes(self.own(place, 0, first), &buf[..first]);
        }
        self.sync(pulse)?;
        let put = super::ops::output_copy(buf.len());
        if me != root {
            put(&mut buf[..first], self.peer(root, place, 0, first));
        }
        if buf.len() <= first || self.size == 1 {
            return Ok(());
        }
        let count = buf.len().div_ceil(piece) as u64;
        let base = self.streamed.get();
        self.streamed.set(base + count);
        // Piece `i` lies at ring position `i % ring`: the positions of the
        // first phase's area, then the other's.
        let per_area = (chunk / piece) as u64;
        let ring = 2 * per_area;
        let at = |i: u64| {
            let pos = i % ring;
            let area = (place.area + (pos / per_area) as usize) % 2;
            (
                Place {
                    area,
                    inline: false,
                },
                (pos % per_area) as usize * piece,
            )
        };
        let n = buf.len();
        let span = |i: u64| {
            let off = i as usize * piece;
            off..n.min(off + piece)
        };
        if me == root {
            for i in 1..count {
                if i >= ring {
                    // Position `i % ring` held piece `i - ring`.
                    self.until_read_by_peers(base + i - ring + 1);
                    pulse.beat();
                }
                let (spot, off) = at(i);
                let span = span(i);
                copy_bytes(self.own(spot, off, span.len()), &buf[span]);
                let written = self.stream_counter(me, Counter::Written);
                wait::publish(written, base + i + 1, self.sleepers(me));
            }
            self.drain_due.set(base + count);
            return Ok(());
        }
        let read = self.stream_counter(me, Counter::Read);
        wait::publish(read, base + 1, self.sleepers(me));
        let written = self.stream_counter(root, Counter::Written);
        for i in 1..count {
            wait::until_at_least(written, base + i + 1, self.sleepers(root), None);
            let (spot, off) = at(i);
            let span = span(i);
            let len = span.len();
            put(&mut buf[span], self.peer(root, spot, off, len));
            wait::publish(read, base + i + 1, self.sleepers(me));
            pulse.beat();
        }
        Ok(())
    }
}
