//! The op list, once: the [`Collectives`] trait every data plane implements.
//!
//! The host group ([`GroupCoordinator`], MPI on host memory) and the device
//! group ([`DeviceGroup`](crate::DeviceGroup), NCCL on GPU memory) are two
//! implementations with an associated tensor type each. Everything above the
//! planes — [`Differentiable`](crate::parallel::Differentiable), tensor dictionaries,
//! `rankmesh bench` — is written once against this trait.
//!
//! Each collective has an `_into` form that writes a caller-owned output
//! (no allocation: what a hot loop calls) and an allocating form, given here
//! once as a default method. An output of the wrong shape or dtype is the
//! same error on every rank (see [`Op::output_shape`] for the shapes). The
//! rules of each op (checks, output shapes, error wording) live in
//! [`crate::op`] and are applied by the dispatch path, not by the planes.

use crate::dtype::DType;
use crate::error::Result;
use crate::group::GroupCoordinator;
use crate::op::ReduceOp;
use crate::op::{Args, Counted};

/// A dense, row-major tensor a data plane moves: what the dispatch path
/// needs to know about it.
pub trait PlaneTensor: Sized {
    /// Whether the tensor lives in GPU memory.
    const ON_DEVICE: bool;
    /// Element type.
    fn dtype(&self) -> DType;
    /// Dimensions.
    fn shape(&self) -> &[usize];
    /// The same elements viewed with another shape of equal element count.
    fn reshape(self, shape: Vec<usize>) -> Result<Self>;
}

/// Both planes' tensors have inherent methods of the same names.
macro_rules! plane_tensor {
    ($t:ty, $on_device:expr) => {
        impl PlaneTensor for $t {
            const ON_DEVICE: bool = $on_device;

            fn dtype(&self) -> DType {
                <$t>::dtype(self)
            }

            fn shape(&self) -> &[usize] {
                <$t>::shape(self)
            }

            fn reshape(self, shape: Vec<usize>) -> Result<Self> {
                <$t>::reshape(self, shape)
            }
        }
    };
}

plane_tensor!(crate::tensor::Tensor, false);
plane_tensor!(crate::device::DeviceTensor, true);

/// One operation of [`Collectives::batch_send_recv`].
pub enum P2p<'a, T> {
    /// Send the tensor to the member at this position.
    Send(&'a T, usize),
    /// Receive into the tensor from the member at this position (its dtype
    /// and shape must be the sender's).
    Recv(&'a mut T, usize),
}

impl<T> P2p<'_, T> {
    /// The tensor and the peer.
    pub(crate) fn parts(&self) -> (&T, usize) {
        match self {
            P2p::Send(t, p) => (t, *p),
            P2p::Recv(t, p) => (t, *p),
        }
    }
}

