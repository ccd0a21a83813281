//! The host plane of `rankmesh bench`: tensors stay in host memory, and the
//! baseline is the same data movement as direct MPI calls.

use super::entries::Split;
use super::{BenchConfig, BenchPlane};
use crate::error::{Error, Result};
use crate::exec::mpi::displacements;
use crate::group::GroupCoordinator;
use crate::object::Objects;
use crate::op::Op;
use crate::op::ReduceOp;
use crate::tensor::{HostData, HostSlice, HostSliceMut, Tensor};
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::traits::*;

/// The host plane of a group.
pub(super) struct HostBench<'g, 'rt>(pub &'g GroupCoordinator<'rt>);

impl<'rt> BenchPlane<'rt> for HostBench<'_, 'rt> {
    type C = GroupCoordinator<'rt>;

    fn coll(&self) -> &GroupCoordinator<'rt> {
        self.0
    }

    /// A copy with half a page of slack: consecutive buffers then start at
    /// different page offsets, as device allocations do (see
    /// `Tensor::copy_with_slack`), so the numbers do not depend on where
    /// malloc happened to put them.
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.copy_with_slack(2048 + 64))
    }

    fn upload_into(&self, t: &Tensor, d: &mut Tensor) -> Result<()> {
        d.bytes_mut().copy_from_slice(t.bytes());
        Ok(())
    }

    fn download(&self, d: &Tensor) -> Result<Tensor> {
        Ok(d.clone())
    }

    fn settle(&self) -> Result<()> {
        Ok(())
    }

    /// `Ok(false)` where MPI has no equivalent (16-bit float reductions, `avg`).
    fn baseline(
        &self,
        cfg: &BenchConfig,
        input: &Tensor,
        output: &mut Tensor,
        split: &Split,
    ) -> Result<bool> {
        let comm = self.0.raw_comm();
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
            Op::Scatter if is_root => {
                root_proc.scatter_into_root(input.bytes(), output.bytes_mut())
            }
            Op::Scatter => root_proc.scatter_into(output.bytes_mut()),
            Op::AllToAll | Op::AllToAll4d => {
                comm.all_to_all_into(input.bytes(), output.bytes_mut())
            }
            // MPI_Alltoallv / MPI_Allgatherv, counts and displacements in
            // elements of the dtype's size.
            Op::AllToAllV | Op::AllGatherV => {
                let elem = input.dtype().size();
                let ints =
                    |c: &[usize]| -> Vec<i32> { c.iter().map(|n| (n * elem) as i32).collect() };
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
                mpi::point_to_point::send_receive_into(
                    input.bytes(),
                    &next,
                    output.bytes_mut(),
                    &prev,
                );
            }
            Op::AllReduce | Op::ReduceScatter | Op::Reduce => {
                let sys = match cfg.redop {
                    ReduceOp::Sum => SystemOperation::sum(),
                    ReduceOp::Prod => SystemOperation::product(),
                    ReduceOp::Min => SystemOperation::min(),
                    ReduceOp::Max => SystemOperation::max(),
                    ReduceOp::Avg => return Ok(false),
                };
                let op = cfg.op.op;
                macro_rules! typed {
                    ($i:expr, $o:expr) => {
                        match op {
                            Op::AllReduce => comm.all_reduce_into($i, &mut *$o, &sys),
                            Op::ReduceScatter => comm.reduce_scatter_block_into($i, &mut *$o, &sys),
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
                    _ => return Ok(false),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `broadcast_object`: the typed object broadcast of the output's
    /// bytes, as a `Vec<u8>` received in place (`broadcast_object_into`:
    /// the same buffers every iteration, as nccl-tests reuses its own).
    fn run_other(&self, cfg: &BenchConfig, _input: &Tensor, output: &mut Tensor) -> Result<()> {
        let group = &self.0;
        output
            .with_owned_data(|data| match data {
                HostData::U8(bytes) => Some(group.broadcast_object_into(bytes, cfg.root)),
                _ => None,
            })
            .flatten()
            .unwrap_or_else(|| {
                Err(Error::Usage {
                    what: "bench broadcast_object",
                    group: group.name().to_string(),
                    msg: "it moves bytes: use -d uint8".into(),
                })
            })
    }
}
