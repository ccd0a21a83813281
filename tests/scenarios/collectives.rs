//! Every tensor collective, dtype and mode against the serial reference.

use super::reference::{assert_tensor, concat, defined, input, reduced, slice, values};
use rankmesh::Collectives as _;
use rankmesh::{DType, ReduceOp, Runtime, Tensor};

/// Multiplies the last dim of every shape (`RANKMESH_TEST_SCALE`), so a
/// run can push each call through many pieces of an executor.
fn scale() -> usize {
    std::env::var("RANKMESH_TEST_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let k = scale();
    let forced = std::env::var("RANKMESH_HOST_PLANE").unwrap_or_default();
    let one_node = g.same_node_ranks(0).unwrap().len() == p;
    let some_node_shared = (0..p).any(|r| g.same_node_ranks(r).unwrap().len() > 1);
    let executor = match (p, forced.as_str()) {
        (1, _) => "local",
        (_, "mpi") => "mpi",
        _ if one_node => "shm",
        (_, "hier" | "auto" | "") if some_node_shared => "hier",
        _ => "mpi",
    };
    assert_eq!(g.host_executor(), executor, "the executor of {}", g.name());
    let (a, b, c) = ([5 * k], [2, 3, 4 * k], [1, 2, 1, 3 * k]);
    let shapes: [&[usize]; 3] = [&a, &b, &c];

    for dtype in DType::ALL {
        for op in ReduceOp::ALL.into_iter().filter(|op| defined(dtype, *op)) {
            for shape in shapes {
                let x = input(me, shape, dtype, op);
                let ctx = format!("all_reduce {op:?} {dtype} {shape:?} np{p}");
                let got = g.all_reduce(&x, op).unwrap();
                assert_tensor(&got, dtype, shape, &reduced(p, x.numel(), dtype, op), &ctx);
            }
        }

        for shape in shapes {
            let n: usize = shape.iter().product();
            let parts: Vec<Vec<f64>> = (0..p).map(|r| values(r, n, dtype, ReduceOp::Sum)).collect();
            let x = input(me, shape, dtype, ReduceOp::Sum);
            for dim in -(shape.len() as isize)..shape.len() as isize {
                let d = dim.rem_euclid(shape.len() as isize) as usize;
                let (want_shape, want) = concat(&parts, shape, d);
                let ctx = format!("all_gather dim {dim} {dtype} {shape:?} np{p}");
                assert_tensor(
                    &g.all_gather(&x, dim).unwrap(),
                    dtype,
                    &want_shape,
                    &want,
                    &ctx,
                );
                for dst in 0..p {
                    let got = g.gather(&x, dst, dim).unwrap();
                    match got {
                        Some(t) => {
                            assert_eq!(me, dst, "gather result on a non-destination rank");
                            assert_tensor(
                                &t,
                                dtype,
                                &want_shape,
                                &want,
                                &format!("gather to {dst}: {ctx}"),
                            );
                        }
                        None => assert_ne!(me, dst, "no gather result on the destination"),
                    }
                }
            }
            for src in 0..p {
                let mut t = if me == src {
                    x.clone()
                } else {
                    Tensor::zeros(shape.to_vec(), dtype).unwrap()
                };
                g.broadcast(&mut t, src).unwrap();
                let want = values(src, n, dtype, ReduceOp::Sum);
                assert_tensor(
                    &t,
                    dtype,
                    shape,
                    &want,
                    &format!("broadcast from {src} {dtype} np{p}"),
                );
            }
        }

        for op in ReduceOp::ALL.into_iter().filter(|op| defined(dtype, *op)) {
            for dim in 0..3usize {
                let mut shape = vec![2, 3, 2 * k];
                shape[dim] *= p;
                let x = input(me, &shape, dtype, op);
                let full = reduced(p, x.numel(), dtype, op);
                let (want_shape, want) = slice(&full, &shape, dim, me, p);
                let ctx = format!("reduce_scatter {op:?} dim {dim} {dtype} np{p}");
                let got = g.reduce_scatter(&x, dim as isize - 3, op).unwrap();
                assert_tensor(&got, dtype, &want_shape, &want, &ctx);
            }
        }

        scatter(&g, dtype);
        all_to_all_4d(&g, dtype);
        rooted_and_exchanges(&g, dtype);
    }
    eight_bit_arithmetic_wraps(&g);
    sixteen_bit_arithmetic_wraps(&g);
    fp8_saturates_and_bools_stay_canonical(&g);
    narrow_floats_reduce_in_steps(&g);
}

/// 8-bit sums and products wrap like Rust's `wrapping_*`, also on vectors long
/// enough for SIMD reduction kernels (Open MPI 4.1's AVX kernels saturate).
fn eight_bit_arithmetic_wraps(g: &rankmesh::GroupCoordinator<'_>) {
    let p = g.size();
    let n = 4096;
    let u: Vec<u8> = (0..n).map(|i| 200 + (i % 7) as u8).collect();
    let i: Vec<i8> = (0..n).map(|k| 100 + (k % 7) as i8).collect();
    let tu = Tensor::from_vec([n], u.clone()).unwrap();
    let ti = Tensor::from_vec([n], i.clone()).unwrap();
    let sum_u = g.all_reduce(&tu, ReduceOp::Sum).unwrap();
    let sum_i = g.all_reduce(&ti, ReduceOp::Sum).unwrap();
    let prod_u = g.all_reduce(&tu, ReduceOp::Prod).unwrap();
    let want_sum_u: Vec<u8> = u.iter().map(|x| x.wrapping_mul(p as u8)).collect();
    let want_sum_i: Vec<i8> = i.iter().map(|x| x.wrapping_mul(p as i8)).collect();
    let want_prod_u: Vec<u8> = u
        .iter()
        .map(|x| (0..p).fold(1u8, |a, _| a.wrapping_mul(*x)))
        .collect();
    first_mismatch(
        sum_u.as_slice::<u8>().unwrap(),
        &want_sum_u,
        &format!("u8 sum wraps np{p}"),
    );
    first_mismatch(
        sum_i.as_slice::<i8>().unwrap(),
        &want_sum_i,
        &format!("i8 sum wraps np{p}"),
    );
    first_mismatch(
        prod_u.as_slice::<u8>().unwrap(),
        &want_prod_u,
        &format!("u8 prod wraps np{p}"),
    );
}

/// 16-bit integers wrap too (NCCL has none; the host plane's own operations).
fn sixteen_bit_arithmetic_wraps(g: &rankmesh::GroupCoordinator<'_>) {
    let p = g.size();
    let n = 4096;
    let i: Vec<i16> = (0..n).map(|k| 30000 + (k % 7) as i16).collect();
    let u: Vec<u16> = (0..n).map(|k| 300 + (k % 7) as u16).collect();
    let sum_i = g
        .all_reduce(&Tensor::from_vec([n], i.clone()).unwrap(), ReduceOp::Sum)
        .unwrap();
    let prod_u = g
        .all_reduce(&Tensor::from_vec([n], u.clone()).unwrap(), ReduceOp::Prod)
        .unwrap();
    let want_i: Vec<i16> = i.iter().map(|x| x.wrapping_mul(p as i16)).collect();
    let want_u: Vec<u16> = u
        .iter()
        .map(|x| (0..p).fold(1u16, |a, _| a.wrapping_mul(*x)))
        .collect();
    first_mismatch(
        sum_i.as_slice::<i16>().unwrap(),
        &want_i,
        &format!("i16 sum wraps np{p}"),
    );
    first_mismatch(
        prod_u.as_slice::<u16>().unwrap(),
        &want_u,
        &format!("u16 prod wraps np{p}"),
    );
}

/// fp8 sums past the largest finite value saturate to it (CUDA's
/// `__NV_SATFINITE`, which NCCL uses), never NaN or infinity; a bool sum is
/// OR with a canonical 0/1 byte, not a byte sum.
fn fp8_saturates_and_bools_stay_canonical(g: &rankmesh::GroupCoordinator<'_>) {
    let p = g.size();
    for (dtype, x, one_rank, max) in [
        (DType::F8E4M3, 300.0, 288.0, 448.0),
        (DType::F8E5M2, 40000.0, 40960.0, 57344.0),
    ] {
        let t = Tensor::from_fn([64], dtype, |_| x).unwrap();
        let got = g.all_reduce(&t, ReduceOp::Sum).unwrap().to_f64_vec();
        let want = if p == 1 { one_rank } else { max };
        assert!(
            got.iter().all(|v| *v == want),
            "{dtype} sum np{p}: {:?}",
            &got[..4]
        );
    }
    let t = Tensor::from_vec(
        [3],
        vec![
            rankmesh::tensor::Bool::TRUE,
            rankmesh::tensor::Bool(7),
            rankmesh::tensor::Bool::FALSE,
        ],
    )
    .unwrap();
    let or = g.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(
        or.bytes(),
        [1, 7, 0],
        "bool sum np{p}: OR of the same bytes"
    );
    let ones = Tensor::from_fn([5], DType::Bool, |_| 1.0).unwrap();
    assert_eq!(
        g.all_reduce(&ones, ReduceOp::Sum).unwrap().bytes(),
        [1; 5],
        "bool sum np{p}"
    );
}

/// f16/bf16 reductions widen a cache-sized step at a time: tensors of many
/// steps (and reduce-scatter blocks spanning steps) must still round once,
/// exactly as one f32 reduction then one rounding would.
fn narrow_floats_reduce_in_steps(g: &rankmesh::GroupCoordinator<'_>) {
    use half::{bf16, f16};
    let (p, me) = (g.size(), g.rank_in_group());
    let n = 70_001 * p; // not a multiple of the 65536-element step; blocks span two steps
    let x = |r: usize, i: usize| ((i * 7 + r * 13) % 101) as f64 / 8.0 - 6.0;
    for dtype in [DType::BF16, DType::F16] {
        let round = |v: f32| match dtype {
            DType::BF16 => bf16::from_f32(v).to_f64(),
            _ => f16::from_f32(v).to_f64(),
        };
        let t = Tensor::from_fn([n], dtype, |i| x(me, i)).unwrap();
        let sum = |i: usize| (0..p).map(|r| x(r, i)).sum::<f64>() as f32;
        let got = g.all_reduce(&t, ReduceOp::Sum).unwrap().to_f64_vec();
        let bad = (0..n).find(|i| got[*i] != round(sum(*i)));
        assert_eq!(bad, None, "{dtype} all_reduce sum np{p}");
        let got = g.all_reduce(&t, ReduceOp::Avg).unwrap().to_f64_vec();
        let bad = (0..n).find(|i| got[*i] != round(sum(*i) / p as f32));
        assert_eq!(bad, None, "{dtype} all_reduce avg np{p}");
        let got = g.reduce_scatter(&t, 0, ReduceOp::Sum).unwrap().to_f64_vec();
        let block = n / p;
        let bad = (0..block).find(|j| got[*j] != round(sum(me * block + j)));
        assert_eq!(bad, None, "{dtype} reduce_scatter np{p}");
        if let Some(got) = g.reduce(&t, p - 1, ReduceOp::Max).unwrap() {
            let max = |i: usize| (0..p).map(|r| x(r, i)).fold(f64::MIN, f64::max) as f32;
            let got = got.to_f64_vec();
            assert_eq!(
                (0..n).find(|i| got[*i] != round(max(*i))),
                None,
                "{dtype} reduce max"
            );
        }
    }
}

fn first_mismatch<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{ctx}: element {i} is {:?}, expected {:?}", got[i], want[i]);
    }
}

