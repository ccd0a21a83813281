//! `DeviceTensor`: a dtype, a shape and bytes in GPU memory — rankmesh's own
//! allocation, or the caller's memory borrowed without a copy.

use super::order::Tail;
use crate::agree::ViewProblem;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::numel;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, SyncOnDrop};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A tensor in the memory of this rank's GPU, row-major and dense like the
/// host [`Tensor`](crate::Tensor).
///
/// Either rankmesh's own allocation ([`Gpu::zeros`](super::Gpu::zeros),
/// [`Gpu::upload`](super::Gpu::upload), the allocating forms of the ops) or
/// memory of the caller's, borrowed without a copy: safely through
/// [`DeviceGroup::view`](crate::DeviceGroup::view) /
/// [`view_mut`](crate::DeviceGroup::view_mut) (cudarc's `CudaSlice`,
/// `CudaView`, `CudaViewMut`, and so candle's CUDA storage), or unsafely from
/// a raw address with [`DeviceTensor::from_raw`]. Every device op takes
/// either kind as input and as output.
pub struct DeviceTensor {
    dtype: DType,
    shape: Vec<usize>,
    nbytes: usize,
    mem: Memory,
}

enum Memory {
    /// rankmesh's allocation, made on the stream of the call that made it
    /// and freed there, after rankmesh's latest work (see `order`).
    // At least one byte: a zero-sized allocation is an error in CUDA.
    /// `ptr` is `buf`'s address, read once: asking cudarc for it on every
    /// call costs a guard and a context query on the hot path.
    Owned {
        buf: CudaSlice<u8>,
        ptr: sys::CUdeviceptr,
        tail: Arc<Tail>,
    },
    /// The caller's memory. `live` is present for views made safely: it is
    /// cleared when the view ends, so a tensor moved out of its view (with
    /// `mem::replace`) is refused instead of touching freed memory.
    Borrowed {
        ptr: sys::CUdeviceptr,
        live: Option<Arc<AtomicBool>>,
        stream: Option<usize>,
    },
}

impl DeviceTensor {
    pub(crate) fn owned(
        dtype: DType,
        shape: Vec<usize>,
        buf: CudaSlice<u8>,
        tail: Arc<Tail>,
    ) -> DeviceTensor {
        let nbytes = numel(&shape) * dtype.size();
        debug_assert!(buf.len() >= nbytes);
        let ptr = buf_ptr(&buf);
        DeviceTensor {
            dtype,
            shape,
            nbytes,
            mem: Memory::Owned { buf, ptr, tail },
        }
    }

