//! How every host-plane wait waits, written once. A wait looks; spins for a
//! bounded *time*; then blocks — on a futex where a peer publishes a counter
//! in shared memory (the shm steps), else napping between looks (MPI
//! requests, the agreement rings).
//!
//! Why not spin, yield and nap by iteration counts: on a node where some
//! other process (a data-loader worker, a monitoring agent, a hyperthread
//! sibling) holds a core, the peer being waited for may be waiting for the
//! waiter's core. A yield hands it over only if the scheduler agrees; a
//! futex wait always does, and the writer's wake-up costs the waiter one
//! wake, not a time slice. The core count of the machine says nothing about
//! such processes, nor about cgroup quotas or CPU masks, so the spin is
//! sized by what waits cost here: [`Spin`] halves after a wait that blocked
//! for long (the peer was not running) and doubles after one that ended
//! while spinning or soon after blocking (the peer was only late), between
//! [`SPIN_MIN`] and [`SPIN_MAX`]. On an idle node waits end while spinning
//! and never pay a system call; on a busy one they block almost at once.
//!
//! **The protocol.** A writer publishes with [`publish`]: a sequentially
//! consistent store of the counter, then a look at the reader-registered
//! sleeper count, and a wake only when it is not zero. A waiter registers
//! as a sleeper (sequentially consistent), looks at the counter once more,
//! and only then sleeps with `FUTEX_WAIT` on the value it saw. Either the
//! writer sees the sleeper (and wakes it) or the waiter sees the write (and
//! does not sleep); a write between the waiter's look and its sleep changes
//! the futex word, so the kernel refuses the sleep. No wake is lost.
//!
//! The watchdog is a thread of its own: a rank blocked here is still in its
//! call, which the node's status board shows open, and `RANKMESH_TIMEOUT`
//! ends the job as before, or, with `RANKMESH_ON_HANG=error`, [gives
//! up](give_up) the wait: a blocked waiter looks every
//! [`give_up::LOOK_EVERY`] (its futex sleeps last no longer), and unwinds
//! to its call, which fails.

pub(crate) mod give_up;

use give_up::{Looks, LOOK_EVERY};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest spin before blocking: longer than a peer that runs takes
/// to reach the same step (µs of skew), shorter than a scheduler tick
/// (docs/BENCHMARKS.md, "Tuned constants", for this and the others here).
const SPIN_MAX: Duration = Duration::from_micros(50);
/// The shortest: a few looks, for nodes where waits keep blocking.
const SPIN_MIN: Duration = Duration::from_micros(1);
/// Looks between two reads of the clock while spinning.
const LOOKS_PER_CLOCK: u32 = 16;
/// A nap between looks, where nothing can wake the waiter.
const NAP: Duration = Duration::from_micros(20);

thread_local! {
    /// This thread's spin budget in ns (every wait of the thread shares it:
    /// what makes one wait block makes the others block too).
    static BUDGET_NS: Cell<u32> = const { Cell::new(SPIN_MAX.as_nanos() as u32) };
}

/// A blocked wait longer than this means the peer was not running (a busy
/// core, a stopped or far peer): the next wait spins for less. A shorter
/// one means it was only late, and spinning on would have been cheaper.
const LONG_WAIT: Duration = Duration::from_micros(4 * SPIN_MAX.as_micros() as u64);

/// The spin budget of the calling thread.
struct Spin;

impl Spin {
    /// The budget now.
    fn budget() -> Duration {
        Duration::from_nanos(u64::from(BUDGET_NS.get()))
    }

    /// A wait ended while spinning, or after a short block: the next may
    /// spin longer.
    fn grow() {
        let max = SPIN_MAX.as_nanos() as u32;
        BUDGET_NS.set(BUDGET_NS.get().saturating_mul(2).min(max));
    }

    /// A wait had to block for `waited` in all.
    fn blocked(waited: Duration) {
        if waited < LONG_WAIT {
            return Self::grow();
        }
        let min = SPIN_MIN.as_nanos() as u32;
        BUDGET_NS.set((BUDGET_NS.get() / 2).max(min));
    }
}

