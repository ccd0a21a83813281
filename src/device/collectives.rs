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
use crate::collectives::{check_all_to_all_4d, divisible, explain_output, scaled};
use crate::dispatch::{dim_in_range, rank_in_range, Descriptor, Op};
use crate::error::{Error, Result};
use crate::group::{GroupCoordinator, Peer};
use crate::layout_ops::{concat_dim_copies, is_contiguous_split, normalize_dim, split_dim_copies};
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
    group: &'g GroupCoordinator<'rt>,
    gpu: &'rt Gpu,
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

fn offset(p: *const c_void, bytes: usize) -> *const c_void {
    (p as usize + bytes) as *const c_void
}

fn offset_mut(p: *mut c_void, bytes: usize) -> *mut c_void {
    (p as usize + bytes) as *mut c_void
}

fn fits(out: &DeviceTensor, dtype: DType, shape: &[usize]) -> bool {
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

    fn stream(&self) -> RawStream {
        self.gpu.stream().cu_stream() as RawStream
    }

    fn err(&self, op: Op, msg: impl Into<String>) -> Error {
        Error::collective(op.name(), self.group.name(), msg)
    }

    fn comm(&self) -> Result<Ref<'g, Communicator<'rt>>> {
        self.group.nccl_comm(|| connect(self.group, self.gpu))
    }

    fn explain(&self, e: Error, out: &DeviceTensor, dtype: DType, shape: &[usize]) -> Error {
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
        let one = crate::layout_ops::Copy2d {
            src_offset: 0,
            dst_offset: 0,
            width: n,
            height: 1,
            src_pitch: n,
            dst_pitch: n,
        };
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

    /// Concatenation of every member's tensor along `dim`, in group-rank order.
    pub fn all_gather(&self, t: &DeviceTensor, dim: isize) -> Result<DeviceTensor> {
        let shape = normalize_dim(dim, t.ndim())
            .map(|d| scaled(t.shape(), d, self.group.size(), true))
            .unwrap_or_default();
        let mut out = self.gpu.empty(shape, t.dtype())?;
        self.all_gather_into(t, &mut out, dim)?;
        Ok(out)
    }

    /// [`all_gather`](Self::all_gather) into `out`.
    pub fn all_gather_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dim: isize,
    ) -> Result<()> {
        let size = self.group.size();
        let d = normalize_dim(dim, t.ndim());
        let want = d.map(|d| scaled(t.shape(), d, size, true));
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc = Descriptor::for_tensor(Op::AllGather, t.dtype(), t.shape(), &[dim as i64])
            .on_device()
            .with_bad_output(d.is_some() && !ok);
        self.group
            .collective(
                desc,
                |d| dim_in_range(d, d.params[0]).map(|_| ()),
                |_| {
                    let d = d.expect("checked by dispatch");
                    let comm = self.comm()?;
                    let s = self.gpu.stream();
                    let dt = nccl_dtype(t.dtype());
                    let src = t.read_ptr(s);
                    let gather = |dst: *mut c_void| {
                        // SAFETY: `dst` holds `size` blocks of `t`'s size.
                        unsafe { comm.all_gather(src, dst, t.numel(), dt, self.stream()) }
                            .map_err(|m| self.err(Op::AllGather, m))
                    };
                    if is_contiguous_split(t.shape(), d) {
                        return gather(out.write_ptr(s));
                    }
                    let mut blocks = self.gpu.empty([out.nbytes()], DType::U8)?;
                    let bp = blocks.write_ptr(s);
                    gather(bp)?;
                    let plan = concat_dim_copies(t.shape(), d, size, t.dtype().size());
                    run_copies(&plan, bp, out.write_ptr(s), s.cu_stream())
                },
            )
            .map_err(|e| match &want {
                Some(w) => self.explain(e, out, t.dtype(), w),
                None => e,
            })
    }

    /// Like [`all_gather`](Self::all_gather), the result only on group rank `dst`.
    pub fn gather(&self, t: &DeviceTensor, dst: usize, dim: isize) -> Result<Option<DeviceTensor>> {
        let desc =
            Descriptor::for_tensor(Op::Gather, t.dtype(), t.shape(), &[dst as i64, dim as i64])
                .on_device();
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let check = |d: &Descriptor| {
            rank_in_range("dst", d.params[0], size)?;
            dim_in_range(d, d.params[1]).map(|_| ())
        };
        self.group.collective(desc, check, |_| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            let comm = self.comm()?;
            let s = self.gpu.stream();
            let dt = nccl_dtype(t.dtype());
            let src = t.read_ptr(s);
            if me != dst {
                comm.grouped("ncclSend", |api, raw| unsafe {
                    // SAFETY: `t` is alive until the stream runs the send.
                    (api.send)(src, t.numel(), dt, dst as c_int, raw, self.stream())
                })
                .map_err(|m| self.err(Op::Gather, m))?;
                return Ok(None);
            }
            let bytes = t.nbytes();
            let mut blocks = self.gpu.empty([bytes * size], DType::U8)?;
            let bp = blocks.write_ptr(s);
            comm.grouped("ncclRecv", |api, raw| {
                for r in (0..size).filter(|r| *r != me) {
                    // SAFETY: block `r` of `blocks` holds `t.numel()` elements.
                    let rc = unsafe {
                        (api.recv)(
                            offset_mut(bp, r * bytes),
                            t.numel(),
                            dt,
                            r as c_int,
                            raw,
                            self.stream(),
                        )
                    };
                    if rc != 0 {
                        return rc;
                    }
                }
                0
            })
            .map_err(|m| self.err(Op::Gather, m))?;
            let own = crate::layout_ops::Copy2d {
                src_offset: 0,
                dst_offset: me * bytes,
                width: bytes,
                height: 1,
                src_pitch: bytes,
                dst_pitch: bytes,
            };
            run_copies(&[own], src, bp, s.cu_stream())?;
            let mut out = self
                .gpu
                .empty(scaled(t.shape(), d, size, true), t.dtype())?;
            let plan = concat_dim_copies(t.shape(), d, size, t.dtype().size());
            run_copies(&plan, bp, out.write_ptr(s), s.cu_stream())?;
            Ok(Some(out))
        })
    }

    /// Reduces every member's tensor and leaves slice `r` along `dim` on group rank `r`.
    pub fn reduce_scatter(
        &self,
        t: &DeviceTensor,
        dim: isize,
        op: ReduceOp,
    ) -> Result<DeviceTensor> {
        let shape = normalize_dim(dim, t.ndim())
            .map(|d| scaled(t.shape(), d, self.group.size(), false))
            .unwrap_or_default();
        let mut out = self.gpu.empty(shape, t.dtype())?;
        self.reduce_scatter_into(t, &mut out, dim, op)?;
        Ok(out)
    }

    /// [`reduce_scatter`](Self::reduce_scatter) into `out`.
    pub fn reduce_scatter_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dim: isize,
        op: ReduceOp,
    ) -> Result<()> {
        let size = self.group.size();
        let d = normalize_dim(dim, t.ndim());
        let want = d.map(|d| scaled(t.shape(), d, size, false));
        let ok = want.as_ref().is_some_and(|w| fits(out, t.dtype(), w));
        let desc = Descriptor::for_tensor(
            Op::ReduceScatter,
            t.dtype(),
            t.shape(),
            &[dim as i64, op.code()],
        )
        .on_device()
        .with_bad_output(d.is_some() && !ok);
        let check = |d: &Descriptor| {
            let k = dim_in_range(d, d.params[0])?;
            divisible(d, k, size, "dim")
        };
        self.group
            .collective(desc, check, |_| {
                let d = d.expect("checked by dispatch");
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let recv_count = out.numel();
                let scatter = |src: *const c_void, dst: *mut c_void| {
                    // SAFETY: `src` holds `size` slices of `out`'s size.
                    unsafe {
                        comm.reduce_scatter(
                            src,
                            dst,
                            recv_count,
                            nccl_dtype(t.dtype()),
                            nccl_op(op),
                            self.stream(),
                        )
                    }
                    .map_err(|m| self.err(Op::ReduceScatter, m))
                };
                let out_p = out.write_ptr(s);
                if is_contiguous_split(t.shape(), d) {
                    return scatter(t.read_ptr(s), out_p);
                }
                let mut packed = self.gpu.empty([t.nbytes()], DType::U8)?;
                let pp = packed.write_ptr(s);
                let plan = split_dim_copies(t.shape(), d, size, t.dtype().size());
                run_copies(&plan, t.read_ptr(s), pp, s.cu_stream())?;
                scatter(pp, out_p)
            })
            .map_err(|e| match &want {
                Some(w) => self.explain(e, out, t.dtype(), w),
                None => e,
            })
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

    /// Block `r` of `src` to group rank `r`, block `r` of `dst` from rank `r`
    /// (`size` blocks of `block` bytes each; own block copied locally).
    fn exchange_blocks(
        &self,
        comm: &Communicator<'_>,
        op: Op,
        src: *const c_void,
        dst: *mut c_void,
        block: usize,
        dtype: DType,
    ) -> Result<()> {
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let count = block / dtype.size();
        let dt = nccl_dtype(dtype);
        if size > 1 {
            comm.grouped("ncclSend/ncclRecv", |api, raw| {
                for r in (0..size).filter(|r| *r != me) {
                    // SAFETY: blocks `r` of both buffers hold `count` elements.
                    let rc = unsafe {
                        let a = (api.send)(
                            offset(src, r * block),
                            count,
                            dt,
                            r as c_int,
                            raw,
                            self.stream(),
                        );
                        if a != 0 {
                            a
                        } else {
                            (api.recv)(
                                offset_mut(dst, r * block),
                                count,
                                dt,
                                r as c_int,
                                raw,
                                self.stream(),
                            )
                        }
                    };
                    if rc != 0 {
                        return rc;
                    }
                }
                0
            })
            .map_err(|m| self.err(op, m))?;
        }
        let own = crate::layout_ops::Copy2d {
            src_offset: me * block,
            dst_offset: me * block,
            width: block,
            height: 1,
            src_pitch: block,
            dst_pitch: block,
        };
        run_copies(&[own], src, dst, self.gpu.stream().cu_stream())
    }

    /// Equal blocks of dim 0 exchanged between all members (nccl-tests' `alltoall`).
    pub fn all_to_all(&self, t: &DeviceTensor) -> Result<DeviceTensor> {
        let mut out = self.gpu.empty(t.shape().to_vec(), t.dtype())?;
        self.all_to_all_into(t, &mut out)?;
        Ok(out)
    }

    /// [`all_to_all`](Self::all_to_all) into `out` (same shape and dtype as `t`).
    pub fn all_to_all_into(&self, t: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let size = self.group.size();
        let ok = fits(out, t.dtype(), t.shape());
        let desc = Descriptor::for_tensor(Op::AllToAll, t.dtype(), t.shape(), &[])
            .on_device()
            .with_bad_output(!ok);
        let check = |d: &Descriptor| {
            if d.ndim() == 0 {
                return Err("expects a tensor with at least one dimension".into());
            }
            divisible(d, 0, size, "dim")
        };
        self.group
            .collective(desc, check, |_| {
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let block = t.nbytes() / size;
                self.exchange_blocks(
                    &comm,
                    Op::AllToAll,
                    t.read_ptr(s),
                    out.write_ptr(s),
                    block,
                    t.dtype(),
                )
            })
            .map_err(|e| self.explain(e, out, t.dtype(), t.shape()))
    }

    /// FastVideo's `all_to_all_4D` on device (see the host
    /// [`all_to_all_4d`](GroupCoordinator::all_to_all_4d)): pack with strided
    /// 2-D copies, exchange with grouped send/recv, unpack with 2-D copies.
    pub fn all_to_all_4d(
        &self,
        t: &DeviceTensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<DeviceTensor> {
        let desc = Descriptor::for_tensor(
            Op::AllToAll4d,
            t.dtype(),
            t.shape(),
            &[scatter_dim as i64, gather_dim as i64],
        )
        .on_device();
        let size = self.group.size();
        self.group.collective(
            desc,
            |d| check_all_to_all_4d(d, size),
            |_| {
                let comm = self.comm()?;
                let s = self.gpu.stream();
                let elem = t.dtype().size();
                let mut packed = self.gpu.empty([t.nbytes()], DType::U8)?;
                let pp = packed.write_ptr(s);
                let plan = split_dim_copies(t.shape(), scatter_dim, size, elem);
                run_copies(&plan, t.read_ptr(s), pp, s.cu_stream())?;
                let mut received = self.gpu.empty([t.nbytes()], DType::U8)?;
                let rp = received.write_ptr(s);
                self.exchange_blocks(&comm, Op::AllToAll4d, pp, rp, t.nbytes() / size, t.dtype())?;
                let block_shape = scaled(t.shape(), scatter_dim, size, false);
                let mut out = self
                    .gpu
                    .empty(scaled(&block_shape, gather_dim, size, true), t.dtype())?;
                let plan = concat_dim_copies(&block_shape, gather_dim, size, elem);
                run_copies(&plan, rp, out.write_ptr(s), s.cu_stream())?;
                Ok(out)
            },
        )
    }

    /// The communicator for a point-to-point call, which cannot create one
    /// (only two members take part).
    fn p2p_comm(&self, op: Op) -> Result<Ref<'g, Communicator<'rt>>> {
        self.group.existing_nccl_comm().ok_or_else(|| {
            self.err(
                op,
                "the group has no NCCL communicator yet: call device().connect() on every \
                 member (or run a device collective) before device send/recv",
            )
        })
    }

    /// Sends `t` to group rank `dst` (the next member when `None`). Shape and
    /// dtype are checked with the receiver over MPI first; then enqueued.
    pub fn send(&self, t: &DeviceTensor, dst: Option<usize>) -> Result<()> {
        let dst = dst.unwrap_or((self.group.rank_in_group() + 1) % self.group.size());
        let desc = Descriptor::for_tensor(Op::Send, t.dtype(), t.shape(), &[]).on_device();
        self.group.point_to_point(desc, Peer::To(dst), |_| {
            let comm = self.p2p_comm(Op::Send)?;
            let src = t.read_ptr(self.gpu.stream());
            comm.grouped("ncclSend", |api, raw| unsafe {
                // SAFETY: `t` holds `numel` elements of its dtype.
                (api.send)(
                    src,
                    t.numel(),
                    nccl_dtype(t.dtype()),
                    dst as c_int,
                    raw,
                    self.stream(),
                )
            })
            .map_err(|m| self.err(Op::Send, m))
        })
    }

    /// Receives a tensor of `shape` and `dtype` from group rank `src` (the
    /// previous member when `None`).
    pub fn recv(&self, shape: &[usize], dtype: DType, src: Option<usize>) -> Result<DeviceTensor> {
        let size = self.group.size();
        let src = src.unwrap_or((self.group.rank_in_group() + size - 1) % size);
        let desc = Descriptor::for_tensor(Op::Send, dtype, shape, &[]).on_device();
        self.group.point_to_point(desc, Peer::From(src), |_| {
            let comm = self.p2p_comm(Op::Send)?;
            let mut t = self.gpu.empty(shape.to_vec(), dtype)?;
            let dst = t.write_ptr(self.gpu.stream());
            comm.grouped("ncclRecv", |api, raw| unsafe {
                // SAFETY: `t` holds `numel` elements of `dtype`.
                (api.recv)(
                    dst,
                    t.numel(),
                    nccl_dtype(dtype),
                    src as c_int,
                    raw,
                    self.stream(),
                )
            })
            .map_err(|m| self.err(Op::Send, m))?;
            Ok(t)
        })
    }
}

impl DeviceGroup<'_, '_> {
    /// Sends `t` to `dst` while receiving `out` from `src` (defaults: next and
    /// previous member), as the host [`send_recv_into`](GroupCoordinator::send_recv_into):
    /// each link is checked by its two ends over MPI; only links that agree
    /// are enqueued, so both ends of a link do the same thing.
    pub fn send_recv_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()> {
        let size = self.group.size();
        let me = self.group.rank_in_group();
        let dst = dst.unwrap_or((me + 1) % size);
        let src = src.unwrap_or((me + size - 1) % size);
        let sent = Descriptor::for_tensor(Op::Send, t.dtype(), t.shape(), &[]).on_device();
        let expected = Descriptor::for_tensor(Op::Send, out.dtype(), out.shape(), &[]).on_device();
        if dst == me || src == me {
            if dst != src {
                return Err(self.err(
                    Op::Send,
                    "dst and src must both be this rank or both another",
                ));
            }
            crate::dispatch::agree_peers(&sent, &expected, me, me)
                .map_err(|m| self.err(Op::Send, m))?;
            let s = self.gpu.stream();
            let own = crate::layout_ops::Copy2d {
                src_offset: 0,
                dst_offset: 0,
                width: t.nbytes(),
                height: 1,
                src_pitch: t.nbytes(),
                dst_pitch: t.nbytes(),
            };
            return run_copies(&[own], t.read_ptr(s), out.write_ptr(s), s.cu_stream());
        }
        let comm = self.p2p_comm(Op::Send)?;
        let s = self.gpu.stream();
        let (sp, rp) = (t.read_ptr(s), out.write_ptr(s));
        let (sn, rn) = (t.numel(), out.numel());
        let (sd, rd) = (nccl_dtype(t.dtype()), nccl_dtype(out.dtype()));
        let mut enqueued = Ok(());
        self.group
            .exchange(sent, dst, expected, src, |send_ok, recv_ok| {
                enqueued = comm.grouped("ncclSend/ncclRecv", |api, raw| unsafe {
                    // SAFETY: both tensors hold the counts passed, on this device.
                    let a = if send_ok {
                        (api.send)(sp, sn, sd, dst as c_int, raw, self.stream())
                    } else {
                        0
                    };
                    if a != 0 || !recv_ok {
                        return a;
                    }
                    (api.recv)(rp, rn, rd, src as c_int, raw, self.stream())
                });
            })?;
        enqueued.map_err(|m| self.err(Op::Send, m))
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
