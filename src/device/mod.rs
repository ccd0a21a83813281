//! The GPU side of a rank: its CUDA device, the one stream rankmesh enqueues
//! on, the NCCL library, and the waiting loop that turns a failed peer into an
//! error instead of a hang.
//!
//! Found at run time: a build without CUDA, driver or NCCL works, and
//! [`Runtime::gpu`](crate::Runtime::gpu) says what is missing. NCCL is
//! needed only for communication: without it the GPU still opens, groups of
//! one member run every device op as a local copy (FastVideo skips
//! communication there too), and the first op that needs a communicator is
//! the same error on every member, naming the ranks without NCCL.
//!
//! **One order.** By default every group enqueues on the rank's one stream;
//! a group can enqueue on the caller's stream instead
//! ([`DeviceGroup::on_stream`](crate::DeviceGroup::on_stream)). Either way rankmesh's calls run in the order
//! the program issued them (`order`: a switch of stream waits for the
//! previous one), which keeps NCCL's cross-communicator deadlock away and
//! makes one op's results safe inputs for the next without events of the
//! caller's. cudarc's per-buffer event tracking is off on rankmesh's
//! context for the same reason (it costs two driver calls per buffer per op).

pub(crate) mod copy;
pub mod driver;
mod order;
pub(crate) mod select;
mod tensor;

pub use tensor::{DeviceTensor, DeviceView, DeviceViewMut};

use crate::agree::{Deferred, Verdict, SCAN_EVERY};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nccl::comm::CommState;
use crate::nccl::loader::{self, Nccl};
use crate::nccl::sys::Api;
use crate::op::Op;
use crate::tensor::Tensor;
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};
use order::Tail;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often [`Gpu::own_failure`] looks at a group's communicators.
const OWN_FAILURE_LOOKS: u32 = 20;

/// Which GPU a rank drives.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    /// CUDA ordinal as this process sees it (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// PCI bus id, e.g. `0000:1B:00.0`.
    pub bus_id: String,
    /// CUDA version the driver supports, e.g. `12.4`.
    pub driver: String,
    /// Compute capability (major, minor), e.g. `(9, 0)` for Hopper.
    pub compute_capability: (u32, u32),
}

/// This rank's GPU, stream and NCCL library (see the module docs).
pub struct Gpu {
    info: DeviceInfo,
    // Drop order: stream, then context, then the library.
    stream: Arc<CudaStream>,
    tail: Arc<Tail>,
    ctx: Arc<CudaContext>,
    comms: RefCell<Vec<Weak<CommState>>>,
    /// The world's communicator (`Runtime::connect_devices`): spared when
    /// a lost rank (ULFM) aborts the others, so the survivors can shrink it.
    root: RefCell<Weak<CommState>>,
    /// Groups with deferred agreements (see `check`).
    deferred: RefCell<Vec<Weak<Deferred>>>,
    /// Of those, groups posting through MPI (counted when registered).
    mpi_posting: Cell<usize>,
    /// Deferred device calls so far (see `settle_at_call`).
    calls: Cell<u64>,
    timeout: Option<Duration>,
    nccl: std::result::Result<Nccl, String>,
}

fn cuda(what: &str, e: cu::DriverError) -> Error {
    Error::Gpu(format!("{what}: {e}"))
}

impl Gpu {
    /// Opens the device for local rank `local_rank` of `local_size`: driver,
    /// NCCL, device choice (`device`, then `CUDA_VISIBLE_DEVICES`), context
    /// and stream. Local: no other rank takes part. `device` and
    /// `nccl_lib`: the runtime's
    /// [`Options::device`](crate::Options::device) and
    /// [`Options::nccl_lib`](crate::Options::nccl_lib).
    pub(crate) fn open(
        local_rank: usize,
        local_size: usize,
        device: Option<&str>,
        nccl_lib: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<Gpu> {
        let env = |k: &str| std::env::var(k).ok();
        // Both checks run, so one message lists everything missing.
        let device = probe(local_rank, local_size, device);
        let nccl = loader::load(nccl_lib, &env).and_then(|n| n.api().map(|_| ()).map(|_| n));
        let (info, nccl) = match (device, nccl) {
            (Ok(d), n) => (d, n.map_err(|e| why_missing(&e))),
            (Err(d), n) => {
                // One message lists everything missing.
                let mut problems = vec![why_missing(&d)];
                if let Err(e) = n {
                    problems.push(why_missing(&e));
                }
                return Err(Error::Gpu(problems.join("\n")));
            }
        };
        let ctx =
            CudaContext::new(info.ordinal).map_err(|e| cuda("creating the CUDA context", e))?;
        // SAFETY: rankmesh orders all of its work on one stream (module docs),
        // so cudarc's cross-stream events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| cuda("creating the CUDA stream", e))?;
        Ok(Gpu {
            info,
            tail: Tail::new(stream.clone()),
            stream,
            ctx,
            comms: RefCell::new(Vec::new()),
            root: RefCell::new(Weak::new()),
            deferred: RefCell::new(Vec::new()),
            mpi_posting: Cell::new(0),
            calls: Cell::new(0),
            timeout,
            nccl,
        })
    }

    /// Which device this rank drives.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The NCCL library in use, or why there is none.
    pub fn nccl(&self) -> Result<&Nccl> {
        self.nccl.as_ref().map_err(|m| Error::Gpu(m.clone()))
    }

    /// `RANKMESH_TIMEOUT`: how long device work and NCCL's background
    /// work may take before communicators are aborted.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// NCCL's entry points, or why this rank has none.
    pub(crate) fn api(&self) -> Result<&'static Api> {
        self.nccl()?.api()
    }

