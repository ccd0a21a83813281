//! Data-parallel training that goes on after losing a rank (issue #66).
//! Each rank is a replica of a small linear model trained by gradient
//! descent on its own batches; a step sums the gradients (`all_reduce`)
//! and averages them over the replicas. Rank K can be killed with SIGKILL
//! at step S, either inside the step (before its all-reduce: the others
//! wait in theirs) or between steps (after it, while the others compute).
//! The survivors get [`Error::PeerLost`], shrink the world, redo the
//! interrupted step and finish. Every rank then checks its parameters
//! against a serial replay that had every replica before the loss and the
//! survivors from that step on, and prints one line.
//!
//! ```text
//! mpirun --with-ft ulfm -np 4 target/release/examples/elastic_dp \
//!     [--steps N] [--tp N] [--kill K@S | --kill-idle K@S]... [--die-in-shrink K]
//! ```
//! `--tp N`: replicas of N ranks (a dp × tp mesh, each TP rank computing
//! its part of the replica's batch); a lost rank's replica is dropped
//! whole (`MeshLayout::after_loss`), its other ranks retire
//! (`Runtime::retire`) and exit 0, and a loss in every replica is an error.
//! `--die-in-shrink K`: rank K dies when it learns of the first loss,
//! while the others shrink (they lose it too, in the same shrink or in a
//! second one).
//! `--p2p`: the replicas' sum from one batch of sends and receives.
//! `--fastvideo`: the same replicas as FastVideo's layout
//! (`ParallelState::initialize_model_parallel(1, N, None)` with N the
//! `--tp` value: the replica's ranks are an SP group, the replicas' sum
//! runs on the DP groups), planned after a loss with `Layout::after_loss`.
//! (Open MPI 5; without ULFM the loss ends the job, as it always did.)
//! With `RANKMESH_HOST_PLANE=mpi` the sums go through MPI instead of the
//! node's shared memory. `--device`: the replicas' sum runs on the GPUs
//! (NCCL, after `Runtime::connect_devices`), and the shrink carries the
//! world's NCCL communicator over (`ncclCommShrink`).

use rankmesh::group::Shrunk;
use rankmesh::parallel::{Layout, Survival};
use rankmesh::prelude::*;
use rankmesh::{Error, Mesh, MeshLayout, ParallelState};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Parameters of the model.
const DIM: usize = 24;
/// Samples per replica and step.
const BATCH: usize = 16;
/// Learning rate.
const LR: f64 = 0.05;

/// When the victim dies.
#[derive(Clone, Copy, PartialEq)]
enum Kill {
    /// Before its all-reduce of the step: the others are inside theirs.
    Inside,
    /// After the step's all-reduce: the others are between calls.
    Idle,
}

struct Args {
    steps: usize,
    /// Ranks per replica (a tensor-parallel group splits each replica's
    /// batch); a lost rank takes its whole replica out.
    tp: usize,
    /// (rank, step, when): each rank killed (several at one step are lost
    /// at once).
    kills: Vec<(usize, usize, Kill)>,
    /// A rank that dies when the first loss is found, while the others
    /// shrink.
    dies_in_shrink: Option<usize>,
    /// The replicas' sum on the device plane.
    device: bool,
    /// FastVideo's layout (ParallelState) instead of a mesh.
    fastvideo: bool,
    /// The replicas' sum from one point-to-point batch (each sends its
    /// gradient to every other replica) instead of an all-reduce.
    p2p: bool,
}

/// The world's layout: a (dp, tp) mesh, or FastVideo's (tp 1, sp = the
/// replica's size), whose SP and DP groups are the mesh's tp and dp.
#[derive(Clone)]
enum Plan {
    Mesh(MeshLayout),
    FastVideo(Layout),
}

