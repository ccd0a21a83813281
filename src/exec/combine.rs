//! Element-wise reductions computed in this process, over byte slices that
//! hold one rank's values each. The shared-memory executor reads its peers'
//! values directly, so no MPI operation combines them.
//!
//! The arithmetic is the host plane's: integers wrap (as the wrapping MPI
//! user operations do), narrow floats are reduced in f32 and rounded once,
//! `Avg` divides the sum by the group size (truncating for integers), bools
//! are OR (sum, max) and AND (prod, min) of bytes, and min/max keep Open
//! MPI's comparison order (`a < b ? a : b`, the running value on the left).

use super::reduction::Widen;
use crate::dtype::DType;
use crate::op::ReduceOp;
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

thread_local! {
    /// f32 accumulator and one widened source, reused across calls.
    static WIDE: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// Arithmetic of one element type.
trait Arith: Copy + bytemuck::Pod {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn less(self, o: Self) -> bool;
    fn div_n(self, n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn less(self, o: Self) -> bool { self < o }
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
int_arith!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn less(self, o: Self) -> bool { self < o }
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
float_arith!(f32, f64);

/// `a op b` for one element, `a` the running value.
#[inline(always)]
fn apply<T: Arith>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a.add(b),
        ReduceOp::Prod => a.mul(b),
        ReduceOp::Min => {
            if a.less(b) {
                a
            } else {
                b
            }
        }
        ReduceOp::Max => {
            if b.less(a) {
                a
            } else {
                b
            }
        }
    }
}

/// `acc = acc op src`, element-wise.
fn fold_into<T: Arith>(acc: &mut [T], src: &[T], op: ReduceOp) {
    // One loop per op, so each vectorises without a branch inside.
    match op {
        ReduceOp::Sum | ReduceOp::Avg => fold_with(acc, src, |a, b| apply(ReduceOp::Sum, a, b)),
        ReduceOp::Prod => fold_with(acc, src, |a, b| apply(ReduceOp::Prod, a, b)),
        ReduceOp::Min => fold_with(acc, src, |a, b| apply(ReduceOp::Min, a, b)),
        ReduceOp::Max => fold_with(acc, src, |a, b| apply(ReduceOp::Max, a, b)),
    }
}

fn fold_with<T: Arith>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    acc.iter_mut().zip(src).for_each(|(a, s)| *a = f(*a, *s));
}

/// `dst = a op b`, element-wise: the first two ranks' values in one pass,
/// without first copying rank 0's into `dst` (a copy that reads a peer's
/// freshly written area runs at a fraction of the loop's speed here).
fn first_two<T: Arith>(dst: &mut [T], a: &[T], b: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pair_with(dst, a, b, |a, b| apply(ReduceOp::Sum, a, b)),
        ReduceOp::Prod => pair_with(dst, a, b, |a, b| apply(ReduceOp::Prod, a, b)),
        ReduceOp::Min => pair_with(dst, a, b, |a, b| apply(ReduceOp::Min, a, b)),
        ReduceOp::Max => pair_with(dst, a, b, |a, b| apply(ReduceOp::Max, a, b)),
    }
}

fn pair_with<T: Arith>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    dst.iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(d, (a, b))| *d = f(*a, *b));
}

/// One rank's values by group rank.
type Source<'s, 'a> = &'s dyn Fn(usize) -> &'a [u8];

/// An element-wise job over bytes, run on a dtype's element type by
/// [`by_dtype`]: in its own arithmetic, or in f32 for narrow floats.
trait Job {
    fn native<T: Arith>(self);
    fn widened<T: Widen + bytemuck::Pod>(self);
}

/// Runs `job` on `dtype`'s element type; bools as bytes.
fn by_dtype(dtype: DType, job: impl Job) {
    match dtype {
        DType::F32 => job.native::<f32>(),
        DType::F64 => job.native::<f64>(),
        DType::I8 => job.native::<i8>(),
        DType::U8 | DType::Bool => job.native::<u8>(),
        DType::I16 => job.native::<i16>(),
        DType::U16 => job.native::<u16>(),
        DType::I32 => job.native::<i32>(),
        DType::U32 => job.native::<u32>(),
        DType::I64 => job.native::<i64>(),
        DType::U64 => job.native::<u64>(),
        DType::F16 => job.widened::<f16>(),
        DType::BF16 => job.widened::<bf16>(),
        DType::F8E4M3 => job.widened::<F8E4M3>(),
        DType::F8E5M2 => job.widened::<F8E5M2>(),
    }
}

/// `dst` = the reduction of the `n` ranks' values (in rank order) with
/// `op`, then `Avg`'s division.
struct Combine<'s, 'a, 'd> {
    n: usize,
    src: Source<'s, 'a>,
    dst: &'d mut [u8],
    op: ReduceOp,
}

impl Job for Combine<'_, '_, '_> {
    fn native<T: Arith>(self) {
        let (n, src, op) = (self.n, self.src, self.op);
        let dst: &mut [T] = bytemuck::cast_slice_mut(self.dst);
        let rank = |r| bytemuck::cast_slice::<u8, T>(src(r));
        match n {
            1 => dst.copy_from_slice(rank(0)),
            _ => first_two(dst, rank(0), rank(1), op),
        }
        for r in 2..n {
            fold_into(dst, rank(r), op);
        }
        if op == ReduceOp::Avg {
            dst.iter_mut().for_each(|x| *x = x.div_n(n));
        }
    }

    /// Every rank's values widened into f32, reduced there, rounded once.
    fn widened<T: Widen + bytemuck::Pod>(self) {
        let (n, src, op) = (self.n, self.src, self.op);
        let dst: &mut [T] = bytemuck::cast_slice_mut(self.dst);
        WIDE.with(|wide| {
            let mut wide = wide.borrow_mut();
            let (acc, tmp) = &mut *wide;
            acc.resize(dst.len(), 0.0);
            tmp.resize(dst.len(), 0.0);
            T::widen(bytemuck::cast_slice(src(0)), acc);
            for r in 1..n {
                T::widen(bytemuck::cast_slice(src(r)), tmp);
                fold_into(acc, tmp, op);
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|x| *x /= n as f32);
            }
            T::narrow(acc, dst);
        });
    }
}