/// Spins from `start` until `ready` holds or the budget is spent: whether
/// it held.
fn spin(start: Instant, ready: &mut impl FnMut() -> bool) -> bool {
    // Crowded: the peer most likely needs this core; yield at once.
    if CROWDED.load(Ordering::Relaxed) {
        return false;
    }
    let budget = Spin::budget();
    loop {
        for _ in 0..LOOKS_PER_CLOCK {
            std::hint::spin_loop();
            if ready() {
                Spin::grow();
                return true;
            }
        }
        if start.elapsed() >= budget {
            return false;
        }
    }
}

/// Whether ranks that wait for each other share CPUs: a group on this node
/// has more members than the CPUs their bindings and cgroup quota leave
/// them ([`note_shared_cpus`], a hint: other processes stay unseen). Then
/// the peer being waited for most likely waits for this core, and a yield
/// hands it over faster than a futex wake brings this rank back (4 ranks
/// on 2 cores: 3 µs per 8 B all-reduce against 65 µs). Spinning first only
/// delays that hand-over. Ranks bound to cores of their own are not
/// crowded, even one core each: a yield there hands the rank's core to
/// whatever else runs on it, for that process's time slice.
static CROWDED: AtomicBool = AtomicBool::new(false);
/// Whether this process's ranks share CPUs ([`CROWDED`]: a group on its
/// node has more members than the CPUs they may use).
pub(crate) fn crowded() -> bool {
    CROWDED.load(Ordering::Relaxed)
}

/// The longest a crowded waiter yields before it blocks: long enough that
/// a rank descheduled for a scheduler tick or two is waited for by yields,
/// not by futex sleeps and wakes (4 ranks on 2 cores, 8 B all-reduce,
/// alternated medians of 3: 1 ms after a 1 µs spin, 5.2 µs; 20 ms and no
/// spin, 2.9 µs; before the wait policy, 3.1-4.4 µs in the same runs).
const YIELD_FOR: Duration = Duration::from_millis(20);

/// Words of a CPU set as [`own_cpus`] gives it (the first 1024 CPUs, as
/// glibc's `cpu_set_t`).
pub(crate) const CPU_WORDS: usize = 16;

/// This process's CPUs: the set it may run on (`sched_getaffinity`), then
/// how many of them it may use ([`std::thread::available_parallelism`],
/// which also counts a cgroup's `cpu.max` quota).
pub(crate) fn own_cpus() -> [u64; CPU_WORDS + 1] {
    let mut out = [0u64; CPU_WORDS + 1];
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at
    // most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } == 0 {
        for cpu in 0..(64 * CPU_WORDS).min(libc::CPU_SETSIZE as usize) {
            // SAFETY: `cpu` is below CPU_SETSIZE.
            if unsafe { libc::CPU_ISSET(cpu, &set) } {
                out[cpu / 64] |= 1 << (cpu % 64);
            }
        }
    }
    out[CPU_WORDS] = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    out
}

/// Records the hint of [`CROWDED`] for a group whose members gave `cpus`
/// ([`own_cpus`] of each): crowded when there are more members than CPUs
/// in the union of their sets, or than the quota of a member whose quota
/// is below its set. Once crowded, the process stays so (a later group of
/// fewer members does not make the first one's waits any less crowded).
pub(crate) fn note_shared_cpus(cpus: &[[u64; CPU_WORDS + 1]]) -> bool {
    let shared = share_cpus(cpus);
    if shared {
        CROWDED.store(true, Ordering::Relaxed);
    }
    shared
}

/// Whether members with `cpus` are more than the CPUs they may use.
fn share_cpus(cpus: &[[u64; CPU_WORDS + 1]]) -> bool {
    let mut union = [0u64; CPU_WORDS];
    let mut usable = usize::MAX;
    for c in cpus {
        let mine: u32 = c[..CPU_WORDS].iter().map(|w| w.count_ones()).sum();
        let quota = c[CPU_WORDS] as usize;
        if quota < mine as usize {
            usable = usable.min(quota);
        }
        for (u, w) in union.iter_mut().zip(c) {
            *u |= w;
        }
    }
    let in_union: u32 = union.iter().map(|w| w.count_ones()).sum();
    // An empty union: the sets could not be read; judge by the quotas.
    if in_union > 0 {
        usable = usable.min(in_union as usize);
    }
    cpus.len() > usable
}

