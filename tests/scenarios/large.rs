//! Buffers past `i32::MAX` elements and objects past 2 GiB, with the default
//! 1 GiB message limit: MPI's `int` counts would overflow without chunking.

use rankmesh::Collectives as _;
use rankmesh::Objects as _;
use rankmesh::{DType, ReduceOp, Runtime, Tensor};

const N: usize = i32::MAX as usize + 3;

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let me = g.rank_in_group();

    let mut t = if me == 0 {
        Tensor::from_vec([N], (0..N).map(pattern).collect::<Vec<u8>>()).unwrap()
    } else {
        Tensor::zeros([N], DType::U8).unwrap()
    };
    g.broadcast(&mut t, 0).unwrap();
    let v = t.as_slice::<u8>().unwrap();
    assert!(
        v.iter().enumerate().all(|(i, x)| *x == pattern(i)),
        "broadcast of {N} bytes"
    );

    let sum = g.all_reduce(&t, ReduceOp::Sum).unwrap();
    drop(t);
    let p = g.size();
    let s = sum.as_slice::<u8>().unwrap();
    let bad = s
        .iter()
        .enumerate()
        .position(|(i, x)| *x != pattern(i).wrapping_mul(p as u8));
    assert_eq!(
        bad,
        None,
        "all_reduce of {N} u8: first wrong element (value {:?})",
        bad.map(|b| s[b])
    );
    drop(sum);

    let obj = (me == 1).then(|| (0..N).map(|i| pattern(i + 1)).collect::<Vec<u8>>());
    let got: Vec<u8> = g.broadcast_object(obj.as_ref(), 1).unwrap();
    drop(obj);
    assert_eq!(got.len(), N);
    assert!(
        got.iter().enumerate().all(|(i, x)| *x == pattern(i + 1)),
        "object of {N} bytes"
    );
}
