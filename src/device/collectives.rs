//! Collectives on device tensors: the same calls, checks and error messages
//! as the host plane, with NCCL moving the bytes.
//!
//! Each call agrees on its descriptor over MPI (flagged as a device call, so
//! a host call meeting a device call is an error), creates the group's NCCL
//! communicator on first use, and *enqueues* the work on the rank's stream:
//! results are ready after [`DeviceGroup::synchronize`] (or a
//! [`Gpu::download`]). No call waits for the device in between.

use super::connect::connect;
use super::copy::run_copies;
use super::{DeviceTensor, Gpu};
use crate::collectives::explain_output;
use crate::dispatch::{rank_in_range, Descriptor, Op};
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::plane::nccl::comm::Communicator;
use crate::plane::nccl::sys::{dtype as nd, redop, RawStream};
use crate::reduce::ReduceOp;
use crate::tensor::DType;
use std::cell::Ref;
use std::os::raw::{c_int, c_void};

/// NCCL's name for a dtype (every rankmesh dtype has one).
pub fn nccl_dtype(d: DType) -> c_int {
    match d {
        DType::F32 => nd::FLOAT32,
        DType::F64 => nd::FLOAT64,
        DType::F16 => nd::FLOAT16,
        DType::BF16 => nd::BFLOAT16,
        DType::I8 => nd::INT8,
        DType::U8 => nd::UINT8,
        DType::I32 => nd::INT32,
        DType::U32 => nd::UINT32,
        DType::I64 => nd::INT64,
        DType::U64 => nd::UINT64,
    }
}

/// NCCL's reduction operator.
pub fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => redop::SUM,
        ReduceOp::Prod => redop::PROD,
        ReduceOp::Min => redop::MIN,
        ReduceOp::Max => redop::MAX,
        ReduceOp::Avg => redop::AVG,
    }
}

/// A group's device-plane view: `tp.device()?.all_reduce(&x, ReduceOp::Sum)`.
#[derive(Clone, Copy)]
pub struct DeviceGroup<'g, 'rt> {
    pub(super) group: &'g GroupCoordinator<'rt>,
    pub(super) gpu: &'rt Gpu,
}

impl<'rt> GroupCoordinator<'rt> {
    /// The device plane of this group. Fails on this rank alone when it has
    /// no usable GPU stack (see [`Runtime::gpu`](crate::Runtime::gpu)).
    pub fn device(&self) -> Result<DeviceGroup<'_, 'rt>> {
        Ok(DeviceGroup {
            group: self,
            gpu: self.runtime().gpu()?,
        })
    }
}

pub(super) fn offset(p: *const c_void, bytes: usize) -> *const c_void {
    (p as usize + bytes) as *const c_void
}

pub(super) fn offset_mut(p: *mut c_void, bytes: usize) -> *mut c_void {
    (p as usize + bytes) as *mut c_void
}

pub(super) fn fits(out: &DeviceTensor, dtype: DType, shape: &[usize]) -> bool {
    out.dtype() == dtype && out.shape() == shape
}

impl<'g, 'rt> DeviceGroup<'g, 'rt> {
    /// The group.
    pub fn group(&self) -> &'g GroupCoordinator<'rt> {
        self.group
    }

