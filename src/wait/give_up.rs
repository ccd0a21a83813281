//! Giving up on a wait that will not end: the watchdog's verdict with
//! `RANKMESH_ON_HANG=error` (no progress, a member left) or the process's
//! interrupt check (Ctrl-C in Python).
//!
//! A wait cannot return an error through every executor in between (a shm
//! step, an MPI request, an agreement ring): those return nothing, by
//! design, since the happy path must not pay for the sad one. So a wait
//! that gives up *unwinds* to the nearest [`run`] (each watched call has
//! one), which turns it into an error. The unwind carries a private
//! payload, is never a panic (no hook runs, nothing is printed), and
//! starts only in a wait's blocking part, never on the fast path.
//!
//! Giving up is for the whole process and final: the runtime's shared
//! state (its steps, its MPI requests) is left mid-call, so every later
//! call fails at once with the same reason, the destructors that would
//! wait on peers (window frees, pending swaps) leak instead, and dropping
//! the runtime ends the job instead of finalising MPI.

use crate::error::Abandon;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a blocked waiter looks whether to give up: the longest a
/// futex sleep lasts before the waiter looks again, and the interval of
/// the interrupt check (which takes Python's lock). A blocked rank wakes
/// 20 times a second at most; a call given up on ends within this.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Whether the process gave up (the reason is in [`REASON`]).
static GIVEN_UP: AtomicBool = AtomicBool::new(false);
/// Whether calls can be given up at all: the watchdog gives up
/// ([`arm`]) or an interrupt check is set. Unarmed, [`run`] runs its call
/// as a plain call, with no landing pad to set up (about 60 instructions
/// per call, 5% of an 8 B all-reduce on shared memory).
static ARMED: AtomicBool = AtomicBool::new(false);
/// Whether the watchdog gives up calls (`OnHang::Error`).
static WATCHDOG_GIVES_UP: AtomicBool = AtomicBool::new(false);
/// The reason, written once before [`GIVEN_UP`] is set.
static REASON: Mutex<Option<(Abandon, String)>> = Mutex::new(None);
/// The interrupt check (`fn() -> bool` as an address; 0: none).
static INTERRUPT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Calls of this thread inside [`run`]: waits outside every call never
    /// unwind (nothing would catch them).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The unwind's payload.
struct GaveUp;

/// Gives up on every wait of this process, for `why` (`msg`: the whole
/// story, which every later call repeats). The first reason stays: whether
/// this one was it.
pub(crate) fn give_up(why: Abandon, msg: String) -> bool {
    let mut reason = REASON.lock().unwrap_or_else(|e| e.into_inner());
    if reason.is_some() {
        return false;
    }
    *reason = Some((why, msg));
    GIVEN_UP.store(true, Ordering::Release);
    true
}

/// Forgets that this process gave up: the survivors of a lost rank shrank
/// the world (`Runtime::shrink`), and what the calls given up left behind
/// went with the old one.
pub(crate) fn reset() {
    let mut reason = REASON.lock().unwrap_or_else(|e| e.into_inner());
    GIVEN_UP.store(false, Ordering::Release);
    *reason = None;
}

