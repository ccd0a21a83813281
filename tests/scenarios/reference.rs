//! Serial references: every rank can compute any rank's input, so each rank
//! computes the expected result of a collective by plain index arithmetic
//! (independent of the library's packing code) and compares.

use rankmesh::Collectives as _;
use rankmesh::{DType, GroupCoordinator, ReduceOp, Tensor};

/// Deterministic input of `rank`: small integers, exact in every dtype,
/// whose sums and products stay in range for 4 ranks (bools: their truth
/// values, 0 or 1). Unsigned maxima and minima take values on both sides of
/// the top bit (7/16 to 15/16 of the type's range), where an MPI that
/// compares them as signed gets them wrong (Debian's MPICH 4.0.2 did).
pub fn values(rank: usize, n: usize, dtype: DType, op: ReduceOp) -> Vec<f64> {
    let unsigned_bits = match dtype {
        DType::U8 => Some(8),
        DType::U16 => Some(16),
        DType::U32 => Some(32),
        DType::U64 => Some(64),
        _ => None,
    };
    (0..n)
        .map(|i| {
            let v = if op == ReduceOp::Prod {
                ((rank + i) % 2 + 1) as f64
            } else {
                let v = ((rank * 7 + i * 3) % 9) as f64;
                match (unsigned_bits, op) {
                    (Some(bits), ReduceOp::Max | ReduceOp::Min) => (v + 7.0) * 2f64.powi(bits - 4),
                    (Some(_), _) => v,
                    (None, _) => v - 4.0,
                }
            };
            if dtype == DType::Bool {
                f64::from(u8::from(v != 0.0))
            } else {
                v
            }
        })
        .collect()
}

/// Whether `op` is defined on `dtype` (avg of bools is not).
pub fn defined(dtype: DType, op: ReduceOp) -> bool {
    !(dtype == DType::Bool && op == ReduceOp::Avg)
}

pub fn input(rank: usize, shape: &[usize], dtype: DType, op: ReduceOp) -> Tensor {
    let v = values(rank, shape.iter().product(), dtype, op);
    Tensor::from_fn(shape.to_vec(), dtype, |i| v[i]).unwrap()
}

/// Element-wise reduction of every rank's `values`, as the collective defines it.
pub fn reduced(p: usize, n: usize, dtype: DType, op: ReduceOp) -> Vec<f64> {
    let all: Vec<Vec<f64>> = (0..p).map(|r| values(r, n, dtype, op)).collect();
    // Bools: sum and max are OR, prod and min are AND (of 0/1 values).
    let op = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum) => ReduceOp::Max,
        (DType::Bool, ReduceOp::Prod) => ReduceOp::Min,
        _ => op,
    };
    (0..n)
        .map(|i| {
            let acc = (1..p).fold(all[0][i], |a, r| op.combine(a, all[r][i]));
            match op {
                ReduceOp::Avg if dtype.is_float() => acc / p as f64,
                ReduceOp::Avg => (acc / p as f64).trunc(),
                _ => acc,
            }
        })
        .collect()
}

pub fn unflat(shape: &[usize], mut f: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = f % shape[d];
        f /= shape[d];
    }
    idx
}

pub fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
}

/// Concatenation of `parts` (each shaped `shape`) along `dim`.
pub fn concat(parts: &[Vec<f64>], shape: &[usize], dim: usize) -> (Vec<usize>, Vec<f64>) {
    let mut out_shape = shape.to_vec();
    out_shape[dim] *= parts.len();
    let n: usize = out_shape.iter().product();
    let data = (0..n)
        .map(|f| {
            let mut idx = unflat(&out_shape, f);
            let part = idx[dim] / shape[dim];
            idx[dim] %= shape[dim];
            parts[part][flat(shape, &idx)]
        })
        .collect();
    (out_shape, data)
}

/// Slice `k` of `parts` equal slices of `data` (shaped `shape`) along `dim`.
pub fn slice(
    data: &[f64],
    shape: &[usize],
    dim: usize,
    k: usize,
    parts: usize,
) -> (Vec<usize>, Vec<f64>) {
    let mut out_shape = shape.to_vec();
    out_shape[dim] /= parts;
    let n: usize = out_shape.iter().product();
    let out = (0..n)
        .map(|f| {
            let mut idx = unflat(&out_shape, f);
            idx[dim] += k * out_shape[dim];
            data[flat(shape, &idx)]
        })
        .collect();
    (out_shape, out)
}

/// One rounding to the dtype (its unit roundoff, relative).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F8E4M3 => 1.0 / 16.0,
        DType::F8E5M2 => 1.0 / 8.0,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

/// Asserts `got` has `shape`, `dtype` and values `want` (exact for integers,
/// within one rounding of the dtype for floats).
pub fn assert_tensor(got: &Tensor, dtype: DType, shape: &[usize], want: &[f64], ctx: &str) {
    assert_eq!(got.dtype(), dtype, "{ctx}: dtype");
    assert_eq!(got.shape(), shape, "{ctx}: shape");
    if dtype == DType::Bool {
        let odd = got.bytes().iter().position(|b| *b > 1);
        assert_eq!(odd, None, "{ctx}: a bool result is not a 0/1 byte");
    }
    let tol = tolerance(dtype);
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs(),
            "{ctx}: element {i} is {g}, expected {w}"
        );
    }
}

/// `n` values in [-1, 1) from `seed` (xorshift64), non-integer so that
/// sums round: every rank can make any rank's input.
pub fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Elements `range` of the sum of every rank's `parts`, added in rank order
/// as the executors combine: bit-identical to their f32 sums.
pub fn rank_order_sum(parts: &[Vec<f32>], range: std::ops::Range<usize>) -> Vec<f32> {
    range
        .map(|i| {
            parts[1..]
                .iter()
                .fold(parts[0][i], |acc, part| acc + part[i])
        })
        .collect()
}

/// The first index where `got` and `want` differ bit-wise, with both values.
pub fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    if got.len() != want.len() {
        return Some((got.len().min(want.len()), f32::NAN, f32::NAN));
    }
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())
        .map(|(i, (g, w))| (i, *g, *w))
}

/// Asserts `got` holds exactly the f32 bits of `want`; `what` names the call.
pub fn assert_bits(got: &Tensor, want: &[f32], what: &str) {
    let got = got.as_slice::<f32>().unwrap();
    assert_eq!(first_difference(got, want), None, "{what}");
}

/// all_reduce (sum), all_gather and a broadcast from each of `roots` of
/// this rank's `all[me]` on `g` (`all`: every rank's values), each
/// bit-exact against its serial reference.
pub fn assert_replicated_ops(
    g: &GroupCoordinator<'_>,
    all: &[Vec<f32>],
    roots: impl IntoIterator<Item = usize>,
) {
    let (p, me, n) = (g.size(), g.rank_in_group(), all[0].len());
    let mine = Tensor::from_vec([n], all[me].clone()).unwrap();
    let sum = g.all_reduce(&mine, ReduceOp::Sum).unwrap();
    let what = format!("all_reduce of {n} f32 on {p} ranks");
    assert_bits(&sum, &rank_order_sum(all, 0..n), &what);
    let gathered = g.all_gather(&mine, 0).unwrap();
    let what = format!("all_gather of {n} f32 on {p} ranks");
    assert_bits(&gathered, &all.concat(), &what);
    for root in roots {
        let mut t = if me == root {
            mine.clone()
        } else {
            Tensor::from_vec([n], vec![0f32; n]).unwrap()
        };
        g.broadcast(&mut t, root).unwrap();
        assert_bits(&t, &all[root], &format!("broadcast of {n} f32 from {root}"));
    }
}
