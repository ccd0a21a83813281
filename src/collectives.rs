//! Tensor collectives and point-to-point transfers on a group (host data plane).
//!
//! Each call builds its descriptor, lets the dispatch path agree on it across
//! the group, then moves bytes. Every collective has an `_into` form that
//! writes a caller-owned output (no allocation in a hot loop) and an
//! out-of-place form that allocates it; `broadcast` works in place, as
//! FastVideo's does. An output of the wrong shape or dtype is an error on
//! every rank.

use crate::dispatch::{dim_in_range, rank_in_range, Descriptor, Op};
use crate::error::{Error, Result};
use crate::group::{GroupCoordinator, Peer};
use crate::layout_ops::{
    concat_dim_into, is_contiguous_split, normalize_dim, split_dim, split_dim_into,
};
use crate::reduce::ReduceOp;
use crate::tensor::{DType, Tensor};

/// The two FastVideo all-to-all modes `(scatter_dim, gather_dim)`.
const ALL_TO_ALL_MODES: [(i64, i64); 2] = [(2, 1), (1, 2)];

/// `shape` with dimension `dim` multiplied (`mul`) or divided by `factor`.
pub(crate) fn scaled(shape: &[usize], dim: usize, factor: usize, mul: bool) -> Vec<usize> {
    let mut s = shape.to_vec();
    if mul {
        s[dim] *= factor;
    } else {
        s[dim] /= factor;
    }
    s
}

/// Output shape of a dim-scaling collective: `t`'s shape with `dim` multiplied
/// (`mul`) or divided by `factor`; `None` when `dim` is out of range.
fn output_shape(t: &Tensor, dim: isize, factor: usize, mul: bool) -> Option<Vec<usize>> {
    normalize_dim(dim, t.ndim()).map(|d| scaled(t.shape(), d, factor, mul))
}

/// Concatenates `parts` gathered blocks shaped like `t` along `dim` into `out`.
fn concat_blocks(t: &Tensor, blocks: &[u8], dim: usize, parts: usize, out: &mut Tensor) {
    concat_dim_into(
        blocks,
        t.shape(),
        dim,
        parts,
        t.dtype().size(),
        out.bytes_mut(),
    );
}

/// Whether `out` has `dtype` and `shape`.
fn fits(out: &Tensor, dtype: DType, shape: &[usize]) -> bool {
    out.dtype() == dtype && out.shape() == shape
}

pub(crate) fn divisible(
    d: &Descriptor,
    dim: usize,
    size: usize,
    what: &str,
) -> std::result::Result<(), String> {
    let n = d.shape()[dim];
    if n % size != 0 {
        return Err(format!(
            "{what} {dim} of size {n} is not divisible by the group size {size}"
        ));
    }
    Ok(())
}

/// The rules of `all_to_all_4d` (both planes): a 4-d tensor, one of
/// FastVideo's two modes, the scattered dim divisible by the group size.
pub(crate) fn check_all_to_all_4d(d: &Descriptor, size: usize) -> std::result::Result<(), String> {
    if d.ndim() != 4 {
        return Err(format!("expects a 4-d tensor, got shape {:?}", d.shape()));
    }
    let mode = (d.params[0], d.params[1]);
    if !ALL_TO_ALL_MODES.contains(&mode) {
        return Err(format!(
            "(scatter_dim, gather_dim) = {mode:?} is not supported; use (2, 1) or (1, 2)"
        ));
    }
    divisible(d, d.params[0] as usize, size, "scatter dim")
}

/// Adds this rank's output and the expected one to an output error (both
/// planes), when this rank's output is the one that does not fit.
pub(crate) fn explain_output(
    e: Error,
    out: (&[usize], DType),
    dtype: DType,
    shape: &[usize],
) -> Error {
    match e {
        Error::Collective { op, group, msg } if out != (shape, dtype) => Error::Collective {
            op,
            group,
            msg: format!(
                "{msg} (this rank: output is {:?} {}, expected {shape:?} {dtype})",
                out.0, out.1
            ),
        },
        e => e,
    }
}

