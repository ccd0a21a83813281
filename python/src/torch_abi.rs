//! The C entry points of `rankmesh.torch`'s c10d backend
//! (`python/rankmesh/torch/backend.cpp`): a table of `extern "C"` functions
//! handed to the C++ side in a capsule, so that torch's dispatcher reaches
//! the library without Python in between (no GIL, no frame per call).
//!
//! The C++ side flattens every torch call to 1-d buffers of one dtype and
//! one of the library's ops ([`Call`]); this side runs it on the group's
//! host plane, or on its device plane on the caller's CUDA stream. The
//! layouts below are mirrored in `backend.cpp` (`RmCall`, `RmP2p`,
//! `RmApi`): change both, and [`ABI_VERSION`], together.

use crate::errors;
use crate::handles::Handle;
use rankmesh::{Collectives, DType, DeviceTensor, Error, GroupCoordinator, P2p, ReduceOp, Tensor};
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::ThreadId;

/// Bumped whenever a layout below changes; the C++ side refuses another.
pub const ABI_VERSION: u32 = 1;

/// One buffer: `numel` elements of the call's dtype at `data`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Buf {
    data: *mut c_void,
    numel: u64,
}

/// One collective on 1-d buffers.
#[repr(C)]
pub struct Call {
    /// An [`Code`] value.
    op: u32,
    /// The dtype's wire code ([`DType::ALL`] order).
    dtype: u32,
    /// [`ReduceOp::ALL`] order: sum, prod, min, max, avg.
    reduce: u32,
    /// Root, source or destination: a position in the group.
    peer: i32,
    /// -1: host memory; else the CUDA ordinal of device memory.
    device: i32,
    /// The caller's `CUstream` (device memory only).
    stream: *mut c_void,
    input: Buf,
    output: Buf,
    /// Per member, in elements (all_to_all_v; the `counts` of all_gather_v
    /// and reduce_scatter_v).
    send_counts: *const u64,
    recv_counts: *const u64,
}

/// One send or receive of a batch.
#[repr(C)]
pub struct P2pOp {
    /// 1: send, 0: receive.
    send: u32,
    peer: i32,
    dtype: u32,
    buf: Buf,
}

/// What `backend.cpp` calls.
#[repr(C)]
pub struct Api {
    version: u32,
    run: unsafe extern "C" fn(*mut c_void, *const Call, *mut c_char, usize) -> i32,
    batch: unsafe extern "C" fn(
        *mut c_void,
        *const P2pOp,
        usize,
        i32,
        *mut c_void,
        *mut c_char,
        usize,
    ) -> i32,
    release: unsafe extern "C" fn(*mut c_void),
    restore_interrupt: unsafe extern "C" fn() -> i32,
}

/// The table; `'static`, so the capsule holds only its address.
pub static API: Api = Api {
    version: ABI_VERSION,
    run,
    batch,
    release,
    restore_interrupt,
};

/// The ops of [`Call::op`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    Barrier = 0,
    AllReduce = 1,
    Reduce = 2,
    Broadcast = 3,
    AllGather = 4,
    Gather = 5,
    Scatter = 6,
    ReduceScatter = 7,
    AllToAll = 8,
    AllToAllV = 9,
    AllGatherV = 10,
    /// A rank refusing its own arguments still calls in (a stand-in that
    /// fails its peers' call, naming it), so every member learns of it.
    Refuse = 11,
    ReduceScatterV = 12,
}

impl Code {
    fn from_u32(op: u32) -> Option<Code> {
        Some(match op {
            0 => Code::Barrier,
            1 => Code::AllReduce,
            2 => Code::Reduce,
            3 => Code::Broadcast,
            4 => Code::AllGather,
            5 => Code::Gather,
            6 => Code::Scatter,
            7 => Code::ReduceScatter,
            8 => Code::AllToAll,
            9 => Code::AllToAllV,
            10 => Code::AllGatherV,
            11 => Code::Refuse,
            12 => Code::ReduceScatterV,
            _ => return None,
        })
    }
}

