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
//! between the two headers by the same argument. Calls longer than a data
//! area, but for reductions, are the exception: after their first phase
//! they stream through their writers' areas, ordered by counters of their
//! own ([`stream`]), and a phase that writes the areas afterwards first
//! waits for the stream's readers.
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
use super::copy::last_level_cache;
use crate::agree::Descriptor;
use crate::agree::{reset_ring, RingArea, RING_BYTES};
use crate::error::Fault;
use crate::mpi_ext::allocate_shared;
use crate::wait;
use crate::watch::Pulse;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::{Cell, RefCell};

mod ops;
mod single_copy;
mod stream;

pub(crate) use ops::ShmCall;
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
/// Where the slot's two stream counters lie (a line each): the pieces of
/// streamed calls this rank has written, and those it has read
/// ([`stream`]).
const STREAM_AT: usize = SLEEPERS_AT + 64;
/// Where the data areas start in a slot (page-aligned).
const DATA_AT: usize = (STREAM_AT + 128).next_multiple_of(4096);
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

/// The smallest blocks all-to-alls may read from their peers directly (one
/// copy, [`single_copy`]) instead of through the window (two): where a
/// read pays at all, its system call and second synchronisation cost
/// about 1 µs, which a 16 KiB block repays (docs/BENCHMARKS.md, "Tuned
/// constants"). Whether and from where above this it pays is timed at
/// start-up (`Runtime::single_copy_from`). Gathers and broadcasts keep
/// the window: its two copies run on both ranks at once, pipelined by
/// pieces, where a single copy puts all of it on the reader (16 MiB
/// broadcast, idle: 1.2 ms against 2.6-3.5 ms; one busy process: no
/// faster).
pub(crate) const SINGLE_COPY_FROM: usize = 16 << 10;
/// Default bytes of one data area (`RANKMESH_SHM_CHUNK_BYTES`): 1 MiB was
/// fastest for 64 MiB all-reduces on 2 ranks (256 KiB took twice as long;
/// docs/BENCHMARKS.md, "Tuned constants", says how to re-measure).
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
        // its ring lies inside it, 64-aligned (RING_AT is), and so do its
        // sleeper count and its stream counters.
        unsafe {
            for h in 0..2 {
                (*(own.add(h * HEADER) as *const AtomicU64)).store(0, Ordering::Release);
            }
            reset_ring(own.add(RING_AT));
            (*(own.add(SLEEPERS_AT) as *const AtomicU32)).store(0, Ordering::Release);
            for line in 0..2 {
                (*(own.add(STREAM_AT + 64 * line) as *const AtomicU64)).store(0, Ordering::Release);
            }
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
        // Freeing is collective: after a call was given up, a peer may never
        // free its part. The runtime ends the job without finalising MPI.
        if crate::wait::give_up::gave_up() {
            return;
        }
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
    /// Blocks from which all-to-alls take single copies, agreed by the
    /// node's ranks (`usize::MAX`: never); it decides the phases, so it is
    /// the same on every member.
    single_copy_from: usize,
    /// Outputs from this many bytes are written with streaming stores: the
    /// group's ranks' outputs together fill the last-level cache
    /// ([`last_level_cache`]). On the 2-core VM (32 MiB), 2 ranks: 16 MiB;
    /// an 8 MiB all-gather streamed ran at 0.73× of plain stores, which
    /// left it in cache for the next call (docs/BENCHMARKS.md, "Tuned
    /// constants").
    stream_from: usize,
    /// Pieces of streamed calls so far (the same on every member).
    streamed: Cell<u64>,
    /// What every peer's read-piece counter must reach before this rank
    /// writes its data areas again: a stream it wrote and returned from
    /// without waiting for its readers (0: none).
    drain_due: Cell<u64>,
}

impl ShmExec {
    /// The plane of group rank `me` over `window`; all-to-alls read blocks
    /// from `single_copy_from` bytes from peers' buffers directly (the
    /// node's agreed `Runtime::single_copy_from`; `None`: never).
    pub(crate) fn new(
        window: Rc<ShmWindow>,
        me: usize,
        single_copy_from: Option<usize>,
    ) -> ShmExec {
        let size = window.slots.len();
        let single_copy = single_copy_from.is_some();
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
            single_copy_from: single_copy_from.unwrap_or(usize::MAX),
            stream_from: last_level_cache() / size.max(1),
            streamed: Cell::new(0),
            drain_due: Cell::new(0),
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
    /// and before this rank's next one (the protocol of the module docs),
    /// or, for a streamed piece, after the root's written-piece counter
    /// and before this rank's read-piece counter ([`stream`]).
    fn peer(&self, r: usize, place: Place, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.capacity(place), "inside the data area");
        let base = self.base(r, place, self.step.get());
        // SAFETY: in bounds (checked); no one writes it during this phase
        // (or, streamed, before this rank says it read it).
        unsafe { std::slice::from_raw_parts(base.add(at), len) }
    }

    /// This rank's data at `place`, bytes `at..at + len`, to write before
    /// the synchronisation (or, streamed, the written-piece counter) that
    /// publishes them.
    #[allow(clippy::mut_from_ref)]
    fn own(&self, place: Place, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.capacity(place), "inside the data area");
        let base = self.base(self.me, place, self.step.get() + 1);
        // SAFETY: in bounds; only this rank writes its own slot, and no
        // peer reads this range in the phase that writes it (or, streamed,
        // before the counter that publishes it).
        unsafe { std::slice::from_raw_parts_mut(base.add(at), len) }
    }

    /// Starts a phase in which each rank publishes `published` bytes;
    /// returns where they go.
    fn begin_phase(&self, published: usize) -> Place {
        let p = self.phase.get();
        self.phase.set(p + 1);
        self.second_line
            .set(published > INLINE_FIRST_LINE && published <= INLINE);
        if published > INLINE {
            self.await_drained();
        }
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