impl Plan {
    /// The plan after losing `lost`: whole replicas dropped.
    fn after_loss(&self, lost: &[usize]) -> rankmesh::Result<(Plan, Survival)> {
        match self {
            Plan::Mesh(l) => l
                .after_loss(lost, "dp")
                .map(|s| (Plan::Mesh(s.layout.clone()), s)),
            Plan::FastVideo(l) => l.after_loss(lost).map(|(l, s)| (Plan::FastVideo(l), s)),
        }
    }
}

impl Args {
    /// When rank `rank` dies at step `step`, if it does.
    fn kill_of(&self, rank: usize, step: usize) -> Option<Kill> {
        self.kills
            .iter()
            .find(|&&(k, s, _)| (k, s) == (rank, step))
            .map(|&(_, _, how)| how)
    }

    /// The step in which the first loss is found.
    fn first_loss(&self) -> Option<usize> {
        self.kills
            .iter()
            .map(|&(_, s, how)| if how == Kill::Inside { s } else { s + 1 })
            .min()
    }

    /// Whether replica `d` (ranks `d*tp..(d+1)*tp` of the first world)
    /// takes part in step `step`: none of its ranks is lost by then.
    fn replica_in(&self, d: usize, step: usize) -> bool {
        (d * self.tp..(d + 1) * self.tp).all(|r| self.rank_in(r, step))
    }

