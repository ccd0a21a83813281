//! What a host executor supplies: the byte movements of every host
//! collective, once the dispatch path has checked the call. Each executor
//! (`mpi`, `shm`, `hier`) implements it; the enum that picks one
//! (`executor`) sits above them, so none of them imports the others' chooser.
//! The host op list in `group/host.rs` is written once against it.

use super::blocks::BlockLayout;
use crate::error::Fault;
use crate::op::ReduceOp;
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
