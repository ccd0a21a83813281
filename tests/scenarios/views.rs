//! Caller-owned host memory as tensors (`Tensor::view`, `Tensor::view_mut`):
//! every op reads and writes the caller's slices in place, with results
//! equal to the same op on rankmesh's own tensors and to the serial
//! reference, on the shared-memory and MPI executors.

use super::reference::{random_f32, rank_order_sum, values};
use rankmesh::Collectives as _;
use rankmesh::{DType, GroupCoordinator, ReduceOp, Runtime, Tensor};

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    all_reduce_in_place_writes_the_callers_vec(&g);
    outputs_are_written_into_the_callers_slices(&g);
    integer_and_narrow_dtypes_match_owned_tensors(&g);
}

/// f32 sums of random non-integer data, in place: the caller's `Vec` holds
/// the rank-order sum afterwards, at its own address.
fn all_reduce_in_place_writes_the_callers_vec(g: &GroupCoordinator<'_>) {
    let (p, me) = (g.size(), g.rank_in_group());
    for n in [1usize, 7, 4099, 70_000] {
        let parts: Vec<Vec<f32>> = (0..p)
            .map(|r| random_f32(r as u64 * 31 + n as u64, n))
            .collect();
        let mut mine = parts[me].clone();
        let addr = mine.as_ptr();
        {
            let mut v = Tensor::view_mut([n], &mut mine).unwrap();
            assert!(v.is_borrowed());
            g.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v.as_slice::<f32>().unwrap().as_ptr(), addr);
        }
        let want = rank_order_sum(&parts, 0..n);
        for (i, (got, want)) in mine.iter().zip(&want).enumerate() {
            let tol = 1e-5 * want.abs().max(1.0);
            assert!(
                (got - want).abs() <= tol,
                "n={n} element {i}: {got} vs {want}"
            );
        }
    }
}

/// Views as inputs and outputs of the out-of-place ops: the caller's output
/// slices hold what the allocating forms return.
fn outputs_are_written_into_the_callers_slices(g: &GroupCoordinator<'_>) {
    let (p, me) = (g.size(), g.rank_in_group());
    let shape = [2usize, 2 * p, 3, 2];
    let n: usize = shape.iter().product();
    let input: Vec<f32> = random_f32(me as u64 + 7, n);
    let owned = Tensor::from_vec(shape, input.clone()).unwrap();
    let view = Tensor::view(shape, &input).unwrap();

    let mut out = vec![0f32; n];
    g.all_reduce_into(
        &view,
        &mut Tensor::view_mut(shape, &mut out).unwrap(),
        ReduceOp::Max,
    )
    .unwrap();
    assert_eq!(
        out,
        g.all_reduce(&owned, ReduceOp::Max)
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
    );

    for dim in [0isize, 1, -1] {
        let want = g.all_gather(&owned, dim).unwrap();
        let mut out = vec![0f32; want.numel()];
        g.all_gather_into(
            &view,
            &mut Tensor::view_mut(want.shape(), &mut out).unwrap(),
            dim,
        )
        .unwrap();
        assert_eq!(out, want.as_slice::<f32>().unwrap(), "all_gather dim {dim}");
        let want = g.reduce_scatter(&owned, 1, ReduceOp::Sum).unwrap();
        let mut out = vec![0f32; want.numel()];
        g.reduce_scatter_into(
            &view,
            &mut Tensor::view_mut(want.shape(), &mut out).unwrap(),
            1,
            ReduceOp::Sum,
        )
        .unwrap();
        assert_eq!(out, want.as_slice::<f32>().unwrap(), "reduce_scatter");
    }

    // FastVideo's sequence-parallel round trip, there and back, into views.
    let heads = [2usize, 3, 2 * p, 4];
    let x: Vec<f32> = random_f32(me as u64 + 99, heads.iter().product());
    let there_shape = [2usize, 3 * p, 2, 4];
    let mut there = vec![0f32; x.len()];
    g.all_to_all_4d_into(
        &Tensor::view(heads, &x).unwrap(),
        &mut Tensor::view_mut(there_shape, &mut there).unwrap(),
        2,
        1,
    )
    .unwrap();
    let owned_there = g
        .all_to_all_4d(&Tensor::from_vec(heads, x.clone()).unwrap(), 2, 1)
        .unwrap();
    assert_eq!(there, owned_there.as_slice::<f32>().unwrap());
    let mut back = vec![0f32; x.len()];
    g.all_to_all_4d_into(
        &Tensor::view(there_shape, &there).unwrap(),
        &mut Tensor::view_mut(heads, &mut back).unwrap(),
        1,
        2,
    )
    .unwrap();
    assert_eq!(back, x, "all_to_all_4d there and back");

    // Broadcast writes every member's slice in place.
    let mut b: Vec<f32> = if me == p - 1 {
        input.clone()
    } else {
        vec![0.0; n]
    };
    g.broadcast(&mut Tensor::view_mut(shape, &mut b).unwrap(), p - 1)
        .unwrap();
    assert_eq!(b, random_f32(p as u64 - 1 + 7, n));
}

/// Integer, bool and 16-bit dtypes through views: all_reduce against the
/// serial reference, for every reduce op each dtype defines.
fn integer_and_narrow_dtypes_match_owned_tensors(g: &GroupCoordinator<'_>) {
    let (p, me) = (g.size(), g.rank_in_group());
    let n = 37;
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let mine: Vec<i32> = values(me, n, DType::I32, op)
            .iter()
            .map(|v| *v as i32)
            .collect();
        let mut out = vec![0i32; n];
        g.all_reduce_into(
            &Tensor::view([n], &mine).unwrap(),
            &mut Tensor::view_mut([n], &mut out).unwrap(),
            op,
        )
        .unwrap();
        let want = super::reference::reduced(p, n, DType::I32, op);
        assert_eq!(
            out.iter().map(|x| *x as f64).collect::<Vec<_>>(),
            want,
            "i32 {op:?}"
        );

        let mut bools: Vec<rankmesh::tensor::Bool> = values(me, n, DType::Bool, op)
            .iter()
            .map(|v| (*v != 0.0).into())
            .collect();
        g.all_reduce_in_place(&mut Tensor::view_mut([n], &mut bools).unwrap(), op)
            .unwrap();
        let want = super::reference::reduced(p, n, DType::Bool, op);
        let got: Vec<f64> = bools.iter().map(|b| f64::from(u8::from(b.get()))).collect();
        assert_eq!(got, want, "bool {op:?}");

        let halves: Vec<half::bf16> = values(me, n, DType::BF16, op)
            .iter()
            .map(|v| half::bf16::from_f64(*v))
            .collect();
        let owned = Tensor::from_vec([n], halves.clone()).unwrap();
        let mut out = vec![half::bf16::ZERO; n];
        g.all_reduce_into(
            &Tensor::view([n], &halves).unwrap(),
            &mut Tensor::view_mut([n], &mut out).unwrap(),
            op,
        )
        .unwrap();
        assert_eq!(
            out,
            g.all_reduce(&owned, op)
                .unwrap()
                .as_slice::<half::bf16>()
                .unwrap()
        );
    }
}