    /// Borrows `numel(shape)` elements of `dtype` at device address `ptr`,
    /// without a copy. Nothing is freed when the tensor is dropped.
    ///
    /// # Safety
    /// - `ptr` addresses at least `numel(shape) * dtype.size()` bytes of
    ///   memory of this rank's device, in the context rankmesh uses (the
    ///   device's primary context), suitably aligned for `dtype`;
    /// - the memory stays allocated, and is neither read nor written by
    ///   other work, until every device op given this tensor has *run* on
    ///   the GPU, not merely returned: order your work with the group's
    ///   stream ([`DeviceGroup::on_stream`](crate::DeviceGroup::on_stream),
    ///   [`DeviceGroup::record_event`](crate::DeviceGroup::record_event)) or
    ///   synchronize before freeing or reusing it.
    pub unsafe fn from_raw(ptr: u64, dtype: DType, shape: impl Into<Vec<usize>>) -> DeviceTensor {
        let shape = shape.into();
        DeviceTensor {
            dtype,
            nbytes: numel(&shape) * dtype.size(),
            shape,
            mem: Memory::Borrowed {
                ptr,
                live: None,
                stream: None,
            },
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Whether the memory is the caller's (a view or [`from_raw`](Self::from_raw)).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.mem, Memory::Borrowed { .. })
    }

    /// The same device memory viewed with another shape of equal element count.
    pub fn reshape(mut self, shape: impl Into<Vec<usize>>) -> Result<DeviceTensor> {
        let shape = shape.into();
        if numel(&shape) != self.numel() {
            return Err(Error::Tensor(format!(
                "cannot reshape device tensor {:?} ({} elements) to {shape:?}",
                self.shape,
                self.numel()
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// The device address, for handing the tensor to kernels of your own.
    /// Order that work with the stream rankmesh used for the tensor.
    pub fn device_ptr(&self) -> u64 {
        match &self.mem {
            Memory::Owned { ptr, .. } | Memory::Borrowed { ptr, .. } => *ptr,
        }
    }

    /// The address for a call enqueued on `stream`: refused when the tensor
    /// is a view whose borrow has ended or that was made for another stream.
    #[inline]
    pub(crate) fn ptr_on(&self, stream: &CudaStream) -> Result<*mut c_void> {
        match self.view_problem(stream) {
            Some((_, why)) => Err(Error::Tensor(why)),
            None => Ok(self.device_ptr() as usize as *mut c_void),
        }
    }

    /// Why a call on `stream` cannot use this tensor, when it is a view
    /// whose borrow has ended or that was made for another stream.
    #[inline]
    pub(crate) fn view_problem(&self, stream: &CudaStream) -> Option<(ViewProblem, String)> {
        // Checked up to three times per call: the usual case (owned, or a
        // live view made for this stream) decides inline, without building
        // the message.
        match &self.mem {
            Memory::Borrowed {
                live: Some(live),
                stream: made_for,
                ..
            } if !live.load(Ordering::Acquire)
                || *made_for != Some(stream.cu_stream() as usize) =>
            {
                self.view_problem_found(stream)
            }
            _ => None,
        }
    }

    #[cold]
    fn view_problem_found(&self, stream: &CudaStream) -> Option<(ViewProblem, String)> {
        let Memory::Borrowed {
            live: Some(live),
            stream: made_for,
            ..
        } = &self.mem
        else {
            return None;
        };
        if !live.load(Ordering::Acquire) {
            return Some((
                ViewProblem::Ended,
                "a device view was used after its borrow ended (moved out of its DeviceView)"
                    .into(),
            ));
        }
        let on = stream.cu_stream() as usize;
        (*made_for != Some(on)).then(|| {
            (
                ViewProblem::Elsewhere,
                format!(
                    "a device view made for stream {:#x} is used on stream {on:#x}: make \
                     views with the DeviceGroup (and stream) that uses them",
                    made_for.unwrap_or(0)
                ),
            )
        })
    }
}

fn buf_ptr(buf: &CudaSlice<u8>) -> u64 {
    // With event tracking off (as rankmesh's context has it) this only
    // reads the address; the guard records nothing.
    let (p, _sync) = buf.device_ptr(buf.stream());
    p
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        if let Memory::Owned { buf, tail, .. } = &self.mem {
            // The free is enqueued on the buffer's stream: make it wait for
            // rankmesh's latest work, which may use the buffer on another.
            tail.before_free(buf.stream());
        }
    }
}

/// A caller's device memory borrowed as a [`DeviceTensor`] (read-only use),
/// for as long as the borrow lasts. Made by
/// [`DeviceGroup::view`](crate::DeviceGroup::view).
pub struct DeviceView<'a>(Borrow<'a>);

/// A caller's device memory borrowed as a writable [`DeviceTensor`]. Made by
/// [`DeviceGroup::view_mut`](crate::DeviceGroup::view_mut).
pub struct DeviceViewMut<'a>(Borrow<'a>);

/// What both views hold: the tensor, the borrow's own liveness flag (the
/// tensor in a mutable view may have been swapped out), and cudarc's guard.
struct Borrow<'a> {
    tensor: DeviceTensor,
    live: Arc<AtomicBool>,
    _sync: SyncOnDrop<'a>,
}

impl<'a> Borrow<'a> {
    fn new(
        dtype: DType,
        shape: Vec<usize>,
        ptr: u64,
        stream: &CudaStream,
        sync: SyncOnDrop<'a>,
    ) -> Borrow<'a> {
        let live = Arc::new(AtomicBool::new(true));
        let tensor = DeviceTensor {
            dtype,
            nbytes: numel(&shape) * dtype.size(),
            shape,
            mem: Memory::Borrowed {
                ptr,
                live: Some(live.clone()),
                stream: Some(stream.cu_stream() as usize),
            },
        };
        Borrow {
            tensor,
            live,
            _sync: sync,
        }
    }
}

// The borrow ends before cudarc's guard records the read or write on the
// stream (fields drop after `drop`).
impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        self.live.store(false, Ordering::Release);
    }
}

impl<'a> DeviceView<'a> {
    pub(crate) fn new(
        dtype: DType,
        shape: Vec<usize>,
        ptr: u64,
        stream: &CudaStream,
        sync: SyncOnDrop<'a>,
    ) -> DeviceView<'a> {
        DeviceView(Borrow::new(dtype, shape, ptr, stream, sync))
    }
}

impl<'a> DeviceViewMut<'a> {
    pub(crate) fn new(
        dtype: DType,
        shape: Vec<usize>,
        ptr: u64,
        stream: &CudaStream,
        sync: SyncOnDrop<'a>,
    ) -> DeviceViewMut<'a> {
        DeviceViewMut(Borrow::new(dtype, shape, ptr, stream, sync))
    }
}

impl std::ops::Deref for DeviceView<'_> {
    type Target = DeviceTensor;
    fn deref(&self) -> &DeviceTensor {
        &self.0.tensor
    }
}

impl std::ops::Deref for DeviceViewMut<'_> {
    type Target = DeviceTensor;
    fn deref(&self) -> &DeviceTensor {
        &self.0.tensor
    }
}

impl std::ops::DerefMut for DeviceViewMut<'_> {
    fn deref_mut(&mut self) -> &mut DeviceTensor {
        &mut self.0.tensor
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("borrowed", &self.is_borrowed())
            .finish()
    }
}
