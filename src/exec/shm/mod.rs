//! The shared-memory executor: host collectives among the ranks of one node
//! through one MPI shared window per group, synchronised by per-rank step
//! counters (a release store and acquire loads: no system call while peers
//! keep up).
//!
//! Each rank owns a slot: two step headers, two descriptor areas, the ring
//! of its deferred device agreements (used by `check`, apart from the
//! phases) and two data areas of `chunk` bytes. A call runs in *phases*; in
//! each, every rank writes only its own slot, publishes its next step,
//! waits for every peer's, then reads the slots it needs. Phases alternate
//! between the two areas, so a rank may write a phase's area as soon as it
//! has passed the previous phase's synchronisation: every peer that got
//! there had finished reading the area two phases back. Steps alternate
//! between the two headers by the same argument.
//!
//! A rank waiting for a peer's step spins briefly, then sleeps on the
//! peer's counter (a futex in the window), and the peer wakes it only when
//! it registered as a sleeper in the peer's slot: on a node where other
//! processes hold cores, a late peer costs one wake-up (see [`crate::wait`]).
//!
//! A step's header is two cache lines: the step counter, the digest of the
//! descriptor it publishes, and up to [`INLINE`] bytes of the phase's data.
//! A small call therefore costs each rank one remote line read per peer
//! (the line it waited on, which arrives with the data and the digest) and
//! no system call.
//!
//! **Agreement for free.** The first synchronisation of a call also
//! publishes the caller's descriptor (its digest in the header, the full
//! descriptor in the descriptor area); every rank compares the digests
//! before using any peer's data, so a disagreement is seen by every rank at
//! the same step and becomes the same named error everywhere (the dispatch
//! path makes it from the full descriptors, read only then), with no extra
//! round trip.
//!
//! MPI owns the segment, so nothing is named in `/dev/shm` and a killed
//! rank leaves nothing behind. Windows are freed by the runtime, in creation
//! order, before MPI finalisation: freeing one is collective (Open MPI's
//! `osc/sm` synchronises inside `MPI_Win_free`), and groups are dropped in
//! whatever order each rank's program drops them.

use super::cma;
use super::combine::combine;
use super::copy::{copy_bytes, split_lens, stream_bytes};
use super::executor::HostMoves;
use super::mpi::{BlockLayout, Blocks, Spans};
use crate::agree::Descriptor;
use crate::agree::{reset_ring, RingArea, RING_BYTES};
use crate::dtype::DType;
use crate::error::Fault;
use crate::mpi_ext::allocate_shared;
use crate::op::uneven::Links;
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::wait;
use crate::watch::Pulse;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::{Cell, RefCell};
use std::ops::Range;

mod single_copy;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of one descriptor area (whole cache lines).
const DESC_AREA: usize = std::mem::size_of::<Descriptor>().next_multiple_of(64);
/// Bytes of one step header.
const HEADER: usize = std::mem::size_of::<Header>();
/// Where the descriptor areas start in a slot (after the two headers).
const DESC_AT: usize = 2 * HEADER;
/// Where the slot's ring of deferred device agreements starts (see `check`).
const RING_AT: usize = DESC_AT + 2 * DESC_AREA;
/// Where the slot's sleeper count lies: peers waiting on this rank's
/// counters register there (a line of its own, written only by sleepers).
const SLEEPERS_AT: usize = (RING_AT + RING_BYTES).next_multiple_of(64);
/// Where the data areas start in a slot (page-aligned).
const DATA_AT: usize = (SLEEPERS_AT + 64).next_multiple_of(4096);
/// All-reduces up to this size are combined whole by every rank after one
/// synchronisation; larger ones are split so each rank reduces a share
/// and the shares are exchanged after a second one.
const SPLIT_BYTES: usize = 8 << 10;
/// Calls of at least this many bytes write their outputs with streaming
/// stores: the output outgrows the last-level cache (32 MiB here, shared
/// with the window and the inputs), so reading each output line before
/// writing it (what a plain store does) is traffic for nothing.
const STREAM_FROM: usize = 8 << 20;
/// Bytes of one member's entry in a count table (see `all_to_all_v`).
const TABLE_ENTRY: usize = 24;
/// Page size the slots are aligned to.
const PAGE: usize = 4096;
/// Bytes of a phase's data a step header carries: a phase publishing at
/// most this much per rank leaves the data areas alone.
const INLINE: usize = 128 - 24;
/// Of which this many share the counter's cache line.
const INLINE_FIRST_LINE: usize = 64 - 24;
/// `Header::call`: the step publishes a descriptor (its digest and, in the
/// low bits, the publisher's local problems).
const CARRIES: u64 = 1 << 63;