    /// Whether rank `r` is alive and taking part in step `step`.
    fn rank_in(&self, r: usize, step: usize) -> bool {
        let killed = self.kills.iter().all(|&(k, s, how)| match how {
            Kill::Inside => r != k || step < s,
            Kill::Idle => r != k || step <= s,
        });
        let shrinking =
            self.dies_in_shrink != Some(r) || self.first_loss().is_none_or(|s| step < s);
        killed && shrinking
    }
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        steps: 8,
        tp: 1,
        kills: Vec::new(),
        dies_in_shrink: None,
        device: false,
        fastvideo: false,
        p2p: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--steps" => args.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--tp" => args.tp = value()?.parse().map_err(|e| format!("--tp: {e}"))?,
            "--kill" | "--kill-idle" => {
                let v = value()?;
                let (k, s) = v
                    .split_once('@')
                    .ok_or(format!("{a} takes RANK@STEP, not {v}"))?;
                let how = if a == "--kill" {
                    Kill::Inside
                } else {
                    Kill::Idle
                };
                let k = k.parse().map_err(|e| format!("{a}: rank {k}: {e}"))?;
                let s = s.parse().map_err(|e| format!("{a}: step {s}: {e}"))?;
                args.kills.push((k, s, how));
            }
            "--device" => args.device = true,
            "--fastvideo" => args.fastvideo = true,
            "--p2p" => args.p2p = true,
            "--die-in-shrink" => {
                let v = value()?;
                args.dies_in_shrink = Some(v.parse().map_err(|e| format!("{a}: rank {v}: {e}"))?);
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(args)
}

/// A replica's batch at a step: inputs and targets from a hash of (rank,
/// step, index), non-integer, the same in every process.
fn batch(replica: usize, step: usize) -> (Vec<f64>, Vec<f64>) {
    let value = |i: usize| {
        let mut z = (replica as u64 + 1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((step as u64) << 32)
            .wrapping_add(i as u64);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let x: Vec<f64> = (0..BATCH * DIM).map(value).collect();
    let y: Vec<f64> = (0..BATCH).map(|i| value(1 << 20 | i) * 3.0).collect();
    (x, y)
}

/// The gradient of the mean squared error of `w` on part `part` of `parts`
/// of a replica's batch (every `parts`-th sample from `part`).
fn gradient(w: &[f64], replica: usize, step: usize, (part, parts): (usize, usize)) -> Vec<f64> {
    let (x, y) = batch(replica, step);
    let mut g = vec![0.0; DIM];
    let samples = x.chunks(DIM).zip(&y).skip(part).step_by(parts);
    for (row, target) in samples {
        let err: f64 = row.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() - target;
        for (gi, xi) in g.iter_mut().zip(row) {
            *gi += 2.0 * err * xi / BATCH as f64;
        }
    }
    g
}

/// One step: `w` moves against the mean of the replicas' gradients.
fn update(w: &mut [f64], sum: &[f64], replicas: usize) {
    for (wi, gi) in w.iter_mut().zip(sum) {
        *wi -= LR * gi / replicas as f64;
    }
}

/// The same training in one process: every replica of `world` before a
/// loss, the whole replicas left from its step on.
fn serial(world: usize, args: &Args) -> Vec<f64> {
    let mut w = vec![0.0; DIM];
    for step in 0..args.steps {
        let replicas: Vec<usize> = (0..world / args.tp)
            .filter(|&d| args.replica_in(d, step))
            .collect();
        let mut sum = vec![0.0; DIM];
        for &d in &replicas {
            for (a, b) in sum.iter_mut().zip(gradient(&w, d, step, (0, 1))) {
                *a += b;
            }
        }
        update(&mut w, &sum, replicas.len());
    }
    w
}

/// Each step done so far: the parameters it started from and the
/// first-world replicas that summed it.
type History = Vec<(Vec<f64>, Vec<usize>)>;

/// The parameters after `history`'s steps, computed alone.
fn replay(history: &History) -> Vec<f64> {
    let mut w = vec![0.0; DIM];
    for (step, (_, replicas)) in history.iter().enumerate() {
        let mut sum = vec![0.0; DIM];
        for &d in replicas {
            for (a, b) in sum.iter_mut().zip(gradient(&w, d, step, (0, 1))) {
                *a += b;
            }
        }
        update(&mut w, &sum, replicas.len());
    }
    w
}

/// How a run on one world ended.
enum Ended {
    /// Every step done.
    Done,
    /// A member was lost in step `step`, which is to be done again.
    Lost { step: usize },
}

/// This process's threads and sockets after its first step, before any
/// loss (MPI connects its TCP links at first use).
static HELD: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

/// This process's threads and open sockets (Linux's /proc).
fn threads_and_sockets() -> (usize, usize) {
    let count = |dir: &str, keep: &dyn Fn(&std::path::Path) -> bool| {
        std::fs::read_dir(dir).map_or(0, |d| d.flatten().filter(|e| keep(&e.path())).count())
    };
    let threads = count("/proc/self/task", &|_| true);
    let sockets = count("/proc/self/fd", &|p| {
        std::fs::read_link(p).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
    });
    (threads, sockets)
}

/// Microseconds since the Unix epoch: the victim's and the survivors'
/// clocks are one (a node's), so the script subtracts them.
fn now_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Kills this process, saying when.
fn die(me: usize, step: usize, when: &str) {
    eprintln!(
        "elastic_dp: rank {me} kills itself {when} step {step} at {} us",
        now_us()
    );
    // SAFETY: raising a signal at this process.
    unsafe { libc::raise(libc::SIGKILL) };
}

/// Runs steps from `from` on `rt`'s world laid out as `layout` (dp × tp);
/// `me`: this process's rank in the first world (its replica's data and
/// its part of it); `after_loss`: say when the first step completes.
fn train(
    rt: &Runtime,
    (plan, args): (&Plan, &Args),
    me: usize,
    (w, history, replicas): (&mut [f64], &mut History, &[usize]),
    (from, mut after_loss): (usize, bool),
) -> rankmesh::Result<Ended> {
    // The replica's group (tp) and the replicas' (dp).
    let (dp, tp) = match plan {
        Plan::Mesh(layout) => {
            let mesh = Mesh::new(rt, layout.clone(), &[])?;
            (mesh.group(&["dp"])?, mesh.group(&["tp"])?)
        }
        Plan::FastVideo(layout) => {
            let mut ps = ParallelState::new(rt)?;
            ps.initialize_model_parallel(layout.tp, layout.sp, Some(layout.dp))?;
            (ps.dp()?, ps.sp()?)
        }
    };
    let (replica, part) = (me / args.tp, (me % args.tp, args.tp));
    for step in from..args.steps {
        history.truncate(step);
        history.push((w.to_vec(), replicas.to_vec()));
        if args.kill_of(me, step) == Some(Kill::Inside) {
            die(me, step, "inside");
        }
        // The replica's gradient from its TP ranks' parts, then the
        // replicas' sum.
        let g = Tensor::from_vec([DIM], gradient(w, replica, step, part))?;
        let sum = match tp.all_reduce(&g, ReduceOp::Sum).and_then(|g| {
            if args.p2p {
                return sum_by_batch(&dp, g);
            }
            if !args.device {
                return dp.all_reduce(&g, ReduceOp::Sum);
            }
            let dev = dp.device()?;
            let sum = dev.all_reduce(&dev.gpu().upload(&g)?, ReduceOp::Sum)?;
            dev.gpu().download(&sum)
        }) {
            Ok(sum) => sum,
            Err(Error::PeerLost { lost, msg, .. }) => {
                eprintln!(
                    "elastic_dp: rank {me}: step {step}: world ranks {lost:?} lost (at {} us): {msg}",
                    now_us()
                );
                return Ok(Ended::Lost { step });
            }
            Err(e) => return Err(e),
        };
        if std::mem::take(&mut after_loss) {
            println!(
                "elastic_dp: rank {me}: first step after the loss done at {} us",
                now_us()
            );
        }
        update(w, sum.as_slice::<f64>()?, dp.size());
        let _ = HELD.set(threads_and_sockets());
        if args
            .kills
            .iter()
            .any(|&(_, s, how)| (s, how) == (step, Kill::Idle))
        {
            if args.kill_of(me, step) == Some(Kill::Idle) {
                die(me, step, "after");
            }
            // The others compute meanwhile, between calls.
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    Ok(Ended::Done)
}

/// The sum of every member's `g`, in member order, from one batch of
/// sends and receives (torch's `batch_isend_irecv`).
fn sum_by_batch(group: &GroupCoordinator<'_>, g: Tensor) -> rankmesh::Result<Tensor> {
    let me = group.rank_in_group();
    let mut got = (0..group.size())
        .map(|_| Tensor::zeros([DIM], DType::F64))
        .collect::<rankmesh::Result<Vec<_>>>()?;
    let peers = (0..group.size()).filter(|&p| p != me);
    let mut ops: Vec<P2p<'_, Tensor>> = peers.clone().map(|p| P2p::Send(&g, p)).collect();
    ops.extend(
        got.iter_mut()
            .enumerate()
            .filter(|(p, _)| *p != me)
            .map(|(p, t)| P2p::Recv(t, p)),
    );
    group.batch_send_recv(&mut ops)?;
    drop(ops);
    let mut sum = vec![0.0; DIM];
    for (p, t) in got.iter().enumerate() {
        let part = if p == me {
            g.as_slice::<f64>()?
        } else {
            t.as_slice::<f64>()?
        };
        sum.iter_mut().zip(part).for_each(|(s, x)| *s += x);
    }
    Tensor::from_vec([DIM], sum)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("elastic_dp: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("elastic_dp: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> rankmesh::Result<bool> {
    let mut rt = Runtime::init()?;
    if args.device {
        rt.connect_devices()?;
    }
    let (me, first_world) = (rt.rank(), rt.size());
    let tp = args.tp;
    let mut layout = match args.fastvideo {
        true => Plan::FastVideo(Layout::new(first_world, 1, tp, None)?),
        false => Plan::Mesh(MeshLayout::row_major(
            first_world,
            &[("dp", first_world / tp), ("tp", tp)],
        )?),
    };
    // The first world's rank of each rank of the current one.
    let mut first_rank: Vec<usize> = (0..first_world).collect();
    let mut w = [0.0; DIM];
    let mut history = History::new();
    let mut replicas: Vec<usize> = (0..first_world / tp).collect();
    let (mut from, mut after_loss) = (0, false);
    let mut shrinks = Vec::new();
    loop {
        let state = (&mut w[..], &mut history, &replicas[..]);
        match train(&rt, (&layout, args), me, state, (from, after_loss))? {
            Ended::Done => break,
            Ended::Lost { step } => {
                if args.dies_in_shrink == Some(me) {
                    die(me, step, "while the others shrink, in");
                }
                let started = Instant::now();
                let before = rt.rank();
                let Shrunk { runtime, lost, .. } = rt.shrink()?;
                for w in runtime.warnings() {
                    eprintln!("elastic_dp: rank {me}: after the shrink: {w}");
                }
                // Whole replicas go on; a lost rank's TP partners retire.
                let (next, plan) = match layout.after_loss(&lost) {
                    Ok(plan) => plan,
                    Err(e) => {
                        // Every survivor says it before any exits (a rank
                        // that exits non-zero ends the job).
                        eprintln!("elastic_dp: rank {me}: {e}");
                        runtime.world_group()?.barrier()?;
                        return Ok(false);
                    }
                };
                let first_lost: Vec<usize> = lost.iter().map(|&r| first_rank[r]).collect();
                if plan.retired.contains(&before) {
                    runtime.retire(false)?;
                    println!(
                        "elastic_dp: rank {me}: retired after losing first-world ranks {first_lost:?} \
                         (its replica lost a rank)"
                    );
                    return Ok(true);
                }
                rt = match plan.retired.is_empty() {
                    true => runtime,
                    false => runtime.retire(true)?.expect("a kept rank stays"),
                };
                first_rank = (0..plan.new_rank.len())
                    .filter(|&r| plan.new_rank[r].is_some())
                    .map(|r| first_rank[r])
                    .collect();
                layout = next;
                replicas = plan.kept.iter().map(|&i| replicas[i]).collect();
                // A survivor may have found the loss one step earlier than
                // the others (it was still finishing a step the lost rank
                // had done its part of): all redo the earliest, from the
                // parameters it started from.
                let mine = Tensor::from_vec([1], vec![step as f64])?;
                let redo = rt.world_group()?.all_reduce(&mine, ReduceOp::Min)?;
                let redo = redo.as_slice::<f64>()?[0] as usize;
                w.copy_from_slice(&history[redo].0);
                eprintln!(
                    "elastic_dp: rank {me} is rank {} of {} after losing first-world ranks {first_lost:?} \
                     (replicas kept: {:?}); redoing step {redo} (this rank was in step {step})",
                    rt.rank(),
                    rt.size(),
                    plan.kept
                );
                shrinks.push(format!("{:.1} ms", started.elapsed().as_secs_f64() * 1e3));
                // The runtime after a shrink holds no more than the first
                // one did once its first step had connected everything (the
                // old world's threads joined, its sockets closed).
                let now = threads_and_sockets();
                let held = *HELD.get().unwrap_or(&now);
                let grew = match (now.0 > held.0, now.1 > held.1) {
                    (true, _) => "; LEAKED threads",
                    (false, true) => "; LEAKED sockets",
                    _ => "",
                };
                eprintln!(
                    "elastic_dp: rank {me}: after the shrink: {} threads, {} sockets (before any loss: {}, {}){grew}",
                    now.0, now.1, held.0, held.1
                );
                (from, after_loss) = (redo, true);
            }
        }
    }
    // What the kills predict, and what the survivors did.
    let planned = serial(first_world, args);
    let want = replay(&history);
    if planned != want {
        eprintln!(
            "elastic_dp: rank {me}: the replicas' steps differ from the kills' plan (a survivor found the loss a step early)"
        );
    }
    let worst = w
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
        .fold(0.0f64, f64::max);
    let ok = worst < 1e-9;
    println!(
        "elastic_dp: rank {me}: {} steps, {} ranks at the end, shrinks: [{}]; parameters {} the serial replay (worst relative difference {worst:.1e})",
        args.steps,
        rt.size(),
        shrinks.join(", "),
        if ok { "match" } else { "DIFFER from" },
    );
    Ok(ok)
}
