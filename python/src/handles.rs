//! Handles Python holds on the library's communicators (groups, meshes).
//! Every one is registered here, so that finalizing drops them all before
//! `MPI_Finalize` (a communicator freed after it is undefined behaviour); a
//! handle Python still holds afterwards refuses calls.
//!
//! Every call that reaches MPI holds [`serial`]: torch's autograd threads
//! call the torch backend off the thread that started MPI, which then runs
//! SERIALIZED, and the lock is what makes those calls one at a time.

use std::cell::{Cell, Ref, RefCell};
use std::marker::PhantomData;
use std::rc::{Rc, Weak};
use std::sync::{Mutex, MutexGuard};

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

thread_local! {
    /// This thread's hold on [`CALLS`] and how many [`Serial`]s share it
    /// (a call that borrows a group inside another call's hold).
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// This thread's turn at MPI, until dropped. Re-entrant on one thread.
/// Never wait for the GIL while holding it: the thread that holds the GIL
/// may be waiting here (the waits of other threads skip Python's signal
/// check, `errors::interrupted`).
pub struct Serial(PhantomData<*const ()>);

pub fn serial() -> Serial {
    DEPTH.with(|d| {
        if d.get() == 0 {
            let guard = CALLS.lock().unwrap_or_else(|p| p.into_inner());
            HELD.with(|h| *h.borrow_mut() = Some(guard));
        }
        d.set(d.get() + 1);
    });
    Serial(PhantomData)
}

impl Drop for Serial {
    fn drop(&mut self) {
        DEPTH.with(|d| {
            d.set(d.get() - 1);
            if d.get() == 0 {
                HELD.with(|h| h.borrow_mut().take());
            }
        });
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
