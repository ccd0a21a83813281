//! Several (fake) nodes: node identity, locality helpers, groups that span
//! nodes, and collectives and tensor gathering across them. The expected
//! layout comes from the launcher spec in RANKMESH_TEST_NODES ("2,3": two
//! ranks on the first node, three on the second; Open MPI fills by slot).

use super::reference::{assert_tensor, concat, input, reduced, values};
use rankmesh::Collectives as _;
use rankmesh::{helpers::MainRank as _, Gathers as _};
use rankmesh::{DType, ParallelState, ReduceOp, Runtime};

pub fn run(rt: &Runtime) {
    let spec: Vec<usize> = std::env::var("RANKMESH_TEST_NODES")
        .expect("launched by the fake-node driver")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let node_of: Vec<usize> = spec
        .iter()
        .enumerate()
        .flat_map(|(node, n)| vec![node; *n])
        .collect();
    let (w, me) = (rt.size(), rt.rank());
    assert_eq!(w, node_of.len());
    let world = rt.world();
    assert_eq!(world.node_count, spec.len(), "node count");
    for (r, info) in world.ranks.iter().enumerate() {
        let first_on_node = node_of.iter().position(|n| *n == node_of[r]).unwrap();
        assert_eq!(info.node, node_of[r], "node of rank {r}");
        assert_eq!(info.local_rank, r - first_on_node, "local rank of rank {r}");
        assert_eq!(info.local_size, spec[node_of[r]], "local size of rank {r}");
        assert_eq!(
            info.host,
            format!("rankmesh-node{}", node_of[r]),
            "host of rank {r}"
        );
    }

    // Locality helpers on the world and on a group that spans nodes.
    let g = rt.world_group().unwrap();
    for src in 0..w {
        let want: Vec<bool> = (0..w).map(|r| node_of[r] == node_of[src]).collect();
        assert_eq!(g.is_the_same_node_as(src).unwrap(), want);
        let positions: Vec<usize> = (0..w).filter(|r| want[*r]).collect();
        assert_eq!(g.same_node_ranks(src).unwrap(), positions);
    }
    let mut ps = ParallelState::new(rt).unwrap();
    ps.initialize_model_parallel(1, 1, None).unwrap();
    let dp = ps.dp().unwrap(); // every rank: spans all nodes
    assert_eq!(dp.ranks(), (0..w).collect::<Vec<_>>().as_slice());
    let sub = rt.subgroup("span", &[w - 1, 0]).ok();
    if let Some(sub) = &sub {
        let want = vec![true, node_of[w - 1] == node_of[0]];
        assert_eq!(sub.is_the_same_node_as(0).unwrap(), want);
    }

    // Collectives across nodes against the serial reference.
    for dtype in [DType::F32, DType::BF16, DType::I64, DType::U8] {
        for op in ReduceOp::ALL {
            let x = input(me, &[3, 4], dtype, op);
            let got = dp.all_reduce(&x, op).unwrap();
            assert_tensor(
                &got,
                dtype,
                &[3, 4],
                &reduced(w, 12, dtype, op),
                &format!("all_reduce {op:?} {dtype}"),
            );
        }
        let x = input(me, &[2, 3], dtype, ReduceOp::Sum);
        let parts: Vec<Vec<f64>> = (0..w).map(|r| values(r, 6, dtype, ReduceOp::Sum)).collect();
        let (shape, want) = concat(&parts, &[2, 3], 1);
        assert_tensor(
            &dp.all_gather(&x, -1).unwrap(),
            dtype,
            &shape,
            &want,
            "all_gather across nodes",
        );
        // Tensor gathering: same-node ranks through shared memory, others through MPI.
        let order: Vec<usize> = (0..w).rev().collect();
        let got = g
            .gather_tensors(&x, rankmesh::object::Ranks::Group(&order))
            .unwrap();
        if me == order[0] {
            for (t, r) in got.unwrap().iter().zip(&order) {
                assert_tensor(
                    t,
                    dtype,
                    &[2, 3],
                    &values(*r, 6, dtype, ReduceOp::Sum),
                    "gather_tensors across nodes",
                );
            }
        }
    }
    let sum = g
        .main_first(|| Ok::<_, String>(rt.world().me().node))
        .unwrap();
    assert_eq!(sum, node_of[me]);
}