/// On a crowded node, yields from `start` until `ready` holds or
/// [`YIELD_FOR`] passes: whether it held.
fn yield_while_crowded(
    start: Instant,
    ready: &mut impl FnMut() -> bool,
    looks: &mut Looks,
) -> bool {
    if !CROWDED.load(Ordering::Relaxed) {
        return false;
    }
    while start.elapsed() < YIELD_FOR {
        std::thread::yield_now();
        if ready() {
            return true;
        }
        looks.look();
    }
    false
}

/// Publishes `value` in `counter` for waiters of [`until_at_least`], waking
/// those that sleep (`sleepers`: the count they register in).
#[inline]
pub(crate) fn publish(counter: &AtomicU64, value: u64, sleepers: &AtomicU32) {
    // Sequentially consistent, paired with the waiter's: the store and the
    // look at `sleepers` are not reordered (see the module docs).
    counter.store(value, Ordering::SeqCst);
    if sleepers.load(Ordering::SeqCst) != 0 {
        wake_all(counter);
    }
}

/// Waits until `counter` reaches `target` (its writer publishes with
/// [`publish`] and the same `sleepers`), or `deadline` passes: whether it
/// did. The counter only grows. Returns at once, with no system call, when
/// it is there already.
#[inline]
pub(crate) fn until_at_least(
    counter: &AtomicU64,
    target: u64,
    sleepers: &AtomicU32,
    deadline: Option<Instant>,
) -> bool {
    counter.load(Ordering::Acquire) >= target || wait_slow(counter, target, sleepers, deadline)
}

/// [`until_at_least`] once the first look failed (no clock read before).
#[cold]
#[inline(never)]
fn wait_slow(
    counter: &AtomicU64,
    target: u64,
    sleepers: &AtomicU32,
    deadline: Option<Instant>,
) -> bool {
    let mut ready = || counter.load(Ordering::Acquire) >= target;
    spin_then_block(&mut ready, |_, looks| {
        block_on(counter, target, sleepers, deadline, looks)
    })
}

/// The policy's order, once: spin within the budget, yield where the node
/// is crowded, then `block`; the budget learns from how long it all took.
fn spin_then_block<R: FnMut() -> bool>(
    ready: &mut R,
    block: impl FnOnce(&mut R, &mut Looks) -> bool,
) -> bool {
    let start = Instant::now();
    if spin(start, ready) {
        return true;
    }
    let mut looks = Looks::new(start);
    let done = yield_while_crowded(start, ready, &mut looks) || block(ready, &mut looks);
    Spin::blocked(start.elapsed());
    done
}

/// The blocking part of [`until_at_least`]: registers as a sleeper, looks
/// once more, and sleeps on the counter ([`LOOK_EVERY`] at most, then
/// looks whether to give up).
fn block_on(
    counter: &AtomicU64,
    target: u64,
    sleepers: &AtomicU32,
    deadline: Option<Instant>,
    looks: &mut Looks,
) -> bool {
    loop {
        sleepers.fetch_add(1, Ordering::SeqCst);
        let seen = counter.load(Ordering::SeqCst);
        if seen >= target {
            sleepers.fetch_sub(1, Ordering::SeqCst);
            return true;
        }
        let timeout = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) => left.min(LOOK_EVERY),
                None => {
                    sleepers.fetch_sub(1, Ordering::SeqCst);
                    return false;
                }
            },
            None => LOOK_EVERY,
        };
        futex_wait(counter, seen, Some(timeout));
        sleepers.fetch_sub(1, Ordering::SeqCst);
        if counter.load(Ordering::Acquire) >= target {
            return true;
        }
        looks.look();
    }
}

/// Waits until `ready` holds, or `deadline` passes (`None`: no limit):
/// whether it did. For what nothing can wake (an MPI request, a peer's
/// ring): spins within the budget, then naps between looks.
pub(crate) fn until(deadline: Option<Instant>, mut ready: impl FnMut() -> bool) -> bool {
    if ready() {
        return true;
    }
    spin_then_block(&mut ready, |ready, looks| loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return ready();
        }
        std::thread::sleep(NAP);
        if ready() {
            return true;
        }
        looks.look();
    })
}

