//! Batched point-to-point moves: a list of tensors sent, received or
//! broadcast in one go on either plane (the host plane through MPI, the
//! device plane in one NCCL group).

use super::{Collectives, GroupCoordinator};
use crate::error::Result;
use crate::op::Op;
use crate::tensor::Tensor;

/// Moving a list of tensors point to point in one go, for a dictionary
/// whose metadata the two ends already agreed on (it came with the
/// checked object message, so no header per tensor). Sealed: only the
/// planes implement it.
pub trait Batch<'rt>: Collectives<'rt> {
    /// Posts every tensor to `dst`, then waits once.
    fn send_batch(&self, ts: &[&Self::Tensor], dst: usize) -> Result<()>;
    /// Posts every receive from `src`, then waits once.
    fn recv_batch(&self, outs: &mut [&mut Self::Tensor], src: usize) -> Result<()>;
    /// Broadcasts every tensor from group rank `src` at once, then waits once.
    fn broadcast_batch(&self, ts: &mut [&mut Self::Tensor], src: usize) -> Result<()>;
}

/// Host tensors of any dictionary move through the group's MPI plane.
pub(crate) fn send_host(g: &GroupCoordinator<'_>, ts: &[&Tensor], dst: usize) -> Result<()> {
    let call = g.watched_with(Op::Send, dst);
    call.run(Op::Send, g.name(), || {
        let bufs: Vec<&[u8]> = ts.iter().map(|t| t.bytes()).collect();
        g.mpi().send_batch(&bufs, dst);
        Ok(())
    })
}

/// The receiving side of [`send_host`].
pub(crate) fn recv_host(
    g: &GroupCoordinator<'_>,
    outs: &mut [&mut Tensor],
    src: usize,
) -> Result<()> {
    let call = g.watched_with(Op::Send, src);
    call.run(Op::Send, g.name(), || {
        let mut bufs: Vec<&mut [u8]> = outs.iter_mut().map(|t| t.bytes_mut()).collect();
        let moved = g.mpi().recv_batch(&mut bufs, src);
        moved.map_err(|f| f.into_error(Op::Send, g.name()))
    })
}

/// Host tensors of a broadcast dictionary, through the group's MPI plane.
pub(crate) fn broadcast_host(
    g: &GroupCoordinator<'_>,
    ts: &mut [&mut Tensor],
    src: usize,
) -> Result<()> {
    let call = g.watched(Op::Broadcast);
    call.run(Op::Broadcast, g.name(), || {
        let mut bufs: Vec<&mut [u8]> = ts.iter_mut().map(|t| t.bytes_mut()).collect();
        g.mpi().broadcast_batch(&mut bufs, src);
        Ok(())
    })
}

impl<'rt> Batch<'rt> for GroupCoordinator<'rt> {
    fn send_batch(&self, ts: &[&Tensor], dst: usize) -> Result<()> {
        send_host(self, ts, dst)
    }
    fn recv_batch(&self, outs: &mut [&mut Tensor], src: usize) -> Result<()> {
        recv_host(self, outs, src)
    }
    fn broadcast_batch(&self, ts: &mut [&mut Tensor], src: usize) -> Result<()> {
        broadcast_host(self, ts, src)
    }
}
