//! Handles Python holds on the library's communicators (groups, meshes).
//! Every one is registered here, so that finalizing drops them all before
//! `MPI_Finalize` (a communicator freed after it is undefined behaviour); a
//! handle Python still holds afterwards refuses calls.

use std::cell::{Ref, RefCell};
use std::rc::{Rc, Weak};

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

    /// The object, `None` once released.
    pub fn borrow(&self) -> Ref<'_, Option<T>> {
        self.0.borrow()
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