/// Why this process gave up, if it did.
pub(crate) fn given_up() -> Option<(Abandon, String)> {
    if !GIVEN_UP.load(Ordering::Acquire) {
        return None;
    }
    REASON.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether this process gave up (one atomic load).
#[inline]
pub(crate) fn gave_up() -> bool {
    GIVEN_UP.load(Ordering::Relaxed)
}

/// Sets the interrupt check: a function the thread of a blocked call runs
/// every [`LOOK_EVERY`]; `true` gives the call up ([`Abandon::Interrupted`]).
pub(crate) fn set_interrupt_check(check: Option<fn() -> bool>) {
    INTERRUPT.store(check.map_or(0, |f| f as usize), Ordering::Release);
    rearm();
}

/// The watchdog will give calls up (`OnHang::Error`): calls must be
/// ready for it.
pub(crate) fn arm() {
    WATCHDOG_GIVES_UP.store(true, Ordering::Release);
    rearm();
}

fn rearm() {
    let armed = WATCHDOG_GIVES_UP.load(Ordering::Acquire) || INTERRUPT.load(Ordering::Acquire) != 0;
    ARMED.store(armed, Ordering::Release);
}

/// Whether a call may be given up (see [`ARMED`]); when not, [`run`] is
/// only `Ok(f())`, which a hot caller can run itself.
#[inline]
pub(crate) fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Unwinds to the call's [`run`] when the process gave up: for a wait
/// that first let go of what it owns (MPI requests into the caller's
/// buffers) instead of unwinding at its next look. Nothing outside a call.
pub(crate) fn unwind_if_given_up() {
    if DEPTH.get() > 0 && gave_up() && !std::thread::panicking() {
        std::panic::resume_unwind(Box::new(GaveUp));
    }
}

/// Whether this thread runs inside [`run`].
#[inline]
pub(crate) fn inside() -> bool {
    DEPTH.get() > 0
}

/// Runs `f`, one call, so that a wait inside it may give up: `Err` with the
/// reason then, or at once when the process gave up before.
pub(crate) fn run<T>(f: impl FnOnce() -> T) -> Result<T, (Abandon, String)> {
    if !armed() {
        return Ok(f());
    }
    if gave_up() {
        return Err(reason());
    }
    DEPTH.set(DEPTH.get() + 1);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    DEPTH.set(DEPTH.get() - 1);
    match out {
        // An MPI routine that returned early on a failed peer (ULFM's error
        // handler gave up meanwhile) left a result that is not one.
        Ok(_) if gave_up() => Err(reason()),
        Ok(v) => Ok(v),
        Err(payload) if payload.is::<GaveUp>() => Err(reason()),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

#[cold]
fn reason() -> (Abandon, String) {
    given_up().unwrap_or((Abandon::Interrupted, "given up".into()))
}

/// A blocked waiter's looks at whether to give up (made once the wait
/// stops spinning).
pub(super) struct Looks {
    next_check: Instant,
}

impl Looks {
    /// For a wait that began at `start` (no clock read of its own: a
    /// wait that blocks briefly pays nothing more).
    pub(super) fn new(start: Instant) -> Looks {
        Looks {
            next_check: start + LOOK_EVERY,
        }
    }

    /// Unwinds to the call's [`run`] when the process gave up, or its
    /// interrupt check (at most every [`LOOK_EVERY`]) says to. Nothing
    /// outside a call, or while unwinding already.
    pub(super) fn look(&mut self) {
        if DEPTH.get() == 0 || std::thread::panicking() {
            return;
        }
        if !gave_up() && self.interrupted() {
            give_up(
                Abandon::Interrupted,
                "interrupted while waiting for the other members".into(),
            );
        }
        if gave_up() {
            std::panic::resume_unwind(Box::new(GaveUp));
        }
    }

    fn interrupted(&mut self) -> bool {
        let check = INTERRUPT.load(Ordering::Acquire);
        if check == 0 {
            return false;
        }
        let now = Instant::now();
        if now < self.next_check {
            return false;
        }
        self.next_check = now + LOOK_EVERY;
        // SAFETY: stored from a `fn() -> bool` by `set_interrupt_check`.
        let check: fn() -> bool = unsafe { std::mem::transmute::<usize, fn() -> bool>(check) };
        check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: giving up is for the whole process, so the cases share it.
    #[test]
    fn a_wait_gives_up_only_inside_a_call_and_every_later_call_fails() {
        // Unarmed, a call is a plain call.
        assert!(run(|| 7).is_ok());
        arm();
        // Outside a call, a look never unwinds.
        let mut looks = Looks::new(Instant::now());
        looks.look();
        assert!(run(|| 7).is_ok());
        // An interrupt check that fires gives the call up.
        fn yes() -> bool {
            true
        }
        set_interrupt_check(Some(yes));
        let out = run(|| {
            let mut looks = Looks {
                next_check: Instant::now(),
            };
            looks.look();
            unreachable!("the look unwinds")
        });
        set_interrupt_check(None);
        let (why, msg) = out.expect_err("given up");
        assert_eq!(why, Abandon::Interrupted);
        assert!(msg.contains("interrupted"), "{msg}");
        // Final: the next call fails before it runs, with the first reason.
        assert!(!give_up(Abandon::Timeout, "later".into()));
        assert_eq!(run(|| 1).err().map(|e| e.0), Some(Abandon::Interrupted));
        // A real panic inside a call is still a panic.
        *REASON.lock().unwrap() = None;
        GIVEN_UP.store(false, Ordering::Release);
        let p = std::panic::catch_unwind(|| run(|| panic!("a bug")));
        assert!(p.is_err());
        assert_eq!(DEPTH.get(), 0);
    }
}
