//! The shared-memory executor's ops, over the window protocol of
//! [`super`]: each op is a sequence of phases, in which every rank writes
//! its own slot, synchronises, and reads its peers'. Reductions split large
//! pieces so each rank combines a share; block exchanges move `P` blocks per
//! rank through a piece of each data area, or by single copy
//! ([`super::single_copy`]) from the block size the node agreed on.

use super::stream::{Piece, Ranks};
use super::{Place, ShmExec, TABLE_ENTRY};
use crate::dtype::DType;
use crate::error::Fault;
use crate::exec::blocks::{BlockLayout, Blocks, Copier, Spans};
use crate::exec::combine::combine;
use crate::exec::copy::{copy_by_loop, copy_bytes, split_lens, stream_bytes};
use crate::exec::moves::HostMoves;
use crate::exec::mpi::MpiExec;
use crate::op::uneven::Links;
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::watch::Pulse;
use std::ops::Range;

/// All-reduces up to this size are combined whole by every rank after one
/// synchronisation; larger ones are split so each rank reduces a share
/// and the shares are exchanged after a second one (docs/BENCHMARKS.md,
/// "Tuned constants").
const SPLIT_BYTES: usize = 8 << 10;

impl ShmExec {
    /// Bytes of each block's piece when every rank's piece of each of `P`
    /// blocks shares one data area (whole cache lines).
    fn block_piece(&self) -> usize {
        (self.window.chunk / self.size) & !63
    }

    /// Rank `r`'s share `[lo, hi)` of an `m`-byte piece of `elem`-byte
    /// elements (cache-line multiples, the last share shorter).
    fn share(&self, m: usize, elem: usize, r: usize) -> (usize, usize) {
        let part = m.div_ceil(self.size).next_multiple_of(64.max(elem));
        ((r * part).min(m), ((r + 1) * part).min(m))
    }

    /// How a call whose output is `total` bytes copies into it: with
    /// streaming stores once the outputs of the group's ranks together
    /// outgrow the last-level cache ([`ShmExec::stream_from`]), when reading
    /// each output line before writing it (what a plain store does) is
    /// traffic for nothing; with plain stores below, where the output stays
    /// in cache for whoever reads it next.
    #[inline]
    fn output_copy(&self, total: usize) -> Copier {
        if total >= self.stream_from {
            stream_bytes
        } else {
            copy_bytes
        }
    }

    /// Reduces `input` (or `out`, in place) into `out` on the ranks where
    /// `gathers` holds, a piece of at most one data area at a time. Small
    /// pieces: every rank publishes the piece and combines all of them.
    /// Larger ones: every rank publishes the other ranks' shares of its
    /// piece, combines its own share (from its own input and the peers'
    /// areas), publishes the result, and copies the others' results.
    #[allow(clippy::too_many_arguments)]
    fn reduce_pieces(
        &self,
        pulse: &Pulse,
        input: Option<&[u8]>,
        out: &mut [u8],
        n: usize,
        dtype: DType,
        op: ReduceOp,
        gathers: bool,
    ) -> Result<(), Fault> {
        let (p, me, elem) = (self.size, self.me, dtype.size());
        let put = self.output_copy(n);
        for (off, m) in pieces(n, self.window.chunk) {
            let place = self.begin_phase(m);
            let split = m > SPLIT_BYTES;
            let from = input.unwrap_or(&*out);
            if split {
                for r in (0..p).filter(|r| *r != me) {
                    let (lo, hi) = self.share(m, elem, r);
                    copy_bytes(self.own(place, lo, hi - lo), &from[off + lo..off + hi]);
                }
            } else {
                copy_bytes(self.own(place, 0, m), &from[off..off + m]);
            }
            self.sync(pulse)?;
            if !split {
                if gathers {
                    let piece = |r| self.peer(r, place, 0, m);
                    combine(dtype, op, p, piece, &mut out[off..off + m]);
                }
                continue;
            }
            // This rank's share of its own area was left unwritten above:
            // its result goes there, where the peers read it.
            let (lo, hi) = self.share(m, elem, me);
            let share = self.own(place, lo, hi - lo);
            let from = input.unwrap_or(&*out);
            let values = |r| match r == me {
                true => &from[off + lo..off + hi],
                false => self.peer(r, place, lo, hi - lo),
            };
            combine(dtype, op, p, values, share);
            if gathers {
                put(&mut out[off + lo..off + hi], share);
            }
            self.sync(pulse)?;
            if gathers {
                for r in (0..p).filter(|r| *r != me) {
                    let (lo, hi) = self.share(m, elem, r);
                    put(
                        &mut out[off + lo..off + hi],
                        self.peer(r, place, lo, hi - lo),
                    );
                }
            }
        }
        Ok(())
    }

