//! Typed reductions on host memory: dtype dispatch, 16- and 8-bit float
//! widening, `Avg`, bool logic, and wrapping 8- and 16-bit arithmetic. The collective that combines the ranks is a
//! [`Reducer`] supplied by the data plane.

use crate::dtype::DType;
use crate::op::ReduceOp;
use crate::tensor::{HostSlice, HostSliceMut};
use float8::{F8E4M3, F8E5M2};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use mpi::collective::{SystemOperation, UnsafeUserOperation};
use mpi::traits::*;
use std::os::raw::{c_int, c_void};

/// A reduction collective over typed slices.
pub(crate) trait Reducer {
    /// Reduces `send` across the ranks into `recv` with `op`.
    fn run<T: Equivalence + Copy + Default, O: Operation + Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: O,
    );

    /// How many output-sized blocks `send` holds (1, or the group size
    /// for a reduce-scatter).
    fn blocks(&self) -> usize {
        1
    }
}

/// Elements of 16- and 8-bit floats widened per step: 256 KiB of f32 stays
/// in cache, and no buffer grows with the tensor (a full-size f32 copy made
/// bf16 all_reduce 6× slower than f32 and tripled its memory;
/// docs/BENCHMARKS.md, "Tuned constants").
const WIDE_CHUNK: usize = 64 << 10;

thread_local! {
    /// Widened input and output of one step, reused across calls.
    static WIDE: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// A narrow float type widened to f32 for reducing.
pub(super) trait Widen: Copy {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

/// 16-bit floats convert whole slices (half uses F16C where the CPU has it).
macro_rules! widen_half {
    ($t:ty) => {
        impl Widen for $t {
            fn widen(src: &[Self], dst: &mut [f32]) {
                src.convert_to_f32_slice(dst);
            }
            fn narrow(src: &[f32], dst: &mut [Self]) {
                dst.convert_from_f32_slice(src);
            }
        }
    };
}
widen_half!(f16);
widen_half!(bf16);

macro_rules! widen_fp8 {
    ($t:ty) => {
        impl Widen for $t {
            fn widen(src: &[Self], dst: &mut [f32]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s.to_f32();
                }
            }
            fn narrow(src: &[f32], dst: &mut [Self]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_f32(*s);
                }
            }
        }
    };
}
widen_fp8!(F8E4M3);
widen_fp8!(F8E5M2);

/// Reduces narrow floats through f32, one cache-sized step at a time: each
/// step widens the step's elements of every block, reduces them, divides
/// for `Avg`, and rounds once into `output`.
fn reduce_widened<T: Widen>(
    reducer: &impl Reducer,
    input: &[T],
    output: &mut [T],
    op: &SystemOperation,
    avg_over: Option<usize>,
) {
    let blocks = reducer.blocks();
    let n = input.len() / blocks;
    WIDE.with(|wide| {
        let mut wide = wide.borrow_mut();
        let (wide_in, wide_out) = &mut *wide;
        wide_in.resize(WIDE_CHUNK * blocks, 0.0);
        wide_out.resize(WIDE_CHUNK, 0.0);
        for start in (0..n).step_by(WIDE_CHUNK) {
            let len = WIDE_CHUNK.min(n - start);
            for b in 0..blocks {
                T::widen(
                    &input[b * n + start..b * n + start + len],
                    &mut wide_in[b * len..(b + 1) * len],
                );
            }
            reducer.run(&wide_in[..len * blocks], &mut wide_out[..len], op);
            if let Some(p) = avg_over {
                wide_out[..len].iter_mut().for_each(|x| *x /= p as f32);
            }
            // A rank whose output is not used (a reduce's non-root) may pass none.
            if let Some(out) = output.get_mut(start..start + len) {
                T::narrow(&wide_out[..len], out);
            }
        }
    });
}

/// Division by the group size for `Avg` (truncating for integers).
trait DivN {
    fn div_n(self, n: usize) -> Self;
}