impl GroupCoordinator<'_> {
    fn explain_output(&self, e: Error, out: &Tensor, dtype: DType, shape: &[usize]) -> Error {
        explain_output(e, (out.shape(), out.dtype()), dtype, shape)
    }

    /// Element-wise reduction of every member's tensor (same shape and dtype
    /// everywhere); the result on every member.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let mut out = Tensor::zeros(t.shape().to_vec(), t.dtype());
        self.all_reduce_into(t, &mut out, op)?;
        Ok(out)
    }

    /// [`all_reduce`](Self::all_reduce) into `out` (same shape and dtype as `t`).
    pub fn all_reduce_into(&self, t: &Tensor, out: &mut Tensor, op: ReduceOp) -> Result<()> {
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::of(Op::AllReduce, t, &[op.code()]).with_bad_output(!ok);
        self.collective(
            desc,
            |_| Ok(()),
            |_| {
                if self.size() == 1 {
                    // Every operator maps one value to itself (avg of one is the value).
                    out.bytes_mut().copy_from_slice(t.bytes());
                } else {
                    self.plane().all_reduce_into(t, out, op);
                }
                Ok(())
            },
        )
        .map_err(|e| self.explain_output(e, out, t.dtype(), t.shape()))
    }

    /// Element-wise reduction onto group rank `dst` (`Some` there, `None` elsewhere).
    pub fn reduce(&self, t: &Tensor, dst: usize, op: ReduceOp) -> Result<Option<Tensor>> {
        let mut out = Tensor::zeros(t.shape().to_vec(), t.dtype());
        self.reduce_into(t, &mut out, dst, op)?;
        Ok((self.rank_in_group() == dst).then_some(out))
    }

    /// [`reduce`](Self::reduce) into `out` (same shape and dtype as `t` on
    /// every rank; written on `dst` only).
    pub fn reduce_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dst: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::of(Op::Reduce, t, &[dst as i64, op.code()]).with_bad_output(!ok);
        let size = self.size();
        self.collective(
            desc,
            |d| rank_in_range("dst", d.params[0], size).map(|_| ()),
            |_| {
                if size == 1 {
                    out.bytes_mut().copy_from_slice(t.bytes());
                } else {
                    self.plane().reduce_into_root(t, out, dst, op);
                }
                Ok(())
            },
        )
        .map_err(|e| self.explain_output(e, out, t.dtype(), t.shape()))
    }

    /// Concatenation of every member's tensor along `dim` (negative counts from
    /// the end), in group-rank order; the result on every member.
    pub fn all_gather(&self, t: &Tensor, dim: isize) -> Result<Tensor> {
        // A bad dim still calls in, so every rank learns about it together.
        let shape = output_shape(t, dim, self.size(), true).unwrap_or_default();
        let mut out = Tensor::zeros(shape, t.dtype());
        self.all_gather_into(t, &mut out, dim)?;
        Ok(out)
    }

    /// [`all_gather`](Self::all_gather) into `out`.
    pub fn all_gather_into(&self, t: &Tensor, out: &mut Tensor, dim: isize) -> Result<()> {
        let size = self.size();
        let d = normalize_dim(dim, t.ndim());
        let want = output_shape(t, dim, size, true);
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc =
            Descriptor::of(Op::AllGather, t, &[dim as i64]).with_bad_output(d.is_some() && !ok);
        self.collective(
            desc,
            |d| dim_in_range(d, d.params[0]).map(|_| ()),
            |_| {
                let d = d.expect("checked by dispatch");
                if size == 1 {
                    out.bytes_mut().copy_from_slice(t.bytes());
                } else if is_contiguous_split(t.shape(), d) {
                    self.plane().all_gather_into(t.bytes(), out.bytes_mut());
                } else {
                    let mut blocks = vec![0u8; out.nbytes()];
                    self.plane().all_gather_into(t.bytes(), &mut blocks);
                    concat_blocks(t, &blocks, d, size, out);
                }
                Ok(())
            },
        )
        .map_err(|e| match &want {
            Some(w) => self.explain_output(e, out, t.dtype(), w),
            None => e,
        })
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
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                return Ok(Some(t.clone()));
            }
            let Some(blocks) = self.plane().gather(t.bytes(), dst) else {
                return Ok(None);
            };
            let mut out = Tensor::zeros(scaled(t.shape(), d, size, true), t.dtype());
            concat_blocks(t, &blocks, d, size, &mut out);
            Ok(Some(out))
        })
    }

    /// Reduces every member's tensor with `op` and leaves slice `r` (of `size`
    /// equal slices along `dim`) on group rank `r`. The adjoint of `all_gather`.
    pub fn reduce_scatter(&self, t: &Tensor, dim: isize, op: ReduceOp) -> Result<Tensor> {
        let shape = output_shape(t, dim, self.size(), false).unwrap_or_default();
        let mut out = Tensor::zeros(shape, t.dtype());
        self.reduce_scatter_into(t, &mut out, dim, op)?;
        Ok(out)
    }

    /// [`reduce_scatter`](Self::reduce_scatter) into `out`.
    pub fn reduce_scatter_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dim: isize,
        op: ReduceOp,
    ) -> Result<()> {
        let size = self.size();
        let d = normalize_dim(dim, t.ndim());
        let want = output_shape(t, dim, size, false);
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc = Descriptor::of(Op::ReduceScatter, t, &[dim as i64, op.code()])
            .with_bad_output(d.is_some() && !ok);
        let check = |d: &Descriptor| {
            let k = dim_in_range(d, d.params[0])?;
            divisible(d, k, size, "dim")
        };
        self.collective(desc, check, |_| {
            let d = d.expect("checked by dispatch");
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else if is_contiguous_split(t.shape(), d) {
                self.plane().reduce_scatter_block_into(t, out, op);
            } else {
                let packed = split_dim(t.bytes(), t.shape(), d, size, t.dtype().size());
                let packed = Tensor::from_bytes(t.shape().to_vec(), t.dtype(), &packed)?;
                self.plane().reduce_scatter_block_into(&packed, out, op);
            }
            Ok(())
        })
        .map_err(|e| match &want {
            Some(w) => self.explain_output(e, out, t.dtype(), w),
            None => e,
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

    /// Splits dim 0 of `t` into `size` equal blocks and sends block `r` to group
    /// rank `r`; the result holds the received blocks in source order (same
    /// shape as `t`). nccl-tests' `alltoall`.
    pub fn all_to_all(&self, t: &Tensor) -> Result<Tensor> {
        let mut out = Tensor::zeros(t.shape().to_vec(), t.dtype());
        self.all_to_all_into(t, &mut out)?;
        Ok(out)
    }

    /// [`all_to_all`](Self::all_to_all) into `out` (same shape and dtype as `t`).
    pub fn all_to_all_into(&self, t: &Tensor, out: &mut Tensor) -> Result<()> {
        let size = self.size();
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::of(Op::AllToAll, t, &[]).with_bad_output(!ok);
        let check = |d: &Descriptor| {
            if d.ndim() == 0 {
                return Err("expects a tensor with at least one dimension".into());
            }
            divisible(d, 0, size, "dim")
        };
        self.collective(desc, check, |_| {
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else {
                self.plane().all_to_all_into(t.bytes(), out.bytes_mut());
            }
            Ok(())
        })
        .map_err(|e| self.explain_output(e, out, t.dtype(), t.shape()))
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
        self.collective(
            desc,
            |d| check_all_to_all_4d(d, size),
            |_| {
                if size == 1 {
                    return Ok(t.clone());
                }
                let elem = t.dtype().size();
                let mut packed = vec![0u8; t.nbytes()];
                split_dim_into(t.bytes(), t.shape(), scatter_dim, size, elem, &mut packed);
                let mut received = vec![0u8; t.nbytes()];
                self.plane().all_to_all_into(&packed, &mut received);
                let block_shape = scaled(t.shape(), scatter_dim, size, false);
                let mut out =
                    Tensor::zeros(scaled(&block_shape, gather_dim, size, true), t.dtype());
                concat_dim_into(
                    &received,
                    &block_shape,
                    gather_dim,
                    size,
                    elem,
                    out.bytes_mut(),
                );
                Ok(out)
            },
        )
    }

    /// Sends `t` to group rank `dst` (the next member when `None`).
    ///
    /// Synchronous: returns once the receiver has matched the call and taken
    /// the data, so a program never depends on MPI's eager buffering. Shape or
    /// dtype disagreement with the receiver is an error on both sides. For a
    /// ring, use [`send_recv_into`](Self::send_recv_into).
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

    /// Sends `t` to `dst` while receiving `out` from `src` (defaults: next and
    /// previous member), deadlock-free in a ring. `out`'s shape and dtype are
    /// what this rank expects from `src`; each link is checked by both ends.
    /// `dst == src == self` copies locally.
    pub fn send_recv_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()> {
        let me = self.rank_in_group();
        let dst = dst.unwrap_or((me + 1) % self.size());
        let src = src.unwrap_or((me + self.size() - 1) % self.size());
        let sent = Descriptor::of(Op::Send, t, &[]);
        let expected = Descriptor::of(Op::Send, out, &[]);
        if dst == me || src == me {
            if dst != src {
                return Err(Error::collective(
                    "send_recv",
                    self.name(),
                    "dst and src must both be this rank or both another",
                ));
            }
            crate::dispatch::agree_peers(&sent, &expected, me, me)
                .map_err(|m| Error::collective("send_recv", self.name(), m))?;
            out.bytes_mut().copy_from_slice(t.bytes());
            return Ok(());
        }
        self.exchange(sent, dst, expected, src, |send_ok, recv_ok| {
            let send = send_ok.then(|| t.bytes());
            let recv = if recv_ok { Some(out.bytes_mut()) } else { None };
            self.plane().send_recv(send, dst, recv, src);
        })
    }
}
