//! The device side of `rankmesh bench --backend nccl`: the same sweep,
//! rows and validation as the host plane, timed the way nccl-tests times
//! (enqueue `iters × agg` calls, then wait for the stream), with raw NCCL
//! calls on the same communicator and buffers as the baseline.

use super::config::BenchConfig;
use super::ops::BenchOp;
use crate::device::collectives::{nccl_dtype, nccl_op};
use crate::device::{DeviceGroup, DeviceTensor};
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::reduce::ReduceOp;
use crate::tensor::Tensor;
use std::os::raw::{c_int, c_void};

impl BenchOp {
    /// One rankmesh device call from `input` into `output`.
    pub fn run_device(
        self,
        dg: &DeviceGroup<'_, '_>,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        match self {
            BenchOp::AllReduce => dg.all_reduce_into(input, output, op),
            BenchOp::AllGather => dg.all_gather_into(input, output, 0),
            BenchOp::ReduceScatter => dg.reduce_scatter_into(input, output, 0, op),
            BenchOp::Broadcast => dg.broadcast(output, root),
            BenchOp::Reduce => dg.reduce_into(input, output, root, op),
            BenchOp::AllToAll => dg.all_to_all_into(input, output),
            BenchOp::SendRecv => dg.send_recv_into(input, output, None, None),
            BenchOp::AllToAll4d => {
                *output = dg.all_to_all_4d(input, 2, 1)?;
                Ok(())
            }
            BenchOp::BroadcastObject => Err(Error::Collective {
                op: "bench",
                group: dg.group().name().to_string(),
                msg: "broadcast_object moves host objects; it has no device form".into(),
            }),
        }
    }

    /// The same data movement as direct NCCL calls on the group's
    /// communicator (no rankmesh layer: no agreement, no checks).
    pub fn run_nccl(
        self,
        dg: &DeviceGroup<'_, '_>,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let g = dg.group();
        let comm = g
            .existing_nccl_comm()
            .ok_or_else(|| Error::Gpu("no NCCL communicator for the baseline".into()))?;
        let stream = dg.gpu().stream();
        let raw_stream = stream.cu_stream() as *mut c_void;
        let (src, dst) = (input.read_ptr(stream), output.write_ptr(stream));
        let dt = nccl_dtype(input.dtype());
        let (n, me) = (g.size(), g.rank_in_group());
        let count = input.numel();
        let fail = |m: String| Error::collective("nccl baseline", g.name(), m);
        // SAFETY: the buffers come from `buffers()` for this op and size, so
        // each call's counts fit them, as in `run_device`.
        unsafe {
            match self {
                BenchOp::AllReduce => comm.all_reduce(src, dst, count, dt, nccl_op(op), raw_stream),
                BenchOp::AllGather => comm.all_gather(src, dst, count, dt, raw_stream),
                BenchOp::ReduceScatter => {
                    comm.reduce_scatter(src, dst, output.numel(), dt, nccl_op(op), raw_stream)
                }
                BenchOp::Broadcast => {
                    comm.broadcast(dst, dst, output.numel(), dt, root, raw_stream)
                }
                BenchOp::Reduce => comm.reduce(src, dst, count, dt, nccl_op(op), root, raw_stream),
                BenchOp::AllToAll | BenchOp::AllToAll4d => {
                    let block = count / n;
                    let bytes = block * input.dtype().size();
                    comm.grouped("alltoall", |api, raw| {
                        for r in 0..n {
                            let s = (src as usize + r * bytes) as *const c_void;
                            let d = (dst as usize + r * bytes) as *mut c_void;
                            let a = (api.send)(s, block, dt, r as c_int, raw, raw_stream);
                            let b = (api.recv)(d, block, dt, r as c_int, raw, raw_stream);
                            if a != 0 || b != 0 {
                                return a.max(b);
                            }
                        }
                        0
                    })
                }
                BenchOp::SendRecv => comm.grouped("sendrecv", |api, raw| {
                    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                    let a = (api.send)(src, count, dt, next as c_int, raw, raw_stream);
                    let b = (api.recv)(dst, output.numel(), dt, prev as c_int, raw, raw_stream);
                    a.max(b)
                }),
                BenchOp::BroadcastObject => Ok(()),
            }
        }
        .map_err(fail)
    }
}

/// Device buffers for one size, filled like the host plane's.
pub(super) struct DeviceBuffers {
    pub input: DeviceTensor,
    pub output: DeviceTensor,
}

impl DeviceBuffers {
    pub(super) fn new(dg: &DeviceGroup<'_, '_>, host: (&Tensor, &Tensor)) -> Result<Self> {
        Ok(DeviceBuffers {
            input: dg.gpu().upload(host.0)?,
            output: dg.gpu().upload(host.1)?,
        })
    }

    pub(super) fn reset(
        &mut self,
        dg: &DeviceGroup<'_, '_>,
        host: (&Tensor, &Tensor),
    ) -> Result<()> {
        dg.gpu().upload_into(host.0, &mut self.input)?;
        dg.gpu().upload_into(host.1, &mut self.output)
    }
}