/// The 32-bit word of `counter` the kernel compares: its low half.
fn futex_word(counter: &AtomicU64) -> *const u32 {
    let at = counter.as_ptr() as *const u32;
    if cfg!(target_endian = "big") {
        // SAFETY: the counter is 8 bytes; its low half is the second word
        // on a big-endian machine.
        unsafe { at.add(1) }
    } else {
        at
    }
}

/// Sleeps while the low half of `counter` still reads `seen`'s, at most
/// `timeout`; returns on a wake, a change, a signal or the timeout alike.
/// Not `FUTEX_PRIVATE_FLAG`: the counter may live in memory shared with
/// other processes (the kernel keys the wait by the mapping's page).
fn futex_wait(counter: &AtomicU64, seen: u64, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a valid, aligned word that stays mapped while this call waits
    // (the caller borrows it); a null or valid timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAIT,
            seen as u32,
            ts_ptr,
        );
    }
}

/// Sleeps while `bell` still reads `seen`, `timeout` at most, until a
/// [`ring`] from any process that maps its page. For rare events: there is
/// no sleeper count, so every ring is a system call.
pub(crate) fn doze(bell: &AtomicU64, seen: u64, timeout: Duration) {
    if bell.load(Ordering::SeqCst) == seen {
        futex_wait(bell, seen, Some(timeout));
    }
}

/// Rings `bell`: every [`doze`] on it returns.
pub(crate) fn ring(bell: &AtomicU64) {
    bell.fetch_add(1, Ordering::SeqCst);
    wake_all(bell);
}

/// Wakes every waiter sleeping on `counter`.
#[cold]
#[inline(never)]
fn wake_all(counter: &AtomicU64) {
    // SAFETY: a valid, aligned word; FUTEX_WAKE reads nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAKE,
            i32::MAX,
        );
    }
}

