//! The device plane of `rankmesh bench --backend nccl`. It is the same
//! harness, timed the way nccl-tests times (enqueue `iters × agg` calls, then
//! wait for the stream), with raw NCCL calls on the same communicator and
//! buffers as the baseline.

use super::entries::Split;
use super::{baseline, BenchConfig, BenchPlane, Held, HeldBox};
use crate::device::{DeviceTensor, Gpu};
use crate::error::{Error, Result};
use crate::group::DeviceGroup;
use crate::group::GroupCoordinator;
use crate::nccl::comm::{RegisteredBuffer, Registration};
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
        let call = baseline::Nccl {
            comm: &comm,
            stream: stream.cu_stream() as *mut c_void,
            src: input.ptr_on(stream)?,
            dst: output.ptr_on(stream)?,
            dt: input.dtype(),
            members: (g.size(), g.rank_in_group()),
            counts: (input.numel(), output.numel()),
        };
        // SAFETY: the buffers come from the entry's shapes for this op and
        // size, so each call's counts fit them, as in the rankmesh call.
        let enqueued = unsafe { baseline::device(cfg, &call, split) };
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
