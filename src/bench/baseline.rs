//! The raw baselines `rankmesh bench` times beside each entry, per op in one
//! place. Each is the same data movement as direct MPI calls on the group's
//! communicator (host plane) and as direct NCCL calls on its NCCL
//! communicator and stream (device plane).

use super::entries::Split;
use super::BenchConfig;
use crate::dtype::DType;
use crate::error::{NcclError, Result};
use crate::exec::mpi::displacements;
use crate::nccl::comm::{Communicator as NcclComm, Rooted};
use crate::op::Op;
use crate::op::ReduceOp;
use crate::tensor::{HostSlice, HostSliceMut, Tensor};
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::os::raw::c_void;

/// An enqueued NCCL baseline, or why NCCL refused it.
type Enqueued = std::result::Result<(), NcclError>;

/// The op of `cfg` as direct MPI calls on `comm`. `Ok(false)` where MPI has
/// no equivalent (16-bit float reductions, `avg`, the ops without a row here).
pub(super) fn host(
    cfg: &BenchConfig,
    comm: &SimpleCommunicator,
    input: &Tensor,
    output: &mut Tensor,
    split: &Split,
) -> Result<bool> {
    let (n, me) = (comm.size(), comm.rank());
    let root = cfg.root;
    let root_proc = comm.process_at_rank(root as i32);
    // Zero elements: nothing moves (and MPI reads two empty Rust buffers as aliased).
    if input.numel() == 0 && output.numel() == 0 {
        return Ok(true);
    }
    let is_root = me as usize == root;
    match cfg.op.op {
        Op::AllGather => comm.all_gather_into(input.bytes(), output.bytes_mut()),
        Op::Broadcast | Op::BroadcastObject => root_proc.broadcast_into(output.bytes_mut()),
        Op::Gather if is_root => root_proc.gather_into_root(input.bytes(), output.bytes_mut()),
        Op::Gather => root_proc.gather_into(input.bytes()),
        Op::Scatter if is_root => root_proc.scatter_into_root(input.bytes(), output.bytes_mut()),
        Op::Scatter => root_proc.scatter_into(output.bytes_mut()),
        Op::AllToAll | Op::AllToAll4d => comm.all_to_all_into(input.bytes(), output.bytes_mut()),
        // MPI_Alltoallv / MPI_Allgatherv, counts and displacements in
        // elements of the dtype's size.
        Op::AllToAllV | Op::AllGatherV => {
            let elem = input.dtype().size();
            let ints = |c: &[usize]| -> Vec<i32> { c.iter().map(|n| (n * elem) as i32).collect() };
            let (sc, rc) = (ints(&split.send), ints(&split.recv));
            let (sd, rd) = (displacements(&sc), displacements(&rc));
            let mut recv = PartitionMut::new(output.bytes_mut(), &rc[..], &rd[..]);
            if cfg.op.op == Op::AllToAllV {
                let send = Partition::new(input.bytes(), &sc[..], &sd[..]);
                comm.all_to_all_varcount_into(&send, &mut recv);
            } else {
                comm.all_gather_varcount_into(input.bytes(), &mut recv);
            }
        }
        Op::SendRecv => {
            let next = comm.process_at_rank((me + 1) % n);
            let prev = comm.process_at_rank((me + n - 1) % n);
            mpi::point_to_point::send_receive_into(input.bytes(), &next, output.bytes_mut(), &prev);
        }
        Op::AllReduce | Op::ReduceScatter | Op::Reduce | Op::ReduceScatterV => {
            return Ok(mpi_reduction(cfg, comm, input, output, split));
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The reductions as direct MPI calls, typed (MPI reduces elements, not
/// bytes); `false` where MPI has no such operator or type.
fn mpi_reduction(
    cfg: &BenchConfig,
    comm: &SimpleCommunicator,
    input: &Tensor,
    output: &mut Tensor,
    split: &Split,
) -> bool {
    let sys = match cfg.redop {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Avg => return false,
    };
    let root_proc = comm.process_at_rank(cfg.root as i32);
    let is_root = comm.rank() as usize == cfg.root;
    let op = cfg.op.op;
    macro_rules! typed {
        ($i:expr, $o:expr) => {
            match op {
                Op::AllReduce => comm.all_reduce_into($i, &mut *$o, &sys),
                Op::ReduceScatter => comm.reduce_scatter_block_into($i, &mut *$o, &sys),
                Op::ReduceScatterV => reduce_scatter(comm, $i, &mut *$o, &split.send, &sys),
                _ if is_root => root_proc.reduce_into_root($i, &mut *$o, &sys),
                _ => root_proc.reduce_into($i, &sys),
            }
        };
    }
    match (input.data(), output.data_mut()) {
        (HostSlice::F32(i), HostSliceMut::F32(o)) => typed!(i, o),
        (HostSlice::F64(i), HostSliceMut::F64(o)) => typed!(i, o),
        (HostSlice::I8(i), HostSliceMut::I8(o)) => typed!(i, o),
        (HostSlice::U8(i), HostSliceMut::U8(o)) => typed!(i, o),
        (HostSlice::I32(i), HostSliceMut::I32(o)) => typed!(i, o),
        (HostSlice::U32(i), HostSliceMut::U32(o)) => typed!(i, o),
        (HostSlice::I64(i), HostSliceMut::I64(o)) => typed!(i, o),
        (HostSlice::U64(i), HostSliceMut::U64(o)) => typed!(i, o),
        _ => return false,
    }
    true
}

/// `MPI_Reduce_scatter` (rsmpi has only the block form): member `r` gets
/// its `counts[r]` elements of the reduction of `send`.
fn reduce_scatter<T: Equivalence>(
    comm: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
    op: &SystemOperation,
) {
    let counts: Vec<i32> = counts.iter().map(|n| *n as i32).collect();
    // SAFETY: `send` holds the sum of `counts` elements and `recv` this
    // member's count (the entry's buffers), all of type `T`.
    unsafe {
        mpi::ffi::MPI_Reduce_scatter(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            counts.as_ptr(),
            T::equivalent_datatype().as_raw(),
            op.as_raw(),
            comm.as_raw(),
        );
    }
}

/// One device baseline call: the communicator, the stream, the entry's
/// buffers and their element counts.
pub(super) struct Nccl<'c, 'rt> {
    pub comm: &'c NcclComm<'rt>,
    pub stream: *mut c_void,
    pub src: *const c_void,
    pub dst: *mut c_void,
    pub dt: DType,
    /// (group size, this member's rank in it).
    pub members: (usize, usize),
    /// Elements of the input and of the output.
    pub counts: (usize, usize),
}

impl Nccl<'_, '_> {
    fn at(&self, k: usize) -> *const c_void {
        (self.src as usize + k * self.dt.size()) as *const c_void
    }

    fn at_mut(&self, k: usize) -> *mut c_void {
        (self.dst as usize + k * self.dt.size()) as *mut c_void
    }
}

/// The op of `cfg` as direct NCCL calls, enqueued on the call's stream.
///
/// # Safety
/// The buffers hold the entry's shapes for this op and size (and `split`
/// its counts), so each call's counts fit them, as in the rankmesh call.
pub(super) unsafe fn device(cfg: &BenchConfig, c: &Nccl<'_, '_>, split: &Split) -> Enqueued {
    let (comm, raw, dt) = (c.comm, c.stream, c.dt);
    let (src, dst) = (c.src, c.dst);
    let (n, _) = c.members;
    let (count, out_count) = c.counts;
    let (red, root) = (cfg.redop, cfg.root);
    // SAFETY: the caller's buffers fit every call below (see above).
    unsafe {
        match cfg.op.op {
            Op::AllReduce => comm.all_reduce(src, dst, count, dt, red, raw),
            Op::AllGather => comm.all_gather(src, dst, count, dt, raw),
            Op::ReduceScatter => comm.reduce_scatter(src, dst, out_count, dt, red, raw),
            Op::Broadcast => comm.broadcast(dst, dst, out_count, dt, root, raw),
            Op::Reduce => comm.reduce(src, dst, count, dt, red, root, raw),
            // The library's own collectives where it has them (NCCL 2.28),
            // as rankmesh uses them: grouped sends and receives were 8-25x
            // slower on one H100 (alltoall, 8 KiB-32 MiB).
            Op::AllToAll | Op::AllToAll4d if comm.has_native_collectives() => {
                comm.all_to_all(src, dst, out_count / n.max(1), dt, raw)
            }
            Op::Gather if comm.has_native_collectives() => {
                comm.rooted(Rooted::Gather, src, dst, count, dt, root, raw)
            }
            Op::Scatter if comm.has_native_collectives() => {
                comm.rooted(Rooted::Scatter, src, dst, out_count, dt, root, raw)
            }
            Op::Gather | Op::Scatter | Op::AllToAll | Op::AllToAll4d | Op::SendRecv => {
                nccl_point_to_point(cfg.op.op, root, c)
            }
            Op::AllToAllV | Op::AllGatherV => nccl_uneven(cfg.op.op, c, split),
            Op::ReduceScatterV => nccl_reduces(red, c, split),
            _ => Ok(()),
        }
    }
}

/// The rooted ops, all-to-all and the ring shift as one group of sends
/// and receives (NCCL before 2.28 has no collective for them).
///
/// # Safety
/// As [`device`].
unsafe fn nccl_point_to_point(op: Op, root: usize, c: &Nccl<'_, '_>) -> Enqueued {
    let (comm, raw, dt) = (c.comm, c.stream, c.dt);
    let (n, me) = c.members;
    let (count, out_count) = c.counts;
    let fused = comm.group()?;
    let block = match op {
        Op::Gather => count,
        _ => out_count / n.max(1),
    };
    // SAFETY: every offset below stays inside the entry's buffers (see `device`).
    unsafe {
        for r in 0..n {
            if op == Op::Gather && me == root {
                comm.recv(c.at_mut(r * count), count, dt, r, raw)?;
            }
            if op == Op::Gather && r == root {
                comm.send(c.src, count, dt, r, raw)?;
            }
            if op == Op::Scatter && me == root {
                comm.send(c.at(r * out_count), out_count, dt, r, raw)?;
            }
            if op == Op::Scatter && r == root {
                comm.recv(c.dst, out_count, dt, r, raw)?;
            }
            if op == Op::SendRecv && r == (me + 1) % n {
                comm.send(c.src, count, dt, r, raw)?;
            }
            if op == Op::SendRecv && r == (me + n - 1) % n {
                comm.recv(c.dst, out_count, dt, r, raw)?;
            }
            if matches!(op, Op::AllToAll | Op::AllToAll4d) {
                comm.send(c.at(r * block), block, dt, r, raw)?;
                comm.recv(c.at_mut(r * block), block, dt, r, raw)?;
            }
        }
    }
    fused.end()
}

/// The uneven ops, which NCCL has no collective for: grouped sends and
/// receives (`alltoallv`), and one broadcast per member (`all_gather_v`, as
/// vLLM's pynccl all_gatherv does).
///
/// # Safety
/// As [`device`].
unsafe fn nccl_uneven(op: Op, c: &Nccl<'_, '_>, split: &Split) -> Enqueued {
    let (comm, raw, dt) = (c.comm, c.stream, c.dt);
    let (n, _) = c.members;
    let fused = comm.group()?;
    let (mut sent, mut got) = (0, 0);
    // SAFETY: the counts add up to the entry's buffers (see `device`).
    unsafe {
        for r in 0..n {
            let (s, g) = (split.send[r], split.recv[r]);
            if op == Op::AllGatherV {
                if g > 0 {
                    comm.broadcast(c.src, c.at_mut(got), g, dt, r, raw)?;
                }
            } else {
                if s > 0 {
                    comm.send(c.at(sent), s, dt, r, raw)?;
                }
                if g > 0 {
                    comm.recv(c.at_mut(got), g, dt, r, raw)?;
                }
            }
            (sent, got) = (sent + s, got + g);
        }
    }
    fused.end()
}

/// `reduce_scatter_v` as one group of reduces, one onto each member from
/// its block (vLLM's pynccl reduce_scatterv).
///
/// # Safety
/// As [`device`].
unsafe fn nccl_reduces(red: ReduceOp, c: &Nccl<'_, '_>, split: &Split) -> Enqueued {
    let fused = c.comm.group()?;
    let mut at = 0;
    // SAFETY: the counts add up to the input, and this member's to its
    // output (see `device`).
    unsafe {
        for (r, n) in split.send.iter().enumerate() {
            if *n > 0 {
                c.comm.reduce(c.at(at), c.dst, *n, c.dt, red, r, c.stream)?;
            }
            at += n;
        }
    }
    fused.end()
}
