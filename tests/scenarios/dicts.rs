//! Tensor dictionaries: broadcast, send/recv, and send-then-all-gather.

use super::reference::{input, values};
use rankmesh::object::TensorDicts as _;
use rankmesh::Collectives as _;
use rankmesh::{
    object::DictValue, object::TensorDict, DType, ParallelState, ReduceOp, Runtime, Tensor,
};
use serde_json::json;

/// A value of a user type (not JSON) with floats that JSON would round.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Sampling {
    guidance: f32,
    steps: u64,
    weights: Vec<f64>,
}

/// Keys are deliberately not sorted: dictionaries keep insertion order.
fn dict_of(rank: usize) -> TensorDict {
    let mut d = TensorDict::new();
    d.insert(
        "sampling".into(),
        DictValue::object(&Sampling {
            guidance: 7.3 + rank as f32,
            steps: u64::MAX - rank as u64,
            weights: vec![0.1, 1.0 / 3.0, f64::MIN_POSITIVE],
        })
        .unwrap(),
    );
    d.insert(
        "mask".into(),
        DictValue::Host(input(rank, &[5], DType::U8, ReduceOp::Max)),
    );
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

/// Equal entries in the same order (`IndexMap`'s `==` ignores order).
fn assert_same(got: &TensorDict, want: &TensorDict) {
    assert_eq!(got, want);
    assert!(got.keys().eq(want.keys()), "key order: {:?}", got.keys());
}

pub fn run(rt: &Runtime) {
    let (w, me) = (rt.size(), rt.rank());
    let mut ps = ParallelState::new(rt).unwrap();
    let world = ps.world().clone();
    for src in 0..w {
        let mine = (me == src).then(|| dict_of(src));
        assert_same(
            &world.broadcast_tensor_dict(mine.as_ref(), src).unwrap(),
            &dict_of(src),
        );
    }
    let got = world.broadcast_tensor_dict(Some(&dict_of(0)), 0).unwrap();
    let DictValue::Object(sampling) = &got["sampling"] else {
        panic!("sampling is not an object")
    };
    assert_eq!(sampling.get::<Sampling>().unwrap().steps, u64::MAX);
    let wrong = sampling.get::<Vec<f64>>().unwrap_err().to_string();
    assert!(wrong.contains("not `alloc::vec::Vec<f64>`"), "{wrong}");

    // A group of one has no peer: nothing is sent and nothing received
    // (FastVideo returns the dict / None); a bad rank is still an error.
    let solo = rt.subgroup("solo", &[me]).unwrap();
    solo.send_tensor_dict(&dict_of(me), None, None).unwrap();
    solo.send_tensor_dict(&dict_of(me), Some(0), None).unwrap();
    assert_eq!(solo.recv_tensor_dict(None, None).unwrap(), None);
    let bad = solo
        .recv_tensor_dict(Some(1), None)
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("src 1 is not a rank of this group of size 1"),
        "{bad}"
    );

    // Pipeline between the two halves: rank r sends to r + w/2 in the world group.
    let half = w / 2;
    if me < half {
        world
            .send_tensor_dict(&dict_of(me), Some(me + half), None)
            .unwrap();
    } else {
        let got = world.recv_tensor_dict(Some(me - half), None).unwrap();
        assert_same(&got.unwrap(), &dict_of(me - half));
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
        let got = got.unwrap();
        assert_same(&got, &dict_of(sender_tp_rank0));
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