    /// All-reduce of `t` in place (no scratch copy: the input is read into
    /// the window before the result is written back).
    pub(crate) fn all_reduce_in_place(
        &self,
        pulse: &Pulse,
        t: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let (n, dtype) = (t.nbytes(), t.dtype());
        self.reduce_pieces(pulse, None, t.bytes_mut(), n, dtype, op, true)
    }

    /// Every rank's `mine` (`blocks.len(r)` bytes from rank `r`, known to
    /// all) into block `r` of `out`, laid out by `blocks`, on the ranks
    /// that pass one: every rank (`root` is `None`, an all-gather) or
    /// `root` (a gather).
    fn gather_blocks<B: Blocks>(
        &self,
        pulse: &Pulse,
        mine: &[u8],
        blocks: B,
        (root, out): (Option<usize>, Option<&mut [u8]>),
    ) -> Result<(), Fault> {
        let longest = (0..self.size).map(|r| blocks.len(r)).max().unwrap_or(0);
        if longest <= self.chunk() || self.size == 1 {
            let phases = (longest, self.chunk());
            return self
                .gather_phases(pulse, mine, blocks, (root, out), phases)
                .map(drop);
        }
        self.gather_streamed(pulse, mine, blocks, (root, out), longest)
    }

    /// [`Self::gather_blocks`] longer than a data area: the first piece in
    /// a phase (the call's agreement), the rest streamed.
    #[inline(never)]
    fn gather_streamed<B: Blocks>(
        &self,
        pulse: &Pulse,
        mine: &[u8],
        blocks: B,
        (root, mut out): (Option<usize>, Option<&mut [u8]>),
        longest: usize,
    ) -> Result<(), Fault> {
        let step = self.stream_slot();
        let phase = (root, out.as_deref_mut());
        let first = self.gather_phases(pulse, mine, blocks, phase, (step, step))?;
        let first = first.expect("pieces() yields one piece at least");
        let put = self.output_copy((0..self.size).map(|r| blocks.len(r)).sum());
        let part = |len: usize, off: usize| len.saturating_sub(off).min(step);
        // A gather's root publishes nothing: no one reads it.
        let roles = match root {
            Some(root) => (Ranks::AllBut(root), Ranks::Only(root)),
            None => (Ranks::All, Ranks::All),
        };
        let count = longest.div_ceil(step) as u64;
        self.stream(pulse, first, count, roles, |piece| {
            match piece {
                Piece::Write(i, bytes) => {
                    let off = i as usize * step;
                    let n = part(mine.len(), off);
                    if n == 0 {
                        return;
                    }
                    copy_bytes(&mut bytes[..n], &mine[off..off + n]);
                    if let Some(out) = out.as_deref_mut() {
                        // This rank's own piece, still in cache.
                        land(blocks, put, out, self.me, off, &mine[off..off + n]);
                    }
                }
                Piece::Read(i, s, bytes) => {
                    let off = i as usize * step;
                    if let Some(out) = out.as_deref_mut() {
                        let n = part(blocks.len(s), off);
                        land(blocks, put, out, s, off, &bytes[..n]);
                    }
                }
            }
        });
        if let Some(out) = out.filter(|_| root == Some(self.me) && mine.len() > step) {
            // The rest of the root's own block, straight from its input.
            land(blocks, put, out, self.me, step, &mine[step..]);
        }
        Ok(())
    }

