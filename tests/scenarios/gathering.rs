//! Config and tensor gathering to the first rank of a list, stateless groups.

use super::reference::{assert_tensor, input, values};
use rankmesh::object::Ranks;
use rankmesh::Collectives as _;
use rankmesh::Gathers as _;
use rankmesh::{DType, ReduceOp, Runtime, StatelessGroup};
use serde_json::json;

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());

    // Lists in several orders, including a proper subset; callers outside a
    // list do not take part.
    let mut lists: Vec<Vec<usize>> = vec![(0..p).collect(), (0..p).rev().collect()];
    if p > 2 {
        lists.push(vec![2, 0]);
    }
    for ranks in &lists {
        if ranks.contains(&me) {
            let cfg = (me % 2 == 0).then(|| json!({"layer": me, "name": format!("l{me}")}));
            let got = g.gather_configs(cfg.as_ref(), Ranks::Group(ranks)).unwrap();
            if me == ranks[0] {
                let got = got.expect("configs on the first rank");
                assert_eq!(got.keys().copied().collect::<Vec<_>>(), {
                    let mut k = ranks.clone();
                    k.sort();
                    k
                });
                for r in ranks {
                    let want = (r % 2 == 0).then(|| json!({"layer": r, "name": format!("l{r}")}));
                    assert_eq!(got[r], want, "config of rank {r}");
                }
            } else {
                assert!(got.is_none());
            }
            for dtype in [DType::F32, DType::BF16, DType::I64] {
                let t = input(me, &[3, 5], dtype, ReduceOp::Sum);
                let got = g.gather_tensors(&t, Ranks::Group(ranks)).unwrap();
                if me == ranks[0] {
                    let got = got.unwrap();
                    assert_eq!(got.len(), ranks.len());
                    for (t, r) in got.iter().zip(ranks) {
                        assert_tensor(
                            t,
                            dtype,
                            &[3, 5],
                            &values(*r, 15, dtype, ReduceOp::Sum),
                            "gather_tensors",
                        );
                    }
                } else {
                    assert!(got.is_none());
                }
            }
        }
        g.barrier().unwrap();
    }

    typed_configs_by_world_rank(rt);

    // Bad lists fail on every caller.
    let err = |r: rankmesh::Result<Option<Vec<rankmesh::Tensor>>>| r.unwrap_err().to_string();
    let t = input(me, &[2], DType::F32, ReduceOp::Sum);
    assert!(err(g.gather_tensors(&t, Ranks::Group(&[]))).contains("the rank list is empty"));
    assert!(err(g.gather_tensors(&t, Ranks::Group(&[me, me])))
        .contains(&format!("rank {me} appears twice")));
    assert!(err(g.gather_tensors(&t, Ranks::Group(&[me, p]))).contains(&format!("rank {p} in")));
    if p > 1 {
        let other = (me + 1) % p;
        assert!(err(g.gather_tensors(&t, Ranks::Group(&[other]))).contains("is not in the list"));
        // Unequal tensors: every caller learns both shapes.
        let shape = if me == p - 1 { vec![3] } else { vec![2] };
        let t = input(me, &shape, DType::F32, ReduceOp::Sum);
        let all: Vec<usize> = (0..p).collect();
        let e = err(g.gather_tensors(&t, Ranks::Group(&all)));
        assert!(
            e.contains("tensors differ") && e.contains("[2] f32") && e.contains("[3] f32"),
            "{e}"
        );
    }
    g.barrier().unwrap();

    // FastVideo's example: A,B form a group, then A,B,C,D another.
    if p == 4 {
        if me < 2 {
            let ab = StatelessGroup::create(rt, &[0, 1]).unwrap();
            assert_eq!((ab.rank(), ab.world_size()), (me, 2));
            if me == 0 {
                ab.send_obj(&"to B".to_string(), 1).unwrap();
                assert_eq!(ab.recv_obj::<String>(1).unwrap(), "to A");
            } else {
                assert_eq!(ab.recv_obj::<String>(0).unwrap(), "to B");
                ab.send_obj(&"to A".to_string(), 0).unwrap();
            }
            assert_eq!(ab.all_gather_obj(&me).unwrap(), vec![0, 1]);
            ab.barrier().unwrap();
        }
        let abcd = StatelessGroup::create(rt, &[3, 1, 0, 2]).unwrap();
        let pos = [2, 1, 3, 0][me];
        assert_eq!(abcd.rank(), pos);
        assert_eq!(
            abcd.broadcast_obj(Some(&format!("from {me}")), 0).unwrap(),
            "from 3"
        );
        assert_eq!(abcd.all_gather_obj(&me).unwrap(), vec![3, 1, 0, 2]);
        // Messages from two senders to one receiver are never confused.
        if pos == 0 {
            let from2: u32 = abcd.recv_obj(2).unwrap();
            let from1: u32 = abcd.recv_obj(1).unwrap();
            assert_eq!((from1, from2), (1, 2));
        } else if pos == 1 || pos == 2 {
            abcd.send_obj(&(pos as u32), 0).unwrap();
        }
        abcd.barrier().unwrap();
    }
    let e = StatelessGroup::create(rt, &[(me + 1) % p.max(2)])
        .err()
        .map(|e| e.to_string());
    if p > 1 {
        assert!(e.unwrap().contains("is not in the list"));
    }
}

