//! Calls small enough that the shared-memory executor carries their data
//! in the step header (up to 104 bytes per rank, 40 of them on the
//! counter's cache line): sizes on each side of both boundaries, random
//! non-integer f32 values, bit-exact against a serial reference (sums in
//! rank order), for every collective that publishes data.

use super::reference::{first_difference, random_f32, rank_order_sum};
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
        let mine = Tensor::from_vec([n], all[me].clone()).unwrap();

        let sum = g.all_reduce(&mine, ReduceOp::Sum).unwrap();
        let want = rank_order_sum(&all, 0..n);
        let got = sum.as_slice::<f32>().unwrap();
        assert_eq!(
            first_difference(got, &want),
            None,
            "all_reduce of {n} f32 on {p} ranks"
        );

        let gathered = g.all_gather(&mine, 0).unwrap();
        let got = gathered.as_slice::<f32>().unwrap();
        assert_eq!(
            first_difference(got, &all.concat()),
            None,
            "all_gather of {n} f32"
        );

        for (root, sent) in all.iter().enumerate() {
            let mut t = if me == root {
                mine.clone()
            } else {
                Tensor::from_vec([n], vec![0f32; n]).unwrap()
            };
            g.broadcast(&mut t, root).unwrap();
            let got = t.as_slice::<f32>().unwrap();
            assert_eq!(
                first_difference(got, sent),
                None,
                "broadcast of {n} f32 from {root}"
            );
        }

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
        let got = swapped.as_slice::<f32>().unwrap();
        assert_eq!(first_difference(got, &want), None, "all_to_all of {m} f32");

        let reduced = g.reduce_scatter(&t, 0, ReduceOp::Sum).unwrap();
        let want = rank_order_sum(&blocks, me * block..(me + 1) * block);
        let got = reduced.as_slice::<f32>().unwrap();
        assert_eq!(
            first_difference(got, &want),
            None,
            "reduce_scatter of {m} f32"
        );
    }
}