    /// [`Self::gather_blocks`]' phases of `step` bytes of every block,
    /// through byte `upto` of the longest; returns the last one's place.
    #[inline(always)]
    fn gather_phases<B: Blocks>(
        &self,
        pulse: &Pulse,
        mine: &[u8],
        blocks: B,
        (root, mut out): (Option<usize>, Option<&mut [u8]>),
        (upto, step): (usize, usize),
    ) -> Result<Option<Place>, Fault> {
        let put = self.output_copy((0..self.size).map(|r| blocks.len(r)).sum());
        // A gather's root publishes nothing: no one reads it.
        let publishes = root != Some(self.me);
        let mut last = None;
        for (off, m) in pieces(upto, step) {
            let place = self.begin_phase(m);
            let own = mine.len().saturating_sub(off).min(m);
            if own > 0 && publishes {
                copy_bytes(self.own(place, 0, own), &mine[off..off + own]);
            }
            self.sync(pulse)?;
            if let Some(out) = out.as_deref_mut() {
                for r in 0..self.size {
                    let n = blocks.len(r).saturating_sub(off).min(m);
                    if n == 0 {
                        continue;
                    }
                    // This rank's own piece from its block, still in cache.
                    let from = match r == self.me {
                        true => &mine[off..off + n],
                        false => self.peer(r, place, 0, n),
                    };
                    land(blocks, put, out, r, off, from);
                }
            }
            last = Some(place);
        }
        Ok(last)
    }

    /// Broadcast of `buf` from `root`: one phase up to a data area; longer,
    /// the first piece in the call's first phase and the rest streamed.
    pub(super) fn broadcast(
        &self,
        pulse: &Pulse,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), Fault> {
        // A call that fits one data area keeps its single phase: streamed,
        // a 1 MiB broadcast took 7-13% longer on an idle node (the readers'
        // copies bound it, and the next call's first piece waits for them).
        let n = buf.len();
        let streamed = n > self.chunk() && self.size > 1;
        let step = match streamed {
            true => self.stream_slot(),
            false => self.chunk(),
        };
        let first = n.min(step);
        let place = self.begin_phase(first);
        let me = self.me;
        // A streamed call's copies take the vector loop, not `memcpy`:
        // there `rep movsb` fell into a mode 2.4x slower in most runs (2-8
        // MiB, the root writing slots while its readers copy the ones
        // before; docs/bench-log/2026-11-27-to-29.md, "Copies that disagree
        // within a line").
        if me == root {
            let (to, from) = (self.own(place, 0, first), &buf[..first]);
            match streamed {
                true => copy_by_loop(to, from),
                false => copy_bytes(to, from),
            }
        }
        self.sync(pulse)?;
        if me != root {
            let (to, from) = (&mut buf[..first], self.peer(root, place, 0, first));
            match (n >= self.stream_from, streamed) {
                (true, _) => stream_bytes(to, from),
                (false, true) => copy_by_loop(to, from),
                (false, false) => copy_bytes(to, from),
            }
        }
        if !streamed {
            return Ok(());
        }
        let put = match n >= self.stream_from {
            true => stream_bytes,
            false => copy_by_loop,
        };
        let span = |i: u64| {
            let off = i as usize * step;
            off..n.min(off + step)
        };
        let roles = (Ranks::Only(root), Ranks::AllBut(root));
        self.stream(
            pulse,
            place,
            n.div_ceil(step) as u64,
            roles,
            |piece| match piece {
                Piece::Write(i, bytes) => {
                    let span = span(i);
                    copy_by_loop(&mut bytes[..span.len()], &buf[span]);
                }
                Piece::Read(i, _, bytes) => {
                    let span = span(i);
                    let len = span.len();
                    put(&mut buf[span], &bytes[..len]);
                }
            },
        );
        Ok(())
    }