    /// rankmesh's own stream: groups enqueue on it unless given another
    /// ([`DeviceGroup::on_stream`](crate::DeviceGroup::on_stream)). Order your own kernels on it (or wait
    /// for it) when they touch tensors of calls made on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Wraps a stream of another library (a raw `CUstream`) for
    /// [`DeviceGroup::on_stream`](crate::DeviceGroup::on_stream); the stream is not destroyed with the
    /// wrapper.
    ///
    /// # Safety
    /// `stream` is a live stream of this rank's device in its primary
    /// context (the one rankmesh and candle use), and stays alive while the
    /// wrapper, or a tensor or group using it, exists.
    pub unsafe fn wrap_stream(&self, stream: sys::CUstream) -> Arc<CudaStream> {
        // SAFETY: the caller's contract above is cudarc's.
        unsafe { self.ctx.wrap_borrowed_stream(stream) }
    }

    /// rankmesh's own stream, put at the end of its order of device work.
    pub(crate) fn enqueue_own(&self) -> Result<&Arc<CudaStream>> {
        self.order_on(&self.stream)?;
        Ok(&self.stream)
    }

    /// Puts `stream` at the end of rankmesh's one order of device work
    /// (module docs); call before enqueuing on it.
    pub(crate) fn order_on(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.tail
            .order_on(stream)
            .map_err(|e| cuda("ordering rankmesh's streams (event record and wait)", e))
    }

    /// The CUDA context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Registers the world's communicator (see `root`).
    pub(crate) fn register_root(&self, state: &Rc<CommState>) {
        self.register(state);
        *self.root.borrow_mut() = Rc::downgrade(state);
    }

    pub(crate) fn register(&self, state: &Rc<CommState>) {
        let mut comms = self.comms.borrow_mut();
        comms.retain(|w| w.strong_count() > 0);
        comms.push(Rc::downgrade(state));
    }

