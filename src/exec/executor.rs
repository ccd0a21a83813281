//! What a host executor supplies: the byte movements of every host
//! collective, once the dispatch path has checked the call. Three
//! executors implement it — MPI ([`MpiExec`]), node-local shared memory
//! ([`ShmCall`](super::shm::ShmCall)) and the node-aware stages across
//! nodes ([`HierCall`]) — and the host op list in `group/host.rs` is
//! written once against it.

use super::blocks::BlockLayout;
use super::hier::HierCall;
use super::mpi::MpiExec;
use super::shm::ShmCall;
use crate::error::{Error, Fault, Result};
use crate::op::ReduceOp;
use crate::parse::{choice, Choice};
use crate::tensor::Tensor;

/// The byte movements of the host collectives. Sizes were agreed before
/// any of these is called; an `Err` is a fault of the transfer itself.
pub(crate) trait HostMoves {
    /// Returns once every member has entered.
    fn barrier(&self) -> Result<(), Fault>;
    /// Element-wise reduction of `input` into every rank's `out`.
    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault>;
    /// Element-wise reduction onto `root`'s `out` (ignored elsewhere).
    fn reduce_into_root(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault>;
    /// `packed` holds `P` equal blocks; rank `r` gets the reduction of
    /// every rank's block `r`.
    fn reduce_scatter_block_into(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault>;
    /// Every rank's `block` (same length everywhere) into `out`, in rank order.
    fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault>;
    /// Every rank's `block` concatenated into `root`'s `out` (`P` blocks;
    /// the caller's buffer, so a large gather faults in no fresh pages);
    /// the other ranks pass `None`.
    fn gather_into(&self, block: &[u8], out: Option<&mut [u8]>, root: usize) -> Result<(), Fault>;
    /// Each rank's `mine` (lengths `lens`, known to all) on `root`, or on
    /// every rank when `root` is `None`; `None` on ranks that get nothing.
    fn gather_varcount(
        &self,
        mine: &[u8],
        lens: &[usize],
        root: Option<usize>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fault>;
    /// Block `r` of `root`'s `send` into rank `r`'s `recv`.
    fn scatter(&self, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<(), Fault>;
    /// `root`'s `buf` into every rank's `buf`.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault>;
    /// Block `r` of every rank's `send` into block `sender` of rank `r`'s `out`.
    fn all_to_all_into(&self, send: &[u8], out: &mut [u8]) -> Result<(), Fault>;
    /// Every rank's `mine` (`lens[r]` bytes from rank `r`, known to all)
    /// into `out`, concatenated in rank order.
    fn all_gather_v_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<(), Fault>;
    /// [`all_to_all_into`](Self::all_to_all_into) with blocks laid out by
    /// `send_layout` and `recv_layout`; `Ok(false)` when the executor cannot
    /// express the layouts (the caller packs instead).
    fn all_to_all_strided(
        &self,
        send: &[u8],
        send_layout: BlockLayout,
        out: &mut [u8],
        recv_layout: BlockLayout,
    ) -> Result<bool, Fault>;
}

/// The executor a host call runs on.
pub(crate) enum HostExec<'a> {
    /// MPI collectives on the group's communicator.
    Mpi(MpiExec<'a>),
    /// The group's shared-memory window.
    Shm(ShmCall<'a>),
    /// Shared memory within nodes, MPI among their leaders.
    Hier(HierCall<'a>),
}

impl<'a> std::ops::Deref for HostExec<'a> {
    type Target = dyn HostMoves + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            HostExec::Mpi(p) => p,
            HostExec::Shm(s) => s,
            HostExec::Hier(h) => h,
        }
    }
}

/// `RANKMESH_HOST_PLANE`: which executor host collectives use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecChoice {
    /// Shared memory for groups whose members share one node; for groups
    /// spanning nodes with two or more members on some node, the node-aware
    /// stages for the ops and sizes where they pay (per-op crossovers,
    /// `GroupCoordinator::host_executor_for`), flat MPI for the rest; MPI
    /// otherwise.
    #[default]
    Auto,
    /// MPI for every group.
    Mpi,
    /// Shared memory; a group spanning nodes is an error at its creation.
    Shm,
    /// As `Auto`, but a group spanning nodes runs every op that has
    /// node-aware stages in them, at every size (broadcast and barrier
    /// included, which `Auto` leaves flat).
    Hier,
}

impl ExecChoice {
    /// The value's name, as `RANKMESH_HOST_PLANE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ExecChoice::Auto => "auto",
            ExecChoice::Mpi => "mpi",
            ExecChoice::Shm => "shm",
            ExecChoice::Hier => "hier",
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64
    }
}

choice!(
    ExecChoice,
    &[
        ExecChoice::Mpi,
        ExecChoice::Shm,
        ExecChoice::Hier,
        ExecChoice::Auto
    ]
);

impl std::str::FromStr for ExecChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ExecChoice::named(s.trim()).ok_or_else(|| {
            Error::Launch(format!(
                "RANKMESH_HOST_PLANE={s:?} is not one of mpi, shm, hier, auto"
            ))
        })
    }
}