/// What a rank publishes with one step (two cache lines; the first holds
/// the counter peers wait on, the digest and 40 bytes of data).
#[repr(C, align(64))]
struct Header {
    /// The step this header was last published with.
    step: AtomicU64,
    /// [`Descriptor::digest`] of the descriptor published, if any.
    digest: u64,
    /// [`CARRIES`] and the descriptor's local problems, or 0.
    call: u64,
    /// The phase's data, when it fits.
    inline: [u8; INLINE],
}
const _: () = assert!(HEADER == 128 && INLINE >= 64);

/// Where a phase's data lie: a data area, or the step header.
#[derive(Clone, Copy)]
struct Place {
    area: usize,
    inline: bool,
}

/// Blocks of at least this many bytes make all-to-alls read their peers'
/// blocks directly (one copy, [`single_copy`]) instead of through the
/// window (two). Measured on 2 ranks (docs/BENCHMARKS.md, "Tuned
/// constants"). Gathers and broadcasts keep the window: its two copies
/// run on both ranks at once, pipelined by pieces, where a single copy
/// puts all of it on the reader (16 MiB broadcast, idle: 1.2 ms against
/// 2.6-3.5 ms; one busy process: no faster).
pub(crate) const SINGLE_COPY_FROM: usize = 16 << 10;
/// Default bytes of one data area (`RANKMESH_SHM_CHUNK_BYTES`): 1 MiB was
/// fastest for 64 MiB all-reduces on 2 ranks here (256 KiB took twice as long).
pub const DEFAULT_CHUNK: usize = 1 << 20;

/// A group's shared window: one slot per rank.
pub(crate) struct ShmWindow {
    win: ffi::MPI_Win,
    slots: Vec<*mut u8>,
    chunk: usize,
    /// Bytes after each data area for the phase's count table (an uneven
    /// all-to-all's: 24 per member).
    table: usize,
}

impl ShmWindow {
    /// Collective over `comm` (ranks of one node): a slot with two data
    /// areas of about `chunk` bytes per rank.
    pub(crate) fn allocate(comm: &SimpleCommunicator, chunk: usize) -> ShmWindow {
        let size = comm.size() as usize;
        // Every rank's share of a per-block piece must hold a cache line.
        let chunk = chunk.max(64 * size).next_multiple_of(4096);
        let table = (TABLE_ENTRY * size).next_multiple_of(64);
        let (win, slots) = allocate_shared(comm, DATA_AT + 2 * (chunk + table), PAGE);
        // MPI does not promise zeroed memory: every counter starts at 0
        // before any rank can wait on it.
        let own = slots[comm.rank() as usize];
        // SAFETY: this rank's slot begins with its two 64-aligned headers,
        // its ring lies inside it, 64-aligned (RING_AT is), and so does its
        // sleeper count.
        unsafe {
            for h in 0..2 {
                (*(own.add(h * HEADER) as *const AtomicU64)).store(0, Ordering::Release);
            }
            reset_ring(own.add(RING_AT));
            (*(own.add(SLEEPERS_AT) as *const AtomicU32)).store(0, Ordering::Release);
        }
        comm.barrier();
        ShmWindow {
            win,
            slots,
            chunk,
            table,
        }
    }

    /// The members' rings of deferred device agreements (`RING_BYTES` each,
    /// 64-aligned, each written only by its member), kept mapped by the
    /// window.
    pub(crate) fn ring_area(self: &Rc<Self>) -> RingArea {
        RingArea {
            // SAFETY: inside each slot (RING_AT + RING_BYTES <= DATA_AT).
            bases: self
                .slots
                .iter()
                .map(|s| unsafe { s.add(RING_AT) })
                .collect(),
            _keep: self.clone(),
        }
    }
}

