//! Deferred agreements on shared memory, for groups within one node. Each
//! member writes every device call's descriptor into its own ring in the
//! group's shared window, and reads its peers' rings only when it checks.
//! Posting is a few stores to memory this rank owns — no MPI call, no system
//! call, no wait for anyone while the ring has room.
//!
//! Each entry has a *key* (call number, digest of the descriptor, its
//! local-problem flags (an unfit output, an unusable view), and the running sum of the member's keys so far) and the
//! full descriptor (read only when keys differ, to make the error every
//! member gets). A member checks entry `n` when every member has posted it:
//! equal keys, and its own checks passed, mean agreed. Entries are checked
//! in batches: when each member's running sum at the batch's last entry is
//! this rank's (plus the offset an earlier disagreement left), every entry
//! of the batch has equal keys — one read of each peer's memory per batch
//! instead of one per entry. A batch that does not add up is checked entry
//! by entry, which finds the entry that differs.
//!
//! A slot is reused `ENTRIES` posts later. Its owner first checks the old
//! entry itself; when that check agreed, a member that has not read the old
//! entry yet may miss it, and finding it overwritten (the key's call number
//! changed, read before and after, as in a sequence lock) is proof that its
//! owner saw every member's entry agree. An entry that did not agree is
//! reused only after every member has checked it.

use super::next::Next;
use crate::agree::Descriptor;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Entries per member: a rank's CPU may run this many device calls ahead of
/// the slowest member's before posting waits.
pub(crate) const ENTRIES: u64 = 128;
/// How many deferred device calls pass between looks at rings for
/// agreements to complete (a ring asks for one at most this often).
pub(crate) const SCAN_EVERY: u64 = ENTRIES / 8;
/// A rank that waits for room in its full ring spins this many times
/// before each read of its members' counters (`Ring::next_for_room`).
const GENTLE_PAUSE: u32 = 32;
/// Words of a descriptor.
const WORDS: usize = std::mem::size_of::<Descriptor>() / 8;
const _: () = assert!(std::mem::size_of::<Descriptor>().is_multiple_of(8) && WORDS <= 32);
/// Where the closed mark is: beside the posted counter, whose line its
/// readers load anyway when they wait, and written once.
const CLOSED_AT: usize = 8;
/// Where the checked counter is (the posted counter is at 0): its own
/// cache line, as the keys and descriptors are.
const CHECKED_AT: usize = 64;
const KEYS_AT: usize = 128;
const KEY_BYTES: usize = 32;
const DESCS_AT: usize = KEYS_AT + ENTRIES as usize * KEY_BYTES;
const DESC_BYTES: usize = 256;
/// Bytes of one member's ring (64-aligned in the window slot).
pub(crate) const RING_BYTES: usize = DESCS_AT + ENTRIES as usize * DESC_BYTES;
/// A key's call number while its owner rewrites the entry.
const REWRITING: u64 = u64::MAX;
/// Words of a key after its call number: digest, local-problem flags, running sum.
const DIGEST: usize = 8;
const BAD: usize = 16;
const SUM: usize = 24;

