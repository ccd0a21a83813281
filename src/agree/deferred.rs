//! A group's deferred agreements (the `deferred` [check mode](crate::op::CheckMode)):
//! posted, completed later.
//!
//! `deferred`: a device call posts its descriptor and enqueues its NCCL work
//! at once. A group within one node posts into its members' rings in the
//! group's shared window (`ring`: a few stores, checked in batches); any
//! other group posts a non-blocking MPI all-gather (`posted`: tested at
//! every later device call, since MPI progresses only when called). The
//! posted agreements are completed at the next
//! [`Gpu::synchronize`](crate::device::Gpu::synchronize), event wait, event
//! query that finds the work done, or download, and before a post that
//! would exceed the backlog either allows. A disagreement found then aborts
//! every NCCL communicator of the rank — the mismatched NCCL work may never
//! finish — and is the error strict mode would have given for that call, on
//! every member. Each member decides from the same descriptors, so all of
//! them abort and fail alike. A rank whose communicator fails closes its
//! posts ([`Deferred::close`]): its members stop waiting for the calls it
//! will never post, and fail them naming it.

use super::next::Next;
use super::posted::MpiPosts;
use super::ring::{Ring, RingArea};
use crate::agree::{agree, Descriptor};
use crate::error::{Error, NcclError, Result};
use crate::op::Op;
use mpi::ffi;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// Where a group's agreements are posted.
pub(crate) enum Posts {
    /// The members' shared-memory rings (a group within one node).
    Ring(Ring),
    /// Non-blocking MPI all-gathers (any group).
    Mpi(MpiPosts),
}

impl Posts {
    /// Rings in the group's shared window, for group rank `me`.
    pub(crate) fn ring(area: RingArea, me: usize) -> Posts {
        Posts::Ring(Ring::new(area, me))
    }

    /// All-gathers over `comm` (kept alive by the group, which completes
    /// its agreements before freeing it).
    pub(crate) fn mpi(comm: ffi::MPI_Comm) -> Posts {
        Posts::Mpi(MpiPosts::new(comm))
    }
}

/// A group's posted agreements.
pub(crate) struct Deferred {
    group: String,
    rank: usize,
    limit: Option<Duration>,
    posts: Posts,
    /// Why the group can no longer be used, after a disagreement.
    broken: RefCell<Option<String>>,
    /// This rank posts nothing more: its NCCL communicator failed.
    closed: Cell<bool>,
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
    /// For the group `group`, as group rank `rank`.
    pub(crate) fn new(group: &str, rank: usize, limit: Option<Duration>, posts: Posts) -> Deferred {
        Deferred {
            group: group.to_string(),
            rank,
            limit,
            posts,
            broken: RefCell::new(None),
            closed: Cell::new(false),
        }
    }

    pub(crate) fn group(&self) -> &str {
        &self.group
    }