/// `scatter` from every source along every dim (negative too), and
/// `scatter_into`; only the source's data is read (the others pass their
/// own, different input).
fn scatter(g: &rankmesh::GroupCoordinator<'_>, dtype: DType) {
    let (p, me) = (g.size(), g.rank_in_group());
    for dim in 0..3usize {
        let mut shape = vec![2, 3, 2 * scale()];
        shape[dim] *= p;
        let x = input(me, &shape, dtype, ReduceOp::Sum);
        for src in 0..p {
            let full = values(src, x.numel(), dtype, ReduceOp::Sum);
            let (want_shape, want) = slice(&full, &shape, dim, me, p);
            let ctx = format!("scatter from {src} dim {dim} {dtype} np{p}");
            let got = g.scatter(&x, src, dim as isize - 3).unwrap();
            assert_tensor(&got, dtype, &want_shape, &want, &ctx);
            let mut out = Tensor::zeros(want_shape.clone(), dtype).unwrap();
            g.scatter_into(&x, &mut out, src, dim as isize).unwrap();
            assert_tensor(&out, dtype, &want_shape, &want, &format!("{ctx} (into)"));
        }
    }
    if p > 1 {
        // A dim that does not divide: the same error on every rank.
        let odd = input(me, &[2, p + 1], dtype, ReduceOp::Sum);
        let err = g.scatter(&odd, 0, 1).unwrap_err();
        assert!(
            matches!(
                err,
                rankmesh::Error::InvalidArgument {
                    op: rankmesh::op::Op::Scatter,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "scatter on world: dim 1 of size {} is not divisible by the group size {p}",
                p + 1
            )
        );
    }
}

/// Both FastVideo modes, element by element from the definition.
fn all_to_all_4d(g: &rankmesh::GroupCoordinator<'_>, dtype: DType) {
    // Strided blocks, and contiguous ones (outer dims 1: one run per block,
    // the plain all-to-all on the caller's buffers).
    for (b, s, h) in [(2, 3, 2), (1, 1, 3)] {
        all_to_all_4d_shaped(g, dtype, (b, s, h, 2 * scale()));
    }
}

pub(super) fn all_to_all_4d_shaped(
    g: &rankmesh::GroupCoordinator<'_>,
    dtype: DType,
    (b, s, h, d): (usize, usize, usize, usize),
) {
    let (p, me) = (g.size(), g.rank_in_group());
    let sum = ReduceOp::Sum;

    // (2, 1): [B, S/P, H, D] -> [B, S, H/P, D] with S/P = s, H = h·P.
    let in_shape = [b, s, h * p, d];
    let x = input(me, &in_shape, dtype, sum);
    let got = g.all_to_all_4d(&x, 2, 1).unwrap();
    let out_shape = [b, s * p, h, d];
    let every: Vec<Vec<f64>> = (0..p)
        .map(|r| values(r, in_shape.iter().product(), dtype, sum))
        .collect();
    let want: Vec<f64> = (0..out_shape.iter().product())
        .map(|f| {
            let i = super::reference::unflat(&out_shape, f);
            let (src, seq) = (i[1] / s, i[1] % s);
            every[src][super::reference::flat(&in_shape, &[i[0], seq, me * h + i[2], i[3]])]
        })
        .collect();
    assert_tensor(
        &got,
        dtype,
        &out_shape,
        &want,
        &format!("all_to_all_4d (2,1) {dtype} np{p} {in_shape:?}"),
    );

    // (1, 2): [B, S, H/P, D] -> [B, S/P, H, D] with S = s·P, H/P = h.
    let in_shape = [b, s * p, h, d];
    let x = input(me, &in_shape, dtype, sum);
    let got = g.all_to_all_4d(&x, 1, 2).unwrap();
    let out_shape = [b, s, h * p, d];
    let every: Vec<Vec<f64>> = (0..p)
        .map(|r| values(r, in_shape.iter().product(), dtype, sum))
        .collect();
    let want: Vec<f64> = (0..out_shape.iter().product())
        .map(|f| {
            let i = super::reference::unflat(&out_shape, f);
            let (src, head) = (i[2] / h, i[2] % h);
            every[src][super::reference::flat(&in_shape, &[i[0], me * s + i[1], head, i[3]])]
        })
        .collect();
    assert_tensor(
        &got,
        dtype,
        &out_shape,
        &want,
        &format!("all_to_all_4d (1,2) {dtype} np{p} {in_shape:?}"),
    );

    // The two modes are inverses.
    let back = g
        .all_to_all_4d(&g.all_to_all_4d(&x, 1, 2).unwrap(), 2, 1)
        .unwrap();
    assert_eq!(back, x, "all_to_all_4d round trip {dtype} np{p}");
}

/// reduce, all_to_all, send_recv and the `_into` forms with reused outputs.
fn rooted_and_exchanges(g: &rankmesh::GroupCoordinator<'_>, dtype: DType) {
    let (p, me) = (g.size(), g.rank_in_group());
    // Zero elements move nothing and must not upset MPI (empty Rust buffers
    // share one address, which MPI would read as aliasing).
    let empty = Tensor::zeros([0, 3], dtype).unwrap();
    for op in ReduceOp::ALL.into_iter().filter(|op| defined(dtype, *op)) {
        assert_eq!(g.all_reduce(&empty, op).unwrap().shape(), &[0, 3]);
        assert_eq!(g.reduce_scatter(&empty, 0, op).unwrap().shape(), &[0, 3]);
        assert_eq!(
            g.reduce(&empty, 0, op)
                .unwrap()
                .map(|t| t.numel())
                .unwrap_or(0),
            0
        );
    }
    assert_eq!(g.all_gather(&empty, 0).unwrap().shape(), &[0, 3]);
    assert_eq!(g.all_to_all(&empty).unwrap().shape(), &[0, 3]);
    assert_eq!(
        g.gather(&empty, 0, 1)
            .unwrap()
            .map(|t| t.shape().to_vec())
            .unwrap_or_default(),
        if me == 0 { vec![0, 3 * p] } else { vec![] }
    );
    g.broadcast(&mut empty.clone(), 0).unwrap();
    if dtype == DType::Bool {
        let x = input(me, &[2, 3], dtype, ReduceOp::Sum);
        let e = g.all_reduce(&x, ReduceOp::Avg).unwrap_err().to_string();
        assert!(e.contains("avg is not defined for bool"), "{e}");
        let e = g
            .reduce_scatter(&empty, 0, ReduceOp::Avg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("avg is not defined for bool"), "{e}");
    }
    for op in ReduceOp::ALL.into_iter().filter(|op| defined(dtype, *op)) {
        let x = input(me, &[2, 3], dtype, op);
        for dst in 0..p {
            let got = g.reduce(&x, dst, op).unwrap();
            match got {
                Some(t) => {
                    assert_eq!(me, dst);
                    assert_tensor(
                        &t,
                        dtype,
                        &[2, 3],
                        &reduced(p, 6, dtype, op),
                        &format!("reduce {op:?} to {dst}"),
                    );
                }
                None => assert_ne!(me, dst),
            }
        }
        let mut out = Tensor::zeros([2, 3], dtype).unwrap();
        for _ in 0..2 {
            g.all_reduce_into(&x, &mut out, op).unwrap();
            assert_tensor(
                &out,
                dtype,
                &[2, 3],
                &reduced(p, 6, dtype, op),
                &format!("all_reduce_into {op:?}"),
            );
        }
    }

    // all_to_all: block r of dim 0 goes to rank r; received blocks in source order.
    let shape = [2 * p, 3];
    let x = input(me, &shape, dtype, ReduceOp::Sum);
    let got = g.all_to_all(&x).unwrap();
    let want: Vec<f64> = (0..p)
        .flat_map(|src| values(src, 6 * p, dtype, ReduceOp::Sum)[me * 6..(me + 1) * 6].to_vec())
        .collect();
    assert_tensor(
        &got,
        dtype,
        &shape,
        &want,
        &format!("all_to_all {dtype} np{p}"),
    );

    // Ring shift with send_recv: everyone sends to next and receives from previous.
    let x = input(me, &[4], dtype, ReduceOp::Sum);
    let mut out = Tensor::zeros([4], dtype).unwrap();
    g.send_recv_into(&x, &mut out, None, None).unwrap();
    let prev = (me + p - 1) % p;
    assert_tensor(
        &out,
        dtype,
        &[4],
        &values(prev, 4, dtype, ReduceOp::Sum),
        &format!("send_recv {dtype} np{p}"),
    );

    // all_gather_into / reduce_scatter_into with a reused output, dim 1 (packed path).
    let x = input(me, &[2, 3], dtype, ReduceOp::Sum);
    let mut out = Tensor::zeros([2, 3 * p], dtype).unwrap();
    g.all_gather_into(&x, &mut out, 1).unwrap();
    let parts: Vec<Vec<f64>> = (0..p).map(|r| values(r, 6, dtype, ReduceOp::Sum)).collect();
    let (want_shape, want) = concat(&parts, &[2, 3], 1);
    assert_tensor(&out, dtype, &want_shape, &want, "all_gather_into");
}
