//! Calls large enough that the shared-memory executor writes their outputs
//! with streaming stores (8 MiB and up): random non-integer f32 values and
//! an odd element count, so shares and tails fall off every alignment, and
//! bit-exact comparison with a serial f32 reference summed in rank order.

use super::reference::{first_difference, random_f32, rank_order_sum};
use rankmesh::Collectives as _;
use rankmesh::{ReduceOp, Runtime, Tensor};

/// 9 MiB and 5 elements.
const N: usize = (9 << 20) / 4 + 5;

/// Rank `rank`'s values.
fn values(rank: usize) -> Vec<f32> {
    random_f32((rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03), N)
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let all: Vec<Vec<f32>> = (0..p).map(values).collect();
    let mine = Tensor::from_vec([N], all[me].clone()).unwrap();

    let sum = g.all_reduce(&mine, ReduceOp::Sum).unwrap();
    let want = rank_order_sum(&all, 0..N);
    let got = sum.as_slice::<f32>().unwrap();
    assert_eq!(
        first_difference(got, &want),
        None,
        "all_reduce of {N} f32 on {p} ranks"
    );

    let gathered = g.all_gather(&mine, 0).unwrap();
    let want: Vec<f32> = all.concat();
    let got = gathered.as_slice::<f32>().unwrap();
    assert_eq!(
        first_difference(got, &want),
        None,
        "all_gather of {N} f32 on {p} ranks"
    );

    let root = p - 1;
    let mut t = if me == root {
        mine.clone()
    } else {
        Tensor::from_vec([N], vec![0f32; N]).unwrap()
    };
    g.broadcast(&mut t, root).unwrap();
    let got = t.as_slice::<f32>().unwrap();
    assert_eq!(
        first_difference(got, &all[root]),
        None,
        "broadcast of {N} f32 from {root}"
    );
}
