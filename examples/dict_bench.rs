//! Measures two things FastVideo and ModelOpt code does in loops, each
//! against its baseline in the same run, alternating A and B every
//! iteration so drift hits both:
//!
//! - a tensor dictionary (K host tensors of S bytes) sent with
//!   `send_tensor_dict` (every tensor posted at once, one wait) vs the same
//!   tensors sent one at a time with checked `send`/`recv` (what the dict
//!   protocol did before); and `broadcast_tensor_dict` vs one `broadcast` per
//!   tensor;
//! - `gather_configs` over a rank list, which reuses one communicator per
//!   list, vs building the sub-communicator for every call (what it did
//!   before), on a per-layer loop.
//!
//! Run: `scripts/mpirun-local.sh -np 2 target/release/examples/dict_bench [K] [S] [ITERS]`
//! (2 or more ranks). Prints the median microseconds per call on rank 0.

use rankmesh::object::Ranks;
use rankmesh::{
    object::DictValue, object::TensorDict, object::TensorDicts as _, Collectives as _, DType,
    Runtime, Tensor,
};
use rankmesh::{Gathers as _, Objects as _};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if let Err(e) = run() {
        eprintln!("dict_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> rankmesh::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let k = args.first().copied().unwrap_or(16);
    let bytes = args.get(1).copied().unwrap_or(64 << 10);
    let iters = args.get(2).copied().unwrap_or(200);
    let rt = Runtime::init()?;
    let g = rt.world_group()?;
    let (me, p) = (g.rank_in_group(), g.size());
    assert!(p >= 2, "run on 2 or more ranks");
    let tensors: Vec<Tensor> = (0..k)
        .map(|i| Tensor::from_fn([bytes / 4], DType::F32, |j| (i * 31 + j) as f64 * 0.5))
        .collect::<rankmesh::Result<_>>()?;
    let mut dict = TensorDict::new();
    for (i, t) in tensors.iter().enumerate() {
        dict.insert(format!("t{i}"), DictValue::Host(t.clone()));
    }

    let (mut batched, mut one_by_one) = (Vec::new(), Vec::new());
    let (mut bcast_batched, mut bcast_each) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        g.barrier()?;
        let t0 = Instant::now();
        match me {
            0 => g.send_tensor_dict(&dict, Some(1), None)?,
            1 => {
                let got = g.recv_tensor_dict(Some(0), None)?.expect("a peer");
                assert_eq!(got.len(), k);
            }
            _ => {}
        }
        batched.push(t0.elapsed().as_secs_f64() * 1e6);

        g.barrier()?;
        let t0 = Instant::now();
        match me {
            0 => {
                g.send_object(&k, 1)?;
                for t in &tensors {
                    g.send(t, Some(1))?;
                }
            }
            1 => {
                let n: usize = g.recv_object(0)?;
                for _ in 0..n {
                    g.recv(&[bytes / 4], DType::F32, Some(0))?;
                }
            }
            _ => {}
        }
        one_by_one.push(t0.elapsed().as_secs_f64() * 1e6);

        g.barrier()?;
        let t0 = Instant::now();
        let got = g.broadcast_tensor_dict((me == 0).then_some(&dict), 0)?;
        assert_eq!(got.len(), k);
        bcast_batched.push(t0.elapsed().as_secs_f64() * 1e6);

        g.barrier()?;
        let t0 = Instant::now();
        let n: usize = g.broadcast_object((me == 0).then_some(&k), 0)?;
        for t in tensors.iter().take(n) {
            let mut t = if me == 0 {
                t.clone()
            } else {
                Tensor::zeros(t.shape().to_vec(), DType::F32)?
            };
            g.broadcast(&mut t, 0)?;
        }
        bcast_each.push(t0.elapsed().as_secs_f64() * 1e6);
    }

    // Per-layer export loop: every rank reports a small config (only
    // listed ranks may call gather_configs).
    let list: Vec<usize> = (0..p).collect();
    let config = serde_json::json!({"layer": 0, "amax": 1.5, "bits": 8});
    let (mut cached, mut fresh) = (Vec::new(), Vec::new());
    for layer in 0..iters.min(100) {
        g.barrier()?;
        let t0 = Instant::now();
        let got = g.gather_configs(Some(&config), Ranks::World(&list))?;
        if me == 0 {
            assert_eq!(got.map(|m| m.len()), Some(list.len()));
        }
        cached.push(t0.elapsed().as_secs_f64() * 1e6);

        g.barrier()?;
        let t0 = Instant::now();
        // JSON text, as gather_configs sends a JSON value.
        let sub = rt.subgroup(&format!("layer{layer}"), &list)?;
        let got = sub.gather_object(&config.to_string(), 0)?;
        if me == 0 {
            assert_eq!(got.map(|v| v.len()), Some(list.len()));
        }
        fresh.push(t0.elapsed().as_secs_f64() * 1e6);
    }

    if me == 0 {
        println!("# {p} ranks, {k} host tensors of {bytes} B, {iters} iterations (medians, us)");
        let row =
            |what: &str, a: f64, b: f64| println!("{what:<44} {a:>10.1} {b:>10.1} {:>7.2}x", b / a);
        println!(
            "{:<44} {:>10} {:>10} {:>8}",
            "", "rankmesh", "baseline", "speedup"
        );
        row(
            "send/recv_tensor_dict vs one at a time",
            median(batched),
            median(one_by_one),
        );
        row(
            "broadcast_tensor_dict vs one at a time",
            median(bcast_batched),
            median(bcast_each),
        );
        row(
            "gather_configs: cached vs new communicator",
            median(cached),
            median(fresh),
        );
    }
    Ok(())
}
