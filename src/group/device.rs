//! The device executor: [`Collectives`] for [`DeviceGroup`] on
//! [`DeviceTensor`]s, with NCCL moving the bytes.
//!
//! Each call agrees on its descriptor over MPI (flagged as a device call, so
//! a host call meeting a device call is an error; when, is the group's
//! [check mode](crate::op::CheckMode)), creates the group's NCCL communicator on
//! first use, and *enqueues* the work on the group's stream (rankmesh's, or
//! the caller's: [`DeviceGroup::on_stream`]): results are ready after
//! [`DeviceGroup::synchronize`], a [`DeviceEvent`], or a [`Gpu::download`].
//! No call waits for the device in between. Inputs and outputs are
//! rankmesh's tensors or the caller's memory borrowed as views. Checks,
//! output shapes and errors come from the op's rules through the dispatch
//! path; non-leading dims are packed and unpacked with the `Copy2d` plans the
//! host plane uses too.

use super::connect::{connect, connect_pair};
use super::uneven::{all_to_all_v_desc, counted_desc, counts_found_here};
use super::{tensor_desc, GroupCoordinator, OutputFit, Peer};
use crate::agree::{Descriptor, ViewProblem};
use crate::device::copy::run_copies;
use crate::device::{DeviceTensor, DeviceView, DeviceViewMut, Gpu};
use crate::dtype::DType;
use crate::error::{Error, Fault, NcclError, Result};
use crate::group::{Collectives, P2p};
use crate::nccl::comm::{Communicator, Rooted};
use crate::nccl::result::reduced_as;
use crate::nccl::sys::RawStream;
use crate::op::ReduceOp;
use crate::op::{normalize_dim, Args, Op};
use crate::tensor::split::{
    concat_dim_copies, concat_uneven_copies, is_contiguous_split, split_dim_copies, Copy2d,
};
use crate::tensor::{numel, Element};
use cudarc::driver::{CudaEvent, CudaStream, DevicePtr, DevicePtrMut};
use std::cell::Ref;
use std::os::raw::c_void;
use std::sync::Arc;

/// A group's device plane: `tp.device()?.all_reduce(&x, ReduceOp::Sum)`,
/// enqueued on rankmesh's stream, or on yours with
/// `tp.device()?.on_stream(&stream)?`.
#[derive(Clone, Copy)]
pub struct DeviceGroup<'g, 'rt> {
    group: &'g GroupCoordinator<'rt>,
    gpu: &'rt Gpu,
    stream: &'g Arc<CudaStream>,
}

impl<'rt> GroupCoordinator<'rt> {
    /// The device plane of this group. Fails on this rank alone when it has
    /// no usable GPU stack (see [`Runtime::gpu`](crate::Runtime::gpu)).
    pub fn device(&self) -> Result<DeviceGroup<'_, 'rt>> {
        let gpu = self.runtime().gpu()?;
        Ok(DeviceGroup {
            group: self,
            gpu,
            stream: gpu.stream(),
        })
    }
}

/// Work enqueued on a group's stream up to a point, as a CUDA event: make
/// your stream wait for it ([`wait_on`](Self::wait_on)), or ask or wait on
/// the host. Asking and waiting settle deferred agreements first, so a
/// disagreement is an error there rather than a hang.
pub struct DeviceEvent<'rt> {
    event: CudaEvent,
    gpu: &'rt Gpu,
}

impl DeviceEvent<'_> {
    /// Makes `stream` wait (on the GPU) until the recorded work is done.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        stream
            .wait(&self.event)
            .map_err(|e| Error::Gpu(format!("cuStreamWaitEvent: {e}")))
    }

    /// Whether the recorded work is done. Never `true` before the deferred
    /// agreements of that work are complete and agreed: a done event first
    /// completes them (a disagreement is the error here); a pending one only
    /// tests them. NCCL communicators are polled for asynchronous errors.
    pub fn query(&self) -> Result<bool> {
        self.gpu.poll_comms()?;
        if self.event.is_complete() {
            self.gpu.settle()?;
            Ok(true)
        } else {
            self.gpu.settle_ready()?;
            Ok(false)
        }
    }

    /// Waits on the host until the recorded work is done, as
    /// [`Gpu::synchronize`] does for the whole device (same errors, same
    /// `RANKMESH_TIMEOUT`).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.wait_until_done(|| {
            // SAFETY: our own live event.
            unsafe { cudarc::driver::sys::cuEventQuery(self.event.cu_event()) }
        })
    }

    /// The event, for CUDA calls of your own.
    pub fn event(&self) -> &CudaEvent {
        &self.event
    }
}

fn at(p: *const c_void, bytes: usize) -> *const c_void {
    (p as usize + bytes) as *const c_void
}

fn at_mut(p: *mut c_void, bytes: usize) -> *mut c_void {
    (p as usize + bytes) as *mut c_void
}