    /// The rank's GPU.
    pub fn gpu(&self) -> &'rt Gpu {
        self.gpu
    }

    pub(super) fn stream(&self) -> RawStream {
        self.gpu.stream().cu_stream() as RawStream
    }

    pub(super) fn err(&self, op: Op, msg: impl Into<String>) -> Error {
        Error::collective(op.name(), self.group.name(), msg)
    }

    pub(super) fn comm(&self) -> Result<Ref<'g, Communicator<'rt>>> {
        self.group.nccl_comm(|| connect(self.group, self.gpu))
    }

    pub(super) fn explain(
        &self,
        e: Error,
        out: &DeviceTensor,
        dtype: DType,
        shape: &[usize],
    ) -> Error {
        explain_output(e, (out.shape(), out.dtype()), dtype, shape)
    }

    /// Creates the group's NCCL communicator now (collective) instead of at
    /// the first device operation. Needed before the first `send`/`recv`,
    /// which involve only two members.
    pub fn connect(&self) -> Result<()> {
        let desc = Descriptor::new(Op::Connect, &[]).on_device();
        self.group
            .collective(desc, |_| Ok(()), |_| self.comm().map(|_| ()))
    }

    /// Enqueues a device-to-device copy of `src` into `dst` (same byte size).
    pub(crate) fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        let s = self.gpu.stream();
        let n = src.nbytes().min(dst.nbytes());
        let one = crate::layout_ops::Copy2d::bytes(0, 0, n);
        run_copies(&[one], src.read_ptr(s), dst.write_ptr(s), s.cu_stream())
    }

    /// Waits for every device operation enqueued so far (see [`Gpu::synchronize`]).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }

    /// Element-wise reduction of every member's tensor; the result on every member.
    pub fn all_reduce(&self, t: &DeviceTensor, op: ReduceOp) -> Result<DeviceTensor> {
        let mut out = self.gpu.empty(t.shape().to_vec(), t.dtype())?;
        self.all_reduce_into(t, &mut out, op)?;
        Ok(out)
    }

    /// [`all_reduce`](Self::all_reduce) into `out` (same shape and dtype as `t`).
    pub fn all_reduce_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        op: ReduceOp,
    ) -> Result<()> {
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::for_tensor(Op::AllReduce, t.dtype(), t.shape(), &[op.code()])
            .on_device()
            .with_bad_output(!ok);
        self.group
            .collective(
                desc,
                |_| Ok(()),
                |_| {
                    let comm = self.comm()?;
                    let s = self.gpu.stream();
                    let (src, dst) = (t.read_ptr(s), out.write_ptr(s));
                    // SAFETY: same shape and dtype (checked), both on this device.
                    unsafe {
                        comm.all_reduce(
                            src,
                            dst,
                            t.numel(),
                            nccl_dtype(t.dtype()),
                            nccl_op(op),
                            self.stream(),
                        )
                    }
                    .map_err(|m| self.err(Op::AllReduce, m))
                },
            )
            .map_err(|e| self.explain(e, out, t.dtype(), t.shape()))
    }

    /// [`all_reduce`](Self::all_reduce) in place: `t` becomes the result.
    pub fn all_reduce_in_place(&self, t: &mut DeviceTensor, op: ReduceOp) -> Result<()> {
        let desc =
            Descriptor::for_tensor(Op::AllReduce, t.dtype(), t.shape(), &[op.code()]).on_device();
        self.group.collective(
            desc,
            |_| Ok(()),
            |_| {
                let comm = self.comm()?;
                let p = t.write_ptr(self.gpu.stream());
                // SAFETY: one buffer used as both sides, as NCCL allows.
                unsafe {
                    comm.all_reduce(
                        p,
                        p,
                        t.numel(),
                        nccl_dtype(t.dtype()),
                        nccl_op(op),
                        self.stream(),
                    )
                }
                .map_err(|m| self.err(Op::AllReduce, m))
            },
        )
    }

    /// Element-wise reduction onto group rank `dst` (`Some` there, `None` elsewhere).
    pub fn reduce(
        &self,
        t: &DeviceTensor,
        dst: usize,
        op: ReduceOp,
    ) -> Result<Option<DeviceTensor>> {
        let mut out = self.gpu.empty(t.shape().to_vec(), t.dtype())?;
        self.reduce_into(t, &mut out, dst, op)?;
        Ok((self.group.rank_in_group() == dst).then_some(out))
    }

    /// [`reduce`](Self::reduce) into `out` (written on `dst` only).
    pub fn reduce_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let ok = fits(out, t.dtype(), t.shape());
        let desc =
            Descriptor::for_tensor(Op::Reduce, t.dtype(), t.shape(), &[dst as i64, op.code()])
                .on_device()
                .with_bad_output(!ok);
        let size = self.group.size();
        self.group
            .collective(
                desc,
                |d| rank_in_range("dst", d.params[0], size).map(|_| ()),
                |_| {
                    let comm = self.comm()?;
                    let s = self.gpu.stream();
                    let (src, out_p) = (t.read_ptr(s), out.write_ptr(s));
                    // SAFETY: same shape and dtype (checked), both on this device.
                    unsafe {
                        comm.reduce(
                            src,
                            out_p,
                            t.numel(),
                            nccl_dtype(t.dtype()),
                            nccl_op(op),
                            dst,
                            self.stream(),
                        )
                    }
                    .map_err(|m| self.err(Op::Reduce, m))
                },
            )
            .map_err(|e| self.explain(e, out, t.dtype(), t.shape()))
    }

    /// Copies group rank `src`'s tensor into `t` on every member (in place).
    pub fn broadcast(&self, t: &mut DeviceTensor, src: usize) -> Result<()> {
        let desc =
            Descriptor::for_tensor(Op::Broadcast, t.dtype(), t.shape(), &[src as i64]).on_device();
        let size = self.group.size();
        self.group.collective(
            desc,
            |d| rank_in_range("src", d.params[0], size).map(|_| ()),
            |_| {
                let comm = self.comm()?;
                let p = t.write_ptr(self.gpu.stream());
                // SAFETY: in place, as NCCL allows.
                unsafe {
                    comm.broadcast(p, p, t.numel(), nccl_dtype(t.dtype()), src, self.stream())
                }
                .map_err(|m| self.err(Op::Broadcast, m))
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_and_operator_has_an_nccl_code() {
        let codes: Vec<c_int> = DType::ALL.iter().map(|d| nccl_dtype(*d)).collect();
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique, (0..10).collect::<Vec<_>>());
        assert_eq!(nccl_dtype(DType::BF16), 9);
        assert_eq!(nccl_op(ReduceOp::Avg), 4);
        assert_eq!(nccl_op(ReduceOp::Min), 3);
    }
}
