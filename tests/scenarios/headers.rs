//! Calls small enough that the shared-memory executor carries their data
//! in the step header (up to 104 bytes per rank, 40 of them on the
//! counter's cache line): sizes on each side of both boundaries, random
//! non-integer f32 values, bit-exact against a serial reference (sums in
//! rank order), for every collective that publishes data.

use super::reference::{assert_bits, assert_replicated_ops, random_f32, rank_order_sum};
use rankmesh::Collectives as _;
use rankmesh::{ReduceOp, Runtime, Tensor};

/// Bytes per rank each call publishes: on both sides of 40 and 104.
const BYTES: [usize; 7] = [4, 36, 40, 44, 64, 104, 108];

/// `n` values of rank `rank` for call `call`.
fn values(rank: usize, call: usize, n: usize) -> Vec<f32> {
    let seed = (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ (call as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
    random_f32(seed, n)
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    for (call, bytes) in BYTES.into_iter().enumerate() {
        let n = bytes / 4;
        let all: Vec<Vec<f32>> = (0..p).map(|r| values(r, call, n)).collect();
        assert_replicated_ops(&g, &all, 0..p);

        // `bytes` per rank in all: one block of `n / p` rows (of p values)
        // per destination, at least one.
        let rows = (n / (p * p)).max(1);
        let m = rows * p * p;
        let blocks: Vec<Vec<f32>> = (0..p).map(|r| values(r, call + 100, m)).collect();
        let t = Tensor::from_vec([rows * p, p], blocks[me].clone()).unwrap();
        let block = m / p;
        let swapped = g.all_to_all(&t).unwrap();
        let want: Vec<f32> = (0..p)
            .flat_map(|s| blocks[s][me * block..(me + 1) * block].to_vec())
            .collect();
        assert_bits(&swapped, &want, &format!("all_to_all of {m} f32"));

        let reduced = g.reduce_scatter(&t, 0, ReduceOp::Sum).unwrap();
        let want = rank_order_sum(&blocks, me * block..(me + 1) * block);
        assert_bits(&reduced, &want, &format!("reduce_scatter of {m} f32"));
    }
}