    /// `all_to_all_v` of rows of `row` bytes (`counts`: rows this rank
    /// sends each member, rows it expects from each). Its first phase
    /// carries both the count exchange and every block's first piece: each
    /// rank publishes its [count table](Links::table) beside the data area
    /// and the pieces in it, then reads its peers' entries for it, judges
    /// its links ([`Links::judge`]), and takes the pieces of the links that
    /// agreed. Blocks of a single copy's size skip the window's first
    /// phase; they and the rest of longer blocks continue as an equal
    /// all-to-all's do (the longest block is the same on every rank, so is
    /// the path).
    pub(crate) fn all_to_all_v(
        &self,
        pulse: &Pulse,
        (send, out): (&[u8], &mut [u8]),
        (sc, rc): (&[usize], &[usize]),
        row: usize,
    ) -> Result<Links, Fault> {
        let (p, me, m) = (self.size, self.me, self.block_piece());
        // Always the data area: the pieces' sizes are not yet agreed.
        let place = self.begin_phase(usize::MAX);
        let table = Links::table(sc, rc);
        self.own_table(place)
            .copy_from_slice(bytemuck::cast_slice(&table));
        // A block of a single copy's size leaves the window alone: the
        // rest of the call reads it from the sender (both ends judge it by
        // the same agreed count; a refused link moves nothing).
        let first = |rows: usize, len: usize| match rows * row >= self.single_copy_from {
            true => 0,
            false => len.min(m),
        };
        let offered = Links::spans(sc, sc, row);
        for r in (0..p).filter(|r| *r != me) {
            let n = first(sc[r], offered[r].len());
            if n > 0 {
                copy_bytes(self.own(place, r * m, n), &send[offered[r].start..][..n]);
            }
        }
        self.sync(pulse)?;
        let theirs: Vec<[u64; 3]> = (0..p).map(|s| self.peer_entry(s, place)).collect();
        let links = Links::judge(me, sc, rc, &theirs);
        let (sent, got) = links.placed((sc, rc), row);
        for s in (0..p).filter(|s| *s != me) {
            let n = first(rc[s], got[s].len());
            if n > 0 {
                copy_bytes(
                    &mut out[got[s].start..][..n],
                    self.peer(s, place, me * m, n),
                );
            }
        }
        let own = got[me].len();
        if own > 0 {
            copy_bytes(
                &mut out[got[me].start..][..own],
                &send[sent[me].start..][..own],
            );
        }
        // The longest block any rank sends decides, the same everywhere.
        let longest = links.longest.saturating_mul(row);
        if longest > m || longest >= self.single_copy_from {
            // What is left of each block (this rank's own is done).
            let rest = |spans: &[Range<usize>], counts: &[usize]| -> Vec<Range<usize>> {
                let left = |(r, s): (usize, &Range<usize>)| match r == me {
                    true => s.end..s.end,
                    false => (s.start + first(counts[r], s.len()))..s.end,
                };
                spans.iter().enumerate().map(left).collect()
            };
            let (sent, got) = (rest(&sent, sc), rest(&got, rc));
            let left = match longest >= self.single_copy_from {
                true => longest,
                false => longest - m,
            };
            self.exchange_blocks(
                pulse,
                Some((send, Spans(&sent))),
                Some((out, Spans(&got))),
                left,
                None,
            )?;
        }
        Ok(links)
    }

    /// This rank's count table at `place`, to write before the
    /// synchronisation that publishes it.
    #[allow(clippy::mut_from_ref)]
    fn own_table(&self, place: Place) -> &mut [u8] {
        // SAFETY: the table follows the data area, inside the slot; only
        // this rank writes it, and no peer reads it in this phase.
        unsafe {
            let at = self.data_at(self.me, place.area).add(self.window.chunk);
            std::slice::from_raw_parts_mut(at, TABLE_ENTRY * self.size)
        }
    }

