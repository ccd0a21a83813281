//! Tensor dictionaries: broadcast, send/recv, and send-then-all-gather.

use super::reference::{input, values};
use rankmesh::Collectives as _;
use rankmesh::TensorDicts as _;
use rankmesh::{DType, DictValue, ParallelState, ReduceOp, Runtime, Tensor, TensorDict};
use serde_json::json;

fn dict_of(rank: usize) -> TensorDict {
    let mut d = TensorDict::new();
    d.insert(
        "hidden".into(),
        DictValue::Tensor(input(rank, &[2, 4], DType::BF16, ReduceOp::Sum)),
    );
    d.insert(
        "ids".into(),
        DictValue::Tensor(input(rank, &[6], DType::I64, ReduceOp::Sum)),
    );
    d.insert(
        "odd".into(),
        DictValue::Tensor(input(rank, &[3], DType::F32, ReduceOp::Sum)),
    );
    d.insert(
        "empty".into(),
        DictValue::Tensor(Tensor::zeros([0, 3], DType::F16).unwrap()),
    );
    d.insert(
        "step".into(),
        DictValue::Value(json!({"step": rank, "tags": ["a", null, 1.5]})),
    );
    d
}

pub fn run(rt: &Runtime) {
    let (w, me) = (rt.size(), rt.rank());
    let mut ps = ParallelState::new(rt).unwrap();
    let world = ps.world().clone();
    for src in 0..w {
        let mine = (me == src).then(|| dict_of(src));
        assert_eq!(
            world.broadcast_tensor_dict(mine.as_ref(), src).unwrap(),
            dict_of(src)
        );
    }

    // Pipeline between the two halves: rank r sends to r + w/2 in the world group.
    let half = w / 2;
    if me < half {
        world
            .send_tensor_dict(&dict_of(me), Some(me + half), None)
            .unwrap();
    } else {
        assert_eq!(
            world.recv_tensor_dict(Some(me - half), None).unwrap(),
            dict_of(me - half)
        );
    }

    // Send-then-all-gather: each half is a TP group; a tensor whose size divides
    // by the TP size travels as slices and is reassembled on the receiving side.
    ps.initialize_model_parallel(half, 1, None).unwrap();
    let tp = ps.tp().unwrap();
    let sender_tp_rank0 = 0;
    if me < half {
        world
            .send_tensor_dict(&dict_of(sender_tp_rank0), Some(me + half), Some(&tp))
            .unwrap();
    } else {
        let got = world.recv_tensor_dict(Some(me - half), Some(&tp)).unwrap();
        assert_eq!(got, dict_of(sender_tp_rank0));
        let DictValue::Tensor(ids) = &got["ids"] else {
            panic!("ids is not a tensor")
        };
        assert_eq!(
            ids.to_f64_vec(),
            values(sender_tp_rank0, 6, DType::I64, ReduceOp::Sum)
        );
    }
    world.barrier().unwrap();
}