/// An entry's term in its member's running sum: a different digest or flag
/// changes it, and the digest already carries the call's number, so two
/// entries swapped do not cancel out.
fn term(digest: u64, problems: u64) -> u64 {
    digest ^ problems.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Zeroes a member's counters. Collective allocation calls it on its own
/// ring before the barrier that precedes any use (MPI does not promise
/// zeroed memory).
///
/// # Safety
/// `ring` is this rank's ring, `RING_BYTES` long and 64-aligned.
pub(crate) unsafe fn reset(ring: *mut u8) {
    for at in [0, CLOSED_AT, CHECKED_AT] {
        (*(ring.add(at) as *const AtomicU64)).store(0, Ordering::Release);
    }
}

/// What entry `n` shows.
enum Entry {
    /// Every member's key is this rank's, or a member found them all alike.
    Same,
    /// Every member's descriptor, by group rank.
    Differ(Vec<Descriptor>),
}

/// The members' rings in a node's shared window: where each begins (by
/// group rank, each [`RING_BYTES`] long and 64-aligned), and the window
/// that keeps them mapped. The executor that owns the window makes it.
pub(crate) struct RingArea {
    /// Start of each member's ring.
    pub bases: Vec<*mut u8>,
    /// Keeps the window (and so every ring) mapped while the ring is used.
    pub _keep: Rc<dyn std::any::Any>,
}

/// One member's view of the group's rings.
pub(crate) struct Ring {
    area: RingArea,
    me: usize,
    size: usize,
    /// Entries this rank posted (its published `posted` counter).
    posted: Cell<u64>,
    /// Entries this rank checked (its published `checked` counter).
    checked: Cell<u64>,
    /// The entry this rank's own checks refused (0: none pending).
    refused_here: Cell<u64>,
    /// Checked entries that did not agree, oldest first: reused only after
    /// every member has checked them.
    held: RefCell<VecDeque<u64>>,
    /// The post count before which no opportunistic check is made.
    next_test: Cell<u64>,
    /// This rank's running sum of its keys (over every post).
    sum: Cell<u64>,
    /// By member: its running sum minus this rank's, at the last entry
    /// checked here (not 0 only after an entry whose keys differed).
    offsets: RefCell<Vec<u64>>,
}

impl Ring {
    /// Group rank `me`'s view of the rings in `area` (reset by its allocation).
    pub(super) fn new(area: RingArea, me: usize) -> Ring {
        let size = area.bases.len();
        Ring {
            area,
            me,
            size,
            posted: Cell::new(0),
            checked: Cell::new(0),
            refused_here: Cell::new(0),
            held: RefCell::new(VecDeque::new()),
            next_test: Cell::new(0),
            sum: Cell::new(0),
            offsets: RefCell::new(vec![0; size]),
        }
    }

    fn word(&self, r: usize, at: usize) -> &AtomicU64 {
        debug_assert!(at + 8 <= RING_BYTES && at.is_multiple_of(8));
        // SAFETY: inside member `r`'s ring (RING_BYTES, 64-aligned), alive
        // as long as the window; only atomics touch it.
        unsafe { &*(self.area.bases[r].add(at) as *const AtomicU64) }
    }

    fn posted_of(&self, r: usize) -> u64 {
        self.word(r, 0).load(Ordering::Acquire)
    }

    /// Whether member `r` closed its ring: it posts nothing more.
    fn closed_of(&self, r: usize) -> bool {
        self.word(r, CLOSED_AT).load(Ordering::Acquire) != 0
    }

    /// A member (not this rank) that closed its ring before posting entry
    /// `n`: no one will ever complete entry `n`. The mark is read first: its
    /// owner set it after its last post, so the count read after it is final.
    fn closed_before(&self, n: u64) -> Option<usize> {
        (0..self.size).find(|&r| r != self.me && self.closed_of(r) && self.posted_of(r) < n)
    }

    /// Tells the members that this rank posts nothing more (its NCCL
    /// communicator failed): their waits for its later entries end.
    pub(super) fn close(&self) {
        self.word(self.me, CLOSED_AT).store(1, Ordering::Release);
    }

    fn checked_of(&self, r: usize) -> u64 {
        self.word(r, CHECKED_AT).load(Ordering::Acquire)
    }

    fn key_at(n: u64) -> usize {
        KEYS_AT + ((n - 1) % ENTRIES) as usize * KEY_BYTES
    }

    fn desc_at(n: u64) -> usize {
        DESCS_AT + ((n - 1) % ENTRIES) as usize * DESC_BYTES
    }

    /// Entries this rank posted.
    pub(super) fn posted(&self) -> u64 {
        self.posted.get()
    }

    /// Entries posted and not yet checked here.
    fn pending(&self) -> u64 {
        self.posted.get() - self.checked.get()
    }

    /// Whether the next post needs the oldest entry checked first.
    pub(super) fn full(&self) -> bool {
        self.pending() >= ENTRIES
    }

    /// Whether an opportunistic check is worth its reads of peers' memory:
    /// when half the ring waits, and at most every `ENTRIES / 8` posts (a
    /// peer's line read here is one its owner must take back to write, so
    /// checking in batches keeps those misses off most calls, also while a
    /// slower member leaves nothing to check).
    pub(super) fn wants_test(&self) -> bool {
        let posted = self.posted.get();
        if self.pending() < ENTRIES / 2 || posted < self.next_test.get() {
            return false;
        }
        self.next_test.set(posted + SCAN_EVERY);
        true
    }

    /// Posts `desc` (of digest `digest`); `refused_here`: this rank's own
    /// checks refused it.
    /// Call when not [`full`](Self::full). Waits (at most `limit`) only
    /// when the slot holds an entry that did not agree and some member has
    /// not checked it yet; `Err` is that entry's number then.
    pub(super) fn post(
        &self,
        desc: &Descriptor,
        digest: u64,
        refused_here: bool,
        limit: Duration,
    ) -> Result<(), u64> {
        debug_assert!(!self.full());
        let n = self.posted.get() + 1;
        loop {
            let front = self.held.borrow().front().copied();
            let Some(h) = front.filter(|h| h + ENTRIES <= n) else {
                break;
            };
            // A closed member never reads the old entry again.
            let all_checked =
                || (0..self.size).all(|r| self.checked_of(r) >= h || self.closed_of(r));
            if !wait_until(Some(Instant::now() + limit), all_checked) {
                return Err(h);
            }
            self.held.borrow_mut().pop_front();
        }
        let (key, at) = (Self::key_at(n), Self::desc_at(n));
        let base = self.area.bases[self.me];
        // SAFETY: offsets inside this rank's ring (see `word`), 8-aligned.
        let word = |at: usize| unsafe { &*(base.add(at) as *const AtomicU64) };
        word(key).store(REWRITING, Ordering::Relaxed);
        // Orders the rewrite mark before the new contents for a reader that
        // sees any of them (its acquire fence pairs with this).
        fence(Ordering::Release);
        // Only the words in use (a 1-d call's 10 of 25): readers clear the
        // dims left over from the slot's earlier entries.
        for (i, w) in desc.used_words().iter().enumerate() {
            word(at + 8 * i).store(*w, Ordering::Relaxed);
        }
        let bad = u64::from(desc.local_problems());
        let sum = self.sum.get().wrapping_add(term(digest, bad));
        self.sum.set(sum);
        word(key + DIGEST).store(digest, Ordering::Relaxed);
        word(key + BAD).store(bad, Ordering::Relaxed);
        word(key + SUM).store(sum, Ordering::Relaxed);
        word(key).store(n, Ordering::Release);
        word(0).store(n, Ordering::Release);
        self.posted.set(n);
        if refused_here {
            self.refused_here.set(n);
        }
        Ok(())
    }

    /// The oldest unchecked entries, when every member has posted them
    /// (waiting until `deadline` for every member to post as far as this
    /// rank has, or not at all when `None`; a member that closed its ring
    /// ends the wait): `Same` for a batch of entries that all agreed, else
    /// the verdict of the oldest one.
    pub(super) fn next(&self, deadline: Option<Instant>, gone: &dyn Fn() -> bool) -> Next {
        self.next_upto(deadline, self.posted.get(), 1, gone)
    }

    /// [`next`](Self::next) when the ring is full: waits (until
    /// `deadline`) only for the members to post the oldest unchecked batch
    /// ([`SCAN_EVERY`] entries), and reads their counters only after
    /// [`GENTLE_PAUSE`] spins each. A member far behind posts each entry into a
    /// line that this rank's every read takes from it; a waiter looking
    /// without pause made each of its posts a cache miss, so that the
    /// rank ahead kept it behind.
    pub(super) fn next_for_room(&self, deadline: Instant, gone: &dyn Fn() -> bool) -> Next {
        let n = self.checked.get() + 1;
        let want = (n + SCAN_EVERY - 1).min(self.posted.get());
        self.next_upto(Some(deadline), want, GENTLE_PAUSE, gone)
    }

    /// The oldest unchecked entries once every member posted through
    /// `want` (waiting until `deadline`, `pause` spins before each read of
    /// the counters), as [`next`](Self::next) says. `gone`: whether a
    /// member was lost, which ends the wait (it would never post).
    fn next_upto(
        &self,
        deadline: Option<Instant>,
        want: u64,
        pause: u32,
        gone: &dyn Fn() -> bool,
    ) -> Next {
        let n = self.checked.get() + 1;
        let posted = self.posted.get();
        if n > posted {
            return Next::Done;
        }
        let reach = || (0..self.size).map(|r| self.posted_of(r)).min().unwrap_or(0);
        if deadline.is_some() {
            wait_until(deadline, || {
                for _ in 1..pause {
                    std::hint::spin_loop();
                }
                reach() >= want || self.closed_before(want).is_some() || gone()
            });
        }
        let upto = reach().min(posted);
        if upto < n {
            if let Some(rank) = self.closed_before(n) {
                let mine = self.own_desc(n);
                return Next::Closed { rank, mine };
            }
            if deadline.is_some() && gone() {
                return Next::Lost(self.own_desc(n));
            }
            return match deadline {
                None => Next::Done,
                Some(_) => Next::Missing(self.own_desc(n)),
            };
        }
        // This rank's refused entry has keys like everyone's but is no
        // agreement: a batch stops before it.
        let refused = self.refused_here.get();
        let last = if (n..=upto).contains(&refused) {
            refused - 1
        } else {
            upto
        };
        if last >= n && self.sums_agree(last) {
            self.checked_to(last);
            return Next::Same;
        }
        match self.read(n) {
            Entry::Same if refused != n => {
                self.settled(true);
                Next::Same
            }
            Entry::Same => Next::Check {
                mine: self.own_desc(n),
                all: vec![self.own_desc(n); self.size],
            },
            Entry::Differ(all) => Next::Check {
                mine: all[self.me],
                all,
            },
        }
    }

    /// Whether every entry up to `last` (all posted, none checked here
    /// disagreeing) has every member's keys: each member's running sum at
    /// `last` is this rank's plus its offset. A member that has reused the
    /// slot found every entry up to `last` agreed (it reuses a slot only
    /// after checking it, and one that disagreed not before this rank has
    /// checked it too).
    fn sums_agree(&self, last: u64) -> bool {
        let at = Self::key_at(last) + SUM;
        let mine = self.word(self.me, at).load(Ordering::Relaxed);
        let offsets = self.offsets.borrow();
        for r in (0..self.size).filter(|r| *r != self.me) {
            let theirs = self.consistent(r, last, || self.word(r, at).load(Ordering::Relaxed));
            match theirs {
                None => return true,
                Some(s) if s.wrapping_sub(mine) != offsets[r] => return false,
                Some(_) => {}
            }
        }
        true
    }

    /// Marks every entry up to `last` checked and agreed.
    fn checked_to(&self, last: u64) {
        self.checked.set(last);
        self.word(self.me, CHECKED_AT)
            .store(last, Ordering::Release);
    }

    /// Marks the oldest unchecked entry checked; `agreed`: its verdict.
    pub(super) fn settled(&self, agreed: bool) {
        let n = self.checked.get() + 1;
        self.checked.set(n);
        self.word(self.me, CHECKED_AT).store(n, Ordering::Release);
        if self.refused_here.get() == n {
            self.refused_here.set(0);
        }
        if !agreed {
            self.held.borrow_mut().push_back(n);
        }
    }

    fn own_desc(&self, n: u64) -> Descriptor {
        let at = Self::desc_at(n);
        let words: [u64; WORDS] =
            std::array::from_fn(|i| self.word(self.me, at + 8 * i).load(Ordering::Relaxed));
        bytemuck::cast::<_, Descriptor>(words).without_stale_dims()
    }

    /// Entry `n` of every member (all have posted it). Keys that differ
    /// move the members' running sums apart: the offsets record by how much.
    fn read(&self, n: u64) -> Entry {
        let key = Self::key_at(n);
        let load =
            |r: usize| [DIGEST, BAD, SUM].map(|o| self.word(r, key + o).load(Ordering::Relaxed));
        let mine = load(self.me);
        let mut theirs = vec![mine; self.size];
        for r in (0..self.size).filter(|r| *r != self.me) {
            match self.consistent(r, n, || load(r)) {
                None => return Entry::Same,
                Some(k) => theirs[r] = k,
            }
        }
        if theirs.iter().all(|k| k[..2] == mine[..2]) {
            return Entry::Same;
        }
        let at = Self::desc_at(n);
        let mut all = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let words = self.consistent(r, n, || {
                std::array::from_fn::<u64, WORDS, _>(|i| {
                    self.word(r, at + 8 * i).load(Ordering::Relaxed)
                })
            });
            match words {
                None => return Entry::Same,
                Some(w) => all.push(bytemuck::cast::<_, Descriptor>(w).without_stale_dims()),
            }
        }
        let mut offsets = self.offsets.borrow_mut();
        for (offset, k) in offsets.iter_mut().zip(&theirs) {
            *offset = k[2].wrapping_sub(mine[2]);
        }
        Entry::Differ(all)
    }

    /// `load` of member `r`'s entry `n`, or `None` when `r` has reused the
    /// slot (which it does only after finding entry `n` agreed).
    fn consistent<T>(&self, r: usize, n: u64, load: impl Fn() -> T) -> Option<T> {
        let key = self.word(r, Self::key_at(n));
        if key.load(Ordering::Acquire) != n {
            return None;
        }
        let value = load();
        fence(Ordering::Acquire);
        (key.load(Ordering::Relaxed) == n).then_some(value)
    }
}