impl Drop for ShmWindow {
    /// Collective: only the runtime drops windows, all in creation order.
    fn drop(&mut self) {
        // SAFETY: a valid window, freed once, with no call using it.
        unsafe { ffi::MPI_Win_free(&mut self.win) };
    }
}

/// The executor state of one group: its window and where the group's
/// calls stand in it.
pub(crate) struct ShmExec {
    window: Rc<ShmWindow>,
    me: usize,
    size: usize,
    /// Synchronisations done (the value last published).
    step: Cell<u64>,
    /// Phases begun (selects the area a phase writes).
    phase: Cell<u64>,
    /// The current phase's data reach its headers' second line.
    second_line: Cell<bool>,
    /// What the next synchronisation publishes and checks (its
    /// descriptor already written): `Header::digest` and `Header::call`.
    staged: Cell<Option<(u64, u64)>>,
    /// Every rank's descriptor, when the last check found them different.
    disagreement: RefCell<Option<Vec<Descriptor>>>,
    /// Large all-to-alls read peers' buffers with one copy: this rank's
    /// setting until a read is refused (then off for the window's life,
    /// and [`cma::refused`] turns it off for the process's other windows).
    single_copy: Cell<bool>,
}

impl ShmExec {
    /// The plane of group rank `me` over `window`; `single_copy`: large
    /// all-to-alls may read peers' buffers directly (`RANKMESH_SINGLE_COPY`).
    pub(crate) fn new(window: Rc<ShmWindow>, me: usize, single_copy: bool) -> ShmExec {
        let size = window.slots.len();
        if single_copy {
            cma::allow_peer_reads();
        }
        ShmExec {
            window,
            me,
            size,
            step: Cell::new(0),
            phase: Cell::new(0),
            second_line: Cell::new(false),
            staged: Cell::new(None),
            disagreement: RefCell::new(None),
            single_copy: Cell::new(single_copy),
        }
    }

    /// The group's window.
    pub(crate) fn window(&self) -> &Rc<ShmWindow> {
        &self.window
    }

    /// Bytes of one data area.
    pub(crate) fn chunk(&self) -> usize {
        self.window.chunk
    }

    /// Rank `r`'s header for `step`.
    fn header(&self, r: usize, step: u64) -> *mut Header {
        // SAFETY: the slot starts with two headers, 64-aligned.
        unsafe { self.window.slots[r].add((step % 2) as usize * HEADER) as *mut Header }
    }

    /// The counter of rank `r`'s header for `step`.
    fn counter(&self, r: usize, step: u64) -> &AtomicU64 {
        // SAFETY: lives as long as the window; only atomics touch it.
        unsafe { &(*self.header(r, step)).step }
    }

    /// Rank `r`'s sleeper count: peers asleep on its counters.
    fn sleepers(&self, r: usize) -> &AtomicU32 {
        // SAFETY: inside slot `r`, 64-aligned; only atomics touch it.
        unsafe { &*(self.window.slots[r].add(SLEEPERS_AT) as *const AtomicU32) }
    }

    /// Rank `r`'s descriptor area for `step` (alternating like headers).
    fn desc_at(&self, r: usize, step: u64) -> *mut Descriptor {
        let area = (step % 2) as usize;
        // SAFETY: inside slot `r` (DESC_AT + 2 areas < DATA_AT), 64-aligned.
        unsafe { self.window.slots[r].add(DESC_AT + area * DESC_AREA) as *mut Descriptor }
    }

    fn data_at(&self, r: usize, area: usize) -> *mut u8 {
        // SAFETY: inside slot `r`: DATA_AT + 2 * (chunk + table) bytes
        // were allocated.
        unsafe {
            let area_bytes = self.window.chunk + self.window.table;
            self.window.slots[r].add(DATA_AT + area * area_bytes)
        }
    }

    /// Where rank `r`'s data at `place` start: its data area, or the
    /// header of `step` (the step that publishes them).
    fn base(&self, r: usize, place: Place, step: u64) -> *mut u8 {
        if place.inline {
            // SAFETY: a field of the header, inside slot `r`.
            unsafe { std::ptr::addr_of_mut!((*self.header(r, step)).inline) as *mut u8 }
        } else {
            self.data_at(r, place.area)
        }
    }

