//! Tensor collectives and point-to-point transfers on a group (host data plane).
//!
//! Each call builds its descriptor, lets the dispatch path agree on it across
//! the group, then moves bytes. Results are new tensors (out-of-place), except
//! `broadcast`, which fills the caller's tensor as FastVideo's does.

use crate::dispatch::{dim_in_range, rank_in_range, Descriptor, Op};
use crate::error::Result;
use crate::group::{GroupCoordinator, Peer};
use crate::layout_ops::{concat_dim, split_dim};
use crate::reduce::ReduceOp;
use crate::tensor::{DType, Tensor};

/// The two FastVideo all-to-all modes `(scatter_dim, gather_dim)`.
const ALL_TO_ALL_MODES: [(i64, i64); 2] = [(2, 1), (1, 2)];

impl GroupCoordinator<'_> {
    /// Element-wise reduction of every member's tensor (same shape and dtype
    /// everywhere); the result on every member.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let desc = Descriptor::of(Op::AllReduce, t, &[op.code()]);
        self.collective(
            desc,
            |_| Ok(()),
            |_| {
                Ok(if self.size() == 1 {
                    // A group of one still applies the operator's identity rules:
                    // avg of one value is the value, as are sum/prod/min/max.
                    t.clone()
                } else {
                    self.plane().all_reduce(t, op)
                })
            },
        )
    }

    /// Concatenation of every member's tensor along `dim` (negative counts from
    /// the end), in group-rank order; the result on every member.
    pub fn all_gather(&self, t: &Tensor, dim: isize) -> Result<Tensor> {
        let desc = Descriptor::of(Op::AllGather, t, &[dim as i64]);
        self.collective(
            desc,
            |d| dim_in_range(d, d.params[0]).map(|_| ()),
            |_| {
                let d =
                    crate::layout_ops::normalize_dim(dim, t.ndim()).expect("checked by dispatch");
                if self.size() == 1 {
                    return Ok(t.clone());
                }
                let blocks = self.plane().all_gather(t.bytes());
                Ok(self.concat(t, &blocks, d))
            },
        )
    }

    /// Like [`all_gather`](Self::all_gather) but the result only on group rank
    /// `dst` (`Some`); `None` on the others.
    pub fn gather(&self, t: &Tensor, dst: usize, dim: isize) -> Result<Option<Tensor>> {
        let desc = Descriptor::of(Op::Gather, t, &[dst as i64, dim as i64]);
        let size = self.size();
        let check = |d: &Descriptor| {
            rank_in_range("dst", d.params[0], size)?;
            dim_in_range(d, d.params[1]).map(|_| ())
        };
        self.collective(desc, check, |_| {
            let d = crate::layout_ops::normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                return Ok(Some(t.clone()));
            }
            Ok(self
                .plane()
                .gather(t.bytes(), dst)
                .map(|blocks| self.concat(t, &blocks, d)))
        })
    }

    /// Reduces every member's tensor with `op` and leaves slice `r` (of `size`
    /// equal slices along `dim`) on group rank `r`. The adjoint of `all_gather`.
    pub fn reduce_scatter(&self, t: &Tensor, dim: isize, op: ReduceOp) -> Result<Tensor> {
        let desc = Descriptor::of(Op::ReduceScatter, t, &[dim as i64, op.code()]);
        let size = self.size();
        let check = |d: &Descriptor| {
            let k = dim_in_range(d, d.params[0])?;
            let n = d.shape()[k];
            if n % size != 0 {
                return Err(format!(
                    "dim {} of size {n} is not divisible by the group size {size}",
                    d.params[0]
                ));
            }
            Ok(())
        };
        self.collective(desc, check, |_| {
            let d = crate::layout_ops::normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                return Ok(t.clone());
            }
            let mut out_shape = t.shape().to_vec();
            out_shape[d] /= size;
            let packed = split_dim(t.bytes(), t.shape(), d, size, t.dtype().size());
            let packed = Tensor::from_bytes(t.shape().to_vec(), t.dtype(), &packed)?;
            Ok(self.plane().reduce_scatter_block(&packed, op, &out_shape))
        })
    }

    /// Copies group rank `src`'s tensor into `t` on every member (all members
    /// pass a tensor of the same shape and dtype).
    pub fn broadcast(&self, t: &mut Tensor, src: usize) -> Result<()> {
        let desc = Descriptor::of(Op::Broadcast, t, &[src as i64]);
        let size = self.size();
        self.collective(
            desc,
            |d| rank_in_range("src", d.params[0], size).map(|_| ()),
            |_| {
                if size > 1 {
                    self.plane().broadcast(t.bytes_mut(), src);
                }
                Ok(())
            },
        )
    }

    /// FastVideo's `all_to_all_4D` on a 4-d tensor `[B, S, H, D]`.
    ///
    /// * `(2, 1)`: `[B, S/P, H, D] → [B, S, H/P, D]`; group rank `r` keeps heads
    ///   `[r·H/P, (r+1)·H/P)`, the sequence assembled in source-rank order.
    /// * `(1, 2)`: the inverse, `[B, S, H/P, D] → [B, S/P, H, D]`.
    ///
    /// Other dim pairs and a scattered dim not divisible by the group size are errors.
    pub fn all_to_all_4d(
        &self,
        t: &Tensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<Tensor> {
        let desc = Descriptor::of(Op::AllToAll4d, t, &[scatter_dim as i64, gather_dim as i64]);
        let size = self.size();
        let check = |d: &Descriptor| {
            if d.ndim() != 4 {
                return Err(format!("expects a 4-d tensor, got shape {:?}", d.shape()));
            }
            let mode = (d.params[0], d.params[1]);
            if !ALL_TO_ALL_MODES.contains(&mode) {
                return Err(format!(
                    "(scatter_dim, gather_dim) = {mode:?} is not supported; use (2, 1) or (1, 2)"
                ));
            }
            let n = d.shape()[d.params[0] as usize];
            if n % size != 0 {
                return Err(format!(
                    "scatter dim {} of size {n} is not divisible by the group size {size}",
                    d.params[0]
                ));
            }
            Ok(())
        };
        self.collective(desc, check, |_| {
            if size == 1 {
                return Ok(t.clone());
            }
            let elem = t.dtype().size();
            let packed = split_dim(t.bytes(), t.shape(), scatter_dim, size, elem);
            let received = self.plane().all_to_all(&packed);
            let mut block_shape = t.shape().to_vec();
            block_shape[scatter_dim] /= size;
            let mut out_shape = block_shape.clone();
            out_shape[gather_dim] *= size;
            let bytes = concat_dim(&received, &block_shape, gather_dim, size, elem);
            Tensor::from_bytes(out_shape, t.dtype(), &bytes)
        })
    }

    /// Sends `t` to group rank `dst` (the next member when `None`).
    ///
    /// Synchronous: returns once the receiver has matched the call and taken
    /// the data, so a program never depends on MPI's eager buffering. Shape or
    /// dtype disagreement with the receiver is an error on both sides. For an
    /// exchange in a ring, order the calls (even ranks send first) or use a
    /// collective.
    pub fn send(&self, t: &Tensor, dst: Option<usize>) -> Result<()> {
        let dst = dst.unwrap_or((self.rank_in_group() + 1) % self.size());
        self.point_to_point(Descriptor::of(Op::Send, t, &[]), Peer::To(dst), |_| {
            self.plane().send(t.bytes(), dst);
            Ok(())
        })
    }

    /// Receives a tensor of `shape` and `dtype` from group rank `src` (the
    /// previous member when `None`).
    pub fn recv(&self, shape: &[usize], dtype: DType, src: Option<usize>) -> Result<Tensor> {
        let src = src.unwrap_or((self.rank_in_group() + self.size() - 1) % self.size());
        let desc = Descriptor::for_tensor(Op::Send, dtype, shape, &[]);
        self.point_to_point(desc, Peer::From(src), |_| {
            let mut t = Tensor::zeros(shape.to_vec(), dtype);
            self.plane().recv(t.bytes_mut(), src);
            Ok(t)
        })
    }

    /// Concatenates `size` gathered blocks shaped like `t` along `dim`.
    fn concat(&self, t: &Tensor, blocks: &[u8], dim: usize) -> Tensor {
        let mut out_shape = t.shape().to_vec();
        out_shape[dim] *= self.size();
        let bytes = concat_dim(blocks, t.shape(), dim, self.size(), t.dtype().size());
        Tensor::from_bytes(out_shape, t.dtype(), &bytes)
            .expect("sizes follow from the agreed shape")
    }
}
