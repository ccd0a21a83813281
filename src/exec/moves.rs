//! What a host executor supplies: the byte movements of every host
//! collective, once the dispatch path has checked the call. MPI (`mpi`)
//! does every op; the fast paths (`shm`, `hier`) override the ones they
//! run faster and leave the rest to MPI, and `route` picks which runs a
//! call. The host op list in `group/host.rs` is written once against it.

use super::blocks::BlockLayout;
use super::mpi::MpiExec;
use crate::error::Fault;
use crate::op::uneven::Links;
use crate::op::ReduceOp;
use crate::tensor::Tensor;

/// The byte movements of the host collectives. Sizes were agreed before
/// any of these is called; an `Err` is a fault of the transfer itself.
/// Every move defaults to the MPI executor's (the inherent method of the
/// same name on [`MpiExec`]): a new op is written once there, and a fast
/// path opts in by overriding it and listing the op in `route`.
pub(crate) trait HostMoves {
    /// MPI on the group's communicator, which runs every op.
    fn flat(&self) -> MpiExec<'_>;
    /// Returns once every member has entered.
    fn barrier(&self) -> Result<(), Fault> {
        self.flat().barrier()
    }
    /// Element-wise reduction of `input` into every rank's `out`.
    fn all_reduce_into(&self, input: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<(), Fault> {
        self.flat().all_reduce_into(input, out, op)
    }
    /// [`Self::all_reduce_into`] with `t` both input and output. The moves
    /// take their input apart from their output (rsmpi has no
    /// `MPI_IN_PLACE`): from `scratch`, the group's kept copy of `t`,
    /// refilled (reused while shape and dtype stay, so a loop of calls
    /// allocates nothing). The window reduces in place.
    fn all_reduce_in_place(
        &self,
        t: &mut Tensor,
        op: ReduceOp,
        scratch: &mut Option<Tensor>,
    ) -> Result<(), Fault> {
        self.all_reduce_into(refilled(scratch, t), t, op)
    }
    /// Element-wise reduction onto `root`'s `out` (ignored elsewhere).
    fn reduce_into_root(
        &self,
        input: &Tensor,
        out: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        self.flat().reduce_into_root(input, out, root, op)
    }
    /// `packed` holds `P` equal blocks; rank `r` gets the reduction of
    /// every rank's block `r`.
    fn reduce_scatter_block_into(
        &self,
        packed: &Tensor,
        out: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        self.flat().reduce_scatter_block_into(packed, out, op)
    }
    /// Every rank's `block` (same length everywhere) into `out`, in rank order.
    fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        self.flat().all_gather_into(block, out)
    }
    /// Every rank's `block` concatenated into `root`'s `out` (`P` blocks;
    /// the caller's buffer, so a large gather faults in no fresh pages);
    /// the other ranks pass `None`.
    fn gather_into(&self, block: &[u8], out: Option<&mut [u8]>, root: usize) -> Result<(), Fault> {
        self.flat().gather_into(block, out, root)
    }
    /// Each rank's `mine` (lengths `lens`, known to all) on `root`, or on
    /// every rank when `root` is `None`; `None` on ranks that get nothing.
    fn gather_varcount(
        &self,
        mine: &[u8],
        lens: &[usize],
        root: Option<usize>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fault> {
        self.flat().gather_varcount(mine, lens, root)
    }
    /// Block `r` of `root`'s `send` into rank `r`'s `recv`.
    fn scatter(&self, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<(), Fault> {
        self.flat().scatter(send, recv, root)
    }
    /// `root`'s `buf` into every rank's `buf`.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        self.flat().broadcast(buf, root)
    }
    /// Block `r` of every rank's `send` into block `sender` of rank `r`'s `out`.
    fn all_to_all_into(&self, send: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        self.flat().all_to_all_into(send, out)
    }
    /// Every rank's `mine` (`lens[r]` bytes from rank `r`, known to all)
    /// into `out`, concatenated in rank order.
    fn all_gather_v_into(&self, mine: &[u8], lens: &[usize], out: &mut [u8]) -> Result<(), Fault> {
        self.flat().all_gather_v_into(mine, lens, out)
    }
    /// [`all_to_all_into`](Self::all_to_all_into) with blocks laid out by
    /// `send_layout` and `recv_layout`; `Ok(false)` when the executor cannot
    /// express the layouts (the caller packs instead).
    fn all_to_all_strided(
        &self,
        send: &[u8],
        send_layout: BlockLayout,
        out: &mut [u8],
        recv_layout: BlockLayout,
    ) -> Result<bool, Fault> {
        self.flat()
            .all_to_all_strided(send, send_layout, out, recv_layout)
    }
    /// Uneven blocks of `row`-byte rows: `counts.0[r]` rows of `send` to
    /// rank `r`, `counts.1[s]` rows of `out` from rank `s`. The count
    /// tables travel first and each link is judged by its two ends
    /// ([`Links::swapped`]); refused links move nothing. Returns the links.
    fn all_to_all_v(
        &self,
        (send, out): (&[u8], &mut [u8]),
        counts: (&[usize], &[usize]),
        row: usize,
    ) -> Result<Links, Fault> {
        let flat = self.flat();
        let swap = |mine: &[u8], theirs: &mut [u8]| flat.all_to_all_into(mine, theirs);
        let links = Links::swapped(flat.rank(), counts.0, counts.1, swap)?;
        let (sent, got) = links.placed(counts, row);
        let longest = links.longest.saturating_mul(row);
        flat.all_to_all_v(send, &sent, out, &got, longest);
        Ok(links)
    }
}

/// `scratch` holding a copy of `t`: refilled where its shape and dtype
/// match, a fresh clone otherwise.
fn refilled<'s>(scratch: &'s mut Option<Tensor>, t: &Tensor) -> &'s Tensor {
    match scratch.as_mut() {
        Some(s) if s.dtype() == t.dtype() && s.shape() == t.shape() => {
            s.bytes_mut().copy_from_slice(t.bytes())
        }
        _ => *scratch = Some(t.clone()),
    }
    scratch.as_ref().expect("set above")
}

/// MPI does every move itself (its inherent methods).
impl HostMoves for MpiExec<'_> {
    fn flat(&self) -> MpiExec<'_> {
        *self
    }
}
