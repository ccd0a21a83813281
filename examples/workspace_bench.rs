//! Saving and loading one rank's 256 MiB workspace file (issue #39's
//! before/after figure): `Workspace::write` (encode, checksum, write, fsync,
//! rename) and `Workspace::read` (read, check the header and checksum,
//! decode), each timed alone, medians of the rounds.
//!
//! `cargo run --release --example workspace_bench -- [DIR] [ROUNDS]`
//! (DIR defaults to /dev/shm, so the file system's speed does not hide the
//! checksum's; a world of 1 without a launcher).

use rankmesh::{helpers::Workspace, DType, Runtime, Tensor};
use std::collections::BTreeMap;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> rankmesh::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/dev/shm".into());
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let rt = Runtime::init()?;
    let world = rt.world_group()?;
    let ws = Workspace::at(format!("{dir}/rankmesh-workspace-bench"), &world)?;
    let n = 64 << 20; // f32 elements: 256 MiB
    let t = Tensor::from_fn([n], DType::F32, |i| (i % 1000) as f64 * 0.25)?;
    let tensors = BTreeMap::from([("w".to_string(), t)]);
    let (mut saves, mut loads) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        ws.write(None, &tensors)?;
        saves.push(t0.elapsed().as_secs_f64() * 1e3);
        let t1 = Instant::now();
        let back = ws.read(0)?.expect("just written");
        loads.push(t1.elapsed().as_secs_f64() * 1e3);
        assert_eq!(back.tensors["w"].bytes().len(), 256 << 20);
    }
    println!(
        "workspace 256 MiB in {dir}: save {:.1} ms, load {:.1} ms (medians of {rounds})",
        median(saves),
        median(loads)
    );
    ws.remove(&world)
}