/// The collectives of one group on one data plane. `'rt` is the runtime's
/// lifetime (every group borrows the [`Runtime`](crate::Runtime)).
///
/// Ranks (`src`, `dst`) are positions inside the group; dims may be negative
/// (counted from the end). On a device plane, calls only enqueue work on the
/// rank's stream: results are ready after
/// [`DeviceGroup::synchronize`](crate::DeviceGroup::synchronize).
pub trait Collectives<'rt> {
    /// The plane's tensor type.
    type Tensor: PlaneTensor + 'static;

    /// The group (its MPI communicator carries the agreement and the object plane).
    fn group(&self) -> &GroupCoordinator<'rt>;

    /// A tensor of `shape` and `dtype` whose contents the next op overwrites.
    fn empty(&self, shape: Vec<usize>, dtype: DType) -> Result<Self::Tensor>;

    /// A copy of elements `[start, start + len)` of `t` (row-major order) as a
    /// 1-d tensor (local; enqueued on a device plane).
    fn copy_flat(&self, t: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;

    /// Blocks until every member has called it (and checks all are in the same call).
    fn barrier(&self) -> Result<()>;

    /// [`all_reduce`](Self::all_reduce) into `out` (same shape and dtype as `t`).
    fn all_reduce_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        reduce_op: ReduceOp,
    ) -> Result<()>;

    /// [`all_reduce`](Self::all_reduce) in place: `t` becomes the result.
    fn all_reduce_in_place(&self, t: &mut Self::Tensor, reduce_op: ReduceOp) -> Result<()>;

    /// [`reduce`](Self::reduce) into `out` (same shape and dtype as `t` on
    /// every rank; written on `dst` only).
    fn reduce_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        dst: usize,
        reduce_op: ReduceOp,
    ) -> Result<()>;

    /// [`all_gather`](Self::all_gather) into `out`.
    fn all_gather_into(&self, t: &Self::Tensor, out: &mut Self::Tensor, dim: isize) -> Result<()>;

    /// [`gather`](Self::gather) into `out`, which is used (and checked) on
    /// `dst` only: other ranks may pass any tensor.
    fn gather_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        dst: usize,
        dim: isize,
    ) -> Result<()>;

    /// [`scatter`](Self::scatter) into `out`.
    fn scatter_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        src: usize,
        dim: isize,
    ) -> Result<()>;

    /// [`reduce_scatter`](Self::reduce_scatter) into `out`.
    fn reduce_scatter_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()>;

    /// Copies group rank `src`'s tensor into `t` on every member (in place;
    /// all members pass a tensor of the same shape and dtype).
    fn broadcast(&self, t: &mut Self::Tensor, src: usize) -> Result<()>;

    /// [`all_to_all`](Self::all_to_all) into `out` (same shape and dtype as `t`).
    fn all_to_all_into(&self, t: &Self::Tensor, out: &mut Self::Tensor) -> Result<()>;

    /// [`all_to_all_4d`](Self::all_to_all_4d) into `out`.
    fn all_to_all_4d_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<()>;

    /// [`all_to_all_v`](Self::all_to_all_v) into `out`, whose dim 0 is the
    /// sum of `recv_counts` (other dims and dtype as `t`'s).
    fn all_to_all_v_into(
        &self,
        t: &Self::Tensor,
        send_counts: &[usize],
        out: &mut Self::Tensor,
        recv_counts: &[usize],
    ) -> Result<()>;

    /// [`all_gather_v`](Self::all_gather_v) into `out`.
    fn all_gather_v_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        counts: &[usize],
        dim: isize,
    ) -> Result<()>;

    /// [`reduce_scatter_v`](Self::reduce_scatter_v) into `out`, which holds
    /// this member's `counts[rank]` slices along `dim` (other dims and dtype
    /// as `t`'s).
    fn reduce_scatter_v_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        counts: &[usize],
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()>;

    /// Sends `t` to group rank `dst` (the next member when `None`). Shape
    /// and dtype disagreement with the receiver is an error on both sides.
    fn send(&self, t: &Self::Tensor, dst: Option<usize>) -> Result<()>;

    /// Receives into `out` (its shape and dtype are what this rank expects)
    /// from group rank `src` (the previous member when `None`).
    fn recv_into(&self, out: &mut Self::Tensor, src: Option<usize>) -> Result<()>;

    /// Sends `t` to `dst` while receiving `out` from `src` (defaults: next and
    /// previous member), deadlock-free in a ring. Each link is checked by its
    /// two ends; `dst == src == self` copies locally.
    fn send_recv_into(
        &self,
        t: &Self::Tensor,
        out: &mut Self::Tensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()>;

    /// torch's `batch_isend_irecv`: every send and receive of `ops` is
    /// issued together and completes together, deadlock-free whatever the
    /// order of `ops` on each member (pipeline stages exchanging
    /// activations). A member's k-th send to a peer pairs with that peer's
    /// k-th receive from it. Each pair is checked by its two ends: a dtype or
    /// size that differs is an error on both, naming both, while the pairs
    /// that agree still move. Peers are positions in the group, never this
    /// member itself.
    fn batch_send_recv(&self, ops: &mut [P2p<'_, Self::Tensor>]) -> Result<()>;

    /// Element-wise reduction of every member's tensor (same shape and dtype
    /// everywhere); the result on every member.
    fn all_reduce(&self, t: &Self::Tensor, reduce_op: ReduceOp) -> Result<Self::Tensor> {
        let mut out = self.empty(t.shape().to_vec(), t.dtype())?;
        self.all_reduce_into(t, &mut out, reduce_op)?;
        Ok(out)
    }

    /// Element-wise reduction onto group rank `dst` (`Some` there, `None` elsewhere).
    fn reduce(
        &self,
        t: &Self::Tensor,
        dst: usize,
        reduce_op: ReduceOp,
    ) -> Result<Option<Self::Tensor>> {
        let mut out = self.empty(t.shape().to_vec(), t.dtype())?;
        self.reduce_into(t, &mut out, dst, reduce_op)?;
        Ok((self.group().rank_in_group() == dst).then_some(out))
    }

    /// Concatenation of every member's tensor along `dim`, in group-rank
    /// order; the result on every member.
    fn all_gather(&self, t: &Self::Tensor, dim: isize) -> Result<Self::Tensor> {
        // A bad dim still calls in, so every rank learns about it together.
        let mut out = self.empty(output_shape(self, Args::all_gather(dim), t), t.dtype())?;
        self.all_gather_into(t, &mut out, dim)?;
        Ok(out)
    }

    /// Like [`all_gather`](Self::all_gather), the result only on group rank
    /// `dst` (`Some`); `None` on the others.
    fn gather(&self, t: &Self::Tensor, dst: usize, dim: isize) -> Result<Option<Self::Tensor>> {
        let mine = self.group().rank_in_group() == dst;
        let shape = if mine {
            output_shape(self, Args::gather(dst, dim), t)
        } else {
            vec![0]
        };
        let mut out = self.empty(shape, t.dtype())?;
        self.gather_into(t, &mut out, dst, dim)?;
        Ok(mine.then_some(out))
    }

    /// Splits group rank `src`'s `t` into `size` equal slices along `dim` and
    /// leaves slice `r` on group rank `r`: the inverse of
    /// [`gather`](Self::gather) (torch.distributed's `scatter`). Every member
    /// passes a tensor of the same shape and dtype, as for
    /// [`broadcast`](Self::broadcast); only `src`'s contents are read.
    fn scatter(&self, t: &Self::Tensor, src: usize, dim: isize) -> Result<Self::Tensor> {
        let shape = output_shape(self, Args::scatter(src, dim), t);
        let mut out = self.empty(shape, t.dtype())?;
        self.scatter_into(t, &mut out, src, dim)?;
        Ok(out)
    }

    /// Reduces every member's tensor with `reduce_op` and leaves slice `r` (of
    /// `size` equal slices along `dim`) on group rank `r`. The adjoint of
    /// [`all_gather`](Self::all_gather).
    fn reduce_scatter(
        &self,
        t: &Self::Tensor,
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<Self::Tensor> {
        let args = Args::reduce_scatter(dim, reduce_op);
        let mut out = self.empty(output_shape(self, args, t), t.dtype())?;
        self.reduce_scatter_into(t, &mut out, dim, reduce_op)?;
        Ok(out)
    }

    /// Splits dim 0 of `t` into `size` equal blocks and sends block `r` to
    /// group rank `r`; the result holds the received blocks in source order
    /// (same shape as `t`). nccl-tests' `alltoall`.
    fn all_to_all(&self, t: &Self::Tensor) -> Result<Self::Tensor> {
        let mut out = self.empty(t.shape().to_vec(), t.dtype())?;
        self.all_to_all_into(t, &mut out)?;
        Ok(out)
    }

    /// All-to-all with per-member counts (`MPI_Alltoallv`; torch's
    /// `all_to_all_single` with split sizes): the first `send_counts[0]`
    /// rows of dim 0 of `t` go to group rank 0, the next `send_counts[1]`
    /// to rank 1, and so on; the result holds `recv_counts[s]` rows from
    /// each group rank `s`, in source order. Zero counts are allowed.
    ///
    /// Each link is checked by its two ends before any row moves: a
    /// sender's count that is not its receiver's expectation is an error on
    /// both, naming both and the two counts, while the links that agree
    /// still move. Counts that do not add up to the tensors' dim 0 are an
    /// error on every member. The counts travel as 24 bytes per member, in
    /// every check mode (on one node's shared memory, with the first
    /// pieces of the blocks; elsewhere, in an exchange of their own).
    fn all_to_all_v(
        &self,
        t: &Self::Tensor,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Self::Tensor> {
        let mut shape = t.shape().to_vec();
        if let Some(rows) = shape.first_mut() {
            *rows = recv_counts.iter().fold(0usize, |a, n| a.saturating_add(*n));
        }
        let mut out = self.empty(shape, t.dtype())?;
        self.all_to_all_v_into(t, send_counts, &mut out, recv_counts)?;
        Ok(out)
    }

    /// Concatenation along `dim` of every member's tensor, in group-rank
    /// order, where group rank `r`'s has `counts[r]` slices along `dim`
    /// (`MPI_Allgatherv`; sequence pieces of uneven length). Every member
    /// passes the same counts (agreed like the dtype: different counts are
    /// an error on every member), zeros allowed; its own count must be its
    /// tensor's size along `dim`.
    fn all_gather_v(&self, t: &Self::Tensor, counts: &[usize], dim: isize) -> Result<Self::Tensor> {
        let me = self.group().rank_in_group();
        let shape = Counted::Gathers.output_shape(t.shape(), counts, dim, me);
        let mut out = self.empty(shape, t.dtype())?;
        self.all_gather_v_into(t, &mut out, counts, dim)?;
        Ok(out)
    }

    /// Reduces every member's tensor with `reduce_op` and leaves group rank
    /// `r` its `counts[r]` slices along `dim`, in group-rank order
    /// (`MPI_Reduce_scatter`; torch's list-form `reduce_scatter` with uneven
    /// pieces, FSDP shards that do not divide evenly). The adjoint of
    /// [`all_gather_v`](Self::all_gather_v). Every member passes the same
    /// counts (agreed like the dtype: different counts are an error on every
    /// member), zeros allowed, and a tensor of their sum along `dim`.
    fn reduce_scatter_v(
        &self,
        t: &Self::Tensor,
        counts: &[usize],
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<Self::Tensor> {
        let me = self.group().rank_in_group();
        let shape = Counted::Scatters.output_shape(t.shape(), counts, dim, me);
        let mut out = self.empty(shape, t.dtype())?;
        self.reduce_scatter_v_into(t, &mut out, counts, dim, reduce_op)?;
        Ok(out)
    }

    /// FastVideo's `all_to_all_4D` on a 4-d tensor `[B, S, H, D]`.
    ///
    /// * `(2, 1)`: `[B, S/P, H, D] → [B, S, H/P, D]`; group rank `r` keeps heads
    ///   `[r·H/P, (r+1)·H/P)`, the sequence assembled in source-rank order.
    /// * `(1, 2)`: the inverse, `[B, S, H/P, D] → [B, S/P, H, D]`.
    ///
    /// Other dim pairs and a scattered dim not divisible by the group size are errors.
    fn all_to_all_4d(
        &self,
        t: &Self::Tensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<Self::Tensor> {
        let args = Args::all_to_all_4d(scatter_dim, gather_dim);
        let mut out = self.empty(output_shape(self, args, t), t.dtype())?;
        self.all_to_all_4d_into(t, &mut out, scatter_dim, gather_dim)?;
        Ok(out)
    }

    /// Receives a tensor of `shape` and `dtype` from group rank `src` (the
    /// previous member when `None`).
    fn recv(&self, shape: &[usize], dtype: DType, src: Option<usize>) -> Result<Self::Tensor> {
        let mut out = self.empty(shape.to_vec(), dtype)?;
        self.recv_into(&mut out, src)?;
        Ok(out)
    }
}

/// The output shape the allocating forms allocate; empty when the arguments
/// name none (the `_into` call then reports why, on every rank).
fn output_shape<'rt, C: Collectives<'rt> + ?Sized>(c: &C, args: Args, t: &C::Tensor) -> Vec<usize> {
    args.output_shape(t.shape(), c.group().size())
        .unwrap_or_default()
}