impl<'g, 'rt> DeviceGroup<'g, 'rt> {
    /// The rank's GPU.
    pub fn gpu(&self) -> &'rt Gpu {
        self.gpu
    }

    /// The same group enqueuing on `stream` (a stream of this rank's device,
    /// e.g. candle's `CudaDevice::cuda_stream()`, or one wrapped with
    /// [`Gpu::wrap_stream`]). Tensors the calls allocate live on it;
    /// rankmesh's work stays in one order across streams (module docs of
    /// [`Gpu`]).
    pub fn on_stream(self, stream: &'g Arc<CudaStream>) -> Result<DeviceGroup<'g, 'rt>> {
        if stream.context().cu_ctx() != self.gpu.context().cu_ctx() {
            return Err(Error::Gpu(format!(
                "on_stream: the stream belongs to another CUDA context (device {}), not \
                 the primary context of device {} that rankmesh uses",
                stream.context().ordinal(),
                self.gpu.info().ordinal
            )));
        }
        Ok(DeviceGroup { stream, ..self })
    }

    /// The stream this group enqueues on.
    pub fn stream(&self) -> &'g Arc<CudaStream> {
        self.stream
    }

    /// Borrows `src` (cudarc's `CudaSlice` or `CudaView`, so candle's CUDA
    /// storage) as an input tensor of `shape`, without a copy, for calls of
    /// this group on its stream. The stream first waits for the buffer's last
    /// write when its context tracks events (cudarc's default), and the read
    /// is recorded when the view is dropped.
    pub fn view<'a, T: Element>(
        &self,
        src: &'a impl DevicePtr<T>,
        shape: impl Into<Vec<usize>>,
    ) -> Result<DeviceView<'a>>
    where
        'g: 'a,
    {
        let shape = shape.into();
        self.check_view::<T>(src.len(), src.stream(), &shape)?;
        self.gpu.order_on(self.stream)?;
        let (ptr, sync) = src.device_ptr(self.stream);
        Ok(DeviceView::new(T::DTYPE, shape, ptr, self.stream, sync))
    }

    /// Borrows `dst` (a `CudaSlice` or `CudaViewMut`) as an output (or
    /// input) tensor of `shape`, without a copy; see [`view`](Self::view).
    pub fn view_mut<'a, T: Element>(
        &self,
        dst: &'a mut impl DevicePtrMut<T>,
        shape: impl Into<Vec<usize>>,
    ) -> Result<DeviceViewMut<'a>>
    where
        'g: 'a,
    {
        let shape = shape.into();
        self.check_view::<T>(dst.len(), dst.stream(), &shape)?;
        self.gpu.order_on(self.stream)?;
        let (ptr, sync) = dst.device_ptr_mut(self.stream);
        Ok(DeviceViewMut::new(T::DTYPE, shape, ptr, self.stream, sync))
    }

    fn check_view<T: Element>(
        &self,
        len: usize,
        owner: &CudaStream,
        shape: &[usize],
    ) -> Result<()> {
        if std::mem::size_of::<T>() != T::DTYPE.size() {
            return Err(Error::Tensor(format!(
                "{} elements are {} bytes on the device, the Rust type has {}",
                T::DTYPE,
                T::DTYPE.size(),
                std::mem::size_of::<T>()
            )));
        }
        if owner.context().cu_ctx() != self.gpu.context().cu_ctx() {
            return Err(Error::Tensor(
                "a device view of memory from another CUDA context or device".into(),
            ));
        }
        let n = numel(shape);
        if n > len {
            return Err(Error::Tensor(format!(
                "a device view of shape {shape:?} needs {n} elements, the buffer has {len}"
            )));
        }
        Ok(())
    }

    /// An event recorded now on the group's stream: the point after every
    /// call enqueued so far (see [`DeviceEvent`]).
    pub fn record_event(&self) -> Result<DeviceEvent<'rt>> {
        self.gpu.order_on(self.stream)?;
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| Error::Gpu(format!("recording an event: {e}")))?;
        Ok(DeviceEvent {
            event,
            gpu: self.gpu,
        })
    }

    /// The dispatch path of a device collective with no output tensor (in
    /// place). An unusable view is flagged in this rank's descriptor, so
    /// every member refuses the call (the same error everywhere; this
    /// rank's adds what it found) instead of the others enqueuing work this
    /// rank never matches.
    #[inline]
    fn run_op<R>(
        &self,
        desc: &mut Descriptor,
        t: &DeviceTensor,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let view = t.view_problem(self.stream);
        self.dispatch(desc, OutputFit::Unchecked, view, body)
    }

    /// [`run_op`](Self::run_op) writing into the caller's `out`, checked
    /// (shape, dtype, view) and then handed to `body`.
    #[inline]
    fn run_op_into<R>(
        &self,
        desc: &mut Descriptor,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        body: impl FnOnce(&mut DeviceTensor) -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let view = t
            .view_problem(self.stream)
            .or_else(|| out.view_problem(self.stream));
        let fit = self.group.output_fit(desc, &*out);
        self.dispatch(desc, fit, view, || body(out))
    }

    /// Flags an unusable view in `desc`, then runs the group's dispatch
    /// path; the error of a rank that found the view names it.
    #[inline]
    fn dispatch<R>(
        &self,
        desc: &mut Descriptor,
        fit: OutputFit,
        view: Option<(ViewProblem, String)>,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        if let Some((problem, _)) = &view {
            desc.mark_unusable_view(*problem);
        }
        self.group
            .run_op(desc, fit, body)
            .map_err(|e| found_here(e, view))
    }

    /// `desc` of a point-to-point call on `t`, flagged when `t` is a view
    /// this call cannot use (both ends then refuse it).
    fn p2p_desc(&self, t: &DeviceTensor) -> (Descriptor, Option<(ViewProblem, String)>) {
        self.p2p_desc_of(Op::Send, t)
    }

    /// [`p2p_desc`](Self::p2p_desc) for `op`.
    fn p2p_desc_of(&self, op: Op, t: &DeviceTensor) -> (Descriptor, Option<(ViewProblem, String)>) {
        let mut desc = tensor_desc(Args::bare(op), t);
        let view = t.view_problem(self.stream);
        if let Some((problem, _)) = &view {
            desc.mark_unusable_view(*problem);
        }
        (desc, view)
    }

    /// The group's stream, put at the end of rankmesh's order: call before
    /// enqueuing on it.
    fn enqueue(&self) -> Result<&'g Arc<CudaStream>> {
        self.gpu.order_on(self.stream)?;
        Ok(self.stream)
    }

    fn raw(&self) -> RawStream {
        self.stream.cu_stream() as RawStream
    }

    /// The group's communicator, created on first use (collective).
    pub(crate) fn comm(&self) -> Result<Ref<'g, Communicator<'rt>>> {
        self.group.nccl_comm(|| connect(self.group, self.gpu))
    }

    /// The communicator reaching group rank `peer`, and `peer`'s index in
    /// it: the group's own communicator when it exists, else the two-member
    /// communicator of this rank and `peer`, made on first use by the two
    /// of them (a point-to-point call involves no one else, so it cannot
    /// create the group's). Call inside the agreed part of a point-to-point
    /// call, where the peer is too.
    fn link(&self, peer: usize) -> Result<(Ref<'g, Communicator<'rt>>, usize)> {
        if let Some(c) = self.group.existing_nccl_comm() {
            return Ok((c, peer));
        }
        let me = self.group.rank_in_group();
        let comm = self
            .group
            .nccl_pair(peer, || connect_pair(self.group, self.gpu, peer))?;
        Ok((comm, usize::from(peer > me)))
    }

    /// Links to several peers. Missing pair communicators are made in
    /// increasing peer order: every rank then makes its pairs in one global
    /// order (by lower, then higher member), so a ring cannot deadlock.
    fn links(&self, peers: &[usize]) -> Result<Vec<(Ref<'g, Communicator<'rt>>, usize)>> {
        let mut ordered = peers.to_vec();
        ordered.sort_unstable();
        ordered.dedup();
        for p in ordered {
            drop(self.link(p)?);
        }
        peers.iter().map(|p| self.link(*p)).collect()
    }

    /// Creates the group's NCCL communicator now (collective) instead of at
    /// the first device collective. Point-to-point calls do not need it: before
    /// it exists they use a communicator of the two members.
    pub fn connect(&self) -> Result<()> {
        let desc = Descriptor::new(Op::Connect, &[]).on_device();
        self.group
            .collective(desc, |_| Ok(()), |_| self.comm().map(|_| ()))
    }

    /// Whether this group runs its ops as local copies: a group of one,
    /// unless `RANKMESH_NCCL_FOR_ONE=1` sends them through NCCL anyway
    /// (as PyTorch does), which is how one GPU checks NCCL's own kernels.
    fn copies_alone(&self) -> bool {
        self.group.size() == 1 && !self.group.runtime().options().nccl_for_one
    }

    /// A group of one moves nothing: the op is a copy on this device (or
    /// nothing at all), without NCCL, as FastVideo skips communication on
    /// such groups. Reductions keep NCCL's dtype rules, so a call refused on
    /// a larger group is refused here too.
    fn alone(
        &self,
        t: &DeviceTensor,
        out: Option<&mut DeviceTensor>,
        reduce_op: Option<ReduceOp>,
    ) -> std::result::Result<(), Fault> {
        if let Some(op) = reduce_op {
            let version = self.gpu.nccl().map_or(i32::MAX, |n| n.version_code());
            reduced_as(t.dtype(), op, version, self.gpu.info().compute_capability)?;
        }
        if let Some(out) = out {
            self.copy(t, out)?;
        }
        Ok(())
    }

    /// Enqueues a device-to-device copy of `src` into `dst` (same byte size).
    pub(crate) fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        let s = self.enqueue()?;
        let n = src.nbytes().min(dst.nbytes());
        let one = Copy2d::bytes(0, 0, n);
        run_copies(&[one], src.ptr_on(s)?, dst.ptr_on(s)?, s.cu_stream())
    }

    /// A device scratch buffer of `bytes` bytes.
    fn scratch(&self, bytes: usize) -> Result<DeviceTensor> {
        self.empty(vec![bytes], DType::U8)
    }

    /// Waits for every device operation enqueued so far (see [`Gpu::synchronize`]).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }

    /// Block `r` of `src` to group rank `r`, block `r` of `dst` from rank `r`
    /// (`size` blocks of `block` bytes each; own block copied locally).
    fn exchange_blocks(
        &self,
        comm: &Communicator<'_>,
        src: *const c_void,
        dst: *mut c_void,
        block: usize,
        dtype: DType,
    ) -> std::result::Result<(), Fault> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        let count = block / dtype.size();
        if comm.has_native_collectives() {
            // SAFETY: both buffers hold `size` blocks of `count` elements.
            return Ok(unsafe { comm.all_to_all(src, dst, count, dtype, self.raw()) }?);
        }
        let fused = comm.group()?;
        for r in (0..size).filter(|r| *r != me) {
            // SAFETY: blocks `r` of both buffers hold `count` elements.
            unsafe {
                comm.send(at(src, r * block), count, dtype, r, self.raw())?;
                comm.recv(at_mut(dst, r * block), count, dtype, r, self.raw())?;
            }
        }
        fused.end()?;
        let own = Copy2d::bytes(me * block, me * block, block);
        Ok(run_copies(&[own], src, dst, self.stream.cu_stream())?)
    }
}