/// A layer config that carries weights (ModelOpt's configs do).
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct LayerConfig {
    name: String,
    scale: f32,
    weights: Vec<f32>,
}

fn layer_config(world_rank: usize, layer: usize) -> LayerConfig {
    LayerConfig {
        name: format!("layer{layer}.rank{world_rank}"),
        scale: 1.0 / (world_rank + 3) as f32,
        weights: (0..5)
            .map(|i| (i as f32 - 2.5) / (world_rank + layer + 1) as f32)
            .collect(),
    }
}

/// Typed configs, world-rank lists on a group whose positions differ from
/// world ranks, repeated per layer (one communicator per list, reused).
fn typed_configs_by_world_rank(rt: &Runtime) {
    let (p, me) = (rt.size(), rt.rank());
    let reversed: Vec<usize> = (0..p).rev().collect();
    let g = rt.subgroup("reversed", &reversed).unwrap();
    // World ranks: the odd ones and 0, highest first.
    let mut list: Vec<usize> = (0..p).filter(|r| r % 2 == 1 || *r == 0).collect();
    list.reverse();
    for layer in 0..20 {
        if !list.contains(&me) {
            continue;
        }
        let cfg = (me != 0).then(|| layer_config(me, layer));
        let got = g.gather_configs(cfg.as_ref(), Ranks::World(&list)).unwrap();
        if me == list[0] {
            let got = got.expect("configs on the first rank");
            assert_eq!(got.len(), list.len());
            for r in &list {
                let want = (*r != 0).then(|| layer_config(*r, layer));
                assert_eq!(got[r], want, "config of world rank {r}, layer {layer}");
            }
        } else {
            assert!(got.is_none());
        }
        // Tensors from the same list, by world rank: list order is kept.
        let t = input(me, &[4], DType::F32, ReduceOp::Sum);
        if let Some(all) = g.gather_tensors(&t, Ranks::World(&list)).unwrap() {
            for (t, r) in all.iter().zip(&list) {
                assert_tensor(
                    t,
                    DType::F32,
                    &[4],
                    &values(*r, 4, DType::F32, ReduceOp::Sum),
                    "by world rank",
                );
            }
        }
    }
    // A world rank that is not in the group is named.
    let solo = rt.subgroup("solo", &[me]).unwrap();
    if p > 1 {
        let other = (me + 1) % p;
        let e = solo
            .gather_configs(Some(&1u8), Ranks::World(&[me, other]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("world rank {other} in")) && e.contains("is not a member of solo"),
            "{e}"
        );
    }
    solo.gather_configs(Some(&1u8), Ranks::World(&[me]))
        .unwrap();
    g.barrier().unwrap();
}
