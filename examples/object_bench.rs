//! Times `broadcast_object` of a ~1 KiB struct — the kind of value FastVideo
//! and ModelOpt broadcast with pickle (a layer's config: names, a shape,
//! hyper-parameters, a list of scales) — as the median of batches of calls.
//! `scripts/bench-object.sh` runs it beside mpi4py's pickle `bcast` of the
//! same value (`scripts/pickle_bcast.py`).
//!
//! Run: `scripts/mpirun-local.sh -np 2 target/release/examples/object_bench [ITERS] [BATCHES]`.
//! Prints `rankmesh broadcast_object[_into] <bytes> B: <median> us` on rank 0.

use rankmesh::Objects as _;
use rankmesh::{Collectives as _, Runtime};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The same fields and values as `scripts/pickle_bcast.py`'s dict.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct LayerConfig {
    name: String,
    step: u64,
    learning_rate: f64,
    shape: Vec<u64>,
    dtype: String,
    tags: Vec<String>,
    quantized: bool,
    scales: Vec<f64>,
}

fn config() -> LayerConfig {
    LayerConfig {
        name: "transformer.blocks.12.attn.qkv_proj".into(),
        step: 123_456,
        learning_rate: 3e-4,
        shape: vec![4096, 12288],
        dtype: "bfloat16".into(),
        tags: vec!["tensor_parallel".into(), "sequence_parallel".into()],
        quantized: true,
        scales: (0..112).map(|i| 1.0 / (i as f64 + 3.0)).collect(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if let Err(e) = run() {
        eprintln!("object_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> rankmesh::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let iters = args.first().copied().unwrap_or(2000);
    let batches = args.get(1).copied().unwrap_or(5);
    let rt = Runtime::init()?;
    let g = rt.world_group()?;
    let me = g.rank_in_group();
    let value = config();
    let encoded = postcard::to_stdvec(&value).expect("encodes").len();
    let mine = (me == 0).then_some(&value);
    // Warm-up, and proof that the value arrives whole.
    let got: LayerConfig = g.broadcast_object(mine, 0)?;
    assert_eq!(got, value, "the broadcast value differs from the source's");
    // `broadcast_object` returns a new value everywhere (the source decodes
    // its own bytes, as it has no `Clone`); `broadcast_object_into` leaves the
    // source's value alone, as mpi4py's `bcast` returns the root's own object.
    let (mut fresh, mut into) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
    let mut slot = value.clone();
    for _ in 0..batches {
        g.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            let got: LayerConfig = g.broadcast_object(mine, 0)?;
            std::hint::black_box(got);
        }
        fresh.push(t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
        g.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            g.broadcast_object_into(&mut slot, 0)?;
            std::hint::black_box(&slot);
        }
        into.push(t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    assert_eq!(slot, value, "broadcast_object_into left another value");
    if me == 0 {
        println!(
            "rankmesh broadcast_object {encoded} B: {:.2} us",
            median(fresh)
        );
        println!(
            "rankmesh broadcast_object_into {encoded} B: {:.2} us",
            median(into)
        );
    }
    Ok(())
}
