//! The device plane of `rankmesh bench --backend nccl`: the same harness,
//! timed the way nccl-tests times (enqueue `iters × agg` calls, then wait for
//! the stream), with raw NCCL calls on the same communicator and buffers as
//! the baseline.

use super::entries::Split;
use super::{BenchConfig, BenchPlane};
use crate::device::DeviceTensor;
use crate::error::NcclError;
use crate::error::{Error, Result};
use crate::group::DeviceGroup;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::Collectives;
use std::os::raw::c_void;

/// The device plane of a group.
pub(super) struct DeviceBench<'g, 'rt>(pub DeviceGroup<'g, 'rt>);

impl<'g, 'rt> BenchPlane<'rt> for DeviceBench<'g, 'rt> {
    type C = DeviceGroup<'g, 'rt>;

    fn coll(&self) -> &DeviceGroup<'g, 'rt> {
        &self.0
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor> {
        self.0.gpu().upload(t)
    }

    fn upload_into(&self, t: &Tensor, d: &mut DeviceTensor) -> Result<()> {
        self.0.gpu().upload_into(t, d)
    }

    fn download(&self, d: &DeviceTensor) -> Result<Tensor> {
        self.0.gpu().download(d)
    }

    fn settle(&self) -> Result<()> {
        self.0.synchronize()
    }

    fn baseline(
        &self,
        cfg: &BenchConfig,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        split: &Split,
    ) -> Result<bool> {
        let dg = &self.0;
        let g = dg.group();
        let comm = dg.comm()?;
        let stream = dg.stream();
        dg.gpu().order_on(stream)?;
        let raw = stream.cu_stream() as *mut c_void;
        let (src, dst) = (input.ptr_on(stream)?, output.ptr_on(stream)?);
        let dt = input.dtype();
        let (n, me) = (g.size(), g.rank_in_group());
        let (count, out_count) = (input.numel(), output.numel());
        let (red, root) = (cfg.redop, cfg.root);
        let at = |p: *const c_void, k: usize| (p as usize + k * dt.size()) as *const c_void;
        let at_mut = |p: *mut c_void, k: usize| (p as usize + k * dt.size()) as *mut c_void;
        // SAFETY: the buffers come from the entry's shapes for this op and
        // size, so each call's counts fit them, as in the rankmesh call.
        let enqueued: std::result::Result<(), NcclError> = (|| unsafe {
            match cfg.op.op {
                Op::AllReduce => comm.all_reduce(src, dst, count, dt, red, raw),
                Op::AllGather => comm.all_gather(src, dst, count, dt, raw),
                Op::ReduceScatter => comm.reduce_scatter(src, dst, out_count, dt, red, raw),
                Op::Broadcast => comm.broadcast(dst, dst, out_count, dt, root, raw),
                Op::Reduce => comm.reduce(src, dst, count, dt, red, root, raw),
                Op::Gather | Op::Scatter | Op::AllToAll | Op::AllToAll4d | Op::SendRecv => {
                    let fused = comm.group()?;
                    let block = match cfg.op.op {
                        Op::Gather => count,
                        _ => out_count / n.max(1),
                    };
                    for r in 0..n {
                        let op = cfg.op.op;
                        if op == Op::Gather && me == root {
                            comm.recv(at_mut(dst, r * count), count, dt, r, raw)?;
                        }
                        if op == Op::Gather && r == root {
                            comm.send(src, count, dt, r, raw)?;
                        }
                        if op == Op::Scatter && me == root {
                            comm.send(at(src, r * out_count), out_count, dt, r, raw)?;
                        }
                        if op == Op::Scatter && r == root {
                            comm.recv(dst, out_count, dt, r, raw)?;
                        }
                        if op == Op::SendRecv && r == (me + 1) % n {
                            comm.send(src, count, dt, r, raw)?;
                        }
                        if op == Op::SendRecv && r == (me + n - 1) % n {
                            comm.recv(dst, out_count, dt, r, raw)?;
                        }
                        if matches!(op, Op::AllToAll | Op::AllToAll4d) {
                            comm.send(at(src, r * block), block, dt, r, raw)?;
                            comm.recv(at_mut(dst, r * block), block, dt, r, raw)?;
                        }
                    }
                    fused.end()
                }
                // Grouped sends and receives, and one broadcast per member
                // (what vLLM's pynccl all_gatherv does): NCCL has neither.
                Op::AllToAllV | Op::AllGatherV => {
                    let fused = comm.group()?;
                    let (mut sent, mut got) = (0, 0);
                    for r in 0..n {
                        let (s, g) = (split.send[r], split.recv[r]);
                        if cfg.op.op == Op::AllGatherV {
                            if g > 0 {
                                comm.broadcast(src, at_mut(dst, got), g, dt, r, raw)?;
                            }
                        } else {
                            if s > 0 {
                                comm.send(at(src, sent), s, dt, r, raw)?;
                            }
                            if g > 0 {
                                comm.recv(at_mut(dst, got), g, dt, r, raw)?;
                            }
                        }
                        (sent, got) = (sent + s, got + g);
                    }
                    fused.end()
                }
                _ => Ok(()),
            }
        })();
        enqueued.map_err(|source| Error::nccl(cfg.op.op, g.name(), source))?;
        Ok(cfg.op.op != Op::BroadcastObject)
    }

    fn run_other(
        &self,
        cfg: &BenchConfig,
        _input: &DeviceTensor,
        _output: &mut DeviceTensor,
    ) -> Result<()> {
        Err(Error::Usage {
            what: "bench",
            group: self.0.group().name().to_string(),
            msg: format!(
                "{} moves host objects; it has no device form",
                cfg.op.name()
            ),
        })
    }
}