    /// Bytes a phase's data may span at `place`.
    fn capacity(&self, place: Place) -> usize {
        if place.inline {
            INLINE
        } else {
            self.window.chunk
        }
    }

    /// Rank `r`'s data at `place`, bytes `at..at + len`, to read.
    ///
    /// Only after the synchronisation that published `r`'s writes to it,
    /// and before this rank's next one (the protocol of the module docs).
    fn peer(&self, r: usize, place: Place, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.capacity(place), "inside the data area");
        let base = self.base(r, place, self.step.get());
        // SAFETY: in bounds (checked); no one writes it during this phase.
        unsafe { std::slice::from_raw_parts(base.add(at), len) }
    }

    /// This rank's data at `place`, bytes `at..at + len`, to write before
    /// the synchronisation that publishes them.
    #[allow(clippy::mut_from_ref)]
    fn own(&self, place: Place, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.capacity(place), "inside the data area");
        let base = self.base(self.me, place, self.step.get() + 1);
        // SAFETY: in bounds; only this rank writes its own slot, and no
        // peer reads this range in the phase that writes it.
        unsafe { std::slice::from_raw_parts_mut(base.add(at), len) }
    }

    /// Starts a phase in which each rank publishes `published` bytes;
    /// returns where they go.
    fn begin_phase(&self, published: usize) -> Place {
        let p = self.phase.get();
        self.phase.set(p + 1);
        self.second_line
            .set(published > INLINE_FIRST_LINE && published <= INLINE);
        Place {
            area: (p % 2) as usize,
            inline: published <= INLINE,
        }
    }

    /// Makes `desc` the descriptor the next synchronisation publishes and
    /// checks. It is written now, before the body touches the header that
    /// synchronisation publishes: written after, the copy's loads wait for
    /// the header's stores to leave the store buffer, and those wait for
    /// the header's line to come back from the peer that read it.
    pub(crate) fn stage(&self, desc: &Descriptor, digest: u64) {
        self.staged.set(Some(self.write_descriptor(desc, digest)));
    }

    /// Whether a staged descriptor was never published (a body that did not
    /// synchronise; a bug the dispatch path reports).
    pub(crate) fn unstage(&self) -> bool {
        self.staged.take().is_some()
    }

    /// Every rank's descriptor, if the last check found a difference.
    pub(crate) fn take_disagreement(&self) -> Option<Vec<Descriptor>> {
        self.disagreement.borrow_mut().take()
    }

    /// Publishes `desc` in a phase of its own and returns every rank's
    /// (the agreement of calls whose body does not run here).
    /// `None`, unless `all` is asked for, when every rank's digest is this
    /// one's and no rank flags a local problem (no descriptor is read then).
    pub(crate) fn exchange_descriptors(
        &self,
        desc: &Descriptor,
        digest: u64,
        all: bool,
        pulse: &Pulse,
    ) -> Option<Vec<Descriptor>> {
        self.begin_phase(0);
        self.publish_header(Some(self.write_descriptor(desc, digest)));
        self.publish_and_wait(pulse);
        (all || !self.all_alike()).then(|| self.descriptors())
    }

    /// Writes `desc` to this rank's descriptor area for its next step (no
    /// one reads it before that step); returns what the step's header says
    /// of it.
    fn write_descriptor(&self, desc: &Descriptor, digest: u64) -> (u64, u64) {
        let at = self.desc_at(self.me, self.step.get() + 1);
        let words = desc.used_words();
        // SAFETY: this rank's own area, 64-aligned, inside its slot, which
        // holds a whole descriptor; `descriptors` clears the rest.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), at as *mut u64, words.len()) };
        (digest, CARRIES | u64::from(desc.local_problems()))
    }

    /// Fills the header of this rank's next step but its counter: the
    /// descriptor's digest and problems, or none.
    fn publish_header(&self, desc: Option<(u64, u64)>) {
        let header = self.header(self.me, self.step.get() + 1);
        // SAFETY: this rank's own header for its next step, which no peer
        // reads before that step is published.
        unsafe {
            match desc {
                Some((digest, call)) => {
                    (*header).digest = digest;
                    (*header).call = call;
                }
                None => (*header).call = 0,
            }
        }
    }

    /// Every rank's descriptor published with the last step, by group
    /// rank (after its synchronisation).
    fn descriptors(&self) -> Vec<Descriptor> {
        let step = self.step.get();
        // SAFETY: written by each rank before it published `step`, which
        // this rank has seen, and not rewritten before its next step.
        (0..self.size)
            .map(|r| unsafe { self.desc_at(r, step).read() }.without_stale_dims())
            .collect()
    }

    /// The synchronisation of a phase; the first of a call
    /// publishes the staged descriptor and fails with
    /// [`Fault::Disagreed`] unless every rank's is the same and usable.
    fn sync(&self, pulse: &Pulse) -> Result<(), Fault> {
        let staged = self.staged.take();
        self.publish_header(staged);
        self.publish_and_wait(pulse);
        if staged.is_none() {
            return Ok(());
        }
        if self.all_alike() {
            return Ok(());
        }
        *self.disagreement.borrow_mut() = Some(self.descriptors());
        Err(Fault::Disagreed)
    }

    /// Whether every rank published this rank's digest at the last step,
    /// with no local problem.
    fn all_alike(&self) -> bool {
        // A peer's header carries its local problems beside the digest:
        // one with any, or with another digest, or publishing no
        // descriptor at this step, differs from this rank's `CARRIES`.
        let step = self.step.get();
        // SAFETY: this rank's own header, written before it published.
        let digest = unsafe { (*self.header(self.me, step)).digest };
        let same = |r: usize| {
            // SAFETY: published with `step`, which this rank has seen; not
            // rewritten before this rank publishes its next step.
            let h = unsafe { &*self.header(r, step) };
            h.call == CARRIES && h.digest == digest
        };
        (0..self.size).all(same)
    }

    /// Publishes the next step and waits until every peer has published it.
    fn publish_and_wait(&self, pulse: &Pulse) {
        let step = self.step.get() + 1;
        self.step.set(step);
        wait::publish(self.counter(self.me, step), step, self.sleepers(self.me));
        let second_line = self.second_line.get();
        for r in (0..self.size).filter(|r| *r != self.me) {
            let flag = self.counter(r, step);
            if second_line {
                // The data's second line comes with the counter's, instead
                // of one more miss after it.
                // SAFETY: inside the header (128 bytes); a prefetch reads
                // nothing the program sees.
                prefetch(unsafe { (self.header(r, step) as *const u8).add(64) });
            }
            // No deadline: a missing peer is the watchdog's to name, and
            // it sees this call as open.
            wait::until_at_least(flag, step, self.sleepers(r), None);
        }
        pulse.beat();
    }

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
        let put = output_copy(n);
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
    /// that pass one (an all-gather, or a gather to the rank that does).
    fn gather_blocks<B: Blocks>(
        &self,
        pulse: &Pulse,
        mine: &[u8],
        blocks: B,
        mut out: Option<&mut [u8]>,
    ) -> Result<(), Fault> {
        let longest = (0..self.size).map(|r| blocks.len(r)).max().unwrap_or(0);
        let put = output_copy((0..self.size).map(|r| blocks.len(r)).sum());
        for (off, m) in pieces(longest, self.chunk()) {
            let place = self.begin_phase(m);
            let own = mine.len().saturating_sub(off).min(m);
            if own > 0 {
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
                    for (at, pos, len) in blocks.runs(r, off, n) {
                        put(&mut out[at..at + len], &from[pos..pos + len]);
                    }
                }
            }
        }
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
        let first = |rows: usize, len: usize| match rows * row >= SINGLE_COPY_FROM {
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
        if longest > m || longest >= SINGLE_COPY_FROM {
            // What is left of each block (this rank's own is done).
            let rest = |spans: &[Range<usize>], counts: &[usize]| -> Vec<Range<usize>> {
                let left = |(r, s): (usize, &Range<usize>)| match r == me {
                    true => s.end..s.end,
                    false => (s.start + first(counts[r], s.len()))..s.end,
                };
                spans.iter().enumerate().map(left).collect()
            };
            let (sent, got) = (rest(&sent, sc), rest(&got, rc));
            let left = match longest >= SINGLE_COPY_FROM {
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
        let p = self.size;
        let senders = match sender {
            Some(s) => s..s + 1,
            None => 0..p,
        };
        let me = self.me;
        // Where sender `s`'s block lands in `out`.
        let slot = |s: usize| if sender.is_some() { 0 } else { s };
        // This rank's block to itself goes straight from `send` to `out`
        // (after the synchronisation, when `out` may be written: a failed
        // agreement leaves it untouched), not through the window.
        let direct = send.filter(|_| out.is_some() && senders.contains(&me));
        let part = |len: usize, off: usize, m: usize| len.saturating_sub(off).min(m);
        for (off, m) in pieces(longest, self.block_piece()) {
            let place = self.begin_phase(p * m);
            if let Some((buf, blocks)) = send {
                for r in (0..p).filter(|r| direct.is_none() || *r != me) {
                    let n = part(blocks.len(r), off, m);
                    blocks.read(buf, r, off, self.own(place, r * m, n));
                }
            }
            self.sync(pulse)?;
            if let Some((buf, blocks)) = out.as_mut() {
                for s in senders.clone() {
                    let n = part(blocks.len(slot(s)), off, m);
                    if let Some((src, from)) = direct.filter(|_| s == me) {
                        from.copy_to(src, me, *blocks, buf, slot(me), off, n);
                        continue;
                    }
                    let piece = self.peer(s, place, me * m, n);
                    blocks.write(buf, slot(s), off, piece);
                }
            }
        }
        Ok(())
    }
}

/// Asks for the cache line at `at` without waiting for it.
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is baseline on x86_64; a prefetch never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(at as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
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

/// How a call whose output is `total` bytes copies into it.
fn output_copy(total: usize) -> fn(&mut [u8], &[u8]) {
    if total >= STREAM_FROM {
        stream_bytes
    } else {
        copy_bytes
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

    /// Every rank's `mine` into block `r` of `out`, laid out by `blocks`.
    pub(crate) fn all_gather_blocks<B: Blocks>(
        &self,
        mine: &[u8],
        blocks: B,
        out: &mut [u8],
    ) -> Result<(), Fault> {
        self.plane
            .gather_blocks(&self.pulse, mine, blocks, Some(out))
    }
}

impl HostMoves for ShmCall<'_> {
    fn barrier(&self) -> Result<(), Fault> {
        self.plane.begin_phase(0);
        self.plane.sync(&self.pulse)
    }

    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault> {
        let (n, dtype) = (input.nbytes(), input.dtype());
        self.plane.reduce_pieces(
            &self.pulse,
            Some(input.bytes()),
            out.bytes_mut(),
            n,
            dtype,
            op,
            true,
        )
    }

    fn reduce_into_root(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        let (n, dtype) = (input.nbytes(), input.dtype());
        let gathers = self.plane.me == root;
        self.plane.reduce_pieces(
            &self.pulse,
            Some(input.bytes()),
            out.bytes_mut(),
            n,
            dtype,
            op,
            gathers,
        )
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
            .gather_blocks(&self.pulse, block, layout, Some(out))
    }

    fn gather(&self, block: &[u8], root: usize) -> Result<Option<Vec<u8>>, Fault> {
        let plane = self.plane;
        let mut out = (plane.me == root).then(|| vec![0u8; block.len() * plane.size]);
        let layout = contiguous(block.len());
        plane.gather_blocks(&self.pulse, block, layout, out.as_deref_mut())?;
        Ok(out)
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
        self.plane
            .gather_blocks(&self.pulse, mine, Spans(&spans), flat.as_deref_mut())?;
        Ok(flat.map(|flat| split_lens(&flat, lens)))
    }

    fn all_gather_v_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<(), Fault> {
        let spans = Links::spans(lens, lens, 1);
        self.plane
            .gather_blocks(&self.pulse, mine, Spans(&spans), Some(out))
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
        let plane = self.plane;
        let put = output_copy(buf.len());
        for (off, m) in pieces(buf.len(), plane.chunk()) {
            let place = plane.begin_phase(m);
            if plane.me == root {
                copy_bytes(plane.own(place, 0, m), &buf[off..off + m]);
            }
            plane.sync(&self.pulse)?;
            if plane.me != root {
                put(&mut buf[off..off + m], plane.peer(root, place, 0, m));
            }
        }
        Ok(())
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
    use super::*;

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
