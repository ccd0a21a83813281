//! Runs the shared [`Copy2d`] plans (`tensor::split`) on device memory with
//! `cuMemcpy2DAsync`: the device half of "one implementation of the pack/unpack
//! index math".

use crate::error::{Error, Result};
use crate::tensor::split::Copy2d;
use cudarc::driver::sys;
use std::os::raw::c_void;

/// Largest pitch `cuMemcpy2D` accepts on current GPUs (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
const MAX_PITCH: usize = i32::MAX as usize;

/// How one plan runs on a device.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DeviceCopy {
    /// `cuMemcpyDtoDAsync` of `len` bytes: a single row has no pitch, and
    /// rows too far apart for a 2-D copy go one at a time.
    Linear { src: usize, dst: usize, len: usize },
    /// `cuMemcpy2DAsync` (both pitches within `CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
    Pitched(Copy2d),
}

/// The device copies that run `c` given the largest pitch a 2-D copy takes.
/// A single row is always a 1-D copy, so a contiguous copy of 2 GiB or more
/// never meets the pitch limit (a row's pitch was its length before).
fn device_copies(c: &Copy2d, max_pitch: usize) -> Vec<DeviceCopy> {
    if c.width == 0 || c.height == 0 {
        return Vec::new();
    }
    let row = |r: usize| DeviceCopy::Linear {
        src: c.src_offset + r * c.src_pitch,
        dst: c.dst_offset + r * c.dst_pitch,
        len: c.width,
    };
    if c.height == 1 {
        vec![row(0)]
    } else if c.src_pitch.max(c.dst_pitch) <= max_pitch {
        vec![DeviceCopy::Pitched(*c)]
    } else {
        (0..c.height).map(row).collect()
    }
}

/// Enqueues `copies` from `src` to `dst` (device addresses) on `stream`.
pub(crate) fn run_copies(
    copies: &[Copy2d],
    src: *const c_void,
    dst: *mut c_void,
    stream: sys::CUstream,
) -> Result<()> {
    let (src, dst) = (src as u64, dst as u64);
    for c in copies {
        for copy in device_copies(c, MAX_PITCH) {
            match copy {
                DeviceCopy::Pitched(p) => enqueue_2d(&p, src, dst, stream)?,
                DeviceCopy::Linear {
                    src: s,
                    dst: d,
                    len,
                } => {
                    // SAFETY: inside both buffers (the plan is built from the
                    // shapes they were allocated for).
                    unsafe {
                        sys::cuMemcpyDtoDAsync_v2(dst + d as u64, src + s as u64, len, stream)
                    }
                    .result()
                    .map_err(|e| Error::Gpu(format!("cuMemcpyDtoDAsync: {e}")))?;
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A contiguous copy of 3 GiB is one 1-D copy (as a 2-D copy its pitch
    /// would be 3 GiB, above the limit, and the driver would refuse it).
    #[test]
    fn one_row_is_a_linear_copy_whatever_its_length() {
        let big = Copy2d::bytes(8, 16, 3 << 30);
        assert_eq!(
            device_copies(&big, MAX_PITCH),
            [DeviceCopy::Linear {
                src: 8,
                dst: 16,
                len: 3 << 30
            }]
        );
    }

    #[test]
    fn rows_too_far_apart_go_one_at_a_time() {
        let c = Copy2d {
            src_offset: 0,
            dst_offset: 4,
            width: 10,
            height: 3,
            src_pitch: 100,
            dst_pitch: 10,
        };
        assert_eq!(device_copies(&c, 1000), [DeviceCopy::Pitched(c)]);
        let rows = device_copies(&c, 50);
        assert_eq!(
            rows,
            [0, 1, 2].map(|r| DeviceCopy::Linear {
                src: 100 * r,
                dst: 4 + 10 * r,
                len: 10
            })
        );
        for copy in rows {
            if let DeviceCopy::Pitched(p) = copy {
                panic!("a 2-D copy with pitches {} / {}", p.src_pitch, p.dst_pitch);
            }
        }
        assert!(device_copies(&Copy2d::bytes(0, 0, 0), 50).is_empty());
    }
}