    /// Rank `s`'s count-table entry for this rank at `place` (after the
    /// synchronisation that published it).
    fn peer_entry(&self, s: usize, place: Place) -> [u64; 3] {
        // SAFETY: inside `s`'s table; no one writes it during this phase.
        unsafe {
            let at = self.data_at(s, place.area).add(self.window.chunk);
            std::ptr::read_unaligned(at.add(TABLE_ENTRY * self.me) as *const [u64; 3])
        }
    }

    /// Moves `P` blocks per rank: block `r` of this rank's `send` to rank
    /// `r`, whose block `me` of `out` receives it (each laid out by its
    /// [`Blocks`]; a link's two ends agree on its length). `longest`: the
    /// longest block any rank sends, the same on every rank (it decides the
    /// phases). `sender` narrows it to a scatter from that rank.
    fn exchange_blocks<S: Blocks, O: Blocks>(
        &self,
        pulse: &Pulse,
        send: Option<(&[u8], S)>,
        mut out: Option<(&mut [u8], O)>,
        longest: usize,
        sender: Option<usize>,
    ) -> Result<(), Fault> {
        if let (None, Some((src, from)), Some((dst, to))) = (sender, send, out.as_mut()) {
            if self.moves_by_single_copy(longest)
                && self.all_to_all_single_copy(pulse, (src, from), (dst, *to))?
            {
                return Ok(());
            }
        }
        let senders = Senders {
            only: sender,
            p: self.size,
        };
        // This rank's block to itself goes straight from `send` to `out`
        // (after the synchronisation, when `out` may be written: a failed
        // agreement leaves it untouched), not through the window.
        let direct = send.filter(|_| out.is_some() && senders.has(self.me));
        let piece = self.block_piece();
        // The tuples are built in each branch: one built before the branch
        // was kept in memory for the streamed call (17 instructions of an
        // 8-byte all-to-all's ~1350, by callgrind).
        if longest <= piece || self.size == 1 {
            return self
                .exchange_phases(pulse, (send, direct, senders), out, (longest, piece))
                .map(drop);
        }
        self.exchange_streamed(pulse, (send, direct, senders), out, longest)
    }

    /// [`Self::exchange_blocks`] longer than a data area's pieces: the
    /// first piece of every block in a phase (the call's agreement), the
    /// rest streamed, in slots of `P` pieces of `step`.
    #[inline(never)]
    #[allow(clippy::type_complexity)]
    fn exchange_streamed<S: Blocks, O: Blocks>(
        &self,
        pulse: &Pulse,
        io: (Option<(&[u8], S)>, Option<(&[u8], S)>, Senders),
        mut out: Option<(&mut [u8], O)>,
        longest: usize,
    ) -> Result<(), Fault> {
        let (send, direct, senders) = io;
        let step = (self.stream_slot() / self.size) & !63;
        let reborrow = out.as_mut().map(|(buf, blocks)| (&mut **buf, *blocks));
        let first = self.exchange_phases(pulse, io, reborrow, (step, step))?;
        let first = first.expect("pieces() yields one piece at least");
        let (p, me) = (self.size, self.me);
        let part = |len: usize, off: usize| len.saturating_sub(off).min(step);
        let writers = match senders.only {
            Some(s) => Ranks::Only(s),
            None => Ranks::All,
        };
        let count = longest.div_ceil(step) as u64;
        // Each rank's output is `p` blocks of up to `longest` bytes.
        let put = self.output_copy(longest.saturating_mul(p));
        self.stream(
            pulse,
            first,
            count,
            (writers, Ranks::All),
            |piece| match piece {
                Piece::Write(i, bytes) => {
                    let off = i as usize * step;
                    if let Some((buf, blocks)) = send {
                        for r in (0..p).filter(|r| direct.is_none() || *r != me) {
                            let n = part(blocks.len(r), off);
                            blocks.read(buf, r, off, &mut bytes[r * step..][..n]);
                        }
                    }
                    if let (Some((src, from)), Some((buf, blocks))) = (direct, out.as_mut()) {
                        let n = part(blocks.len(senders.block(me)), off);
                        let to = (*blocks, &mut **buf, senders.block(me));
                        from.copy_to_by(put, src, me, to, off, n);
                    }
                }
                Piece::Read(i, s, bytes) => {
                    if let Some((buf, blocks)) = out.as_mut() {
                        let off = i as usize * step;
                        let n = part(blocks.len(senders.block(s)), off);
                        let piece = &bytes[me * step..][..n];
                        blocks.write_by(put, buf, senders.block(s), off, piece);
                    }
                }
            },
        );
        Ok(())
    }