    /// A zero-filled device tensor.
    pub fn zeros(&self, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<DeviceTensor> {
        let t = self.empty(shape.into(), dtype)?;
        let s = &self.stream;
        let p = t.ptr_on(s)? as u64;
        // SAFETY: `p` addresses at least `t.nbytes()` bytes of this device.
        unsafe { cu::memset_d8_async(p, 0, t.nbytes(), s.cu_stream()) }
            .map_err(|e| cuda("zeroing device memory", e))?;
        Ok(t)
    }

    /// A device tensor with unspecified contents, for outputs that an
    /// operation overwrites entirely (saves the memset kernel of `zeros`).
    pub(crate) fn empty(&self, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<DeviceTensor> {
        self.empty_on(&self.stream, shape.into(), dtype)
    }

    /// [`empty`](Self::empty) allocated (and later freed) on `stream`, the
    /// stream of the call that uses it.
    pub(crate) fn empty_on(
        &self,
        stream: &Arc<CudaStream>,
        shape: Vec<usize>,
        dtype: DType,
    ) -> Result<DeviceTensor> {
        self.order_on(stream)?;
        let n = crate::tensor::numel(&shape) * dtype.size();
        // SAFETY: u8 has no invalid bit patterns; callers write before reading.
        let buf = unsafe { stream.alloc::<u8>(n.max(1)) }
            .map_err(|e| cuda(&format!("allocating {n} bytes"), e))?;
        Ok(DeviceTensor::owned(dtype, shape, buf, self.tail.clone()))
    }

    /// Copies a host tensor to the device (enqueued on [`stream`](Self::stream);
    /// `t` may be reused as soon as this returns).
    pub fn upload(&self, t: &Tensor) -> Result<DeviceTensor> {
        let mut d = self.empty(t.shape().to_vec(), t.dtype())?;
        self.upload_into(t, &mut d)?;
        Ok(d)
    }

    /// Copies a host tensor into an existing device tensor of the same shape and dtype.
    pub fn upload_into(&self, t: &Tensor, d: &mut DeviceTensor) -> Result<()> {
        if t.dtype() != d.dtype() || t.shape() != d.shape() {
            return Err(Error::Tensor(format!(
                "upload of a {:?} {} tensor into a {:?} {} device tensor",
                t.shape(),
                t.dtype(),
                d.shape(),
                d.dtype()
            )));
        }
        if t.nbytes() == 0 {
            return Ok(());
        }
        self.order_on(&self.stream)?;
        let dst = d.ptr_on(&self.stream)? as u64;
        // SAFETY: `dst` holds `t.nbytes()` bytes (same shape and dtype); the
        // driver stages pageable memory before returning.
        unsafe { cu::memcpy_htod_async(dst, t.bytes(), self.stream.cu_stream()) }
            .map_err(|e| cuda("host-to-device copy", e))
    }

    /// Copies a device tensor to the host, after all work enqueued before it
    /// (waits like [`synchronize`](Self::synchronize)).
    pub fn download(&self, d: &DeviceTensor) -> Result<Tensor> {
        let mut t = Tensor::zeros(d.shape().to_vec(), d.dtype())?;
        // A copy into pageable memory blocks until the stream reaches it, so
        // wait first with the polling loop: a stuck NCCL call becomes an
        // error here, not a hang inside the copy.
        self.synchronize()?;
        if t.nbytes() > 0 {
            self.order_on(&self.stream)?;
            let src = d.ptr_on(&self.stream)? as u64;
            // SAFETY: `t` holds exactly `d.nbytes()` bytes and outlives the
            // copy: `synchronize` below returns only once the stream is done.
            unsafe { cu::memcpy_dtoh_async(t.bytes_mut(), src, self.stream.cu_stream()) }
                .map_err(|e| cuda("device-to-host copy", e))?;
            self.synchronize()?;
        }
        Ok(t)
    }

    /// Waits until every operation enqueued so far has finished: the point at
    /// which device results are ready. While waiting it polls every live NCCL
    /// communicator for asynchronous errors (a failed peer becomes an error,
    /// the communicator is aborted) and gives up after `RANKMESH_TIMEOUT`.
    pub fn synchronize(&self) -> Result<()> {
        // The tail's work follows all of rankmesh's earlier work (`order`).
        let tail = self.tail.stream();
        self.wait_until_done(|| {
            // SAFETY: a live stream (held above), context bound by the loop.
            unsafe { sys::cuStreamQuery(tail.cu_stream()) }
        })
    }

    /// The waiting loop of every host-side wait: settles deferred
    /// agreements, then asks `query` (a stream or event query) until it
    /// answers success, polling the NCCL communicators for asynchronous
    /// errors and giving up after `RANKMESH_TIMEOUT`.
    pub(crate) fn wait_until_done(&self, query: impl Fn() -> sys::CUresult) -> Result<()> {
        self.settle()?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda("binding the CUDA context", e))?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            match query() {
                // A communicator can hold an error even when its kernels
                // finished (a proxy or peer failure): check before reporting success.
                sys::CUresult::CUDA_SUCCESS => return self.poll_comms(),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                rc => return Err(cuda("waiting for the device", cu::DriverError(rc))),
            }
            self.poll_comms()?;
            if let Some(limit) = self.timeout {
                if start.elapsed() > limit {
                    let why = format!(
                        "device work did not finish within {} s (RANKMESH_TIMEOUT)",
                        limit.as_secs_f64()
                    );
                    let groups = self.abort_all(&why);
                    return Err(Error::Timeout {
                        op: Op::Synchronize,
                        group: groups,
                        msg: why + "; NCCL communicators aborted",
                    });
                }
            }
            // Spin briefly (small collectives finish in microseconds), then back off.
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Completes the deferred agreements of every group (see `check`),
    /// waiting for each at most `RANKMESH_TIMEOUT`.
    pub(crate) fn settle(&self) -> Result<()> {
        let limit = self.timeout.unwrap_or(Duration::from_secs(600));
        self.complete_agreements(Some(Instant::now() + limit))
    }

    /// Completes the deferred agreements that are done already (no wait).
    pub(crate) fn settle_ready(&self) -> Result<()> {
        self.complete_agreements(None)
    }

    /// At a deferred device call: completes the agreements that are done.
    /// While every group posts to shared-memory rings only every
    /// [`SCAN_EVERY`]-th call looks (a ring wants a test at most every
    /// `ENTRIES / 8` posts, and a full ring is settled before its next post
    /// anyway); MPI posts are tested at every call, since MPI progresses
    /// only when called.
    pub(crate) fn settle_at_call(&self) -> Result<()> {
        let n = self.calls.get().wrapping_add(1);
        self.calls.set(n);
        if self.mpi_posting.get() == 0 && !n.is_multiple_of(SCAN_EVERY) {
            return Ok(());
        }
        self.complete_agreements(None)
    }

    pub(crate) fn register_deferred(&self, d: &Rc<Deferred>) {
        let mut all = self.deferred.borrow_mut();
        all.retain(|w| w.strong_count() > 0);
        all.push(Rc::downgrade(d));
        let mpi = all
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|d| !d.on_ring());
        self.mpi_posting.set(mpi.count());
    }

    fn complete_agreements(&self, deadline: Option<Instant>) -> Result<()> {
        // By index, holding no borrow while a group completes (every device
        // call gets here: no collecting into a new vector).
        for i in 0.. {
            let entry = self.deferred.borrow().get(i).map(Weak::upgrade);
            let Some(entry) = entry else { break };
            let Some(d) = entry else { continue };
            self.act_on(&d, d.complete(deadline))?;
        }
        Ok(())
    }

    /// Completes `d`'s oldest agreements until its next post fits (a
    /// deferred call on a full ring or queue), as a wait would.
    pub(crate) fn make_room(&self, d: &Deferred) -> Result<()> {
        self.act_on(d, d.make_room())
    }

    /// What a completion of `d`'s agreements means for the rank: an
    /// error or a disagreement aborts every communicator first.
    fn act_on(&self, d: &Deferred, verdict: Result<Verdict>) -> Result<()> {
        let verdict = match verdict {
            Ok(v) => v,
            // A member lost: every communicator but the world's ends, which
            // the survivors shrink (`Runtime::shrink`).
            Err(e @ Error::PeerLost { .. }) => {
                self.abort_all_but_root(&e.to_string());
                return Err(e);
            }
            Err(e) => {
                let e = self.own_failure(d.group(), &e).unwrap_or(e);
                self.abort_all(&e.to_string());
                return Err(e);
            }
        };
        match verdict {
            Verdict::Agreed => Ok(()),
            Verdict::RefusedEverywhere(e) => Err(e),
            Verdict::Disagreed(e) => {
                self.abort_all(&format!("a deferred agreement on {} failed", d.group()));
                Err(e)
            }
        }
    }

    /// `e`, a deferred agreement's failure on `group`, with this rank's own
    /// NCCL error first where its communicator failed too. A member's
    /// closed posts (its communicator failed) can arrive before this
    /// rank's communicator reports the same lost link: the answer then
    /// says both, its own error and the member that stopped. Looked at a
    /// few times, since NCCL answers "in progress" while work is under way
    /// (about 10 ms at most, on a path that ends the group).
    fn own_failure(&self, group: &str, e: &Error) -> Option<Error> {
        let api = self.api().ok()?;
        let comms: Vec<_> = self
            .live_comms()
            .into_iter()
            .filter(|c| c.group() == group)
            .collect();
        let op = e.op().unwrap_or(Op::Synchronize);
        for _ in 0..OWN_FAILURE_LOOKS {
            for c in &comms {
                if let Err(mut own) = c.poll(api) {
                    let theirs = match e {
                        Error::Nccl { source, .. } => &source.msg,
                        other => &other.to_string(),
                    };
                    own.msg = format!("{}; and {theirs}", own.msg);
                    return Some(Error::nccl(op, group, own));
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        None
    }

    /// The communicators still alive (collected, so no borrow is held while
    /// NCCL is called).
    fn live_comms(&self) -> Vec<Rc<CommState>> {
        self.comms
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    pub(crate) fn poll_comms(&self) -> Result<()> {
        // Communicators exist only where NCCL does.
        let Ok(api) = self.api() else {
            return Ok(());
        };
        for c in self.live_comms() {
            c.poll(api).map_err(|source| {
                self.close_agreements(Some(c.group()));
                match crate::ulfm::lost() {
                    // Under ULFM, after a loss in this world, a failed
                    // communicator is that loss.
                    lost if !lost.is_empty() => {
                        self.abort_all_but_root(&source.msg);
                        crate::ulfm::revoke_all();
                        Error::PeerLost {
                            op: Op::Synchronize,
                            group: c.group().to_string(),
                            lost,
                            msg: format!("its NCCL communicator failed: {}", source.msg),
                        }
                    }
                    _ => Error::nccl(Op::Synchronize, c.group(), source),
                }
            })?;
        }
        Ok(())
    }

    /// Closes the deferred agreements of group `group` (every group when
    /// `None`) whose NCCL communicator failed here: the members stop
    /// waiting for this rank's later device calls, which cannot complete.
    pub(crate) fn close_agreements(&self, group: Option<&str>) {
        let all: Vec<_> = self
            .deferred
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for d in all.iter().filter(|d| group.is_none_or(|g| d.group() == g)) {
            d.close();
        }
    }

    /// Aborts every live communicator; returns their groups' names.
    fn abort_all(&self, why: &str) -> String {
        self.abort_comms(why, None)
    }

    /// As `abort_all`, sparing the world's communicator.
    fn abort_all_but_root(&self, why: &str) {
        let root = self.root.borrow().upgrade();
        self.abort_comms(why, root.as_ref());
    }

    fn abort_comms(&self, why: &str, spare: Option<&Rc<CommState>>) -> String {
        let mut groups = Vec::new();
        if let Ok(api) = self.api() {
            for c in self.live_comms() {
                if spare.is_some_and(|s| Rc::ptr_eq(s, &c)) {
                    continue;
                }
                c.abort(api, why);
                groups.push(c.group().to_string());
            }
        }
        self.close_agreements(None);
        if groups.is_empty() {
            "the device stream".into()
        } else {
            groups.join(", ")
        }
    }
}

fn why_missing(e: &Error) -> String {
    match e {
        Error::Launch(m) | Error::Gpu(m) => m.clone(),
        e => e.to_string(),
    }
}

/// How many CUDA devices this process sees (after `CUDA_VISIBLE_DEVICES`);
/// the error says what is missing (driver, or the driver's answer).
pub fn device_count() -> Result<usize> {
    driver::driver_version().map_err(Error::Gpu)?;
    visible_devices()
}

fn visible_devices() -> Result<usize> {
    let n = CudaContext::device_count().map_err(|e| {
        // CUDA_ERROR_NO_DEVICE: a driver that shows this process no GPU,
        // most often because of the mask it was given.
        if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE {
            let mask = std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"))
                .unwrap_or_default();
            Error::Gpu(format!("no GPU visible to this process{mask}: the CUDA driver reports CUDA_ERROR_NO_DEVICE"))
        } else {
            cuda("cuDeviceGetCount", e)
        }
    })?;
    Ok(n.max(0) as usize)
}

/// Which device local rank `local_rank` of `local_size` would drive, found
/// without creating a context (no GPU memory is used): `rankmesh topo` shows it.
/// Errors are [`Error::Gpu`] saying what is missing.
/// `device`: [`Options::device`](crate::Options::device).
pub fn probe(local_rank: usize, local_size: usize, device: Option<&str>) -> Result<DeviceInfo> {
    let env = |k: &str| std::env::var(k).ok();
    let version = driver::driver_version().map_err(Error::Gpu)?;
    let count = visible_devices()?;
    let ordinal = select::choose_device(
        local_rank,
        local_size,
        count,
        device,
        env("CUDA_VISIBLE_DEVICES").as_deref(),
    )
    .map_err(Error::Gpu)?;
    let dev = cu::device::get(ordinal as i32).map_err(|e| cuda("cuDeviceGet", e))?;
    let name = cu::device::get_name(dev).map_err(|e| cuda("cuDeviceGetName", e))?;
    let mut buf = [0 as std::os::raw::c_char; 32];
    // SAFETY: `buf` is writable for its length; `dev` is a valid device.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }
        .result()
        .map_err(|e| cuda("cuDeviceGetPCIBusId", e))?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf`.
    let bus_id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let attribute = |a| {
        // SAFETY: `dev` came from cuDeviceGet.
        unsafe { cu::device::get_attribute(dev, a) }
            .map(|v| v.max(0) as u32)
            .map_err(|e| cuda("cuDeviceGetAttribute", e))
    };
    let compute_capability = (
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    Ok(DeviceInfo {
        ordinal,
        name,
        bus_id,
        driver: driver::cuda_version(version),
        compute_capability,
    })
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("info", &self.info)
            .field("nccl", &self.nccl)
            .finish()
    }
}
