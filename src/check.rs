//! When a device call's agreement happens: [`CheckMode`], and the deferred
//! agreements of a group (posted, completed later).
//!
//! `deferred`: a device call posts its descriptor in a non-blocking MPI
//! all-gather and enqueues its NCCL work at once. The posted agreements are
//! tested (without waiting) at every later device call of the rank and
//! completed at the next [`Gpu::synchronize`](crate::device::Gpu::synchronize),
//! event wait, event query that finds the work done, or download. A
//! disagreement found then aborts every NCCL communicator of the rank — the
//! mismatched NCCL work may never finish — and is the error strict mode
//! would have given for that call, on every member. Each member decides from
//! the same all-gathered descriptors, so all of them abort and fail alike.

use crate::dispatch::{agree, Descriptor};
use crate::error::{Error, Result};
use crate::op::Op;
use mpi::ffi;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// When device calls agree on their descriptors (`RANKMESH_CHECK`, or
/// [`GroupCoordinator::set_check_mode`](crate::GroupCoordinator::set_check_mode)).
/// Host calls always agree before they move data (on shared memory the
/// agreement rides on the data exchange and costs nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckMode {
    /// Agree (one host all-reduce) before enqueuing: the CPU of every
    /// member waits for the slowest member at every device call.
    Strict,
    /// Post the agreement and enqueue at once; a disagreement is an error
    /// at the next synchronization point (module docs). The default.
    Deferred,
    /// No agreement: a mismatched call is not detected, and hangs until
    /// `RANKMESH_TIMEOUT` turns it into an error. Point-to-point calls keep
    /// their handshake in every mode.
    Off,
}

impl CheckMode {
    /// The name, as `RANKMESH_CHECK` takes it.
    pub fn name(self) -> &'static str {
        match self {
            CheckMode::Strict => "strict",
            CheckMode::Deferred => "deferred",
            CheckMode::Off => "off",
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    pub(crate) fn from_code(code: i64) -> Option<CheckMode> {
        [CheckMode::Strict, CheckMode::Deferred, CheckMode::Off]
            .into_iter()
            .find(|m| m.code() as i64 == code)
    }
}

impl std::str::FromStr for CheckMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<CheckMode> {
        match s.trim() {
            "strict" => Ok(CheckMode::Strict),
            "deferred" => Ok(CheckMode::Deferred),
            "off" => Ok(CheckMode::Off),
            other => Err(Error::Launch(format!(
                "RANKMESH_CHECK={other:?}: expected strict, deferred or off"
            ))),
        }
    }
}

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

/// A group's posted agreements, oldest first.
pub(crate) struct Deferred {
    group: String,
    comm: ffi::MPI_Comm,
    rank: usize,
    limit: Option<Duration>,
    posted: RefCell<VecDeque<Posted>>,
    /// Why the group can no longer be used, after a disagreement.
    broken: RefCell<Option<String>>,
}

/// What a completed agreement says.
pub(crate) enum Verdict {
    Agreed,
    /// Every member refused the call before enqueuing it: the error, and no
    /// NCCL work to abort.
    RefusedEverywhere(Error),
    /// Some member enqueued work the others did not match.
    Disagreed(Error),
}

impl Deferred {
    /// For the group `group` over `comm` (kept alive by the group, which
    /// completes its agreements before freeing it).
    pub(crate) fn new(
        group: &str,
        comm: ffi::MPI_Comm,
        rank: usize,
        limit: Option<Duration>,
    ) -> Deferred {
        Deferred {
            group: group.to_string(),
            comm,
            rank,
            limit,
            posted: RefCell::new(VecDeque::new()),
            broken: RefCell::new(None),
        }
    }

    pub(crate) fn group(&self) -> &str {
        &self.group
    }

    /// The error every call on the group gets after a disagreement.
    pub(crate) fn check_usable(&self, op: Op) -> Result<()> {
        match &*self.broken.borrow() {
            None => Ok(()),
            Some(first) => Err(Error::Mismatch {
                op,
                group: self.group.clone(),
                msg: format!(
                    "the group is unusable after an earlier device call disagreed ({first}); \
                     its NCCL communicators were aborted"
                ),
            }),
        }
    }