/// Return codes: which `rankmesh` exception the error stands for
/// (`backend.cpp` names it in the message it raises).
mod status {
    pub const OK: i32 = 0;
    pub const MISMATCH: i32 = 1;
    pub const INVALID: i32 = 2;
    pub const TENSOR: i32 = 3;
    pub const STATE: i32 = 4;
    pub const TIMEOUT: i32 = 5;
    pub const PEER: i32 = 6;
    pub const GPU: i32 = 7;
    pub const OTHER: i32 = 8;
    /// A signal handler raised (Ctrl-C): `restore_interrupt` puts its
    /// exception back for Python to raise.
    pub const INTERRUPTED: i32 = 9;
}

/// A group as the C++ backend holds it: the same handle Python's `Group`
/// holds (so finalizing empties both), and the thread that made it. Other
/// threads (torch's autograd threads, which all-reduce DDP's buckets on
/// CUDA) may call too where MPI runs SERIALIZED: the handle's borrow takes
/// the package's MPI lock.
pub struct TorchGroup {
    slot: Handle<GroupCoordinator<'static>>,
    thread: ThreadId,
}

impl TorchGroup {
    /// A new C handle on `slot`, released by `release`.
    pub fn leak(slot: Handle<GroupCoordinator<'static>>) -> usize {
        let g = Box::new(TorchGroup {
            slot,
            thread: std::thread::current().id(),
        });
        Box::into_raw(g) as usize
    }
}

fn kind(e: &Error) -> i32 {
    use rankmesh::{error::Abandon, Error as E};
    match e {
        E::Abandoned { why, .. } => match why {
            Abandon::Interrupted => status::INTERRUPTED,
            Abandon::Timeout => status::TIMEOUT,
            Abandon::PeerLeft => status::PEER,
        },
        E::Mismatch { .. } => status::MISMATCH,
        E::InvalidArgument { .. } | E::Usage { .. } => status::INVALID,
        E::Tensor(_) => status::TENSOR,
        E::State(_) | E::Workspace { .. } => status::STATE,
        E::Timeout { .. } => status::TIMEOUT,
        E::Failed { .. } | E::Connection { .. } | E::PeerLost { .. } => status::PEER,
        E::Nccl { .. } | E::Gpu(_) => status::GPU,
        _ => status::OTHER,
    }
}

/// Writes `msg` (truncated on a character boundary) NUL-terminated into
/// the caller's `err`.
fn write_message(msg: &str, err: *mut c_char, len: usize) {
    if err.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller gives `len` writable bytes at `err`; `n < len`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// Runs `f` on the group behind `h`, turning an error or a panic into a
/// status and a message.
fn guarded(
    h: *mut c_void,
    err: *mut c_char,
    len: usize,
    f: impl FnOnce(&GroupCoordinator<'static>) -> Result<(), (i32, String)>,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `h` came from `TorchGroup::leak` and is released only by
        // `release`, after the C++ backend's last call.
        let group = unsafe { &*(h as *const TorchGroup) };
        let slot = group.slot.borrow();
        if std::thread::current().id() != group.thread
            && !slot
                .as_ref()
                .is_some_and(|g| g.runtime().calls_from_any_thread())
        {
            return Err((
                status::STATE,
                "rankmesh's torch backend was called from a thread other than the one that \
                 initialised it, and this MPI granted less than MPI_THREAD_SERIALIZED: call \
                 collectives from the thread that called init_process_group"
                    .to_string(),
            ));
        }
        let g = slot.as_ref().ok_or_else(|| {
            (
                status::STATE,
                "rankmesh has been finalized (destroy_distributed_environment or exit): this \
                 process group can no longer be used"
                    .to_string(),
            )
        })?;
        f(g)
    }));
    let (code, msg) = match outcome {
        Ok(Ok(())) => return status::OK,
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            (status::OTHER, format!("rankmesh panicked: {what}"))
        }
    };
    write_message(&msg, err, len);
    code
}

fn lib(e: Error) -> (i32, String) {
    (kind(&e), e.to_string())
}

