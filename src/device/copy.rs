//! Runs the shared [`Copy2d`] plans (`tensor::split`) on device memory with
//! `cuMemcpy2DAsync`: the device half of "one implementation of the pack/unpack
//! index math".

use crate::error::{Error, Result};
use crate::tensor::split::Copy2d;
use cudarc::driver::sys;
use std::os::raw::c_void;

/// Largest pitch `cuMemcpy2D` accepts on current GPUs (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
const MAX_PITCH: usize = i32::MAX as usize;

/// Enqueues `copies` from `src` to `dst` (device addresses) on `stream`.
pub(crate) fn run_copies(
    copies: &[Copy2d],
    src: *const c_void,
    dst: *mut c_void,
    stream: sys::CUstream,
) -> Result<()> {
    let (src, dst) = (src as u64, dst as u64);
    for c in copies.iter().filter(|c| c.width > 0 && c.height > 0) {
        if c.src_pitch.max(c.dst_pitch) <= MAX_PITCH {
            enqueue_2d(c, src, dst, stream)?;
        } else {
            // Rows too far apart for one 2-D copy: one 1-D copy per row.
            for row in 0..c.height {
                let one = Copy2d::bytes(
                    c.src_offset + row * c.src_pitch,
                    c.dst_offset + row * c.dst_pitch,
                    c.width,
                );
                enqueue_2d(&one, src, dst, stream)?;
            }
        }
    }
    Ok(())
}

fn enqueue_2d(c: &Copy2d, src: u64, dst: u64, stream: sys::CUstream) -> Result<()> {
    let p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src + c.src_offset as u64,
        srcArray: std::ptr::null_mut(),
        srcPitch: c.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst + c.dst_offset as u64,
        dstArray: std::ptr::null_mut(),
        dstPitch: c.dst_pitch,
        WidthInBytes: c.width,
        Height: c.height,
    };
    // SAFETY: the plan stays inside both buffers (tensor::split builds it from
    // the same shapes the buffers were allocated for).
    unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) }
        .result()
        .map_err(|e| Error::Gpu(format!("cuMemcpy2DAsync: {e}")))
}
