//! Calls large enough that the shared-memory executor writes their outputs
//! with streaming stores (8 MiB and up): random non-integer f32 values and
//! an odd element count, so shares and tails fall off every alignment, and
//! bit-exact comparison with a serial f32 reference summed in rank order.

use super::reference::{assert_replicated_ops, random_f32};
use rankmesh::Runtime;

/// 9 MiB and 5 elements.
const N: usize = (9 << 20) / 4 + 5;

/// Rank `rank`'s values.
fn values(rank: usize) -> Vec<f32> {
    random_f32((rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03), N)
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let p = g.size();
    let all: Vec<Vec<f32>> = (0..p).map(values).collect();
    assert_replicated_ops(&g, &all, [p - 1]);
}