fn invalid(msg: String) -> (i32, String) {
    (status::INVALID, msg)
}

fn dtype_of(code: u32) -> Result<DType, (i32, String)> {
    DType::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| invalid(format!("unknown dtype code {code} from the torch backend")))
}

fn reduce_of(code: u32) -> Result<ReduceOp, (i32, String)> {
    ReduceOp::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| invalid(format!("unknown reduce code {code} from the torch backend")))
}

fn counts(ptr: *const u64, n: usize) -> Vec<usize> {
    if ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the C++ side passes one count per member.
    unsafe { std::slice::from_raw_parts(ptr, n) }
        .iter()
        .map(|c| *c as usize)
        .collect()
}

/// One op body for both planes: `make` views a buffer as the plane's tensor.
fn dispatch<'rt, C: Collectives<'rt>>(
    g: &C,
    call: &Call,
    code: Code,
    reduce: ReduceOp,
    make: impl Fn(Buf) -> rankmesh::Result<C::Tensor>,
) -> rankmesh::Result<()> {
    let size = g.group().size();
    let peer = usize::try_from(call.peer).unwrap_or(usize::MAX);
    match code {
        Code::Barrier => g.barrier(),
        Code::Refuse => g.group().refuse_here(),
        Code::AllReduce => g.all_reduce_in_place(&mut make(call.input)?, reduce),
        Code::Broadcast => g.broadcast(&mut make(call.input)?, peer),
        Code::Reduce => g.reduce_into(&make(call.input)?, &mut make(call.output)?, peer, reduce),
        Code::AllGather => g.all_gather_into(&make(call.input)?, &mut make(call.output)?, 0),
        Code::Gather => g.gather_into(&make(call.input)?, &mut make(call.output)?, peer, 0),
        Code::Scatter => g.scatter_into(&make(call.input)?, &mut make(call.output)?, peer, 0),
        Code::ReduceScatter => {
            g.reduce_scatter_into(&make(call.input)?, &mut make(call.output)?, 0, reduce)
        }
        Code::AllToAll => g.all_to_all_into(&make(call.input)?, &mut make(call.output)?),
        Code::AllToAllV => g.all_to_all_v_into(
            &make(call.input)?,
            &counts(call.send_counts, size),
            &mut make(call.output)?,
            &counts(call.recv_counts, size),
        ),
        Code::AllGatherV => g.all_gather_v_into(
            &make(call.input)?,
            &mut make(call.output)?,
            &counts(call.recv_counts, size),
            0,
        ),
        Code::ReduceScatterV => g.reduce_scatter_v_into(
            &make(call.input)?,
            &mut make(call.output)?,
            &counts(call.recv_counts, size),
            0,
            reduce,
        ),
    }
}

fn host_tensor(buf: Buf, dtype: DType) -> rankmesh::Result<Tensor> {
    // A zero-size buffer may have no address; any aligned one will do.
    let ptr = if buf.data.is_null() && buf.numel == 0 {
        dtype.size() as *mut u8
    } else {
        buf.data.cast::<u8>()
    };
    // SAFETY: the C++ side passes a contiguous tensor of `numel` elements
    // of `dtype` that torch keeps alive (and that no one else writes) until
    // the call returns.
    unsafe { Tensor::from_raw_parts(ptr, dtype, vec![buf.numel as usize]) }
}

fn device_tensor(buf: Buf, dtype: DType) -> DeviceTensor {
    // SAFETY: a contiguous CUDA tensor on this rank's device, held by torch
    // until its stream (the caller's, which the call enqueues on) has run.
    unsafe { DeviceTensor::from_raw(buf.data as u64, dtype, vec![buf.numel as usize]) }
}