/// Polls `ready` until it holds or `deadline` passes (`None`: once). A
/// member's post wakes no one (posting is stores only): the wait spins
/// within the thread's budget, then naps ([`crate::wait::until`]).
fn wait_until(deadline: Option<Instant>, mut ready: impl FnMut() -> bool) -> bool {
    match deadline {
        None => ready(),
        Some(_) => crate::wait::until(deadline, ready),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Op;

    #[repr(C, align(64))]
    struct Line([u8; 64]);

    /// The rings of `size` members in one zeroed, 64-aligned heap block.
    fn rings(size: usize) -> Vec<Ring> {
        let mut mem: Vec<Line> = (0..size * RING_BYTES / 64).map(|_| Line([0; 64])).collect();
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: each offset stays inside the block of `size` rings.
        let bases: Vec<*mut u8> = (0..size)
            .map(|r| unsafe { base.add(r * RING_BYTES) })
            .collect();
        let keep: Rc<dyn std::any::Any> = Rc::new(mem);
        (0..size)
            .map(|me| {
                let area = RingArea {
                    bases: bases.clone(),
                    _keep: keep.clone(),
                };
                Ring::new(area, me)
            })
            .collect()
    }

    fn post(ring: &Ring, seq: u64) {
        let mut d = Descriptor::new(Op::Barrier, &[]);
        d.seq = seq;
        ring.post(&d, d.digest(), false, Duration::from_secs(1))
            .unwrap();
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(2))
    }

    #[test]
    fn a_closed_member_ends_the_wait_for_what_it_never_posts() {
        let r = rings(3);
        for seq in 1..=3 {
            post(&r[0], seq);
            post(&r[2], seq);
        }
        post(&r[1], 1);
        // Member 1 may still post: no verdict without a wait.
        assert!(matches!(r[0].next(None, &|| false), Next::Same));
        assert!(matches!(r[0].next(None, &|| false), Next::Done));
        r[1].close();
        // Entry 1 was agreed; entry 2 never will be, and member 1 is named.
        match r[0].next(None, &|| false) {
            Next::Closed { rank: 1, mine } => assert_eq!(mine.seq, 2),
            _ => panic!("member 1 closed before call 2: want Closed"),
        }
        match r[2].next(soon(), &|| false) {
            Next::Same => {}
            _ => panic!("entry 1 was posted by every member"),
        }
        assert!(matches!(
            r[2].next(soon(), &|| false),
            Next::Closed { rank: 1, .. }
        ));
    }

    #[test]
    fn a_full_ring_waits_for_one_batch_of_a_member_behind_not_for_all() {
        let r = rings(2);
        for seq in 1..=ENTRIES {
            post(&r[0], seq);
        }
        for seq in 1..=SCAN_EVERY {
            post(&r[1], seq);
        }
        assert!(r[0].full());
        // Member 1 has posted the oldest batch: no wait for the other 112.
        let deadline = Instant::now() + Duration::from_secs(30);
        assert!(matches!(
            r[0].next_for_room(deadline, &|| false),
            Next::Same
        ));
        assert!(Instant::now() < deadline, "waited for member 1 to catch up");
        assert!(!r[0].full());
        // A member that has not posted the oldest entry is missing at the deadline.
        let r = rings(2);
        post(&r[0], 1);
        assert!(
            matches!(r[0].next_for_room(Instant::now(), &|| false), Next::Missing(d) if d.seq == 1)
        );
    }

    #[test]
    fn an_open_member_that_falls_behind_is_missing_not_closed() {
        let r = rings(2);
        post(&r[0], 1);
        post(&r[0], 2);
        post(&r[1], 1);
        assert!(matches!(r[0].next(soon(), &|| false), Next::Same));
        assert!(matches!(r[0].next(soon(), &|| false), Next::Missing(d) if d.seq == 2));
        // A member's own close is no reason to stop checking its peers' posts.
        r[0].close();
        post(&r[1], 2);
        assert!(matches!(r[1].next(soon(), &|| false), Next::Same));
    }

    #[test]
    fn a_lost_rank_ends_the_wait_for_what_was_not_posted() {
        let r = rings(2);
        post(&r[0], 1);
        post(&r[0], 2);
        post(&r[1], 1);
        // What every member posted is still checked; a loss ends the wait
        // for the rest at once, long before the deadline.
        assert!(matches!(r[0].next(soon(), &|| true), Next::Same));
        let deadline = Instant::now() + Duration::from_secs(30);
        let started = Instant::now();
        assert!(matches!(r[0].next(Some(deadline), &|| true), Next::Lost(d) if d.seq == 2));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