    /// [`Self::exchange_blocks`]' phases of `step` bytes of every block,
    /// through byte `upto` of the longest; returns the last one's place.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn exchange_phases<S: Blocks, O: Blocks>(
        &self,
        pulse: &Pulse,
        (send, direct, senders): (Option<(&[u8], S)>, Option<(&[u8], S)>, Senders),
        mut out: Option<(&mut [u8], O)>,
        (upto, step): (usize, usize),
    ) -> Result<Option<Place>, Fault> {
        let (p, me) = (self.size, self.me);
        let part = |len: usize, off: usize, m: usize| len.saturating_sub(off).min(m);
        let mut last = None;
        for (off, m) in pieces(upto, step) {
            let place = self.begin_phase(p * m);
            if let Some((buf, blocks)) = send {
                for r in (0..p).filter(|r| direct.is_none() || *r != me) {
                    let n = part(blocks.len(r), off, m);
                    blocks.read(buf, r, off, self.own(place, r * m, n));
                }
            }
            self.sync(pulse)?;
            if let Some((buf, blocks)) = out.as_mut() {
                for s in senders.iter() {
                    let block = senders.block(s);
                    let n = part(blocks.len(block), off, m);
                    if let Some((src, from)) = direct.filter(|_| s == me) {
                        from.copy_to(src, me, *blocks, buf, block, off, n);
                        continue;
                    }
                    let piece = self.peer(s, place, me * m, n);
                    blocks.write(buf, block, off, piece);
                }
            }
            last = Some(place);
        }
        Ok(last)
    }
}

/// The ranks that send in a block exchange: every rank (an all-to-all) or
/// `only` (a scatter's root).
#[derive(Clone, Copy)]
struct Senders {
    only: Option<usize>,
    p: usize,
}

impl Senders {
    fn iter(self) -> Range<usize> {
        match self.only {
            Some(s) => s..s + 1,
            None => 0..self.p,
        }
    }

    fn has(self, r: usize) -> bool {
        self.only.is_none_or(|s| s == r)
    }

    /// Where sender `s`'s block lands in `out` (a scatter's one block).
    fn block(self, s: usize) -> usize {
        match self.only {
            Some(_) => 0,
            None => s,
        }
    }
}

/// `(offset, length)` of the pieces of `total` bytes, at most `step` each;
/// one empty piece when `total` is 0 (a call always synchronises once).
fn pieces(total: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = total.div_ceil(step).max(1);
    (0..count).map(move |i| {
        let off = i * step;
        (off, step.min(total - off))
    })
}

/// Rank `r`'s bytes `off..` of its block (`from`), into `out` laid out by
/// `blocks`, copied with `put`.
#[inline]
fn land<B: Blocks>(blocks: B, put: Copier, out: &mut [u8], r: usize, off: usize, from: &[u8]) {
    for (at, pos, len) in blocks.runs(r, off, from.len()) {
        put(&mut out[at..at + len], &from[pos..pos + len]);
    }
}

