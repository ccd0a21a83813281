//! A small, self-checking parallel workload over TP/SP/DP groups: what a
//! training step does to a cluster's network, with every result verified.
//! `rankmesh workload` runs it; the Slurm example job submits it.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::group::Collectives;
use crate::group::Runtime;
use crate::op::ReduceOp;
use crate::parallel::ParallelState;
use crate::tensor::Tensor;
use std::time::Instant;

/// Timing of one workload run (as seen by world rank 0).
#[derive(Clone, Debug)]
pub struct WorkloadReport {
    /// Steps run.
    pub steps: usize,
    /// Mean seconds per step, slowest rank.
    pub step_secs: f64,
    /// Elements per rank in the activations.
    pub elements: usize,
}

fn mismatch(what: &str, got: f64, want: f64) -> Error {
    Error::Usage {
        what: "workload",
        group: "world".into(),
        msg: format!("{what}: got {got}, expected {want}"),
    }
}

/// Each step: TP all_reduce (sum) of activations, SP all_to_all_4d heads ↔
/// sequence and back, DP all_reduce (avg) of gradients; every result is
/// checked against its closed form. `tokens` is the local sequence length.
pub fn run(
    rt: &Runtime,
    tp: usize,
    sp: usize,
    steps: usize,
    tokens: usize,
) -> Result<WorkloadReport> {
    let mut ps = ParallelState::new(rt)?;
    ps.initialize_model_parallel(tp, sp, None)?;
    let (tpg, spg, dpg) = (ps.tp()?, ps.sp()?, ps.dp()?);
    let me = rt.rank() as f64;
    // [B=1, S/P=tokens, H=heads, D=8] with heads divisible by the SP size.
    let heads = 2 * sp;
    let shape = [1, tokens, heads, 8];
    let elements: usize = shape.iter().product();
    let mut total = 0.0;
    for step in 0..steps {
        let t0 = Instant::now();
        let act = Tensor::from_fn(shape, DType::F32, |i| (i % 7) as f64 + me)?;
        let summed = tpg.all_reduce(&act, ReduceOp::Sum)?;
        let tp_ranks: f64 = tpg.ranks().iter().map(|r| *r as f64).sum();
        let want = |i: usize| tpg.size() as f64 * (i % 7) as f64 + tp_ranks;
        if let Some((i, v)) = summed
            .to_f64_vec()
            .iter()
            .enumerate()
            .find(|(i, v)| **v != want(*i))
        {
            return Err(mismatch(
                &format!("step {step} tp all_reduce element {i}"),
                *v,
                want(i),
            ));
        }
        let heads_view = spg.all_to_all_4d(&summed, 2, 1)?;
        let back = spg.all_to_all_4d(&heads_view, 1, 2)?;
        if back != summed {
            return Err(mismatch(
                &format!("step {step} sp all_to_all_4d round trip"),
                0.0,
                1.0,
            ));
        }
        let grad = Tensor::from_fn([elements], DType::F32, |i| {
            (i % 5) as f64 * dpg.size() as f64 + me
        })?;
        let avg = dpg.all_reduce(&grad, ReduceOp::Avg)?;
        let dp_mean: f64 = dpg.ranks().iter().map(|r| *r as f64).sum::<f64>() / dpg.size() as f64;
        for (i, v) in avg.to_f64_vec().iter().enumerate() {
            let want = (i % 5) as f64 * dpg.size() as f64 + dp_mean;
            if (v - want).abs() > 1e-5 * want.abs().max(1.0) {
                return Err(mismatch(
                    &format!("step {step} dp all_reduce(avg) element {i}"),
                    *v,
                    want,
                ));
            }
        }
        total += t0.elapsed().as_secs_f64();
    }
    let slowest = ps
        .world()
        .all_reduce(&Tensor::from_vec([1], vec![total])?, ReduceOp::Max)?;
    Ok(WorkloadReport {
        steps,
        step_secs: slowest.as_slice::<f64>()?[0] / steps.max(1) as f64,
        elements,
    })
}
