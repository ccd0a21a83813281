//! Handles Python holds on the library's communicators (groups, meshes).
//! Every one is registered here, so that finalizing drops them all before
//! `MPI_Finalize` (a communicator freed after it is undefined behaviour); a
//! handle Python still holds afterwards refuses calls.
//!
//! Every call that reaches MPI holds [`serial`]: torch's autograd threads
//! call the torch backend off the thread that started MPI, which then runs
//! SERIALIZED, and the lock is what makes those calls one at a time.

use std::cell::{Ref, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

trait Release {
    fn release(&self);
}

impl<T> Release for RefCell<Option<T>> {
    fn release(&self) {
        self.borrow_mut().take();
    }
}

thread_local! {
    /// Every live handle (the extension's classes are unsendable: one thread).
    static LIVE: RefCell<Vec<Weak<dyn Release>>> = const { RefCell::new(Vec::new()) };
}

/// The process's MPI lock.
static CALLS: Mutex<()> = Mutex::new(());

/// The `pthread_self` of the thread holding [`CALLS`], 0 when none. Only
/// the holder writes it, so a thread reads its own id here only while it
/// holds the lock: that is how a nested call knows the turn is already its
/// own. No thread-local is touched: in this cdylib each access is a
/// `__tls_get_addr` call, and the depth-and-guard version took 123
/// instructions a call against this one's 76 (callgrind, call_cost.py).
/// Either way the lock's two atomic read-modify-writes are its time: 13 ns
/// of a 270 ns NumPy call in a world of one.
static OWNER: AtomicUsize = AtomicUsize::new(0);

fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    unsafe { libc::pthread_self() as usize }
}

/// This thread's turn at MPI, until dropped. Re-entrant on one thread: the
/// outermost turn holds the lock, nested ones hold nothing. Never wait for
/// the GIL while holding it: the thread that holds the GIL may be waiting
/// here (the waits of other threads skip Python's signal check,
/// `errors::interrupted`).
pub struct Serial(Option<MutexGuard<'static, ()>>);

pub fn serial() -> Serial {
    let guard = match CALLS.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) if OWNER.load(Ordering::Relaxed) == this_thread() => {
            return Serial(None);
        }
        Err(TryLockError::WouldBlock) => CALLS.lock().unwrap_or_else(|p| p.into_inner()),
    };
    OWNER.store(this_thread(), Ordering::Relaxed);
    Serial(Some(guard))
}

impl Drop for Serial {
    fn drop(&mut self) {
        if let Some(guard) = self.0.take() {
            OWNER.store(0, Ordering::Relaxed);
            drop(guard);
        }
    }
}

/// An object borrowed with this thread's turn at MPI held.
pub struct Held<'a, T: 'static> {
    // Declared first: dropped before the turn ends.
    slot: Ref<'a, Option<T>>,
    _turn: Serial,
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = Option<T>;
    fn deref(&self) -> &Option<T> {
        &self.slot
    }
}

/// A library object Python holds, emptied by [`release_all`].
pub struct Handle<T: 'static>(Rc<RefCell<Option<T>>>);

impl<T: 'static> Handle<T> {
    pub fn new(value: T) -> Handle<T> {
        let rc = Rc::new(RefCell::new(Some(value)));
        let weak: Weak<dyn Release> = Rc::downgrade(&(rc.clone() as Rc<dyn Release>));
        LIVE.with(|live| {
            let mut live = live.borrow_mut();
            live.retain(|w| w.strong_count() > 0);
            live.push(weak);
        });
        Handle(rc)
    }

    /// The object, `None` once released, with this thread's turn at MPI.
    pub fn borrow(&self) -> Held<'_, T> {
        let turn = serial();
        Held {
            slot: self.0.borrow(),
            _turn: turn,
        }
    }
}

impl<T: 'static> Clone for Handle<T> {
    /// Another holder of the same object (released with it).
    fn clone(&self) -> Handle<T> {
        Handle(self.0.clone())
    }
}

/// Drops every object a handle holds.
pub fn release_all() {
    let live = LIVE.with(|live| std::mem::take(&mut *live.borrow_mut()));
    for w in live {
        if let Some(h) = w.upgrade() {
            h.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn a_turn_nests_on_its_thread_and_excludes_the_others() {
        let outer = serial();
        let inner = serial(); // must not deadlock
        let entered = std::sync::Arc::new(AtomicBool::new(false));
        let other = {
            let entered = entered.clone();
            std::thread::spawn(move || {
                let _turn = serial();
                entered.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(inner);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !entered.load(Ordering::SeqCst),
            "another thread entered during a nested turn's outer hold"
        );
        drop(outer);
        other.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(OWNER.load(Ordering::SeqCst), 0);
    }
}