    /// Posts `desc` for the group's `size` members.
    pub(crate) fn post(&self, desc: &Descriptor, size: usize) -> Result<()> {
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
                "MPI_Iallgather of a call descriptor on {} failed (code {rc})",
                self.group
            )));
        }
        self.posted
            .borrow_mut()
            .push_back(Posted { request, mine, all });
        Ok(())
    }

    /// Whether more agreements are posted than the bound allows.
    pub(crate) fn over_bound(&self) -> bool {
        self.posted.borrow().len() > MAX_POSTED
    }

    /// Completes posted agreements, oldest first: those already done when
    /// `deadline` is `None`, all of them otherwise (an agreement not done
    /// by the deadline is an error: a member never made that call). Stops
    /// at the first that does not agree and returns its verdict.
    pub(crate) fn complete(&self, deadline: Option<Instant>) -> Result<Verdict> {
        loop {
            let Some(front) = self.posted.borrow_mut().pop_front() else {
                return Ok(Verdict::Agreed);
            };
            let mut front = front;
            if !wait(&mut front.request, deadline) {
                let seq = front.mine.seq;
                let op = front.mine.op().unwrap_or(Op::Synchronize);
                if deadline.is_none() {
                    self.posted.borrow_mut().push_front(front);
                    return Ok(Verdict::Agreed);
                }
                // The all-gather may still write into the buffers.
                std::mem::forget(front);
                self.break_with("a member did not make the call");
                return Err(Error::Timeout {
                    op,
                    group: self.group.clone(),
                    msg: format!(
                        "the deferred agreement of call #{seq} did not complete within \
                         RANKMESH_TIMEOUT: a member never made that call (or is stuck before it)"
                    ),
                });
            }
            match self.verdict(&front) {
                Verdict::Agreed => {}
                other => return Ok(other),
            }
        }
    }

    fn verdict(&self, p: &Posted) -> Verdict {
        let size = p.all.len();
        let op = p.mine.op().unwrap_or(Op::Synchronize);
        let check = |d: &Descriptor| op.check(d, size);
        let Err(rejection) = agree(&p.all, self.rank, &check) else {
            return Verdict::Agreed;
        };
        let err = Error::rejected(op, &self.group, rejection);
        // A member enqueued the call when its own descriptor passed its own checks.
        let enqueued = |d: &Descriptor| agree(std::slice::from_ref(d), 0, &check).is_ok();
        if p.all.iter().any(enqueued) {
            self.break_with(&err.to_string());
            self.abandon_rest();
            Verdict::Disagreed(err)
        } else {
            Verdict::RefusedEverywhere(err)
        }
    }

    fn break_with(&self, why: &str) {
        self.broken
            .borrow_mut()
            .get_or_insert_with(|| why.to_string());
    }

    /// After a disagreement the members may have posted different numbers
    /// of agreements: the later ones may never complete. Their buffers are
    /// leaked (MPI may still write into them); the group refuses every call.
    fn abandon_rest(&self) {
        for p in self.posted.borrow_mut().drain(..) {
            std::mem::forget(p);
        }
    }
}

/// The group's communicator is freed next: its agreements are completed
/// first (at most `RANKMESH_TIMEOUT`); what does not complete is leaked. A
/// disagreement found here has no caller left to report to: it is logged.
impl Drop for Deferred {
    fn drop(&mut self) {
        let limit = self.limit.unwrap_or(Duration::from_secs(600));
        match self.complete(Some(Instant::now() + limit)) {
            Ok(Verdict::Agreed) => {}
            Ok(Verdict::RefusedEverywhere(e) | Verdict::Disagreed(e)) | Err(e) => {
                tracing::error!("{e} (found when the group was dropped)")
            }
        }
        self.abandon_rest();
    }
}

/// Tests `request` until it completes or `deadline` passes (`None`: one test).
fn wait(request: &mut ffi::MPI_Request, deadline: Option<Instant>) -> bool {
    let mut spins = 0u32;
    loop {
        let mut done = 0;
        // SAFETY: a live request of ours; the status is ignored.
        unsafe { ffi::MPI_Test(request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
        if done != 0 {
            return true;
        }
        match deadline {
            None => return false,
            Some(d) if Instant::now() > d => return false,
            Some(_) => {}
        }
        spins += 1;
        if spins > 1000 {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}
