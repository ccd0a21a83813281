//! The device plane of `rankmesh bench --backend nccl`: the same harness,
//! timed the way nccl-tests times (enqueue `iters × agg` calls, then wait for
//! the stream), with raw NCCL calls on the same communicator and buffers as
//! the baseline.

use super::entries::Split;
use super::{BenchConfig, BenchPlane, Held, HeldBox};
use crate::device::{DeviceTensor, Gpu};
use crate::error::NcclError;
use crate::error::{Error, Result};
use crate::group::DeviceGroup;
use crate::group::GroupCoordinator;
use crate::nccl::comm::{RegisteredBuffer, Registration, Rooted};
use crate::op::Op;
use crate::tensor::Tensor;
use crate::{Collectives, Objects};
use std::os::raw::c_void;

/// The device plane of a group, with its buffers registered as `-R` asks.
pub(super) struct DeviceBench<'g, 'rt>(pub DeviceGroup<'g, 'rt>, Option<Registration>);

impl<'g, 'rt> DeviceBench<'g, 'rt> {
    pub(super) fn new(dg: DeviceGroup<'g, 'rt>, register: Option<Registration>) -> Self {
        DeviceBench(dg, register)
    }
}

/// `-R`'s registration where every rank's NCCL has it (agreed over the
/// world: a window is collective), and the note the header prints when it
/// is asked for and not done.
pub(super) fn registration(
    cfg: &BenchConfig,
    dg: Option<&DeviceGroup<'_, '_>>,
    world: &GroupCoordinator<'_>,
) -> Result<(Option<Registration>, Option<String>)> {
    let kind = match cfg.register {
        0 => return Ok((None, None)),
        1 => Registration::Local,
        _ => Registration::Symmetric,
    };
    let Some(dg) = dg else {
        let note = format!(
            "Option -R {} applies to the device plane (--backend nccl). Ignoring",
            cfg.register
        );
        return Ok((None, Some(note)));
    };
    let nccl = dg.gpu().nccl()?;
    let lacking = kind
        .missing(nccl.api()?)
        .map(|m| format!("NCCL {} has no {m}", nccl.version()));
    let all: Vec<Option<String>> = world.all_gather_object(&lacking)?;
    match all
        .iter()
        .enumerate()
        .find_map(|(r, l)| l.as_ref().map(|l| (r, l)))
    {
        Some((rank, why)) => Ok((
            None,
            Some(format!(
                "Option -R {}: {why} on rank {rank}; buffers are not registered",
                cfg.register
            )),
        )),
        None => Ok((Some(kind), None)),
    }
}

/// A registered buffer, freed only once the device is done with it.
struct Registered<'rt> {
    gpu: &'rt Gpu,
    buf: Option<RegisteredBuffer<'rt>>,
}

impl Held for Registered<'_> {}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        // The stream may still read the buffer: wait, then deregister and free.
        if let Err(e) = self.gpu.synchronize() {
            tracing::warn!("a registered bench buffer freed after a failed wait: {e}");
        }
        self.buf.take();
    }
}

impl<'g, 'rt> BenchPlane<'rt> for DeviceBench<'g, 'rt> {
    type C = DeviceGroup<'g, 'rt>;

    fn coll(&self) -> &DeviceGroup<'g, 'rt> {
        &self.0
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor> {
        self.0.gpu().upload(t)
    }

    fn buffer(&self, t: &Tensor) -> Result<(DeviceTensor, Option<HeldBox<'rt>>)> {
        let Some(kind) = self.1 else {
            return Ok((self.upload(t)?, None));
        };
        let gpu = self.0.gpu();
        let buf = self
            .0
            .comm()?
            .alloc_registered(t.nbytes(), kind)
            .map_err(|e| Error::nccl(Op::Connect, self.0.group().name(), e))?;
        // SAFETY: `buf` holds `t.nbytes()` bytes of this device's memory and
        // is freed only after the device is done (`Registered::drop`, which
        // `Buffers` drops after this tensor).
        let mut d = unsafe { DeviceTensor::from_raw(buf.address(), t.dtype(), t.shape().to_vec()) };
        gpu.upload_into(t, &mut d)?;
        let held = Registered {
            gpu,
            buf: Some(buf),
        };
        Ok((d, Some(Box::new(held))))
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
                // The library's own collectives where it has them (NCCL
                // 2.28), as rankmesh uses them: grouped sends and receives
                // were 8-25x slower on one H100 (alltoall, 8 KiB-32 MiB).
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
