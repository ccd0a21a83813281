//! Parallel groups: membership, names, rank helpers, collectives inside
//! sub-groups, per-model groups, overrides, node helpers and teardown.

use super::reference::{assert_tensor, input, reduced};
use rankmesh::Collectives as _;
use rankmesh::{parallel::GroupKind, parallel::Layout, DType, ParallelState, ReduceOp, Runtime};

pub fn run(rt: &Runtime) {
    let (w, me) = (rt.size(), rt.rank());
    let mut ps = ParallelState::new(rt).unwrap();
    assert!(!ps.model_parallel_is_initialized());
    assert!(ps.tp().unwrap_err().to_string().contains("not initialised"));
    let divisors: Vec<usize> = (1..=w).filter(|d| w % d == 0).collect();
    for &t in &divisors {
        for &s in &divisors {
            ps.initialize_model_parallel(t, s, Some(w / s)).unwrap();
            let layout = Layout::new(w, t, s, None).unwrap();
            for (kind, g) in [
                (GroupKind::Tp, ps.tp().unwrap()),
                (GroupKind::Sp, ps.sp().unwrap()),
                (GroupKind::Dp, ps.dp().unwrap()),
            ] {
                let want = layout.group_of(kind, me);
                let pos = want.iter().position(|r| *r == me).unwrap();
                assert_eq!(g.ranks(), want.as_slice(), "{kind:?} t{t} s{s}");
                assert_eq!(
                    g.name(),
                    format!("{}:{}", kind.name(), layout.group_index(kind, me))
                );
                assert_eq!(g.rank_in_group(), pos);
                assert_eq!(g.size(), want.len());
                assert_eq!(g.global_rank(), me);
                assert_eq!(g.first_rank(), want[0]);
                assert_eq!(g.last_rank(), *want.last().unwrap());
                assert_eq!(g.is_first_rank(), pos == 0);
                assert_eq!(g.is_last_rank(), pos + 1 == want.len());
                assert_eq!(g.next_rank(), want[(pos + 1) % want.len()]);
                assert_eq!(g.prev_rank(), want[(pos + want.len() - 1) % want.len()]);
                // Sum of world ranks over the group.
                let x = rankmesh::Tensor::from_vec([1], vec![me as i64]).unwrap();
                let sum = g.all_reduce(&x, ReduceOp::Sum).unwrap();
                assert_eq!(
                    sum.as_slice::<i64>().unwrap(),
                    &[want.iter().sum::<usize>() as i64]
                );
                // All ranks run on one node here.
                assert_eq!(g.is_the_same_node_as(0).unwrap(), vec![true; want.len()]);
                assert_eq!(
                    g.same_node_ranks(want.len() - 1).unwrap(),
                    (0..want.len()).collect::<Vec<_>>()
                );
                g.barrier().unwrap();
            }
            assert_eq!(ps.tp_world_size().unwrap(), t);
            assert_eq!(ps.sp_world_size().unwrap(), s);
            assert_eq!(ps.dp_world_size().unwrap(), w / s);
            assert_eq!(ps.tp_rank().unwrap(), me % t);
            assert_eq!(ps.sp_rank().unwrap(), me % s);
            assert_eq!(ps.dp_rank().unwrap(), me / s);
            let again = ps
                .initialize_model_parallel(t, s, None)
                .unwrap_err()
                .to_string();
            assert!(again.contains("already initialised"), "{again}");
            ps.destroy_model_parallel();
            assert!(!ps.model_parallel_is_initialized());
        }
    }

    // Per-model groups and scoped overrides (FastVideo's patch_*_parallel_group).
    ps.initialize_model_parallel(1, 1, None).unwrap();
    let model_tp = ps.new_tensor_parallel_group(w, "model1").unwrap();
    assert_eq!(model_tp.name(), "tp_model1:0");
    let model_sp = ps.new_sequence_parallel_group(1, "model2").unwrap();
    assert_eq!(model_sp.name(), format!("sp_model2:{me}"));
    let inside = ps
        .with_tp_group(&model_tp, || {
            let tp = ps.tp().unwrap();
            let x = super::reference::input(me, &[4], DType::F32, ReduceOp::Sum);
            let got = tp.all_reduce(&x, ReduceOp::Sum).unwrap();
            assert_tensor(
                &got,
                DType::F32,
                &[4],
                &reduced(w, 4, DType::F32, ReduceOp::Sum),
                "override",
            );
            // FastVideo's module-level helpers follow the override too.
            assert_eq!(ps.tensor_model_parallel_all_reduce(&x).unwrap(), got);
            let wide = super::reference::input(me, &[2, 3], DType::BF16, ReduceOp::Sum);
            assert_eq!(
                ps.tensor_model_parallel_all_gather(&wide, -1).unwrap(),
                tp.all_gather(&wide, -1).unwrap()
            );
            assert_eq!(
                ps.tensor_model_parallel_all_gather(&wide, -1)
                    .unwrap()
                    .shape(),
                [2, 3 * w]
            );
            let nested = ps.with_tp_group(&model_tp, || ()).unwrap_err().to_string();
            assert!(
                nested.contains("already overridden by tp_model1:0"),
                "{nested}"
            );
            ps.tp_world_size().unwrap()
        })
        .unwrap();
    assert_eq!(inside, w);
    assert_eq!(ps.tp_world_size().unwrap(), 1, "override restored");
    let sp_inside = ps
        .with_sp_group(&model_sp, || ps.sp().unwrap().name().to_string())
        .unwrap();
    let sp_all = ps.new_sequence_parallel_group(w, "all").unwrap();
    ps.with_sp_group(&sp_all, || {
        let q = super::reference::input(me, &[1, 2, 2 * w, 3], DType::F32, ReduceOp::Sum);
        assert_eq!(
            ps.sequence_model_parallel_all_to_all_4d(&q, 2, 1).unwrap(),
            sp_all.all_to_all_4d(&q, 2, 1).unwrap()
        );
        assert_eq!(
            ps.sequence_model_parallel_all_to_all_4d(&q, 2, 1)
                .unwrap()
                .shape(),
            [1, 2 * w, 2, 3]
        );
        assert_eq!(
            ps.sequence_model_parallel_all_gather(&q, 1).unwrap(),
            sp_all.all_gather(&q, 1).unwrap()
        );
    })
    .unwrap();
    assert_eq!(sp_inside, format!("sp_model2:{me}"));
    assert_eq!(ps.sp().unwrap().name(), format!("sp:{me}"));
    let _ = input;
}