/// Validates one device call: fresh data, one call, copy back, count wrong
/// elements on this rank.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_device(
    g: &GroupCoordinator<'_>,
    dg: &DeviceGroup<'_, '_>,
    cfg: &BenchConfig,
    bufs: &mut DeviceBuffers,
    host: (&Tensor, &Tensor),
    in_place: bool,
    corrupt: bool,
) -> Result<u64> {
    let op = cfg.op;
    bufs.reset(dg, host)?;
    if in_place && op == BenchOp::AllReduce {
        dg.all_reduce_in_place(&mut bufs.input, cfg.redop)?;
        std::mem::swap(&mut bufs.input, &mut bufs.output);
        let r = check_output(g, dg, cfg, bufs, host.0.numel(), corrupt);
        std::mem::swap(&mut bufs.input, &mut bufs.output);
        return r;
    }
    op.run_device(dg, &bufs.input, &mut bufs.output, cfg.redop, cfg.root)?;
    check_output(g, dg, cfg, bufs, host.0.numel(), corrupt)
}

fn check_output(
    g: &GroupCoordinator<'_>,
    dg: &DeviceGroup<'_, '_>,
    cfg: &BenchConfig,
    bufs: &DeviceBuffers,
    input_len: usize,
    corrupt: bool,
) -> Result<u64> {
    let mut got = dg.gpu().download(&bufs.output)?;
    if corrupt && got.numel() > 0 {
        got.bytes_mut()[0] ^= 0x5a;
    }
    Ok(cfg.op.count_wrong(g, input_len, &got, cfg.redop, cfg.root))
}

/// Warm-up at the largest and smallest size, as the host harness does.
pub(super) fn warm_up_device(
    g: &GroupCoordinator<'_>,
    dg: &DeviceGroup<'_, '_>,
    cfg: &BenchConfig,
    sweep: &[usize],
) -> Result<()> {
    for &size in [sweep.last(), sweep.first()].into_iter().flatten() {
        let (mut input, mut output) = cfg.op.buffers(g, size / cfg.dtype.size(), cfg.dtype);
        cfg.op.init(g, &mut input, &mut output, cfg.redop, cfg.root);
        let mut bufs = DeviceBuffers::new(dg, (&input, &output))?;
        for _ in 0..cfg.warmup {
            cfg.op
                .run_device(dg, &bufs.input, &mut bufs.output, cfg.redop, cfg.root)?;
        }
    }
    dg.synchronize()
}

/// Measures one size on the device: out-of-place, in-place (all_reduce truly
/// in place; other collectives a second run, as on the host), NCCL baseline
/// and statistics.
pub(super) fn measure_size_device(
    g: &GroupCoordinator<'_>,
    dg: &DeviceGroup<'_, '_>,
    cfg: &BenchConfig,
    size: usize,
    first: bool,
) -> Result<super::Row> {
    let op = cfg.op;
    let sizing = super::Sizing::new(g, cfg, size);
    let (mut input, mut output) = op.buffers(g, sizing.count, cfg.dtype);
    op.init(g, &mut input, &mut output, cfg.redop, cfg.root);
    let host = (&input, &output);
    let mut bufs = DeviceBuffers::new(dg, host)?;
    let mut cells = Vec::new();
    let mut stats = None;
    for pass in 0..2 {
        let in_place = pass == 1;
        let (secs, samples) = {
            let b = &mut bufs;
            super::time_calls(
                g,
                cfg,
                || {
                    if in_place && op == BenchOp::AllReduce {
                        dg.all_reduce_in_place(&mut b.input, cfg.redop)
                    } else {
                        op.run_device(dg, &b.input, &mut b.output, cfg.redop, cfg.root)
                    }
                },
                || dg.synchronize(),
            )?
        };
        let secs = super::combine(g, secs, cfg.average)?;
        if cfg.stats && pass == 0 {
            let all: Vec<Vec<f64>> = g.all_gather_object(&samples)?;
            stats = Some(super::format::RankStats::of(&all));
        }
        let corrupt = cfg.corrupt && first && pass == 0 && g.is_first_rank();
        let wrong = super::validate(g, cfg, || {
            check_device(g, dg, cfg, &mut bufs, host, in_place, corrupt)
        })?;
        cells.push(sizing.cell(secs, wrong));
    }
    let baseline = if cfg.baseline {
        bufs.reset(dg, host)?;
        let b = &mut bufs;
        let (secs, _) = super::time_calls(
            g,
            cfg,
            || op.run_nccl(dg, &b.input, &mut b.output, cfg.redop, cfg.root),
            || dg.synchronize(),
        )?;
        let secs = super::combine(g, secs, cfg.average)?;
        Some(sizing.cell(secs, None))
    } else {
        None
    };
    Ok(sizing.row(g, cfg, [cells[0], cells[1]], baseline, stats))
}
