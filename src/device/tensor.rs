//! `DeviceTensor`: a dtype, a shape and bytes in GPU memory.

use crate::tensor::{numel, DType};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::os::raw::c_void;

/// A tensor in the memory of this rank's GPU (see [`Gpu`](super::Gpu) for
/// creating one and copying to and from the host). Row-major and dense, like
/// the host [`Tensor`](crate::Tensor).
pub struct DeviceTensor {
    dtype: DType,
    shape: Vec<usize>,
    nbytes: usize,
    // At least one byte: a zero-sized allocation is an error in CUDA.
    buf: CudaSlice<u8>,
}

impl DeviceTensor {
    pub(crate) fn new(dtype: DType, shape: Vec<usize>, buf: CudaSlice<u8>) -> DeviceTensor {
        let nbytes = numel(&shape) * dtype.size();
        debug_assert!(buf.len() >= nbytes);
        DeviceTensor {
            dtype,
            shape,
            nbytes,
            buf,
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

    /// The same device memory viewed with another shape of equal element count.
    pub fn reshape(mut self, shape: impl Into<Vec<usize>>) -> crate::Result<DeviceTensor> {
        let shape = shape.into();
        if numel(&shape) != self.numel() {
            return Err(crate::Error::Tensor(format!(
                "cannot reshape device tensor {:?} ({} elements) to {shape:?}",
                self.shape,
                self.numel()
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// The device address, for handing the tensor to kernels of your own.
    /// Work on it must be ordered with rankmesh's stream ([`Gpu::stream`](super::Gpu::stream)).
    pub fn device_ptr(&self, stream: &CudaStream) -> u64 {
        let (p, _sync) = self.buf.device_ptr(stream);
        p
    }

    pub(crate) fn read_ptr(&self, stream: &CudaStream) -> *const c_void {
        let (p, _sync) = self.buf.device_ptr(stream);
        p as usize as *const c_void
    }

    pub(crate) fn write_ptr(&mut self, stream: &CudaStream) -> *mut c_void {
        let (p, _sync) = self.buf.device_ptr_mut(stream);
        p as usize as *mut c_void
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("device", &self.buf.ordinal())
            .finish()
    }
}
