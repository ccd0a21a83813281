//! The adjoint identity <A x, y> = <x, Aᵀ y>, with inner products summed over
//! all ranks, for every differentiable collective.

use rankmesh::Collectives as _;
use rankmesh::{parallel::Differentiable, DType, GroupCoordinator, ReduceOp, Runtime, Tensor};

fn dot(g: &GroupCoordinator<'_>, a: &Tensor, b: &Tensor) -> f64 {
    let local: f64 = a
        .to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| x * y)
        .sum();
    let t = Tensor::from_vec([1], vec![local]).unwrap();
    g.all_reduce(&t, ReduceOp::Sum)
        .unwrap()
        .as_slice::<f64>()
        .unwrap()[0]
}

fn pseudo_random(seed: usize, shape: &[usize]) -> Tensor {
    Tensor::from_fn(shape.to_vec(), DType::F64, |i| {
        let z = (seed * 7919 + i * 104_729) as f64;
        (z.sin() * 1000.0).fract()
    })
    .unwrap()
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let cases: Vec<(Differentiable, Vec<usize>)> = vec![
        (Differentiable::AllReduceSum, vec![3, 4]),
        (Differentiable::AllGather { dim: 1 }, vec![2, 3, 2]),
        (Differentiable::AllGather { dim: -1 }, vec![2, 3]),
        (Differentiable::ReduceScatterSum { dim: 0 }, vec![2 * p, 3]),
        (
            Differentiable::AllToAll4d {
                scatter_dim: 2,
                gather_dim: 1,
            },
            vec![2, 3, 2 * p, 2],
        ),
        (
            Differentiable::AllToAll4d {
                scatter_dim: 1,
                gather_dim: 2,
            },
            vec![2, 3 * p, 2, 2],
        ),
    ];
    for (op, shape) in cases {
        let x = pseudo_random(me, &shape);
        let ax = op.forward(&g, &x).unwrap();
        let y = pseudo_random(me + 100, ax.shape());
        let aty = op.backward(&g, &y).unwrap();
        assert_eq!(aty.shape(), x.shape(), "{op:?}: gradient shape");
        let (lhs, rhs) = (dot(&g, &ax, &y), dot(&g, &x, &aty));
        assert!(
            (lhs - rhs).abs() <= 1e-9 * lhs.abs().max(1.0),
            "{op:?} np{p}: <Ax,y> = {lhs} but <x,A^T y> = {rhs}"
        );
        assert_eq!(op.adjoint().adjoint(), op);
    }
}