/// The device group on the caller's stream, or an error naming the device
/// the tensor is on when it is not this rank's GPU.
fn on_device<R>(
    g: &GroupCoordinator<'static>,
    device: i32,
    stream: *mut c_void,
    f: impl FnOnce(&rankmesh::DeviceGroup<'_, 'static>) -> rankmesh::Result<R>,
) -> Result<R, (i32, String)> {
    let gpu = g.runtime().gpu().map_err(lib)?;
    let mine = gpu.info().ordinal;
    if usize::try_from(device).ok() != Some(mine) {
        return Err((
            status::TENSOR,
            format!(
                "a CUDA tensor on cuda:{device} given to {}, whose device plane uses cuda:{mine} \
                 on this rank (RANKMESH_DEVICE, or the local rank by default)",
                g.name()
            ),
        ));
    }
    // SAFETY: torch's current stream on that device; it outlives the call,
    // which only enqueues on it.
    let stream = unsafe { gpu.wrap_stream(stream as cudarc::driver::sys::CUstream) };
    let d = g.device().map_err(lib)?;
    let d = d.on_stream(&stream).map_err(lib)?;
    f(&d).map_err(lib)
}

unsafe extern "C" fn run(h: *mut c_void, call: *const Call, err: *mut c_char, len: usize) -> i32 {
    guarded(h, err, len, |g| {
        // SAFETY: the C++ side passes a live `RmCall`.
        let call = unsafe { &*call };
        let code = Code::from_u32(call.op).ok_or_else(|| {
            invalid(format!(
                "unknown op code {} from the torch backend",
                call.op
            ))
        })?;
        let dtype = dtype_of(call.dtype)?;
        let reduce = reduce_of(call.reduce)?;
        if call.device < 0 {
            dispatch(g, call, code, reduce, |b| host_tensor(b, dtype)).map_err(lib)
        } else {
            on_device(g, call.device, call.stream, |d| {
                dispatch(d, call, code, reduce, |b| Ok(device_tensor(b, dtype)))
            })
        }
    })
}

/// Sends and receives of one batch (torch's coalesced p2p).
fn batch_ops<'rt, C: Collectives<'rt>>(
    g: &C,
    ops: &[P2pOp],
    dtypes: &[DType],
    make: impl Fn(Buf, DType) -> rankmesh::Result<C::Tensor>,
) -> rankmesh::Result<()> {
    let mut tensors = Vec::with_capacity(ops.len());
    for (op, dtype) in ops.iter().zip(dtypes) {
        tensors.push(make(op.buf, *dtype)?);
    }
    let mut list: Vec<P2p<'_, C::Tensor>> = tensors
        .iter_mut()
        .zip(ops)
        .map(|(t, op)| {
            let peer = usize::try_from(op.peer).unwrap_or(usize::MAX);
            if op.send != 0 {
                P2p::Send(&*t, peer)
            } else {
                P2p::Recv(t, peer)
            }
        })
        .collect();
    g.batch_send_recv(&mut list)
}

unsafe extern "C" fn batch(
    h: *mut c_void,
    ops: *const P2pOp,
    n: usize,
    device: i32,
    stream: *mut c_void,
    err: *mut c_char,
    len: usize,
) -> i32 {
    guarded(h, err, len, |g| {
        let ops = if n == 0 {
            &[][..]
        } else {
            // SAFETY: the C++ side passes `n` live ops.
            unsafe { std::slice::from_raw_parts(ops, n) }
        };
        let dtypes = ops
            .iter()
            .map(|op| dtype_of(op.dtype))
            .collect::<Result<Vec<_>, _>>()?;
        if device < 0 {
            batch_ops(g, ops, &dtypes, host_tensor).map_err(lib)
        } else {
            on_device(g, device, stream, |d| {
                batch_ops(d, ops, &dtypes, |b, dt| Ok(device_tensor(b, dt)))
            })
        }
    })
}

unsafe extern "C" fn release(h: *mut c_void) {
    if !h.is_null() {
        let _turn = crate::handles::serial();
        // SAFETY: from `TorchGroup::leak`, released once (the C++
        // backend's destructor).
        drop(unsafe { Box::from_raw(h as *mut TorchGroup) });
    }
}

unsafe extern "C" fn restore_interrupt() -> i32 {
    pyo3::Python::attach(|py| match errors::take_pending() {
        Some(e) => {
            e.restore(py);
            1
        }
        None => 0,
    })
}
