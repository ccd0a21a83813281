//! Bad input: every rank of the group gets an `Err` naming what is wrong, and
//! the group stays usable afterwards (checked by a final correct collective).

use rankmesh::Collectives as _;
use rankmesh::Objects as _;
use rankmesh::{DType, ParallelState, ReduceOp, Runtime, Tensor};
use serde::{Deserialize, Serialize};

#[track_caller]
fn expect_err<T: std::fmt::Debug>(r: rankmesh::Result<T>, needles: &[&str]) {
    let msg = match r {
        Ok(v) => panic!("expected an error containing {needles:?}, got Ok({v:?})"),
        Err(e) => e.to_string(),
    };
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not contain {n:?}");
    }
    println!("ERR-OK {msg}");
}

/// Deserialisation accepts only values up to 100; the sender can still build
/// a bigger one, so the receiver sees a well-formed but invalid message.
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
#[serde(try_from = "u32", into = "u32")]
struct Percent(u32);

impl TryFrom<u32> for Percent {
    type Error = String;
    fn try_from(v: u32) -> Result<Self, String> {
        if v <= 100 {
            Ok(Percent(v))
        } else {
            Err(format!("{v} is not a percentage"))
        }
    }
}

impl From<Percent> for u32 {
    fn from(p: Percent) -> u32 {
        p.0
    }
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let x = Tensor::from_vec([2, 3, 4], vec![1f32; 24]).unwrap();

    // Arguments wrong on every rank: InvalidArgument, naming the Op.
    match g.all_gather(&x, 3) {
        Err(rankmesh::Error::InvalidArgument { op, group, .. }) => {
            assert_eq!((op, group.as_str()), (rankmesh::op::Op::AllGather, "world"))
        }
        other => panic!("a bad dim is an InvalidArgument: {other:?}"),
    }
    expect_err(
        g.all_gather(&x, 3),
        &["all_gather on world: dim 3 out of range for a 3-d tensor"],
    );
    expect_err(g.all_gather(&x, -4), &["dim -4 out of range"]);
    expect_err(
        g.gather(&x, p, 0),
        &[&format!(
            "gather on world: dst {p} is not a rank of this group of size {p}"
        )],
    );
    expect_err(
        g.broadcast(&mut x.clone(), p + 3),
        &["broadcast on world: src"],
    );
    expect_err(
        g.all_to_all_4d(&x, 2, 1),
        &["expects a 4-d tensor, got shape [2, 3, 4]"],
    );
    let x4 = Tensor::zeros([1, 2, 4 * p + 1, 2], DType::F16).unwrap();
    expect_err(g.all_to_all_4d(&x4, 0, 3), &["(0, 3) is not supported"]);
    if p > 1 {
        expect_err(
            g.all_to_all_4d(&x4, 2, 1),
            &["not divisible by the group size"],
        );
        let odd = Tensor::zeros([p * 2 + 1], DType::I32).unwrap();
        expect_err(
            g.reduce_scatter(&odd, 0, ReduceOp::Sum),
            &["reduce_scatter on world: dim 0 of size", "not divisible"],
        );
    }
    expect_err(
        g.broadcast_object::<String>(None, 0),
        &["no object given on the source rank"],
    );
    expect_err(g.is_the_same_node_as(p), &["src"]);

