//! Deferred agreements through MPI: each call's descriptor in a
//! non-blocking all-gather (`MPI_Iallgather`), for groups that span nodes or
//! run on the MPI host executor.

use super::next::Next;
use crate::agree::Descriptor;
use crate::error::{Error, Result};
use mpi::ffi;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Instant;

/// Most agreements a group keeps posted: the oldest is completed before
/// another is posted, so a loop that never synchronizes stays bounded.
const MAX_POSTED: usize = 1024;

/// One posted agreement. The buffers are boxed: MPI writes into them until
/// the request completes, wherever the queue moves its entries.
struct Posted {
    request: ffi::MPI_Request,
    mine: Box<Descriptor>,
    all: Box<[Descriptor]>,
}

/// A group's posted all-gathers, oldest first.
pub(crate) struct MpiPosts {
    comm: ffi::MPI_Comm,
    queue: RefCell<VecDeque<Posted>>,
}

impl MpiPosts {
    /// Over `comm` (kept alive by the group, which completes its
    /// agreements before freeing it).
    pub(super) fn new(comm: ffi::MPI_Comm) -> MpiPosts {
        MpiPosts {
            comm,
            queue: RefCell::new(VecDeque::new()),
        }
    }

    /// Posts `desc` for the group's `size` members.
    pub(super) fn post(&self, desc: &Descriptor, size: usize, group: &str) -> Result<()> {
        let mine = Box::new(*desc);
        let mut all: Box<[Descriptor]> = vec![*desc; size].into_boxed_slice();
        let bytes = std::mem::size_of::<Descriptor>() as i32;
        // SAFETY: RSMPI_REQUEST_NULL is a plain handle value.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: both buffers are boxed and kept (in `Posted`) until the
        // request completes or is leaked; counts match their sizes.
        let rc = unsafe {
            ffi::MPI_Iallgather(
                (&*mine as *const Descriptor).cast(),
                bytes,
                ffi::RSMPI_UINT8_T,
                all.as_mut_ptr().cast(),
                bytes,
                ffi::RSMPI_UINT8_T,
                self.comm,
                &mut request,
            )
        };
        if rc != 0 {
            return Err(Error::Launch(format!(
                "MPI_Iallgather of a call descriptor on {group} failed (code {rc})"
            )));
        }
        self.queue
            .borrow_mut()
            .push_back(Posted { request, mine, all });
        Ok(())
    }

    /// Whether the queue must be completed before another post.
    pub(super) fn full(&self) -> bool {
        self.queue.borrow().len() >= MAX_POSTED
    }

    /// Whether anything is posted (MPI needs the tests to progress).
    pub(super) fn wants_test(&self) -> bool {
        !self.queue.borrow().is_empty()
    }

    /// The oldest agreement, once complete (see [`Next`]).
    /// `gone`: whether a member was lost, which ends the wait.
    pub(super) fn next(&self, deadline: Option<Instant>, gone: &dyn Fn() -> bool) -> Next {
        let Some(mut front) = self.queue.borrow_mut().pop_front() else {
            return Next::Done;
        };
        // Unlike a ring's, a request that completes after a loss proves
        // nothing: on a revoked communicator MPI completes it in error,
        // its descriptors unwritten.
        if wait(&mut front.request, deadline, gone) && !(deadline.is_some() && gone()) {
            return Next::Check {
                mine: *front.mine,
                all: front.all.into_vec(),
            };
        }
        if deadline.is_none() {
            self.queue.borrow_mut().push_front(front);
            return Next::Done;
        }
        let mine = *front.mine;
        if gone() {
            // Left for `abandon`: MPI may still write into the buffers.
            self.queue.borrow_mut().push_front(front);
            return Next::Lost(mine);
        }
        // The all-gather may still write into the buffers.
        std::mem::forget(front);
        Next::Missing(mine)
    }

    /// Tells the members that this rank posts nothing more (its NCCL
    /// communicator failed): one last all-gather of a closing stand-in,
    /// which meets the members' next post and ends their wait for it.
    pub(super) fn close(&self, group: &str) -> Result<()> {
        let mut size = 0;
        // SAFETY: a live communicator (see `new`).
        unsafe { ffi::MPI_Comm_size(self.comm, &mut size) };
        self.post(&Descriptor::closing(), size as usize, group)
    }

    /// After a disagreement the members may have posted different numbers
    /// of agreements: the later ones may never complete. Their buffers are
    /// leaked (MPI may still write into them).
    pub(super) fn abandon(&self) {
        for p in self.queue.borrow_mut().drain(..) {
            std::mem::forget(p);
        }
    }
}

/// Tests `request` until it completes or `deadline` passes (`None`: one test).
/// A member lost (`gone`) ends the wait.
fn wait(
    request: &mut ffi::MPI_Request,
    deadline: Option<Instant>,
    gone: &dyn Fn() -> bool,
) -> bool {
    let mut test = || {
        let mut done = 0;
        // SAFETY: a live request of ours; the status is ignored.
        unsafe { ffi::MPI_Test(request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
        done != 0
    };
    match deadline {
        None => test(),
        Some(d) => crate::wait::until(Some(d), || test() || gone()),
    }
}
