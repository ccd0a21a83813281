//! The node-aware executor where `auto` chooses it: a group spanning
//! (fake) nodes, at sizes past each op's crossover (so every all-reduce
//! here runs several pipelined rounds), against the serial reference —
//! every op that takes the stages, for every dtype class (floats, random
//! and non-integer in f32; integers; bools) — and the executor chosen at a
//! few ops and sizes. Run under `auto` (the default) and under
//! `RANKMESH_HOST_PLANE=hier`, which stages broadcast and barrier too.

use super::reference::{assert_tensor, input, random_f32, reduced, values};
use rankmesh::Collectives as _;
use rankmesh::{op::Op, DType, ReduceOp, Runtime, Tensor};

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let forced = std::env::var("RANKMESH_HOST_PLANE").is_ok_and(|v| v == "hier");

    // The choice, per op and size.
    assert_eq!(g.host_executor(), "hier");
    let staged_below = if forced { "hier" } else { "mpi" };
    for (op, from) in [
        (Op::AllReduce, 256 << 10),
        (Op::Reduce, 1 << 20),
        (Op::ReduceScatter, 64 << 10),
        (Op::AllGather, 32 << 10),
    ] {
        assert_eq!(g.host_executor_for(op, from), "hier", "{op:?} at {from}");
        assert_eq!(
            g.host_executor_for(op, from - 4),
            staged_below,
            "{op:?} below"
        );
        assert_eq!(g.host_executor_for(op, 8), staged_below, "{op:?} at 8 B");
    }
    assert_eq!(g.host_executor_for(Op::Broadcast, 64 << 20), staged_below);
    for op in [Op::AllToAll, Op::Gather, Op::Scatter, Op::AllGatherV] {
        assert_eq!(g.host_executor_for(op, 64 << 20), "mpi", "{op:?}");
    }

    // all_reduce of random non-integer f32 (rounded at every stage: held
    // to a few roundings of the sum of magnitudes).
    let n = 300_007;
    let all: Vec<Vec<f32>> = (0..p).map(|r| random_f32(r as u64 + 11, n)).collect();
    let x = Tensor::from_vec([n], all[me].clone()).unwrap();
    let got = g.all_reduce(&x, ReduceOp::Sum).unwrap();
    let got = got.as_slice::<f32>().unwrap();
    for i in 0..n {
        let want: f64 = all.iter().map(|v| f64::from(v[i])).sum();
        let scale: f64 = all.iter().map(|v| f64::from(v[i]).abs()).sum();
        let err = (f64::from(got[i]) - want).abs();
        assert!(
            err <= 4.0 * f64::from(f32::EPSILON) * scale,
            "all_reduce f32 element {i}: {} against {want}",
            got[i]
        );
    }

    // Every dtype class and operator, exact values (sums of small integers).
    for (dtype, n) in [
        (DType::BF16, 600_011),
        (DType::I32, 300_007),
        (DType::Bool, 1_100_003),
    ] {
        for op in ReduceOp::ALL {
            if dtype == DType::Bool && op == ReduceOp::Avg {
                continue;
            }
            let ctx = format!("{dtype} {op:?} np{p}");
            let x = input(me, &[n], dtype, op);
            let got = g.all_reduce(&x, op).unwrap();
            assert_tensor(
                &got,
                dtype,
                &[n],
                &reduced(p, n, dtype, op),
                &format!("all_reduce {ctx}"),
            );
            for root in [1, p - 1] {
                let got = g.reduce(&x, root, op).unwrap();
                assert_eq!(
                    got.is_some(),
                    me == root,
                    "reduce's result on the root only"
                );
                if let Some(got) = got {
                    assert_tensor(
                        &got,
                        dtype,
                        &[n],
                        &reduced(p, n, dtype, op),
                        &format!("reduce to {root} {ctx}"),
                    );
                }
            }
        }
        let k = 20_011;
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let x = input(me, &[p * k], dtype, op);
            let got = g.reduce_scatter(&x, 0, op).unwrap();
            let want = reduced(p, p * k, dtype, op)[me * k..(me + 1) * k].to_vec();
            assert_tensor(
                &got,
                dtype,
                &[k],
                &want,
                &format!("reduce_scatter {dtype} {op:?} np{p}"),
            );
        }
        let x = input(me, &[k], dtype, ReduceOp::Sum);
        let got = g.all_gather(&x, 0).unwrap();
        let want: Vec<f64> = (0..p)
            .flat_map(|r| values(r, k, dtype, ReduceOp::Sum))
            .collect();
        assert_tensor(
            &got,
            dtype,
            &[p * k],
            &want,
            &format!("all_gather {dtype} np{p}"),
        );
        for root in [1, p - 1] {
            let mut t = input(me, &[n], dtype, ReduceOp::Max);
            g.broadcast(&mut t, root).unwrap();
            let want = values(root, n, dtype, ReduceOp::Max);
            assert_tensor(
                &t,
                dtype,
                &[n],
                &want,
                &format!("broadcast from {root} {dtype} np{p}"),
            );
        }
    }
    g.barrier().unwrap();
}