macro_rules! div_n {
    ($($t:ty),*) => {$(
        impl DivN for $t {
            fn div_n(self, n: usize) -> Self {
                self / (n as $t)
            }
        }
    )*};
}
div_n!(f32, f64, i8, u8, i16, u16, i32, u32, i64, u64);

/// rankmesh's own element-wise reductions where MPI builds differ:
/// - 8- and 16-bit integer sums and products wrap. Open MPI 4.1's AVX
///   kernels saturate 8-bit `MPI_SUM`/`MPI_PROD` on long vectors while its
///   scalar tail wraps, so a sum could depend on the buffer length; these
///   wrap everywhere, as C, NCCL and Rust's `wrapping_*` do (16-bit too, so
///   no width depends on the MPI build).
/// - Unsigned maxima and minima compare unsigned. Debian's MPICH 4.0.2
///   (ch4:ucx) reduces every unsigned type with `MPI_MAX`/`MPI_MIN` as
///   signed: max(0xF0, 0) of `MPI_UINT8_T` came back 0, and so for 16, 32
///   and 64 bits (MPICH 5, Intel MPI and Open MPI 4 and 5 compare right).
macro_rules! own_op {
    ($name:ident, $t:ty, $combine:expr) => {
        unsafe extern "C" fn $name(
            invec: *mut c_void,
            inoutvec: *mut c_void,
            len: *mut c_int,
            _datatype: *mut mpi::ffi::MPI_Datatype,
        ) {
            // SAFETY: MPI passes two buffers of `*len` elements of the type the
            // operation was used with (only ever `$t`, see `own_op`).
            let (a, b) = unsafe {
                let n = *len as usize;
                (
                    std::slice::from_raw_parts(invec as *const $t, n),
                    std::slice::from_raw_parts_mut(inoutvec as *mut $t, n),
                )
            };
            let combine: fn($t, $t) -> $t = $combine;
            for (x, y) in a.iter().zip(b) {
                *y = combine(*y, *x);
            }
        }
    };
}
own_op!(add_i8, i8, i8::wrapping_add);
own_op!(add_u8, u8, u8::wrapping_add);
own_op!(mul_i8, i8, i8::wrapping_mul);
own_op!(mul_u8, u8, u8::wrapping_mul);
own_op!(add_i16, i16, i16::wrapping_add);
own_op!(add_u16, u16, u16::wrapping_add);
own_op!(mul_i16, i16, i16::wrapping_mul);
own_op!(mul_u16, u16, u16::wrapping_mul);
own_op!(max_u8, u8, Ord::max);
own_op!(min_u8, u8, Ord::min);
own_op!(max_u16, u16, Ord::max);
own_op!(min_u16, u16, Ord::min);
own_op!(max_u32, u32, Ord::max);
own_op!(min_u32, u32, Ord::min);
own_op!(max_u64, u64, Ord::max);
own_op!(min_u64, u64, Ord::min);

/// The operation of rankmesh's own (see [`own_op`]) replacing MPI's for
/// `data` and `op`, if any.
fn own_op(dtype: DType, op: ReduceOp) -> Option<UnsafeUserOperation> {
    let f: mpi::collective::UnsafeUserFunction = match (dtype, op) {
        (DType::I8, ReduceOp::Sum | ReduceOp::Avg) => add_i8,
        (DType::U8, ReduceOp::Sum | ReduceOp::Avg) => add_u8,
        (DType::I8, ReduceOp::Prod) => mul_i8,
        (DType::U8, ReduceOp::Prod) => mul_u8,
        (DType::I16, ReduceOp::Sum | ReduceOp::Avg) => add_i16,
        (DType::U16, ReduceOp::Sum | ReduceOp::Avg) => add_u16,
        (DType::I16, ReduceOp::Prod) => mul_i16,
        (DType::U16, ReduceOp::Prod) => mul_u16,
        (DType::U8, ReduceOp::Max) => max_u8,
        (DType::U8, ReduceOp::Min) => min_u8,
        (DType::U16, ReduceOp::Max) => max_u16,
        (DType::U16, ReduceOp::Min) => min_u16,
        (DType::U32, ReduceOp::Max) => max_u32,
        (DType::U32, ReduceOp::Min) => min_u32,
        (DType::U64, ReduceOp::Max) => max_u64,
        (DType::U64, ReduceOp::Min) => min_u64,
        _ => return None,
    };
    // SAFETY: each function is only used with buffers of its own element type.
    Some(unsafe { UnsafeUserOperation::commutative(f) })
}