impl<'rt> Collectives<'rt> for DeviceGroup<'_, 'rt> {
    type Tensor = DeviceTensor;

    fn group(&self) -> &GroupCoordinator<'rt> {
        self.group
    }

    fn empty(&self, shape: Vec<usize>, dtype: DType) -> Result<DeviceTensor> {
        self.gpu.empty_on(self.stream, shape, dtype)
    }

    fn copy_flat(&self, t: &DeviceTensor, start: usize, len: usize) -> Result<DeviceTensor> {
        let out = self.empty(vec![len], t.dtype())?;
        let e = t.dtype().size();
        let s = self.enqueue()?;
        let one = Copy2d::bytes(start * e, 0, len * e);
        run_copies(&[one], t.ptr_on(s)?, out.ptr_on(s)?, s.cu_stream())?;
        Ok(out)
    }

    /// The group's host barrier: it does not wait for device work (use
    /// [`synchronize`](DeviceGroup::synchronize) for that).
    fn barrier(&self) -> Result<()> {
        self.group.barrier()
    }

    fn all_reduce_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        self.run_op_into(
            &mut tensor_desc(Args::all_reduce(reduce_op), t),
            t,
            out,
            |out| {
                if self.copies_alone() {
                    return self.alone(t, Some(out), Some(reduce_op));
                }
                let comm = self.comm()?;
                let s = self.enqueue()?;
                let (src, dst) = (t.ptr_on(s)?, out.ptr_on(s)?);
                // SAFETY: same shape and dtype (checked), both on this device.
                Ok(unsafe {
                    comm.all_reduce(src, dst, t.numel(), t.dtype(), reduce_op, self.raw())
                }?)
            },
        )
    }

    fn all_reduce_in_place(&self, t: &mut DeviceTensor, reduce_op: ReduceOp) -> Result<()> {
        self.run_op(
            &mut tensor_desc(Args::all_reduce(reduce_op), &*t),
            &*t,
            || {
                if self.copies_alone() {
                    return self.alone(t, None, Some(reduce_op));
                }
                let comm = self.comm()?;
                let p = t.ptr_on(self.enqueue()?)?;
                // SAFETY: one buffer used as both sides, as NCCL allows.
                Ok(unsafe { comm.all_reduce(p, p, t.numel(), t.dtype(), reduce_op, self.raw()) }?)
            },
        )
    }

    fn reduce_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: usize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        self.run_op_into(
            &mut tensor_desc(Args::reduce(dst, reduce_op), t),
            t,
            out,
            |out| {
                if self.copies_alone() {
                    return self.alone(t, Some(out), Some(reduce_op));
                }
                let comm = self.comm()?;
                let s = self.enqueue()?;
                let (src, out_p) = (t.ptr_on(s)?, out.ptr_on(s)?);
                let (n, dt) = (t.numel(), t.dtype());
                // SAFETY: same shape and dtype (checked), both on this device.
                Ok(unsafe { comm.reduce(src, out_p, n, dt, reduce_op, dst, self.raw()) }?)
            },
        )
    }

    fn all_gather_into(&self, t: &DeviceTensor, out: &mut DeviceTensor, dim: isize) -> Result<()> {
        let size = self.group.size();
        self.run_op_into(&mut tensor_desc(Args::all_gather(dim), t), t, out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if self.copies_alone() {
                return self.alone(t, Some(out), None);
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let src = t.ptr_on(s)?;
            let gather = |dst: *mut c_void| {
                // SAFETY: `dst` holds `size` blocks of `t`'s size.
                unsafe { comm.all_gather(src, dst, t.numel(), t.dtype(), self.raw()) }
            };
            if is_contiguous_split(t.shape(), d) {
                return Ok(gather(out.ptr_on(s)?)?);
            }
            let blocks = self.scratch(out.nbytes())?;
            let bp = blocks.ptr_on(s)?;
            gather(bp)?;
            let plan = concat_dim_copies(t.shape(), d, size, t.dtype().size());
            Ok(run_copies(&plan, bp, out.ptr_on(s)?, s.cu_stream())?)
        })
    }

    fn gather_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: usize,
        dim: isize,
    ) -> Result<()> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        self.run_op_into(&mut tensor_desc(Args::gather(dst, dim), t), t, out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if self.copies_alone() {
                return self.alone(t, Some(out), None);
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let src = t.ptr_on(s)?;
            let (n, dt) = (t.numel(), t.dtype());
            if comm.has_native_collectives() {
                let blocks = (me == dst)
                    .then(|| self.scratch(t.nbytes() * size))
                    .transpose()?;
                let bp = match &blocks {
                    Some(b) => b.ptr_on(s)?,
                    None => std::ptr::null_mut(),
                };
                // SAFETY: `t` holds `n` elements; on the root `blocks` holds `n × size`.
                unsafe { comm.rooted(Rooted::Gather, src, bp, n, dt, dst, self.raw()) }?;
                if me != dst {
                    return Ok(());
                }
                let plan = concat_dim_copies(t.shape(), d, size, dt.size());
                return Ok(run_copies(&plan, bp, out.ptr_on(s)?, s.cu_stream())?);
            }
            if me != dst {
                // SAFETY: `t` is alive until the stream runs the send.
                return Ok(unsafe { comm.send(src, n, dt, dst, self.raw()) }?);
            }
            let bytes = t.nbytes();
            let blocks = self.scratch(bytes * size)?;
            let bp = blocks.ptr_on(s)?;
            let fused = comm.group()?;
            for r in (0..size).filter(|r| *r != me) {
                // SAFETY: block `r` of `blocks` holds `n` elements.
                unsafe { comm.recv(at_mut(bp, r * bytes), n, dt, r, self.raw()) }?;
            }
            fused.end()?;
            run_copies(
                &[Copy2d::bytes(0, me * bytes, bytes)],
                src,
                bp,
                s.cu_stream(),
            )?;
            let plan = concat_dim_copies(t.shape(), d, size, dt.size());
            Ok(run_copies(&plan, bp, out.ptr_on(s)?, s.cu_stream())?)
        })
    }

    fn scatter_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        src: usize,
        dim: isize,
    ) -> Result<()> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        self.run_op_into(
            &mut tensor_desc(Args::scatter(src, dim), t),
            t,
            out,
            |out| {
                let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
                if self.copies_alone() {
                    return self.alone(t, Some(out), None);
                }
                let comm = self.comm()?;
                let s = self.enqueue()?;
                let (n, dt) = (out.numel(), out.dtype());
                let out_p = out.ptr_on(s)?;
                let native = comm.has_native_collectives();
                if me != src {
                    // SAFETY: `out` holds `n` elements, alive until the stream
                    // runs the call; the send side is the root's only.
                    return Ok(unsafe {
                        match native {
                            true => comm.rooted(
                                Rooted::Scatter,
                                std::ptr::null(),
                                out_p,
                                n,
                                dt,
                                src,
                                self.raw(),
                            ),
                            false => comm.recv(out_p, n, dt, src, self.raw()),
                        }
                    }?);
                }
                let mut packed = None;
                let mut blocks = t.ptr_on(s)?;
                if !is_contiguous_split(t.shape(), d) {
                    let p = packed.insert(self.scratch(t.nbytes())?).ptr_on(s)?;
                    let plan = split_dim_copies(t.shape(), d, size, dt.size());
                    run_copies(&plan, blocks, p, s.cu_stream())?;
                    blocks = p;
                }
                let bytes = out.nbytes();
                if native {
                    // SAFETY: `blocks` holds `size` blocks of `n` elements; `out` one.
                    return Ok(unsafe {
                        comm.rooted(Rooted::Scatter, blocks, out_p, n, dt, src, self.raw())
                    }?);
                }
                let fused = comm.group()?;
                for r in (0..size).filter(|r| *r != me) {
                    // SAFETY: block `r` of `blocks` holds `n` elements.
                    unsafe { comm.send(at(blocks, r * bytes), n, dt, r, self.raw()) }?;
                }
                fused.end()?;
                Ok(run_copies(
                    &[Copy2d::bytes(me * bytes, 0, bytes)],
                    blocks,
                    out_p,
                    s.cu_stream(),
                )?)
            },
        )
    }

    fn reduce_scatter_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        let size = self.group.size();
        let args = Args::reduce_scatter(dim, reduce_op);
        self.run_op_into(&mut tensor_desc(args, t), t, out, |out| {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if self.copies_alone() {
                return self.alone(t, Some(out), Some(reduce_op));
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let (n, dt) = (out.numel(), t.dtype());
            let scatter = |src: *const c_void, dst: *mut c_void| {
                // SAFETY: `src` holds `size` slices of `out`'s size.
                unsafe { comm.reduce_scatter(src, dst, n, dt, reduce_op, self.raw()) }
            };
            let out_p = out.ptr_on(s)?;
            if is_contiguous_split(t.shape(), d) {
                return Ok(scatter(t.ptr_on(s)?, out_p)?);
            }
            let packed = self.scratch(t.nbytes())?;
            let pp = packed.ptr_on(s)?;
            let plan = split_dim_copies(t.shape(), d, size, dt.size());
            run_copies(&plan, t.ptr_on(s)?, pp, s.cu_stream())?;
            Ok(scatter(pp, out_p)?)
        })
    }

    fn broadcast(&self, t: &mut DeviceTensor, src: usize) -> Result<()> {
        self.run_op(&mut tensor_desc(Args::broadcast(src), &*t), &*t, || {
            if self.copies_alone() {
                return self.alone(t, None, None);
            }
            let comm = self.comm()?;
            let p = t.ptr_on(self.enqueue()?)?;
            // SAFETY: in place, as NCCL allows.
            Ok(unsafe { comm.broadcast(p, p, t.numel(), t.dtype(), src, self.raw()) }?)
        })
    }

    fn all_to_all_into(&self, t: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let size = self.group.size();
        self.run_op_into(
            &mut tensor_desc(Args::bare(Op::AllToAll), t),
            t,
            out,
            |out| {
                if self.copies_alone() {
                    return self.alone(t, Some(out), None);
                }
                let comm = self.comm()?;
                let s = self.enqueue()?;
                let (src, dst) = (t.ptr_on(s)?, out.ptr_on(s)?);
                self.exchange_blocks(&comm, src, dst, t.nbytes() / size, t.dtype())
            },
        )
    }

    /// Packs with strided 2-D copies, exchanges with grouped send/recv,
    /// unpacks with 2-D copies.
    fn all_to_all_4d_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<()> {
        let size = self.group.size();
        let args = Args::all_to_all_4d(scatter_dim, gather_dim);
        self.run_op_into(&mut tensor_desc(args, t), t, out, |out| {
            if self.copies_alone() {
                return self.alone(t, Some(out), None);
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let elem = t.dtype().size();
            let packed = self.scratch(t.nbytes())?;
            let pp = packed.ptr_on(s)?;
            let plan = split_dim_copies(t.shape(), scatter_dim, size, elem);
            run_copies(&plan, t.ptr_on(s)?, pp, s.cu_stream())?;
            let received = self.scratch(t.nbytes())?;
            let rp = received.ptr_on(s)?;
            self.exchange_blocks(&comm, pp, rp, t.nbytes() / size, t.dtype())?;
            let mut block_shape = t.shape().to_vec();
            block_shape[scatter_dim] /= size;
            let plan = concat_dim_copies(&block_shape, gather_dim, size, elem);
            Ok(run_copies(&plan, rp, out.ptr_on(s)?, s.cu_stream())?)
        })
    }

    /// The counts are exchanged over MPI (each link checked by its two
    /// ends), then every agreed link is enqueued in one NCCL group.
    fn all_to_all_v_into(
        &self,
        t: &DeviceTensor,
        send_counts: &[usize],
        out: &mut DeviceTensor,
        recv_counts: &[usize],
    ) -> Result<()> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        let (mut desc, problem) = all_to_all_v_desc(t, send_counts, &*out, recv_counts, size);
        let view = t
            .view_problem(self.stream)
            .or_else(|| out.view_problem(self.stream));
        let refused = self
            .dispatch(&mut desc, OutputFit::Unchecked, view, || {
                let links = self.group.swap_counts(send_counts, recv_counts)?;
                let row_elems = numel(&t.shape()[1..]);
                let row = row_elems * t.dtype().size();
                let (sent, got) = links.placed((send_counts, recv_counts), row);
                let s = self.enqueue()?;
                let (src, dst) = (t.ptr_on(s)?, out.ptr_on(s)?);
                if size > 1 {
                    let comm = self.comm()?;
                    let fused = comm.group()?;
                    for r in (0..size).filter(|r| *r != me) {
                        let (ns, nr) = (links.send[r] * row_elems, links.recv[r] * row_elems);
                        // SAFETY: the spans lie inside the tensors (the
                        // counts were checked against their dim 0).
                        unsafe {
                            if ns > 0 {
                                comm.send(at(src, sent[r].start), ns, t.dtype(), r, self.raw())?;
                            }
                            if nr > 0 {
                                comm.recv(at_mut(dst, got[r].start), nr, t.dtype(), r, self.raw())?;
                            }
                        }
                    }
                    fused.end()?;
                }
                let own = Copy2d::bytes(sent[me].start, got[me].start, got[me].len());
                run_copies(&[own], src, dst, s.cu_stream())?;
                Ok(links.refused)
            })
            .map_err(|e| counts_found_here(e, &problem))?;
        match refused {
            Some(m) => Err(Error::mismatch(Op::AllToAllV, self.group.name(), m)),
            None => Ok(()),
        }
    }

    /// One NCCL group of broadcasts, one per member with a non-zero count,
    /// each into its place (NCCL has no all-gather of uneven counts); a
    /// non-leading dim goes through scratch and 2-D copies.
    fn all_gather_v_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        counts: &[usize],
        dim: isize,
    ) -> Result<()> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        let (mut desc, problem) = counted_desc(
            Args::counted(Op::AllGatherV, dim, counts, None),
            (t, &*out),
            (counts, dim),
            (me, size),
        );
        let view = t
            .view_problem(self.stream)
            .or_else(|| out.view_problem(self.stream));
        let fit = self.group.output_fit(&desc, &*out);
        self.dispatch(&mut desc, fit, view, || {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if self.copies_alone() {
                return self.alone(t, Some(out), None);
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let src = t.ptr_on(s)?;
            let slice = numel(&t.shape()[..d]) * numel(&t.shape()[d + 1..]);
            let contiguous = is_contiguous_split(t.shape(), d);
            let blocks = match contiguous {
                true => None,
                false => Some(self.scratch(out.nbytes())?),
            };
            let dst = match &blocks {
                Some(b) => b.ptr_on(s)?,
                None => out.ptr_on(s)?,
            };
            let fused = comm.group()?;
            let mut at_elem = 0;
            for (r, n) in counts.iter().enumerate() {
                let count = n * slice;
                if count > 0 {
                    let into = at_mut(dst, at_elem * t.dtype().size());
                    // SAFETY: member `r`'s block lies inside `dst` (the
                    // counts were agreed and checked against the output).
                    unsafe { comm.broadcast(src, into, count, t.dtype(), r, self.raw())? };
                }
                at_elem += count;
            }
            fused.end()?;
            if let Some(b) = blocks {
                let plan = concat_uneven_copies(out.shape(), d, counts, t.dtype().size());
                run_copies(&plan, b.ptr_on(s)?, out.ptr_on(s)?, s.cu_stream())?;
            }
            Ok(())
        })
        .map_err(|e| counts_found_here(e, &problem))
    }

    /// One NCCL group of reduces, one per member with a non-zero count, each
    /// onto that member from its block (NCCL has no reduce-scatter of
    /// uneven counts; grouped reduces move each block once where a padded
    /// `ncclReduceScatter` moves `size` longest blocks); a non-leading dim
    /// is packed into blocks in scratch first.
    fn reduce_scatter_v_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        counts: &[usize],
        dim: isize,
        reduce_op: ReduceOp,
    ) -> Result<()> {
        let (size, me) = (self.group.size(), self.group.rank_in_group());
        let args = Args::counted(Op::ReduceScatterV, dim, counts, Some(reduce_op));
        let (mut desc, problem) = counted_desc(args, (t, &*out), (counts, dim), (me, size));
        let view = t
            .view_problem(self.stream)
            .or_else(|| out.view_problem(self.stream));
        self.dispatch(&mut desc, OutputFit::Unchecked, view, || {
            let d = normalize_dim(dim, t.ndim()).expect("checked by dispatch");
            if self.copies_alone() {
                return self.alone(t, Some(out), Some(reduce_op));
            }
            let comm = self.comm()?;
            let s = self.enqueue()?;
            let dt = t.dtype();
            let slice = numel(&t.shape()[..d]) * numel(&t.shape()[d + 1..]);
            let packed = match is_contiguous_split(t.shape(), d) {
                true => None,
                false => Some(self.scratch(t.nbytes())?),
            };
            let src = match &packed {
                Some(p) => {
                    let plan: Vec<Copy2d> = concat_uneven_copies(t.shape(), d, counts, dt.size())
                        .iter()
                        .map(Copy2d::reversed)
                        .collect();
                    run_copies(&plan, t.ptr_on(s)?, p.ptr_on(s)?, s.cu_stream())?;
                    p.ptr_on(s)?
                }
                None => t.ptr_on(s)?,
            };
            let dst = out.ptr_on(s)?;
            let fused = comm.group()?;
            let mut at_elem = 0;
            for (r, n) in counts.iter().enumerate() {
                let count = n * slice;
                if count > 0 {
                    let from = at(src, at_elem * dt.size());
                    // SAFETY: member `r`'s block lies inside `src` (the counts
                    // were agreed and add up to the input), and the root's
                    // output holds its own count (checked with its counts).
                    unsafe { comm.reduce(from, dst, count, dt, reduce_op, r, self.raw())? };
                }
                at_elem += count;
            }
            fused.end()?;
            Ok(())
        })
        .map_err(|e| counts_found_here(e, &problem))
    }

    /// Shape and dtype are checked with the receiver over MPI first; then enqueued.
    fn send(&self, t: &DeviceTensor, dst: Option<usize>) -> Result<()> {
        let (dst, _) = self.group.ring_peers(dst, None);
        let (desc, view) = self.p2p_desc(t);
        self.group
            .point_to_point(desc, Peer::To(dst), |_| {
                let (comm, peer) = self.link(dst)?;
                let src = t.ptr_on(self.enqueue()?)?;
                // SAFETY: `t` holds `numel` elements of its dtype.
                Ok(unsafe { comm.send(src, t.numel(), t.dtype(), peer, self.raw()) }?)
            })
            .map_err(|e| found_here(e, view))
    }

    fn recv_into(&self, out: &mut DeviceTensor, src: Option<usize>) -> Result<()> {
        let (_, src) = self.group.ring_peers(None, src);
        let (desc, view) = self.p2p_desc(out);
        self.group
            .point_to_point(desc, Peer::From(src), |_| {
                let (comm, peer) = self.link(src)?;
                let dst = out.ptr_on(self.enqueue()?)?;
                // SAFETY: `out` holds `numel` elements of its dtype.
                Ok(unsafe { comm.recv(dst, out.numel(), out.dtype(), peer, self.raw()) }?)
            })
            .map_err(|e| found_here(e, view))
    }

    /// Each link is checked by its two ends over MPI; only links that agree
    /// are enqueued, so both ends of a link do the same thing.
    fn batch_send_recv(&self, ops: &mut [P2p<'_, DeviceTensor>]) -> Result<()> {
        let mut view = None;
        let pairs: Vec<(Descriptor, Peer)> = ops
            .iter()
            .map(|o| {
                let (t, peer) = o.parts();
                let (desc, v) = self.p2p_desc_of(Op::BatchSendRecv, t);
                view = view.take().or(v);
                match o {
                    P2p::Send(..) => (desc, Peer::To(peer)),
                    P2p::Recv(..) => (desc, Peer::From(peer)),
                }
            })
            .collect();
        self.group
            .exchange_batch(&pairs, |agreed| {
                // Only the pairs both ends agreed on, all in one NCCL group
                // (across pair communicators too: the bracket is NCCL-wide).
                let s = self.enqueue()?;
                let moving: Vec<&P2p<'_, DeviceTensor>> = ops
                    .iter()
                    .zip(agreed)
                    .filter_map(|(o, ok)| ok.then_some(o))
                    .collect();
                let peers: Vec<usize> = moving.iter().map(|o| o.parts().1).collect();
                let links = self.links(&peers)?;
                let Some((first, _)) = links.first() else {
                    return Ok(());
                };
                let fused = first.group()?;
                for (o, (comm, peer)) in moving.iter().zip(&links) {
                    let t = o.parts().0;
                    let p = t.ptr_on(s)?;
                    // SAFETY: `t` holds `numel` elements of its dtype on this device.
                    unsafe {
                        match o {
                            P2p::Send(..) => {
                                comm.send(p, t.numel(), t.dtype(), *peer, self.raw())?
                            }
                            P2p::Recv(..) => {
                                comm.recv(p, t.numel(), t.dtype(), *peer, self.raw())?
                            }
                        }
                    }
                }
                Ok(fused.end()?)
            })
            .map_err(|e| found_here(e, view))
    }

    fn send_recv_into(
        &self,
        t: &DeviceTensor,
        out: &mut DeviceTensor,
        dst: Option<usize>,
        src: Option<usize>,
    ) -> Result<()> {
        let (dst, src) = self.group.ring_peers(dst, src);
        let (sent, sent_view) = self.p2p_desc(t);
        let (expected, expected_view) = self.p2p_desc(&*out);
        let view = sent_view.or(expected_view);
        if self.group.send_recv_to_self(&sent, &expected, dst, src)? {
            return self.copy(t, out);
        }
        self.group
            .exchange(sent, dst, expected, src, |send_ok, recv_ok| {
                // Only the links both ends agreed on: a flagged view here
                // refused its own link, the other may still move.
                let s = self.enqueue()?;
                let sp = if send_ok {
                    t.ptr_on(s)?
                } else {
                    std::ptr::null_mut()
                };
                let rp = if recv_ok {
                    out.ptr_on(s)?
                } else {
                    std::ptr::null_mut()
                };
                let peers: Vec<usize> = [(send_ok, dst), (recv_ok, src)]
                    .into_iter()
                    .filter_map(|(ok, p)| ok.then_some(p))
                    .collect();
                let links = self.links(&peers)?;
                let Some((first, _)) = links.first() else {
                    return Ok(());
                };
                // One NCCL group for both directions (across two pair
                // communicators too: the bracket is NCCL-wide).
                let fused = first.group()?;
                let mut links = links.iter();
                // SAFETY: both tensors hold the counts passed, on this device.
                unsafe {
                    if send_ok {
                        let (comm, peer) = links.next().expect("a link per peer");
                        comm.send(sp, t.numel(), t.dtype(), *peer, self.raw())?;
                    }
                    if recv_ok {
                        let (comm, peer) = links.next().expect("a link per peer");
                        comm.recv(rp, out.numel(), out.dtype(), *peer, self.raw())?;
                    }
                }
                Ok(fused.end()?)
            })
            .map_err(|e| found_here(e, view))
    }
}

