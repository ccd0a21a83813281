//! Deferred agreements on shared memory, for groups within one node: each
//! member writes every device call's descriptor into its own ring in the
//! group's shared window, and reads its peers' rings only when it checks.
//! Posting is a few stores to memory this rank owns — no MPI call, no
//! system call, no wait for anyone while the ring has room.
//!
//! Each entry has a *key* (call number, digest of the descriptor, its
//! bad-output flag) and the full descriptor (read only when keys differ, to
//! make the error every member gets). A member checks entry `n` when every
//! member has posted it: equal keys, and its own checks passed, mean agreed.
//!
//! A slot is reused `ENTRIES` posts later. Its owner first checks the old
//! entry itself; when that check agreed, a member that has not read the old
//! entry yet may miss it, and finding it overwritten (the key's call number
//! changed, read before and after, as in a sequence lock) is proof that its
//! owner saw every member's entry agree. An entry that did not agree is
//! reused only after every member has checked it.

use crate::dispatch::Descriptor;
use crate::plane::shm::ShmWindow;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Entries per member: a rank's CPU may run this many device calls ahead of
/// the slowest member's before posting waits.
pub(crate) const ENTRIES: u64 = 128;
/// Words of a descriptor.
const WORDS: usize = std::mem::size_of::<Descriptor>() / 8;
const _: () = assert!(std::mem::size_of::<Descriptor>() % 8 == 0 && WORDS <= 32);
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

/// Zeroes a member's counters. Collective allocation calls it on its own
/// ring before the barrier that precedes any use (MPI does not promise
/// zeroed memory).
///
/// # Safety
/// `ring` is this rank's ring, `RING_BYTES` long and 64-aligned.
pub(crate) unsafe fn reset(ring: *mut u8) {
    for at in [0, CHECKED_AT] {
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

/// One member's view of the group's rings.
pub(crate) struct Ring {
    window: Rc<ShmWindow>,
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
}

impl Ring {
    /// Group rank `me`'s view of the rings in `window` (reset by its allocation).
    pub(super) fn new(window: Rc<ShmWindow>, me: usize) -> Ring {
        let size = window.members();
        Ring {
            window,
            me,
            size,
            posted: Cell::new(0),
            checked: Cell::new(0),
            refused_here: Cell::new(0),
            held: RefCell::new(VecDeque::new()),
            next_test: Cell::new(0),
        }
    }

    fn word(&self, r: usize, at: usize) -> &AtomicU64 {
        debug_assert!(at + 8 <= RING_BYTES && at % 8 == 0);
        // SAFETY: inside member `r`'s ring (RING_BYTES, 64-aligned), alive
        // as long as the window; only atomics touch it.
        unsafe { &*(self.window.ring(r).add(at) as *const AtomicU64) }
    }

    fn posted_of(&self, r: usize) -> u64 {
        self.word(r, 0).load(Ordering::Acquire)
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
        self.next_test.set(posted + ENTRIES / 8);
        true
    }

    /// Posts `desc`; `refused_here`: this rank's own checks refused it.
    /// Call when not [`full`](Self::full). Waits (at most `limit`) only
    /// when the slot holds an entry that did not agree and some member has
    /// not checked it yet; `Err` is that entry's number then.
    pub(super) fn post(
        &self,
        desc: &Descriptor,
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
            let all_checked = || (0..self.size).all(|r| self.checked_of(r) >= h);
            if !wait_until(Some(Instant::now() + limit), all_checked) {
                return Err(h);
            }
            self.held.borrow_mut().pop_front();
        }
        let (key, at) = (Self::key_at(n), Self::desc_at(n));
        let base = self.window.ring(self.me);
        // SAFETY: offsets inside this rank's ring (see `word`), 8-aligned.
        let word = |at: usize| unsafe { &*(base.add(at) as *const AtomicU64) };
        word(key).store(REWRITING, Ordering::Relaxed);
        // Orders the rewrite mark before the new contents for a reader that
        // sees any of them (its acquire fence pairs with this).
        fence(Ordering::Release);
        let words: &[u64; WORDS] = bytemuck::cast_ref(desc);
        for (i, w) in words.iter().enumerate() {
            word(at + 8 * i).store(*w, Ordering::Relaxed);
        }
        word(key + 8).store(desc.digest(), Ordering::Relaxed);
        word(key + 16).store(u64::from(desc.bad_output()), Ordering::Relaxed);
        word(key).store(n, Ordering::Release);
        word(0).store(n, Ordering::Release);
        self.posted.set(n);
        if refused_here {
            self.refused_here.set(n);
        }
        Ok(())
    }

    /// The oldest unchecked entry, when every member has posted it (waiting
    /// until `deadline`, or not at all when `None`).
    pub(super) fn next(&self, deadline: Option<Instant>) -> super::Next {
        let n = self.checked.get() + 1;
        if n > self.posted.get() {
            return super::Next::Done;
        }
        // When waiting, wait for a batch: a waiter that rechecks after every
        // post of a slower member takes that member's line at every post.
        let want = match deadline {
            None => n,
            Some(_) => self.posted.get().min(n + ENTRIES / 8 - 1),
        };
        let all_posted = || (0..self.size).all(|r| self.posted_of(r) >= want);
        if !wait_until(deadline, all_posted) && !(0..self.size).all(|r| self.posted_of(r) >= n) {
            if deadline.is_none() {
                return super::Next::Done;
            }
            return super::Next::Missing(self.own_desc(n));
        }
        match self.read(n) {
            Entry::Same if self.refused_here.get() != n => {
                self.settled(true);
                super::Next::Same
            }
            Entry::Same => super::Next::Check {
                mine: self.own_desc(n),
                all: vec![self.own_desc(n); self.size],
            },
            Entry::Differ(all) => super::Next::Check {
                mine: all[self.me],
                all,
            },
        }
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
        bytemuck::cast(words)
    }

    /// Entry `n` of every member (all have posted it).
    fn read(&self, n: u64) -> Entry {
        let key = Self::key_at(n);
        let mine = [8, 16].map(|o| self.word(self.me, key + o).load(Ordering::Relaxed));
        let mut same = true;
        for r in (0..self.size).filter(|r| *r != self.me) {
            match self.consistent(r, n, || {
                [8, 16].map(|o| self.word(r, key + o).load(Ordering::Relaxed))
            }) {
                None => return Entry::Same,
                Some(theirs) => same &= theirs == mine,
            }
        }
        if same {
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
                Some(w) => all.push(bytemuck::cast(w)),
            }
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

/// Polls `ready` until it holds or `deadline` passes (`None`: once).
fn wait_until(deadline: Option<Instant>, ready: impl Fn() -> bool) -> bool {
    let mut polls = 0u32;
    loop {
        if ready() {
            return true;
        }
        match deadline {
            None => return false,
            Some(d) if polls % 16 == 0 && Instant::now() > d => return false,
            Some(_) => {}
        }
        polls += 1;
        // Each poll reads lines other members write: a pause between polls
        // (16 × ~25 ns here) keeps the member waited for from losing them
        // at every write. It may also need this core (ranks can outnumber
        // cores): yield, then sleep.
        if polls < 256 {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
        } else if polls < 1024 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}