/// Waits until `fd` can be read (a listener: a connection is waiting), or
/// `deadline` passes: whether it can. Blocks in `poll(2)`, so a connection
/// wakes the waiter at once.
pub(crate) fn readable(fd: std::os::fd::RawFd, deadline: Option<Instant>) -> bool {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                None => return false,
                Some(left) => left.as_millis().clamp(1, i32::MAX as u128) as i32,
            },
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // A bad descriptor: the caller's accept reports why.
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A CPU record: `cpus` in the set, `quota` usable.
    fn record(cpus: impl IntoIterator<Item = usize>, quota: u64) -> [u64; CPU_WORDS + 1] {
        let mut r = [0u64; CPU_WORDS + 1];
        for c in cpus {
            r[c / 64] |= 1 << (c % 64);
        }
        r[CPU_WORDS] = quota;
        r
    }

    #[test]
    fn ranks_share_cpus_only_when_their_sets_or_quota_are_fewer_than_they() {
        // Bound to a core each (Open MPI's default for 2 ranks): one CPU per
        // rank, none shared, however busy the cores are with other work.
        assert!(!share_cpus(&[record([0], 1), record([1], 1)]));
        // 4 ranks on 2 cores, unbound or bound to the same two.
        assert!(share_cpus(&[record(0..2, 2); 4]));
        // Two ranks bound to one core.
        assert!(share_cpus(&[record([3], 1), record([3], 1)]));
        // 4 ranks free to use 64 CPUs, but a cgroup quota of 2.
        assert!(share_cpus(&[record(0..64, 2); 4]));
        assert!(!share_cpus(&[record(0..64, 4); 4]));
        // CPUs past the first word count.
        assert!(!share_cpus(&[record([70], 1), record([700], 1)]));
        // Sets the kernel would not give: judged by the quotas alone.
        assert!(!share_cpus(&[record([], 8), record([], 8)]));
        let me = own_cpus();
        assert!(me[CPU_WORDS] >= 1 && me[..CPU_WORDS].iter().any(|w| *w != 0));
    }

    /// A counter and its sleeper count, as a window's slot holds them.
    struct Shared {
        counter: AtomicU64,
        sleepers: AtomicU32,
    }

    #[test]
    fn a_published_value_is_seen_without_sleeping() {
        let s = Shared {
            counter: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
        };
        publish(&s.counter, 3, &s.sleepers);
        assert!(until_at_least(&s.counter, 3, &s.sleepers, None));
        assert!(until_at_least(&s.counter, 2, &s.sleepers, None));
        assert_eq!(s.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_deadline_ends_a_wait_nobody_answers() {
        let s = Shared {
            counter: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
        };
        let t = Instant::now();
        let limit = Duration::from_millis(30);
        assert!(!until_at_least(&s.counter, 1, &s.sleepers, Some(t + limit)));
        assert!(t.elapsed() >= limit);
        assert_eq!(
            s.sleepers.load(Ordering::SeqCst),
            0,
            "unregistered on the way out"
        );
        assert!(!until(Some(Instant::now() + limit), || false));
    }

    /// A waiter that sleeps on every step is woken by each write it waits
    /// for, and by nothing else: it comes back from the kernel at most once
    /// per write (none are lost: no deadline is set, so a lost wake would
    /// hang the test), and sees every value.
    #[test]
    fn each_write_wakes_its_sleeping_waiter_once() {
        const WRITES: u64 = 200;
        let s = Arc::new(Shared {
            counter: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
        });
        let returns = Arc::new(AtomicUsize::new(0));
        // Steps the waiter has finished waiting for.
        let seen = Arc::new(AtomicU64::new(0));
        let waiter = {
            let (s, returns, seen) = (s.clone(), returns.clone(), seen.clone());
            std::thread::spawn(move || {
                for step in 1..=WRITES {
                    // Register and sleep directly: every wait blocks.
                    loop {
                        s.sleepers.fetch_add(1, Ordering::SeqCst);
                        let now = s.counter.load(Ordering::SeqCst);
                        if now >= step {
                            s.sleepers.fetch_sub(1, Ordering::SeqCst);
                            break;
                        }
                        futex_wait(&s.counter, now, None);
                        returns.fetch_add(1, Ordering::SeqCst);
                        s.sleepers.fetch_sub(1, Ordering::SeqCst);
                    }
                    seen.store(step, Ordering::SeqCst);
                }
            })
        };
        for step in 1..=WRITES {
            // Publish only once the waiter waits for this step and has
            // registered, so each write has exactly one sleeper to wake.
            while seen.load(Ordering::SeqCst) != step - 1 || s.sleepers.load(Ordering::SeqCst) == 0
            {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(200));
            publish(&s.counter, step, &s.sleepers);
        }
        waiter.join().unwrap();
        assert_eq!(returns.load(Ordering::SeqCst) as u64, WRITES);
    }

    /// Writes racing waiters that are going to sleep, at every phase of
    /// the registration: every wait ends (a lost wake would hang it; the
    /// test's deadline names the step instead).
    #[test]
    fn no_wake_is_lost_when_a_write_races_the_sleep() {
        const WRITES: u64 = 20_000;
        let s = Arc::new(Shared {
            counter: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
        });
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for step in 1..=WRITES {
                        // Straight to the blocking path: the race under
                        // test is between registration and the write.
                        let limit = Instant::now() + Duration::from_secs(20);
                        let ok = s.counter.load(Ordering::Acquire) >= step
                            || block_on(
                                &s.counter,
                                step,
                                &s.sleepers,
                                Some(limit),
                                &mut Looks::new(Instant::now()),
                            );
                        assert!(ok, "the wait for write {step} was never woken");
                    }
                })
            })
            .collect();
        for step in 1..=WRITES {
            // Vary the gap so writes land before, during and after a
            // waiter's registration.
            for _ in 0..(step % 64) {
                std::hint::spin_loop();
            }
            publish(&s.counter, step, &s.sleepers);
        }
        for w in waiters {
            w.join().unwrap();
        }
    }

    #[test]
    fn the_budget_shrinks_after_long_blocks_and_grows_after_short_waits() {
        std::thread::spawn(|| {
            assert_eq!(Spin::budget(), SPIN_MAX);
            for _ in 0..64 {
                Spin::blocked(LONG_WAIT * 2);
            }
            assert_eq!(Spin::budget(), SPIN_MIN);
            Spin::grow();
            assert_eq!(Spin::budget(), SPIN_MIN * 2);
            // A peer that was only late: spinning on would have been cheaper.
            Spin::blocked(LONG_WAIT / 2);
            assert_eq!(Spin::budget(), SPIN_MIN * 4);
            for _ in 0..64 {
                Spin::grow();
            }
            assert_eq!(Spin::budget(), SPIN_MAX);
        })
        .join()
        .unwrap();
    }
}