/// Contiguous blocks of `block` bytes.
fn contiguous(block: usize) -> BlockLayout {
    BlockLayout {
        count: 1,
        run: block,
        stride: block,
        extent: block,
    }
}

/// One call's view of a group's [`ShmExec`]: the plane and the watchdog's pulse.
pub(crate) struct ShmCall<'a> {
    pub(crate) plane: &'a ShmExec,
    /// MPI among the window's members: the moves it does not override.
    pub(crate) flat: MpiExec<'a>,
    pub(crate) pulse: Pulse<'a>,
}

impl ShmCall<'_> {
    /// Rank `r` gets in `out` the reduction of every rank's block `r` of
    /// `input`, laid out by `blocks` (`out` holds `blocks.len(me)` bytes).
    pub(crate) fn reduce_scatter_blocks<B: Blocks>(
        &self,
        input: &[u8],
        blocks: B,
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let plane = self.plane;
        let (p, me) = (plane.size, plane.me);
        let longest = (0..p).map(|r| blocks.len(r)).max().unwrap_or(0);
        let part = |r: usize, off: usize, m: usize| blocks.len(r).saturating_sub(off).min(m);
        for (off, m) in pieces(longest, plane.block_piece()) {
            let place = plane.begin_phase(p * m);
            // This rank's own block is read from its input, not published.
            for r in (0..p).filter(|r| *r != me) {
                blocks.read(input, r, off, plane.own(place, r * m, part(r, off, m)));
            }
            plane.sync(&self.pulse)?;
            for (at, pos, len) in blocks.runs(me, off, part(me, off, m)) {
                let piece_of = |q| match q == me {
                    true => &input[at..at + len],
                    false => plane.peer(q, place, me * m + pos, len),
                };
                combine(dtype, op, p, piece_of, &mut out[off + pos..off + pos + len]);
            }
        }
        Ok(())
    }

    /// `input` reduced element-wise into `out` on the ranks where `gathers`
    /// holds (every rank for an all-reduce, the root for a reduce).
    fn reduce_to(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
        gathers: bool,
    ) -> Result<(), Fault> {
        let (n, dtype) = (input.nbytes(), input.dtype());
        let (input, out) = (Some(input.bytes()), out.bytes_mut());
        self.plane
            .reduce_pieces(&self.pulse, input, out, n, dtype, op, gathers)
    }

    /// Every rank's `mine` into block `r` of `out`, laid out by `blocks`.
    pub(crate) fn all_gather_blocks<B: Blocks>(
        &self,
        mine: &[u8],
        blocks: B,
        out: &mut [u8],
    ) -> Result<(), Fault> {
        self.plane
            .gather_blocks(&self.pulse, mine, blocks, (None, Some(out)))
    }
}

