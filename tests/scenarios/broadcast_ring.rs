//! Broadcasts streamed through the shared-memory executor's ring (pieces of
//! 256 KiB, 2 MiB in the ring at the default area size): sizes just over
//! one data area, of the ring exactly, and of several laps; the same
//! root twice in a row (its second call writes the ring while the first
//! call's readers may still be reading it), roots in turn, and calls that
//! publish only in their step headers between them. Random non-integer f32
//! values, compared bit for bit.

use super::reference::{assert_bits, random_f32};
use rankmesh::Collectives as _;
use rankmesh::{ReduceOp, Runtime, Tensor};

/// Element counts: just over a data area (five pieces), the ring exactly,
/// 2.5 laps plus an odd tail.
const SIZES: [usize; 3] = [(256 << 10) / 4 + 3, (2 << 20) / 4, (5 << 20) / 4 + 7];

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let (p, me) = (g.size(), g.rank_in_group());
    let roots = (0..p).flat_map(|r| [r, r]);
    for (call, root) in roots.enumerate() {
        for n in SIZES {
            let want = random_f32((call * 31 + n) as u64, n);
            let mut t = match me == root {
                true => Tensor::from_vec([n], want.clone()).unwrap(),
                false => Tensor::from_vec([n], vec![0f32; n]).unwrap(),
            };
            g.broadcast(&mut t, root).unwrap();
            assert_bits(
                &t,
                &want,
                &format!("broadcast {call} of {n} f32 from {root}"),
            );
            if call % 2 == 1 {
                // A call whose data ride in the step headers.
                let one = Tensor::from_vec([1], vec![1f32]).unwrap();
                let sum = g.all_reduce(&one, ReduceOp::Sum).unwrap();
                assert_bits(
                    &sum,
                    &[p as f32],
                    "all_reduce of one f32 between broadcasts",
                );
            }
        }
    }
}
