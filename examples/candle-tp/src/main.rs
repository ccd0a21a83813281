//! A tensor-parallel transformer MLP block in candle, under `mpirun`:
//! column-parallel linear, GELU, row-parallel linear, all-reduce (Megatron's
//! split), with rankmesh carrying the all-reduce. Every rank also computes
//! the block unsplit, as a single process would, and the script reports the
//! largest difference.
//!
//! `mpirun -np N target/release/candle-tp [batch hidden ffn]` (ffn divisible
//! by N). CPU tensors here; on a GPU host the same block passes candle's CUDA
//! buffers to rankmesh as views (README, "GPU data plane").

use candle_core::{Device, Tensor as Candle};
use rankmesh::{Collectives, GroupCoordinator, ReduceOp, Runtime, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Deterministic weights, the same on every rank: uniform in [-scale, scale).
fn weights(seed: u64, rows: usize, cols: usize, scale: f32) -> Res<Candle> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Ok(Candle::from_vec(v, (rows, cols), &Device::Cpu)?)
}

/// The block: `gelu(x W1 + b1) W2 + b2`.
struct Mlp {
    w1: Candle,
    b1: Candle,
    w2: Candle,
    b2: Candle,
}

impl Mlp {
    fn new(hidden: usize, ffn: usize) -> Res<Mlp> {
        Ok(Mlp {
            w1: weights(1, hidden, ffn, (1.0 / hidden as f32).sqrt())?,
            b1: weights(2, 1, ffn, 0.1)?,
            w2: weights(3, ffn, hidden, (1.0 / ffn as f32).sqrt())?,
            b2: weights(4, 1, hidden, 0.1)?,
        })
    }

    fn forward(&self, x: &Candle) -> Res<Candle> {
        let h = x.matmul(&self.w1)?.broadcast_add(&self.b1)?.gelu()?;
        Ok(h.matmul(&self.w2)?.broadcast_add(&self.b2)?)
    }

    /// Member `rank` of `size`: W1's columns and b1 of its shard (column
    /// parallel), W2's rows of the same shard (row parallel).
    fn shard(&self, rank: usize, size: usize) -> Res<Mlp> {
        let k = self.w1.dim(1)? / size;
        Ok(Mlp {
            w1: self.w1.narrow(1, rank * k, k)?.contiguous()?,
            b1: self.b1.narrow(1, rank * k, k)?.contiguous()?,
            w2: self.w2.narrow(0, rank * k, k)?.contiguous()?,
            b2: self.b2.clone(),
        })
    }
}

/// The tensor-parallel forward pass: each rank's partial product, summed
/// over the group by rankmesh, then the bias once.
fn tp_forward(shard: &Mlp, x: &Candle, tp: &GroupCoordinator<'_>) -> Res<Candle> {
    let h = x.matmul(&shard.w1)?.broadcast_add(&shard.b1)?.gelu()?;
    let partial = h.matmul(&shard.w2)?;
    let dims = partial.dims().to_vec();
    let host = Tensor::from_vec(dims.clone(), partial.flatten_all()?.to_vec1::<f32>()?)?;
    let summed = tp.all_reduce(&host, ReduceOp::Sum)?;
    let out = Candle::from_slice(summed.as_slice::<f32>()?, dims, &Device::Cpu)?;
    Ok(out.broadcast_add(&shard.b2)?)
}

fn main() -> Res<()> {
    let rt = Runtime::init()?;
    let tp = rt.world_group()?;
    let (size, rank) = (tp.size(), tp.rank_in_group());
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let (batch, hidden, ffn) = match args[..] {
        [] => (8, 256, 1024),
        [b, h, f] => (b, h, f),
        _ => return Err("usage: candle-tp [batch hidden ffn]".into()),
    };
    if ffn % size != 0 {
        return Err(format!("ffn {ffn} is not divisible by the {size} ranks").into());
    }
    let mlp = Mlp::new(hidden, ffn)?;
    let x = weights(5, batch, hidden, 1.0)?;
    let single = mlp.forward(&x)?;
    let parallel = tp_forward(&mlp.shard(rank, size)?, &x, &tp)?;
    let diff = (parallel - &single)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let scale = single.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    // f32 sums in another order: a few ulps of the largest value per term.
    let tol = 1e-5 * scale.max(1.0) * (ffn as f32).sqrt();
    // Each rank judges its own result against its own single-process
    // computation: a verdict reduced by rankmesh could not see rankmesh
    // failing (an all-reduce of zeros would report a difference of zero).
    let own = if diff.is_finite() && diff <= tol {
        None
    } else {
        Some(format!("rank {rank}: difference {diff:e} above {tol:e}"))
    };
    // The largest difference, for the report only.
    let worst = tp.all_reduce(&Tensor::from_vec([1], vec![diff])?, ReduceOp::Max)?;
    let worst = worst.as_slice::<f32>()?[0];
    if rank == 0 {
        println!(
            "candle-tp: {size} ranks, MLP [{batch}x{hidden}] -> {ffn} -> {hidden}, \
             max |tensor-parallel - single process| = {worst:e} (tolerance {tol:e})"
        );
    }
    drop(tp);
    match own {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