    /// Whether the group posts to shared-memory rings (not through MPI).
    pub(crate) fn on_ring(&self) -> bool {
        matches!(self.posts, Posts::Ring(_))
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

    /// Whether the oldest agreement must be completed before another post.
    pub(crate) fn full(&self) -> bool {
        match &self.posts {
            Posts::Ring(r) => r.full(),
            Posts::Mpi(m) => m.full(),
        }
    }

    /// This rank's NCCL communicator for the group failed, so it makes no
    /// more device calls on it that could complete: the members are told
    /// (a closed ring, or a closing all-gather) and stop waiting for its
    /// later posts, and this rank completes nothing more. Idempotent.
    pub(crate) fn close(&self) {
        if self.closed.replace(true) || self.broken.borrow().is_some() {
            return;
        }
        match &self.posts {
            Posts::Ring(r) => r.close(),
            Posts::Mpi(m) => {
                if let Err(e) = m.close(&self.group) {
                    tracing::warn!("{e}: the members of {} wait for it", self.group);
                }
            }
        }
    }

    /// Posts `desc` (of digest `digest`) for the group's `size` members;
    /// `refused_here`: this rank's own checks refused the call (it
    /// enqueues nothing). A closed rank posts nothing: the call fails on
    /// its aborted communicator.
    pub(crate) fn post(
        &self,
        desc: &Descriptor,
        digest: u64,
        size: usize,
        refused_here: bool,
    ) -> Result<()> {
        if self.closed.get() {
            return Ok(());
        }
        match &self.posts {
            Posts::Mpi(m) => m.post(desc, size, &self.group),
            Posts::Ring(r) => r
                .post(desc, digest, refused_here, self.limit())
                .map_err(|held| {
                    self.break_with("a member did not check a refused call");
                    Error::Timeout {
                        op: desc.op().unwrap_or(Op::Synchronize),
                        group: self.group.clone(),
                        msg: format!(
                            "a member did not check the refused device call posted {} calls \
                         earlier within RANKMESH_TIMEOUT",
                            r.posted() + 1 - held
                        ),
                    }
                }),
        }
    }

    fn limit(&self) -> Duration {
        self.limit.unwrap_or(Duration::from_secs(600))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.limit()
    }

    /// Completes posted agreements, oldest first: those already done when
    /// `deadline` is `None`, all of them otherwise (an agreement not done
    /// by the deadline is an error: a member never made that call). Stops
    /// at the first that does not agree and returns its verdict.
    pub(crate) fn complete(&self, deadline: Option<Instant>) -> Result<Verdict> {
        if self.inert() || deadline.is_none() && !self.wants_test() {
            return Ok(Verdict::Agreed);
        }
        loop {
            let gone = crate::ulfm::loss_known;
            let next = match &self.posts {
                Posts::Ring(r) => r.next(deadline, &gone),
                Posts::Mpi(m) => m.next(deadline, &gone),
            };
            if let Some(verdict) = self.settle(next) {
                return verdict;
            }
        }
    }

    /// Completes the oldest agreements until another post fits (see
    /// [`full`](Self::full)), waiting at most `RANKMESH_TIMEOUT` for the
    /// members to post them: a rank far ahead of a member waits for one
    /// batch of its posts, not for it to catch up, and looks at its
    /// counter gently while it does (`Ring::next_for_room`).
    pub(crate) fn make_room(&self) -> Result<Verdict> {
        if self.inert() {
            return Ok(Verdict::Agreed);
        }
        while self.full() {
            let gone = crate::ulfm::loss_known;
            let next = match &self.posts {
                Posts::Ring(r) => r.next_for_room(self.deadline(), &gone),
                Posts::Mpi(m) => m.next(Some(self.deadline()), &gone),
            };
            if let Some(verdict) = self.settle(next) {
                return verdict;
            }
        }
        Ok(Verdict::Agreed)
    }

    /// What `next` says of the group: `None` to go on to the next
    /// agreement, else the verdict to return.
    fn settle(&self, next: Next) -> Option<Result<Verdict>> {
        match next {
            Next::Done => Some(Ok(Verdict::Agreed)),
            Next::Same => None,
            Next::Missing(mine) => {
                self.break_with("a member did not make the call");
                self.abandon_rest();
                Some(Err(Error::Timeout {
                    op: mine.op().unwrap_or(Op::Synchronize),
                    group: self.group.clone(),
                    msg: format!(
                        "the deferred agreement of call #{} did not complete within \
                         RANKMESH_TIMEOUT: a member never made that call (or is stuck before it)",
                        mine.seq
                    ),
                }))
            }
            Next::Closed { rank, mine } => Some(Err(self.closed_by(rank, &mine))),
            Next::Lost(mine) => Some(Err(self.lost_member(&mine))),
            Next::Check { mine, all } => {
                if let Some(rank) = all.iter().position(Descriptor::is_closing) {
                    return Some(Err(self.closed_by(rank, &mine)));
                }
                let verdict = self.verdict(&mine, &all);
                if let Posts::Ring(r) = &self.posts {
                    r.settled(matches!(verdict, Verdict::Agreed));
                }
                match verdict {
                    Verdict::Agreed => None,
                    other => Some(Ok(other)),
                }
            }
        }
    }

    /// The error of a call whose agreement was not complete when a rank of
    /// the world was lost (ULFM): the survivors must all shrink, so no
    /// member waits for another's post any more. The group posts nothing
    /// more, and this rank's groups are revoked so that members waiting
    /// elsewhere return too.
    fn lost_member(&self, mine: &Descriptor) -> Error {
        self.abandon_rest();
        self.close();
        crate::ulfm::revoke_all();
        Error::PeerLost {
            op: mine.op().unwrap_or(Op::Synchronize),
            group: self.group.clone(),
            lost: crate::ulfm::lost(),
            msg: format!(
                "a rank was lost before every member made device call #{}",
                mine.seq
            ),
        }
    }

    /// The error of this rank's call `mine`, which group rank `rank` will
    /// never make: its NCCL communicator failed first. This rank's work
    /// for the call can never finish either: it closes too (its caller
    /// aborts its communicators).
    /// Under ULFM after a loss, the loss is the answer instead.
    fn closed_by(&self, rank: usize, mine: &Descriptor) -> Error {
        if crate::ulfm::loss_known() {
            // A survivor that found the loss first closed its posts.
            return self.lost_member(mine);
        }
        self.abandon_rest();
        self.close();
        Error::nccl(
            mine.op().unwrap_or(Op::Synchronize),
            &self.group,
            NcclError::other(format!(
                "group rank {rank} makes no device call from call #{} on: its NCCL \
                 communicator failed (its own error says why)",
                mine.seq
            )),
        )
    }

    /// Whether nothing posted matters any more: a broken group's error was
    /// returned once, and a closed rank's communicator is aborted.
    fn inert(&self) -> bool {
        self.broken.borrow().is_some() || self.closed.get()
    }

    /// Whether testing without waiting is worth it now.
    fn wants_test(&self) -> bool {
        match &self.posts {
            Posts::Ring(r) => r.wants_test(),
            Posts::Mpi(m) => m.wants_test(),
        }
    }

    fn verdict(&self, mine: &Descriptor, all: &[Descriptor]) -> Verdict {
        let size = all.len();
        let op = mine.op().unwrap_or(Op::Synchronize);
        let check = |d: &Descriptor| d.validate(op, size);
        let Err(rejection) = agree(all, self.rank, &check) else {
            return Verdict::Agreed;
        };
        let err = Error::rejected(op, &self.group, rejection);
        // A member enqueued the call when its own descriptor passed its own checks.
        let enqueued = |d: &Descriptor| agree(std::slice::from_ref(d), 0, &check).is_ok();
        if all.iter().any(enqueued) {
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

    /// After a disagreement the group refuses every call; what is still
    /// posted through MPI is leaked (see `posted`).
    fn abandon_rest(&self) {
        if let Posts::Mpi(m) = &self.posts {
            m.abandon();
        }
    }
}

/// The group's communicator is freed next: its agreements are completed
/// first (at most `RANKMESH_TIMEOUT`); what does not complete is leaked. A
/// disagreement found here has no caller left to report to: it is logged.
impl Drop for Deferred {
    fn drop(&mut self) {
        // After a call was given up the peers may never post: leak.
        if crate::wait::give_up::gave_up() {
            return self.abandon_rest();
        }
        match self.complete(Some(self.deadline())) {
            Ok(Verdict::Agreed) => {}
            Ok(Verdict::RefusedEverywhere(e) | Verdict::Disagreed(e)) | Err(e) => {
                tracing::error!("{e} (found when the group was dropped)")
            }
        }
        self.abandon_rest();
    }
}