    // Arguments that differ between ranks: everyone learns who passed what.
    if p > 1 {
        let mine = if me == p - 1 {
            Tensor::zeros([2, 5], DType::F32).unwrap()
        } else {
            Tensor::zeros([2, 4], DType::F32).unwrap()
        };
        expect_err(
            g.all_reduce(&mine, ReduceOp::Sum),
            &[
                "ranks disagree",
                "group rank 0 passed all_reduce(shape [2, 4] f32, op sum)",
                &format!(
                    "group rank {} passed all_reduce(shape [2, 5] f32, op sum)",
                    p - 1
                ),
            ],
        );
        let dt = if me == 0 { DType::BF16 } else { DType::F16 };
        expect_err(
            g.all_gather(&Tensor::zeros([3], dt).unwrap(), 0),
            &["ranks disagree", "bf16", "f16"],
        );
        let op = if me == 0 {
            ReduceOp::Max
        } else {
            ReduceOp::Min
        };
        expect_err(
            g.all_reduce(&Tensor::zeros([3], DType::I8).unwrap(), op),
            &["op max", "op min"],
        );
        // Different calls: rank 0 is at a barrier while the others all-reduce.
        let r = if me == 0 {
            g.barrier()
        } else {
            g.all_reduce(&x, ReduceOp::Sum).map(|_| ())
        };
        assert!(
            matches!(&r, Err(rankmesh::Error::Mismatch { .. })),
            "different calls are a Mismatch: {r:?}"
        );
        expect_err(
            r,
            &["ranks are in different calls", "barrier()", "all_reduce("],
        );
        // Different object types.
        let r = if me == 0 {
            g.broadcast_object(Some(&"text".to_string()), 0).map(|_| ())
        } else {
            g.broadcast_object::<u64>(None, 0).map(|_| ())
        };
        expect_err(r, &["broadcast_object on world", "types differ"]);
        // A message that is well formed on the wire but invalid for the type.
        let bad = (me == 0).then_some(Percent(250));
        expect_err(
            g.broadcast_object(bad.as_ref(), 0),
            &[
                "broadcast_object on world: cannot decode `",
                "Percent` sent by group rank 0",
            ],
        );

        // Point-to-point: a shape mismatch fails on both sides.
        if me == 0 {
            expect_err(g.send(&Tensor::zeros([4], DType::F32).unwrap(), Some(1)), &["group rank 0 sends send/recv(shape [4] f32) but group rank 1 expects send/recv(shape [3] f32)"]);
        } else if me == 1 {
            expect_err(
                g.recv(&[3], DType::F32, Some(0)),
                &["group rank 0 sends send/recv(shape [4] f32) but group rank 1 expects"],
            );
        }
        if me == 0 {
            expect_err(g.send_object(&1u8, 1), &["types differ"]);
        } else if me == 1 {
            expect_err(g.recv_object::<String>(0), &["types differ", "String"]);
        }
    }
    // A call repeated (its checks remembered per group) and then changed on
    // one rank only: every rank still gets the error, and the repeat works
    // again afterwards, with the right values.
    if p > 1 {
        let last = p - 1;
        let mut t = Tensor::from_vec([3], vec![0.5f32 + me as f32; 3]).unwrap();
        for _ in 0..3 {
            g.broadcast(&mut t, last).unwrap();
        }
        let src = if me == 0 { p } else { last };
        expect_err(g.broadcast(&mut t, src), &["broadcast on world"]);
        let mut wider = Tensor::zeros([if me == 0 { 4 } else { 3 }], DType::F32).unwrap();
        expect_err(
            g.broadcast(&mut wider, last),
            &["ranks disagree", "shape [4] f32", "shape [3] f32"],
        );
        let mut out = Tensor::zeros([if me == last { 4 } else { 3 }], DType::F32).unwrap();
        let x = Tensor::from_vec([3], vec![0.25f32; 3]).unwrap();
        let mut fits = Tensor::zeros([3], DType::F32).unwrap();
        for _ in 0..2 {
            g.all_reduce_into(&x, &mut fits, ReduceOp::Sum).unwrap();
        }
        expect_err(
            g.all_reduce_into(&x, &mut out, ReduceOp::Sum),
            &[&format!("group rank {last} passed an output tensor")],
        );
        let mut t = Tensor::from_vec([3], vec![0.5f32 + me as f32; 3]).unwrap();
        g.broadcast(&mut t, last).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[0.5 + last as f32; 3]);
    }
    // A rank that refuses its own call (a binding's check) calls in with a
    // stand-in: the others' call, whatever it is, fails naming it, and the
    // group goes on.
    let last = p - 1;
    let x3 = Tensor::from_vec([3], vec![0.25f32; 3]).unwrap();
    let mut sum = x3.clone();
    if me == last {
        expect_err(
            g.refuse_here(),
            &[&format!("group rank {last} refused call #")],
        );
    } else {
        expect_err(
            g.all_reduce_in_place(&mut sum, ReduceOp::Sum),
            &[
                &format!("all_reduce on world: group rank {last} refused call #"),
                "on its own arguments",
            ],
        );
    }
    g.all_reduce_in_place(&mut sum, ReduceOp::Sum).unwrap();
    assert_eq!(sum.as_slice::<f32>().unwrap(), &[0.25 * p as f32; 3]);
    // A wrong output buffer on one rank fails every rank, naming that rank.
    let input = Tensor::zeros([4], DType::F32).unwrap();
    let mut out = if me == 0 {
        Tensor::zeros([5], DType::F32).unwrap()
    } else {
        Tensor::zeros([4], DType::F32).unwrap()
    };
    expect_err(
        g.all_reduce_into(&input, &mut out, ReduceOp::Sum),
        &["all_reduce on world: group rank 0 passed an output tensor of the wrong shape or dtype"],
    );
    if me == 0 {
        expect_err(
            g.all_reduce_into(&input, &mut out, ReduceOp::Sum),
            &["this rank: output is [5] f32, expected [4] f32"],
        );
    } else {
        expect_err(
            g.all_reduce_into(&input, &mut out, ReduceOp::Sum),
            &["group rank 0 passed an output tensor"],
        );
    }
    // The new `_into` forms check their outputs by the same rules.
    let big = Tensor::zeros([2 * p, 3], DType::F32).unwrap();
    expect_err(
        g.scatter(&big, p, 0),
        &[&format!(
            "scatter on world: src {p} is not a rank of this group of size {p}"
        )],
    );
    // (With one rank these outputs are the right shape.)
    if p > 1 {
        let mut bad = Tensor::zeros([2 * p, 3], DType::F32).unwrap();
        expect_err(
            g.scatter_into(&big, &mut bad, 0, 0),
            &[
                "scatter on world: group rank 0 passed an output tensor of the wrong shape",
                &format!(
                    "this rank: output is [{}, 3] f32, expected [2, 3] f32",
                    2 * p
                ),
            ],
        );
        let x4 = Tensor::zeros([1, 2, 2 * p, 2], DType::BF16).unwrap();
        let mut bad4 = Tensor::zeros([1, 2, 2 * p, 2], DType::BF16).unwrap();
        expect_err(
            g.all_to_all_4d_into(&x4, &mut bad4, 2, 1),
            &[
                "all_to_all_4d on world: group rank 0 passed an output tensor",
                &format!("expected [1, {}, 2, 2] bf16", 2 * p),
            ],
        );
    }
    let mut wrong_dtype = Tensor::zeros([4 * p], DType::F64).unwrap();
    expect_err(
        g.all_gather_into(&input, &mut wrong_dtype, 0),
        &[
            "output tensor of the wrong shape or dtype",
            "expected [",
            "f32",
        ],
    );
    expect_err(
        g.reduce(&input, p, ReduceOp::Sum),
        &["reduce on world: dst"],
    );
    if p > 1 {
        expect_err(
            g.all_to_all(&Tensor::zeros([p + 1], DType::U8).unwrap()),
            &["all_to_all on world: dim 0 of size"],
        );
        // A ring where one link disagrees: both ends of that link fail, the others succeed.
        let send = Tensor::zeros([if me == 0 { 3 } else { 2 }], DType::I32).unwrap();
        let mut recv = Tensor::zeros([2], DType::I32).unwrap();
        let r = g.send_recv_into(&send, &mut recv, None, None);
        if me == 0 || me == 1 % p {
            expect_err(r, &["send_recv on world: group rank 0 sends send/recv(shape [3] i32) but group rank 1 expects send/recv(shape [2] i32)"]);
        } else {
            r.unwrap();
        }
    }
    expect_err(g.send(&x, Some(me)), &["dst", "is this rank itself"]);
    expect_err(g.recv(&[1], DType::U8, Some(p)), &["src", "is not a rank"]);

    // Invalid layouts fail on every rank before any communicator is made.
    let mut ps = ParallelState::new(rt).unwrap();
    expect_err(
        ps.initialize_model_parallel(0, 1, None),
        &["tensor-parallel size must be at least 1"],
    );
    expect_err(
        ps.initialize_model_parallel(p + 1, 1, None),
        &[&format!(
            "world size {p} is not divisible by tensor-parallel size {}",
            p + 1
        )],
    );
    expect_err(
        ps.initialize_model_parallel(1, p + 1, None),
        &["sequence-parallel size"],
    );
    expect_err(
        ps.initialize_model_parallel(1, 1, Some(p + 1)),
        &["data-parallel size"],
    );
    expect_err(
        ps.new_tensor_parallel_group(p + 1, "m"),
        &["tensor-parallel size"],
    );
    expect_err(
        rt.split_groups("bad", &[vec![0], vec![0]]),
        &["rank 0 appears in group lists 0 and 1"],
    );
    assert!(!ps.model_parallel_is_initialized());

    // The group still works after all of that.
    let ones = Tensor::from_vec([2], vec![1i32, 2]).unwrap();
    let sum = g.all_reduce(&ones, ReduceOp::Sum).unwrap();
    assert_eq!(sum.as_slice::<i32>().unwrap(), &[p as i32, 2 * p as i32]);
}