/// `e` with what this rank found wrong with its own view, when it did.
fn found_here(e: Error, view: Option<(ViewProblem, String)>) -> Error {
    match view {
        Some((_, here)) => e.noted(format_args!("this rank: {here}")),
        None => e,
    }
}

/// A dictionary's device tensors move in one NCCL group: every send,
/// receive or broadcast is enqueued together, so none waits for another.
impl<'rt> super::Batch<'rt> for DeviceGroup<'_, 'rt> {
    fn send_batch(&self, ts: &[&DeviceTensor], dst: usize) -> Result<()> {
        let (comm, peer) = self.link(dst)?;
        let s = self.enqueue()?;
        let ptrs = ts.iter().map(|t| t.ptr_on(s)).collect::<Result<Vec<_>>>()?;
        self.in_one_group(Op::Send, &comm, ts.iter().zip(ptrs), |(t, p)| {
            // SAFETY: `t` holds `numel` elements of its dtype.
            unsafe { comm.send(p, t.numel(), t.dtype(), peer, self.raw()) }
        })
    }

    fn recv_batch(&self, outs: &mut [&mut DeviceTensor], src: usize) -> Result<()> {
        let (comm, peer) = self.link(src)?;
        let s = self.enqueue()?;
        let ptrs = outs
            .iter()
            .map(|t| t.ptr_on(s))
            .collect::<Result<Vec<_>>>()?;
        self.in_one_group(Op::Send, &comm, outs.iter().zip(ptrs), |(t, p)| {
            // SAFETY: `t` holds `numel` elements of its dtype.
            unsafe { comm.recv(p, t.numel(), t.dtype(), peer, self.raw()) }
        })
    }