/// Runs `reducer` from `input` into `output` (same dtype; lengths as the
/// reducer needs), widening 16- and 8-bit floats to f32 (one rounding at
/// the end; fp8 saturates to its largest finite value as CUDA's
/// `__NV_SATFINITE` does), then applies `Avg`'s division by the group size
/// `n`. Bools reduce as bytes: sum and max are OR (`MPI_MAX`), prod and min
/// are AND (`MPI_MIN`); avg was refused by the op's check.
pub(crate) fn reduce_into(
    reducer: &impl Reducer,
    input: HostSlice<'_>,
    output: HostSliceMut<'_>,
    op: ReduceOp,
    n: usize,
) {
    // Nothing to combine; and empty buffers would look aliased to MPI.
    if input.is_empty() {
        return;
    }
    let sys = match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    };
    let own = own_op(input.dtype(), op);
    macro_rules! native {
        ($i:expr, $o:expr) => {{
            match &own {
                Some(user_op) => reducer.run($i, &mut *$o, user_op),
                None => reducer.run($i, &mut *$o, &sys),
            }
            if op == ReduceOp::Avg {
                $o.iter_mut().for_each(|x| *x = DivN::div_n(*x, n));
            }
        }};
    }
    let avg_over = (op == ReduceOp::Avg).then_some(n);
    macro_rules! widened {
        ($i:expr, $o:expr) => {
            reduce_widened(reducer, $i, $o, &sys, avg_over)
        };
    }
    match (input, output) {
        (HostSlice::F32(i), HostSliceMut::F32(o)) => native!(i, o),
        (HostSlice::F64(i), HostSliceMut::F64(o)) => native!(i, o),
        (HostSlice::I8(i), HostSliceMut::I8(o)) => native!(i, o),
        (HostSlice::U8(i), HostSliceMut::U8(o)) => native!(i, o),
        (HostSlice::I32(i), HostSliceMut::I32(o)) => native!(i, o),
        (HostSlice::U32(i), HostSliceMut::U32(o)) => native!(i, o),
        (HostSlice::I64(i), HostSliceMut::I64(o)) => native!(i, o),
        (HostSlice::U64(i), HostSliceMut::U64(o)) => native!(i, o),
        (HostSlice::F16(i), HostSliceMut::F16(o)) => widened!(i, o),
        (HostSlice::BF16(i), HostSliceMut::BF16(o)) => widened!(i, o),
        (HostSlice::F8E4M3(i), HostSliceMut::F8E4M3(o)) => widened!(i, o),
        (HostSlice::F8E5M2(i), HostSliceMut::F8E5M2(o)) => widened!(i, o),
        (HostSlice::I16(i), HostSliceMut::I16(o)) => native!(i, o),
        (HostSlice::U16(i), HostSliceMut::U16(o)) => native!(i, o),
        (HostSlice::Bool(i), HostSliceMut::Bool(o)) => {
            let logic = match op {
                ReduceOp::Sum | ReduceOp::Max | ReduceOp::Avg => SystemOperation::max(),
                ReduceOp::Prod | ReduceOp::Min => SystemOperation::min(),
            };
            let (i, o): (&[u8], &mut [u8]) = (bytemuck::cast_slice(i), bytemuck::cast_slice_mut(o));
            reducer.run(i, o, logic);
        }
        (i, o) => unreachable!(
            "dtypes agreed before reducing: {:?} into {:?}",
            i.dtype(),
            o.dtype()
        ),
    }
}