impl HostMoves for ShmCall<'_> {
    fn flat(&self) -> MpiExec<'_> {
        self.flat
    }

    fn all_reduce_in_place(
        &self,
        t: &mut Tensor,
        op: ReduceOp,
        _: &mut Option<Tensor>,
    ) -> Result<(), Fault> {
        self.plane.all_reduce_in_place(&self.pulse, t, op)
    }

    fn all_to_all_v(
        &self,
        buffers: (&[u8], &mut [u8]),
        counts: (&[usize], &[usize]),
        row: usize,
    ) -> Result<Links, Fault> {
        self.plane.all_to_all_v(&self.pulse, buffers, counts, row)
    }

    fn barrier(&self) -> Result<(), Fault> {
        self.plane.begin_phase(0);
        self.plane.sync(&self.pulse)
    }

    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault> {
        self.reduce_to(input, out, op, true)
    }

    fn reduce_into_root(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        self.reduce_to(input, out, op, self.plane.me == root)
    }

    fn reduce_scatter_block_into(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let layout = contiguous(out.nbytes());
        let dtype = packed.dtype();
        self.reduce_scatter_blocks(packed.bytes(), layout, out.bytes_mut(), dtype, op)
    }

    fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let layout = contiguous(block.len());
        self.plane
            .gather_blocks(&self.pulse, block, layout, (None, Some(out)))
    }

    fn gather_into(&self, block: &[u8], out: Option<&mut [u8]>, root: usize) -> Result<(), Fault> {
        let plane = self.plane;
        let out = out.filter(|_| plane.me == root);
        let layout = contiguous(block.len());
        plane.gather_blocks(&self.pulse, block, layout, (Some(root), out))
    }

    fn gather_varcount(
        &self,
        mine: &[u8],
        lens: &[usize],
        root: Option<usize>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fault> {
        let gets = root.is_none_or(|r| r == self.plane.me);
        let mut flat = gets.then(|| vec![0u8; lens.iter().sum()]);
        let spans = Links::spans(lens, lens, 1);
        self.plane.gather_blocks(
            &self.pulse,
            mine,
            Spans(&spans),
            (root, flat.as_deref_mut()),
        )?;
        Ok(flat.map(|flat| split_lens(&flat, lens)))
    }

    fn all_gather_v_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<(), Fault> {
        let spans = Links::spans(lens, lens, 1);
        self.plane
            .gather_blocks(&self.pulse, mine, Spans(&spans), (None, Some(out)))
    }

    fn scatter(&self, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<(), Fault> {
        let block = recv.len();
        let send = send
            .filter(|_| self.plane.me == root)
            .map(|s| (s, contiguous(block)));
        self.plane.exchange_blocks(
            &self.pulse,
            send,
            Some((recv, contiguous(block))),
            block,
            Some(root),
        )
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        self.plane.broadcast(&self.pulse, buf, root)
    }

    fn all_to_all_into(&self, send: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let block = send.len() / self.plane.size;
        let layout = contiguous(block);
        self.all_to_all_strided(send, layout, out, layout)
            .map(|_| ())
    }

    fn all_to_all_strided(
        &self,
        send: &[u8],
        send_layout: BlockLayout,
        out: &mut [u8],
        recv_layout: BlockLayout,
    ) -> Result<bool, Fault> {
        let block = send_layout.count * send_layout.run;
        self.plane.exchange_blocks(
            &self.pulse,
            Some((send, send_layout)),
            Some((out, recv_layout)),
            block,
            None,
        )?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::{contiguous, pieces, BlockLayout, Blocks};

    #[test]
    fn pieces_cover_the_total_and_an_empty_call_has_one() {
        assert_eq!(pieces(0, 8).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(pieces(20, 8).collect::<Vec<_>>(), [(0, 8), (8, 8), (16, 4)]);
    }

    #[test]
    fn strided_blocks_round_trip() {
        // A [2, 4] tensor of bytes, split into 2 blocks along dim 1.
        let buf: Vec<u8> = (0..8).collect();
        let l = BlockLayout::along(&[2, 4], 1, 2, 1);
        let mut got = vec![0u8; 4];
        l.read(&buf, 1, 0, &mut got);
        assert_eq!(got, [2, 3, 6, 7]);
        let mut part = vec![0u8; 3];
        l.read(&buf, 1, 1, &mut part);
        assert_eq!(part, [3, 6, 7]);
        let mut back = vec![0u8; 8];
        l.write(&mut back, 1, 0, &got);
        assert_eq!(back, [0, 0, 2, 3, 0, 0, 6, 7]);
        // Block 1's bytes 1..4 straight into block 1 of contiguous blocks.
        let mut flat = vec![0u8; 8];
        l.copy_to(&buf, 1, contiguous(4), &mut flat, 1, 1, 3);
        assert_eq!(flat, [0, 0, 0, 0, 0, 3, 6, 7]);
        // And back, from contiguous blocks into the strided layout.
        let mut strided = vec![0u8; 8];
        contiguous(4).copy_to(&flat, 1, l, &mut strided, 1, 1, 3);
        assert_eq!(strided, [0, 0, 0, 3, 0, 0, 6, 7]);
    }
}