    fn broadcast_batch(&self, ts: &mut [&mut DeviceTensor], src: usize) -> Result<()> {
        if self.copies_alone() {
            return Ok(());
        }
        let comm = self.comm()?;
        let s = self.enqueue()?;
        let ptrs = ts.iter().map(|t| t.ptr_on(s)).collect::<Result<Vec<_>>>()?;
        self.in_one_group(Op::Broadcast, &comm, ts.iter().zip(ptrs), |(t, p)| {
            let (n, dt) = (t.numel(), t.dtype());
            // SAFETY: in place, as NCCL allows; `t` holds `n` elements.
            unsafe { comm.broadcast(p, p, n, dt, src, self.raw()) }
        })
    }
}

impl DeviceGroup<'_, '_> {
    /// `each` on every item between one `ncclGroupStart` and its end, so
    /// that no transfer of a batch waits for another; a failure is `op`'s.
    fn in_one_group<T>(
        &self,
        op: Op,
        comm: &Communicator<'_>,
        items: impl IntoIterator<Item = T>,
        mut each: impl FnMut(T) -> std::result::Result<(), NcclError>,
    ) -> Result<()> {
        let fused = comm.group().and_then(|fused| {
            for item in items {
                each(item)?;
            }
            fused.end()
        });
        fused.map_err(|e| Error::nccl(op, self.group.name(), e))
    }
}