/// Writes the reduction with `op` of the values of the `n` ranks of a
/// group into `dst`; `src(r)` is rank `r`'s slice (as long as `dst`,
/// aligned for `dtype`), and `Avg` divides by `n`. Taking a function
/// keeps the hot path free of a per-call list of slices.
pub(crate) fn combine<'a>(
    dtype: DType,
    op: ReduceOp,
    n: usize,
    src: impl Fn(usize) -> &'a [u8],
    dst: &mut [u8],
) {
    if dst.is_empty() {
        return;
    }
    let op = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Avg) => ReduceOp::Max,
        (DType::Bool, ReduceOp::Prod | ReduceOp::Min) => ReduceOp::Min,
        (_, op) => op,
    };
    by_dtype(
        dtype,
        Combine {
            n,
            src: &src,
            dst,
            op,
        },
    );
}

/// Every element divided by `n`, as `Avg` does after a sum.
struct Divide<'d> {
    bytes: &'d mut [u8],
    n: usize,
}

impl Job for Divide<'_> {
    fn native<T: Arith>(self) {
        let xs: &mut [T] = bytemuck::cast_slice_mut(self.bytes);
        xs.iter_mut().for_each(|x| *x = x.div_n(self.n));
    }

    fn widened<T: Widen + bytemuck::Pod>(self) {
        let xs: &mut [T] = bytemuck::cast_slice_mut(self.bytes);
        let mut wide = vec![0f32; xs.len()];
        T::widen(xs, &mut wide);
        wide.iter_mut().for_each(|x| *x /= self.n as f32);
        T::narrow(&wide, xs);
    }
}

/// Divides every element of `bytes` (values of `dtype`) by `n`, as `Avg`
/// does after a sum (truncating for integers; narrow floats through f32).
pub(crate) fn divide(dtype: DType, bytes: &mut [u8], n: usize) {
    // Refused before any data moves (no average of bools).
    if dtype != DType::Bool {
        by_dtype(dtype, Divide { bytes, n });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn integers_wrap_and_avg_truncates() {
        let (a, b) = (bytes(&[200u8, 7]), bytes(&[100u8, 2]));
        let mut out = vec![0u8; 2];
        combine(DType::U8, ReduceOp::Sum, 2, |r| [&a, &b][r], &mut out);
        assert_eq!(out, [44, 9]);
        combine(DType::U8, ReduceOp::Avg, 2, |r| [&a, &b][r], &mut out);
        assert_eq!(out, [22, 4]);
        combine(DType::U8, ReduceOp::Prod, 2, |r| [&a, &b][r], &mut out);
        assert_eq!(out, [(200u32 * 100 % 256) as u8, 14]);
    }

    #[test]
    fn narrow_floats_round_once() {
        // 1 + 2^-11 + 2^-11 is exact in f32 but not in f16 after each step.
        let one = bytes(&[f16::from_f32(1.0)]);
        let tiny = bytes(&[f16::from_f32(2f32.powi(-11))]);
        let mut out = vec![0u8; 2];
        combine(
            DType::F16,
            ReduceOp::Sum,
            3,
            |r| [&one, &tiny, &tiny][r],
            &mut out,
        );
        let got: &[f16] = bytemuck::cast_slice(&out);
        assert_eq!(got[0].to_f32(), 1.0 + 2f32.powi(-10));
    }

    #[test]
    fn divide_is_avgs_division() {
        let mut b = bytes(&[7i32, -7, 9]);
        divide(DType::I32, &mut b, 2);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&b), &[3, -3, 4]);
        let mut b = bytes(&[1.0f64, 3.0]);
        divide(DType::F64, &mut b, 4);
        assert_eq!(bytemuck::cast_slice::<u8, f64>(&b), &[0.25, 0.75]);
        // bf16 through f32, rounded once: 1.0 / 3 to bf16's nearest.
        let mut b = bytes(&[bf16::from_f32(1.0)]);
        divide(DType::BF16, &mut b, 3);
        assert_eq!(
            bytemuck::cast_slice::<u8, bf16>(&b),
            &[bf16::from_f32(1.0 / 3.0)]
        );
        let mut b = vec![1u8, 0];
        divide(DType::Bool, &mut b, 2);
        assert_eq!(b, [1, 0]);
    }

    #[test]
    fn min_max_bool_and_float() {
        let (a, b) = (bytes(&[1.5f32, -2.0]), bytes(&[0.5f32, 3.0]));
        let mut out = vec![0u8; 8];
        combine(DType::F32, ReduceOp::Min, 2, |r| [&a, &b][r], &mut out);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), [0.5, -2.0]);
        combine(DType::F32, ReduceOp::Max, 2, |r| [&a, &b][r], &mut out);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), [1.5, 3.0]);
        let (x, y) = (vec![1u8, 0, 1], vec![0u8, 0, 1]);
        let mut out = vec![9u8; 3];
        combine(DType::Bool, ReduceOp::Sum, 2, |r| [&x, &y][r], &mut out);
        assert_eq!(out, [1, 0, 1]);
        combine(DType::Bool, ReduceOp::Prod, 2, |r| [&x, &y][r], &mut out);
        assert_eq!(out, [0, 0, 1]);
    }
}
