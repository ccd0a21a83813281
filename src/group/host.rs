//! The host op list: [`Collectives`] for [`GroupCoordinator`] on host
//! [`Tensor`]s. Each op names its descriptor and moves bytes through the
//! group's [host executor](crate::exec::moves::HostMoves) (MPI, or
//! shared memory on one node); checks, output shapes
//! and errors come from the op's rules through the dispatch path. Packing
//! for non-leading dims uses the same `tensor::split` plans as the device plane,
//! into scratch buffers the group keeps (no allocation per call once warm).

use crate::agree::Descriptor;
use crate::dtype::DType;
use crate::error::{Error, Fault, Result};
use crate::exec::blocks::BlockLayout;
use crate::group::uneven::{all_to_all_v_desc, counted_desc, counts_found_here};
use crate::group::{tensor_desc, GroupCoordinator, Peer};
use crate::group::{Collectives, P2p};
use crate::op::normalize_dim;
use crate::op::ReduceOp;
use crate::op::{Args, Op};
use crate::tensor::split::{
    concat_dim_into, concat_uneven_copies, is_contiguous_split, split_dim_into, Copy2d,
};
use crate::tensor::{numel, Tensor};

impl<'rt> Collectives<'rt> for GroupCoordinator<'rt> {
    type Tensor = Tensor;

    fn group(&self) -> &GroupCoordinator<'rt> {
        self
    }

    fn empty(&self, shape: Vec<usize>, dtype: DType) -> Result<Tensor> {
        Tensor::zeros(shape, dtype)
    }

    fn copy_flat(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        let e = t.dtype().size();
        Tensor::from_bytes([len], t.dtype(), &t.bytes()[start * e..(start + len) * e])
    }

    fn barrier(&self) -> Result<()> {
        self.run_host_op(Descriptor::new(Op::Barrier, &[]), || {
            if self.size() > 1 {
                self.host_for(Op::Barrier, 0).barrier()?;
            }
            Ok(())
        })
    }

    fn all_reduce_into(&self, t: &Tensor, out: &mut Tensor, reduce_op: ReduceOp) -> Result<()> {
        self.run_host_op_into(tensor_desc(Args::all_reduce(reduce_op), t), out, |out| {
            if self.size() == 1 {
                // Every operator maps one value to itself (avg of one is the value).
                out.bytes_mut().copy_from_slice(t.bytes());
            } else {
                self.host_for(Op::AllReduce, t.nbytes())
                    .all_reduce_into(t, out, reduce_op)?;
            }
            Ok(())
        })
    }

    fn all_reduce_in_place(&self, t: &mut Tensor, reduce_op: ReduceOp) -> Result<()> {
        self.run_host_op(tensor_desc(Args::all_reduce(reduce_op), &*t), || {
            if self.size() == 1 {
                return Ok(());
            }
            let exec = self.host_for(Op::AllReduce, t.nbytes());
            exec.all_reduce_in_place(t, reduce_op, &mut self.scratch_tensor())
        })
    }

    fn reduce_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dst: usize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        self.run_host_op_into(tensor_desc(Args::reduce(dst, reduce_op), t), out, |out| {
            if self.size() == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else {
                self.host_for(Op::Reduce, t.nbytes())
                    .reduce_into_root(t, out, dst, reduce_op)?;
            }
            Ok(())
        })
    }

    fn all_gather_into(&self, t: &Tensor, out: &mut Tensor, dim: isize) -> Result<()> {
        let size = self.size();
        self.run_host_op_into(tensor_desc(Args::all_gather(dim), t), out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else {
                self.land_joined(t, d, out, |blocks| {
                    self.host_for(Op::AllGather, blocks.len())
                        .all_gather_into(t.bytes(), blocks)
                })?;
            }
            Ok(())
        })
    }

    fn gather_into(&self, t: &Tensor, out: &mut Tensor, dst: usize, dim: isize) -> Result<()> {
        let size = self.size();
        self.run_host_op_into(tensor_desc(Args::gather(dst, dim), t), out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
                return Ok(());
            }
            if self.rank_in_group() != dst {
                self.host_for(Op::Gather, t.nbytes())
                    .gather_into(t.bytes(), None, dst)?;
            } else {
                self.land_joined(t, d, out, |blocks| {
                    self.host_for(Op::Gather, t.nbytes())
                        .gather_into(t.bytes(), Some(blocks), dst)
                })?;
            }
            Ok(())
        })
    }

    fn scatter_into(&self, t: &Tensor, out: &mut Tensor, src: usize, dim: isize) -> Result<()> {
        let size = self.size();
        self.run_host_op_into(tensor_desc(Args::scatter(src, dim), t), out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else if self.rank_in_group() != src {
                self.host_for(Op::Scatter, out.nbytes())
                    .scatter(None, out.bytes_mut(), src)?;
            } else if is_contiguous_split(t.shape(), d) {
                self.host_for(Op::Scatter, out.nbytes()).scatter(
                    Some(t.bytes()),
                    out.bytes_mut(),
                    src,
                )?;
            } else {
                self.with_scratch(t.nbytes(), 0, |packed, _| {
                    split_dim_into(t.bytes(), t.shape(), d, size, t.dtype().size(), packed);
                    self.host_for(Op::Scatter, out.nbytes()).scatter(
                        Some(packed),
                        out.bytes_mut(),
                        src,
                    )
                })?;
            }
            Ok(())
        })
    }

    fn reduce_scatter_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        let size = self.size();
        let args = Args::reduce_scatter(dim, reduce_op);
        self.run_host_op_into(tensor_desc(args, t), out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else if is_contiguous_split(t.shape(), d) {
                self.host_for(Op::ReduceScatter, t.nbytes())
                    .reduce_scatter_block_into(t, out, reduce_op)?;
            } else {
                // Packed straight into a typed tensor: the reduction needs one.
                self.with_typed_scratch(t.dtype(), (t.numel(), 0), |packed, _| {
                    let elem = t.dtype().size();
                    split_dim_into(t.bytes(), t.shape(), d, size, elem, packed.bytes_mut());
                    self.host_for(Op::ReduceScatter, t.nbytes())
                        .reduce_scatter_block_into(packed, out, reduce_op)
                })??;
            }
            Ok(())
        })
    }

    fn broadcast(&self, t: &mut Tensor, src: usize) -> Result<()> {
        self.run_host_op(tensor_desc(Args::broadcast(src), &*t), || {
            if self.size() > 1 {
                self.host_for(Op::Broadcast, t.nbytes())
                    .broadcast(t.bytes_mut(), src)?;
            }
            Ok(())
        })
    }

    fn all_to_all_into(&self, t: &Tensor, out: &mut Tensor) -> Result<()> {
        self.run_host_op_into(tensor_desc(Args::bare(Op::AllToAll), t), out, |out| {
            if self.size() == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else {
                self.host_for(Op::AllToAll, t.nbytes())
                    .all_to_all_into(t.bytes(), out.bytes_mut())?;
            }
            Ok(())
        })
    }

    fn all_to_all_4d_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<()> {
        let size = self.size();
        let args = Args::all_to_all_4d(scatter_dim, gather_dim);
        self.run_host_op_into(tensor_desc(args, t), out, |out| {
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
                return Ok(());
            }
            let elem = t.dtype().size();
            let n = t.nbytes();
            // Straight from the input's blocks into the output's places.
            let send = BlockLayout::along(t.shape(), scatter_dim, size, elem);
            let recv = BlockLayout::along(out.shape(), gather_dim, size, elem);
            if self.host_for(Op::AllToAll4d, n).all_to_all_strided(
                t.bytes(),
                send,
                out.bytes_mut(),
                recv,
            )? {
                return Ok(());
            }
            self.with_scratch(n, n, |packed, received| {
                split_dim_into(t.bytes(), t.shape(), scatter_dim, size, elem, packed);
                self.host_for(Op::AllToAll4d, n)
                    .all_to_all_into(packed, received)?;
                let mut block_shape = t.shape().to_vec();
                block_shape[scatter_dim] /= size;
                concat_dim_into(
                    received,
                    &block_shape,
                    gather_dim,
                    size,
                    elem,
                    out.bytes_mut(),
                );
                Ok::<_, Fault>(())
            })?;
            Ok(())
        })
    }

    fn all_to_all_v_into(
        &self,
        t: &Tensor,
        send_counts: &[usize],
        out: &mut Tensor,
        recv_counts: &[usize],
    ) -> Result<()> {
        let (desc, problem) = all_to_all_v_desc(t, send_counts, &*out, recv_counts, self.size());
        let refused = self
            .run_host_op(desc, || {
                let row = numel(&t.shape()[1..]) * t.dtype().size();
                let counts = (send_counts, recv_counts);
                let buffers = (t.bytes(), out.bytes_mut());
                let links = match self.size() {
                    1 => {
                        let links = self.swap_counts(send_counts, recv_counts)?;
                        let (sent, got) = links.placed(counts, row);
                        buffers.1[got[0].clone()].copy_from_slice(&buffers.0[sent[0].clone()]);
                        links
                    }
                    _ => self
                        .host_for(Op::AllToAllV, t.nbytes())
                        .all_to_all_v(buffers, counts, row)?,
                };
                Ok(links.refused)
            })
            .map_err(|e| counts_found_here(e, &problem))?;
        match refused {
            Some(m) => Err(Error::mismatch(Op::AllToAllV, self.name(), m)),
            None => Ok(()),
        }
    }

    fn all_gather_v_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        counts: &[usize],
        dim: isize,
    ) -> Result<()> {
        let (size, me) = (self.size(), self.rank_in_group());
        let (desc, problem) = counted_desc(
            Args::counted(Op::AllGatherV, dim, counts, None),
            (t, &*out),
            (counts, dim),
            (me, size),
        );
        self.run_host_op_into(desc, out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            // Bytes of one slice along `d`, over every outer index.
            let (shape, elem) = (t.shape(), t.dtype().size());
            let slice = numel(&shape[..d]) * numel(&shape[d + 1..]) * elem;
            let lens: Vec<usize> = counts.iter().map(|n| n * slice).collect();
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
            } else if is_contiguous_split(t.shape(), d) {
                self.host_for(Op::AllGatherV, out.nbytes())
                    .all_gather_v_into(t.bytes(), &lens, out.bytes_mut())?;
            } else {
                self.with_scratch(out.nbytes(), 0, |blocks, _| {
                    self.host_for(Op::AllGatherV, blocks.len())
                        .all_gather_v_into(t.bytes(), &lens, blocks)?;
                    for c in concat_uneven_copies(out.shape(), d, counts, elem) {
                        c.apply(blocks, out.bytes_mut());
                    }
                    Ok::<_, Fault>(())
                })?;
            }
            Ok(())
        })
        .map_err(|e| counts_found_here(e, &problem))
    }

    /// Padded to equal blocks and run as the group's `reduce_scatter` (its
    /// executor and fast paths, as `host_for` routes a reduce_scatter of
    /// that size): member `r`'s block holds its `counts[r]` slices, then
    /// zeros up to the longest block, which no member keeps. This moves
    /// `size × longest` slices where `MPI_Reduce_scatter` moves their sum;
    /// the bench's baseline is that call.
    fn reduce_scatter_v_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        counts: &[usize],
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        let (size, me) = (self.size(), self.rank_in_group());
        let args = Args::counted(Op::ReduceScatterV, dim, counts, Some(reduce_op));
        let (desc, problem) = counted_desc(args, (t, &*out), (counts, dim), (me, size));
        self.run_host_op_into(desc, out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            let (shape, dtype) = (t.shape(), t.dtype());
            if size == 1 {
                out.bytes_mut().copy_from_slice(t.bytes());
                return Ok(());
            }
            let slice = numel(&shape[..d]) * numel(&shape[d + 1..]);
            let longest = counts.iter().max().copied().unwrap_or(0) * slice;
            let even = counts.iter().all(|n| *n == counts[0]);
            if even && is_contiguous_split(shape, d) {
                return self
                    .host_for(Op::ReduceScatter, t.nbytes())
                    .reduce_scatter_block_into(t, out, reduce_op);
            }
            let e = dtype.size();
            let direct = out.numel() == longest;
            let kept = if direct { 0 } else { longest };
            self.with_typed_scratch(dtype, (size * longest, kept), |padded, mine| {
                let plan = concat_uneven_copies(shape, d, counts, e);
                for (r, (c, n)) in plan.iter().zip(counts).enumerate() {
                    let block = r * longest * e;
                    Copy2d {
                        dst_offset: block,
                        ..c.reversed()
                    }
                    .apply(t.bytes(), padded.bytes_mut());
                    // The padding is reduced and dropped: zeros, not what the
                    // last call left.
                    padded.bytes_mut()[block + n * slice * e..block + longest * e].fill(0);
                }
                let exec = self.host_for(Op::ReduceScatter, padded.nbytes());
                if direct {
                    return exec.reduce_scatter_block_into(padded, out, reduce_op);
                }
                exec.reduce_scatter_block_into(padded, mine, reduce_op)?;
                let kept = out.nbytes();
                out.bytes_mut().copy_from_slice(&mine.bytes()[..kept]);
                Ok(())
            })?
        })
        .map_err(|e| counts_found_here(e, &problem))
    }

    /// Synchronous: returns once the receiver has matched the call and taken
    /// the data, so a program never depends on MPI's eager buffering.
    fn send(&self, t: &Tensor, dst: Option<usize>) -> Result<()> {
        let (dst, _) = self.ring_peers(dst, None);
        self.point_to_point(tensor_desc(Args::bare(Op::Send), t), Peer::To(dst), |_| {
            self.mpi().send(t.bytes(), dst);
            Ok(())
        })
    }

    fn recv_into(&self, out: &mut Tensor, src: Option<usize>) -> Result<()> {
        let (_, src) = self.ring_peers(None, src);
        self.point_to_point(
            tensor_desc(Args::bare(Op::Send), &*out),
            Peer::From(src),
            |_| self.mpi().recv(out.bytes_mut(), src),
        )
    }

    fn batch_send_recv(&self, ops: &mut [P2p<'_, Tensor>]) -> Result<()> {
        let pairs: Vec<(Descriptor, Peer)> = ops
            .iter()
            .map(|o| {
                let (t, peer) = o.parts();
                let desc = tensor_desc(Args::bare(Op::BatchSendRecv), t);
                match o {
                    P2p::Send(..) => (desc, Peer::To(peer)),
                    P2p::Recv(..) => (desc, Peer::From(peer)),
                }
            })
            .collect();
        self.exchange_batch(&pairs, |agreed| {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for (o, ok) in ops.iter_mut().zip(agreed) {
                match o {
                    P2p::Send(t, dst) if *ok => sends.push((t.bytes(), *dst)),
                    P2p::Recv(t, src) if *ok => recvs.push((t.bytes_mut(), *src)),
                    _ => {}
                }
            }
            self.mpi().send_recv_batch(&sends, &mut recvs)
        })
    }

    fn send_recv_into(
        &self,
        t: &Tensor,
        out: &mut Tensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()> {
        let (dst, src) = self.ring_peers(dst, src);
        let sent = tensor_desc(Args::bare(Op::Send), t);
        let expected = tensor_desc(Args::bare(Op::Send), &*out);
        if self.send_recv_to_self(&sent, &expected, dst, src)? {
            out.bytes_mut().copy_from_slice(t.bytes());
            return Ok(());
        }
        self.exchange(sent, dst, expected, src, |send_ok, recv_ok| {
            let send = send_ok.then(|| t.bytes());
            let recv = if recv_ok { Some(out.bytes_mut()) } else { None };
            self.mpi().send_recv(send, dst, recv, src)
        })
    }
}

impl GroupCoordinator<'_> {
    /// Calls in for a call this rank refused on its own arguments before it
    /// could say which call it was (a binding's own checks): each member's
    /// matching call fails naming this rank, instead of waiting for it. The
    /// same error comes back here; the caller reports its own reason.
    pub fn refuse_here(&self) -> Result<()> {
        self.run_host_op(Descriptor::refused_here(), || Ok(()))
    }

    /// Lands every member's `t`, joined along dim `d`, in `out`: `gather`
    /// writes the members' blocks in rank order, straight into `out` where
    /// blocks along `d` are contiguous in it, else into scratch that is
    /// then joined along `d` (an all-gather's, and a gather's root's).
    fn land_joined(
        &self,
        t: &Tensor,
        d: usize,
        out: &mut Tensor,
        gather: impl FnOnce(&mut [u8]) -> Result<(), Fault>,
    ) -> Result<(), Fault> {
        if is_contiguous_split(t.shape(), d) {
            return gather(out.bytes_mut());
        }
        self.with_scratch(out.nbytes(), 0, |blocks, _| {
            gather(blocks)?;
            let elem = t.dtype().size();
            concat_dim_into(blocks, t.shape(), d, self.size(), elem, out.bytes_mut());
            Ok(())
        })
    }

    /// `(dst, src)` of a send/receive pair, defaulting to the next and the
    /// previous member.
    pub(crate) fn ring_peers(&self, dst: Option<usize>, src: Option<usize>) -> (usize, usize) {
        let (me, n) = (self.rank_in_group(), self.size());
        (dst.unwrap_or((me + 1) % n), src.unwrap_or((me + n - 1) % n))
    }

    /// Whether a send/receive pair is a local copy (both peers this rank,
    /// after checking the two sides agree); an error when only one is.
    pub(crate) fn send_recv_to_self(
        &self,
        sent: &Descriptor,
        expected: &Descriptor,
        dst: usize,
        src: usize,
    ) -> Result<bool> {
        let me = self.rank_in_group();
        if dst != me && src != me {
            return Ok(false);
        }
        if dst != src {
            return Err(Error::invalid(
                Op::SendRecv,
                self.name(),
                "dst and src must both be this rank or both another",
            ));
        }
        crate::agree::agree_peers(sent, expected, me, me)
            .map_err(|m| Error::mismatch(Op::SendRecv, self.name(), m))?;
        Ok(true)
    }
}
