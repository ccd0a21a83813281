//! `rankmesh doctor`: which node, rank or link is broken or slow.
//!
//! Three steps, every rank in lock-step, every wait bounded by a deadline:
//! 1. **reach**: every rank exchanges a small message with every other (a
//!    round-robin schedule, so no rank serves two peers at once); a rank that
//!    does not answer is named and the job aborted, never left hanging;
//! 2. **within nodes**: each node's ranks run an all_reduce on a node
//!    communicator, and every pair of ranks on a node measures its bandwidth;
//!    every rank reports its NCCL library and GPU count, and with a GPU and
//!    NCCL on every rank each node runs a device all_reduce too;
//! 3. **between nodes**: one leader rank per node measures bandwidth and
//!    latency to every other node's leader, in rounds so pairs do not contend;
//! 4. **alone**: whatever the rounds put below a fraction of the median of
//!    its kind is measured again with every other rank idle, beside a few
//!    healthy measurements of its kind as the reference ([`verdict`]): on a
//!    busy node two pairs measured at once share its cores, and a gate that
//!    failed healthy clusters would be switched off.
//!
//! [`report`] renders the table, the JSON and the heatmap.

mod probe;
pub mod report;
pub mod verdict;

use crate::dtype::DType;
use crate::error::Result;
use crate::group::{Collectives, GroupCoordinator, Runtime, WorldInfo};
use crate::object::Objects;
use crate::op::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::topology::Color;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use probe::{partner, rounds, Probe};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use verdict::{Judgement, Task};

pub use probe::UNREACHABLE_EXIT;

/// What to measure and how strictly to judge it.
#[derive(Clone, Debug)]
pub struct DoctorConfig {
    /// Bytes per bandwidth message.
    pub bytes: usize,
    /// Timed repetitions per measurement (the best one counts).
    pub reps: usize,
    /// A node, rank or link below this fraction of the reference (the
    /// median of its kind measured alone) is flagged.
    pub threshold: f64,
    /// How long any single wait may take before the peer is named.
    pub deadline: Duration,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        DoctorConfig {
            bytes: 1 << 20,
            reps: 10,
            threshold: 0.8,
            deadline: Duration::from_secs(30),
        }
    }
}

/// One measured pair of world ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    /// Lower world rank.
    pub a: usize,
    /// Higher world rank.
    pub b: usize,
    /// Small-message time per exchange, µs.
    pub latency_us: f64,
    /// Bandwidth per direction, GB/s (0 for reach-only pairs).
    pub bandwidth_gbs: f64,
}

/// One node as the doctor saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeResult {
    /// Node index.
    pub node: usize,
    /// Host name.
    pub host: String,
    /// World ranks on the node.
    pub ranks: Vec<usize>,
    /// Bus bandwidth of an all_reduce over the node's ranks, GB/s (`None`
    /// on a node with one rank).
    pub all_reduce_busbw: Option<f64>,
    /// Bus bandwidth of a device (NCCL) all_reduce over the node's ranks,
    /// GB/s (`None` without GPUs on every rank, or on a node of one rank).
    pub device_busbw: Option<f64>,
    /// Why the node's device all_reduce failed, when it did.
    pub device_error: Option<String>,
    /// The node's ranks outnumber the CPUs they may use: a pair's figure
    /// there says where the scheduler ran its two ranks, so its ranks are
    /// not judged by their pairs.
    #[serde(default)]
    pub ranks_share_cpus: bool,
}

/// One rank's GPU stack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// World rank.
    pub rank: usize,
    /// Its node.
    pub node: usize,
    /// The NCCL library it loads (path, version), or why none.
    pub nccl: std::result::Result<(String, String), String>,
    /// CUDA devices it sees, or why none.
    pub gpus: std::result::Result<usize, String>,
}

impl DeviceFacts {
    /// This rank's, found without creating a context.
    fn here(rank: usize, node: usize, nccl_lib: Option<&str>) -> DeviceFacts {
        let env = |k: &str| std::env::var(k).ok();
        DeviceFacts {
            rank,
            node,
            nccl: crate::nccl::loader::load(nccl_lib, &env)
                .map(|n| (n.path().to_string(), n.version()))
                .map_err(one_line),
            gpus: crate::device::device_count().map_err(one_line),
        }
    }

    /// A GPU and NCCL: the device plane can run here.
    fn ready(&self) -> bool {
        self.nccl.is_ok() && self.gpus.as_ref().is_ok_and(|n| *n > 0)
    }
}

/// Everything a doctor run measured (complete on world rank 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// Bytes per bandwidth message.
    pub bytes: usize,
    /// Repetitions per measurement.
    pub reps: usize,
    /// Every pair of ranks: small-message exchange time.
    pub reach: Vec<PairResult>,
    /// The nodes.
    pub nodes: Vec<NodeResult>,
    /// Pairs of ranks on the same node.
    pub intra_node: Vec<PairResult>,
    /// Pairs of node leaders (`a`, `b` are node indices here).
    pub inter_node: Vec<PairResult>,
    /// Every rank's GPU stack.
    pub devices: Vec<DeviceFacts>,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

/// Small-message size and repetitions for latency.
const PING_BYTES: usize = 8;
const PING_REPS: usize = 20;

/// What a doctor run found: everything measured, and the verdict.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The concurrent rounds.
    pub measurements: Measurements,
    /// Suspects retaken alone, and what was confirmed.
    pub judgement: Judgement,
}

/// Runs the steps on every rank; world rank 0 gets the outcome, the other
/// ranks `None`.
pub fn run(rt: &Runtime, cfg: &DoctorConfig) -> Result<Option<Outcome>> {
    let start = Instant::now();
    let d = Doctor::new(rt, cfg);
    // 1. Reach: every pair of ranks, round by round.
    let mut mine = d.reach();
    // 2. Within nodes: each node's all_reduce, its pairs, its devices.
    let node_comm = d
        .comm
        .split_by_color(Color::with_value(d.node as i32))
        .expect("every rank passes a colour");
    let node_busbw = d.node_all_reduce(&node_comm);
    mine.extend(d.within_nodes());
    let facts = DeviceFacts::here(d.me, d.node, d.rt.options().nccl_lib.as_deref());
    let (device_node, device_run) = d.node_devices(&facts, &node_comm)?;
    // 3. Between nodes: node leaders, node pair by node pair.
    mine.extend(d.between_nodes());
    let node_entry = (d.info.me().local_rank == 0).then(|| NodeResult {
        node: d.node,
        host: d.info.me().host.clone(),
        ranks: d.node_ranks(d.node),
        all_reduce_busbw: node_busbw,
        device_busbw: device_run.as_ref().and_then(|r| r.as_ref().ok().copied()),
        device_error: device_run.and_then(|r| r.err()).map(one_line),
        ranks_share_cpus: crate::wait::crowded(),
    });
    let world = rt.world_group()?;
    let measured = d.gathered(&world, mine, node_entry, facts, start)?;
    // 4. Suspects measured again, one at a time, every other rank idle.
    let retakes = Instant::now();
    let plan = measured
        .as_ref()
        .map(|m| verdict::plan(m, verdict::suspects(m, cfg.threshold)));
    let (figures, passes) = d.retake(&world, plan.as_ref(), &node_comm, device_node.as_ref())?;
    Ok(measured.zip(plan).map(|(m, plan)| {
        let mut judgement = verdict::confirm(&m, &plan, &figures, cfg.threshold);
        judgement.seconds = retakes.elapsed().as_secs_f64();
        judgement.passes = passes;
        Outcome {
            measurements: m,
            judgement,
        }
    }))
}

/// One rank's view of a doctor run: the world, where this rank is, and the
/// probe every step waits through.
struct Doctor<'a> {
    rt: &'a Runtime,
    cfg: &'a DoctorConfig,
    comm: &'a SimpleCommunicator,
    probe: Probe<'a>,
    info: &'a WorldInfo,
    me: usize,
    node: usize,
}

impl<'a> Doctor<'a> {
    fn new(rt: &'a Runtime, cfg: &'a DoctorConfig) -> Self {
        let comm = rt.world_comm();
        let info = rt.world();
        Doctor {
            rt,
            cfg,
            comm,
            probe: Probe::new(comm, cfg.deadline),
            info,
            me: info.rank,
            node: info.me().node,
        }
    }

    /// The world ranks on node `n`, in order.
    fn node_ranks(&self, n: usize) -> Vec<usize> {
        self.info
            .ranks
            .iter()
            .filter(|r| r.node == n)
            .map(|r| r.rank)
            .collect()
    }

    /// Latency between every pair of ranks, round by round.
    fn reach(&self) -> Vec<Step> {
        let mut mine = Vec::new();
        for (k, round) in rounds(self.info.size).iter().enumerate() {
            if let Some(peer) = partner(round, self.me) {
                let t = self
                    .probe
                    .best_exchange(peer, PING_BYTES, PING_REPS, "reach");
                if self.me < peer {
                    mine.push(Step::Reach(pair(self.me, peer, t, 0.0, 0)));
                }
            }
            self.probe.barrier(&format!("reach round {k}"));
        }
        mine
    }

    /// This node's all_reduce over `node_comm` (none for a node of one).
    fn node_all_reduce(&self, node_comm: &SimpleCommunicator) -> Option<f64> {
        let busbw = (node_comm.size() > 1)
            .then(|| node_all_reduce(node_comm, self.cfg.bytes, self.cfg.reps));
        self.probe.barrier("node all_reduce");
        busbw
    }

    /// Pairs within each node, by local rank, all nodes at once.
    fn within_nodes(&self) -> Vec<Step> {
        let (cfg, me) = (self.cfg, self.me);
        let local = self.node_ranks(self.node);
        let widest = self
            .info
            .ranks
            .iter()
            .map(|r| r.local_size)
            .max()
            .unwrap_or(1);
        let mut mine = Vec::new();
        for (k, round) in rounds(widest).iter().enumerate() {
            let mate = partner(round, self.info.me().local_rank).filter(|j| *j < local.len());
            if let Some(peer) = mate.map(|j| local[j]) {
                let t = self
                    .probe
                    .best_exchange(peer, cfg.bytes, cfg.reps, "within a node");
                if me < peer {
                    mine.push(Step::Intra(pair(me, peer, 0.0, t, cfg.bytes)));
                }
            }
            self.probe.barrier(&format!("within-node round {k}"));
        }
        mine
    }

    /// Each node's device all_reduce, when every rank has a GPU and NCCL:
    /// the node's device group (kept for the retakes) and its figure.
    #[allow(clippy::type_complexity)]
    fn node_devices(
        &self,
        facts: &DeviceFacts,
        node_comm: &SimpleCommunicator,
    ) -> Result<(Option<GroupCoordinator<'a>>, Option<Result<f64>>)> {
        let mut every = 0u8;
        self.comm
            .all_reduce_into(&u8::from(facts.ready()), &mut every, SystemOperation::min());
        let device_node = match every {
            1 => {
                let lists: Vec<Vec<usize>> = (0..self.info.node_count)
                    .map(|n| self.node_ranks(n))
                    .collect();
                self.rt
                    .split_groups("node", &lists)?
                    .filter(|g| g.size() > 1)
            }
            _ => None,
        };
        let device_run = device_node
            .as_ref()
            .map(|g| device_all_reduce(g, node_comm, self.cfg.bytes, self.cfg.reps));
        self.probe.barrier("node device all_reduce");
        Ok((device_node, device_run))
    }

    /// Node leaders, node pair by node pair: latency and bandwidth.
    fn between_nodes(&self) -> Vec<Step> {
        let (cfg, node) = (self.cfg, self.node);
        let mut mine = Vec::new();
        for (k, round) in rounds(self.info.node_count).iter().enumerate() {
            if self.info.me().local_rank == 0 {
                if let Some(other) = partner(round, node) {
                    let peer = self.node_ranks(other)[0];
                    let p = &self.probe;
                    let lat = p.best_exchange(peer, PING_BYTES, PING_REPS, "between nodes");
                    let bw = p.best_exchange(peer, cfg.bytes, cfg.reps, "between nodes");
                    if node < other {
                        mine.push(Step::Inter(pair(node, other, lat, bw, cfg.bytes)));
                    }
                }
            }
            self.probe.barrier(&format!("between-node round {k}"));
        }
        mine
    }

    /// Every rank's steps, node entry and device facts gathered over
    /// `world` on world rank 0, as sorted measurements (`None` elsewhere).
    fn gathered(
        &self,
        world: &GroupCoordinator<'_>,
        mine: Vec<Step>,
        node_entry: Option<NodeResult>,
        facts: DeviceFacts,
        start: Instant,
    ) -> Result<Option<Measurements>> {
        let gathered = world.gather_object(&(mine, node_entry, facts), 0)?;
        Ok(gathered.map(|all| {
            let mut m = Measurements {
                bytes: self.cfg.bytes,
                reps: self.cfg.reps,
                reach: Vec::new(),
                nodes: Vec::new(),
                intra_node: Vec::new(),
                inter_node: Vec::new(),
                devices: Vec::new(),
                seconds: start.elapsed().as_secs_f64(),
            };
            for (steps, node, facts) in all {
                m.nodes.extend(node);
                m.devices.push(facts);
                for s in steps {
                    match s {
                        Step::Reach(p) => m.reach.push(p),
                        Step::Intra(p) => m.intra_node.push(p),
                        Step::Inter(p) => m.inter_node.push(p),
                    }
                }
            }
            m.nodes.sort_by_key(|n| n.node);
            for v in [&mut m.reach, &mut m.intra_node, &mut m.inter_node] {
                v.sort_by_key(|p| (p.a, p.b));
            }
            m
        }))
    }

    /// Measures `plan`'s tasks (rank 0's plan, broadcast) one at a time with
    /// every other rank idle, in passes while suspects stay low: each
    /// task's best figure and the passes taken.
    fn retake(
        &self,
        world: &GroupCoordinator<'_>,
        plan: Option<&verdict::Plan>,
        node_comm: &SimpleCommunicator,
        device_node: Option<&GroupCoordinator<'_>>,
    ) -> Result<(Vec<f64>, usize)> {
        let (cfg, me, node) = (self.cfg, self.me, self.node);
        let planned = plan.map(|p| (p.tasks.clone(), p.reps.clone()));
        let (tasks, reps) = world.broadcast_object(planned.as_ref(), 0)?;
        let mut figures = vec![0.0f64; tasks.len()];
        let mut todo: Vec<usize> = (0..tasks.len()).collect();
        let mut passes = 0;
        while !todo.is_empty() {
            passes += 1;
            let mut alone = vec![0.0; tasks.len()];
            for &k in &todo {
                self.probe.barrier(&format!("retake {k}"));
                match tasks[k] {
                    Task::Pair(a, b) if me == a || me == b => {
                        let peer = a + b - me;
                        let t =
                            self.probe
                                .best_exchange(peer, cfg.bytes, reps[k], "measured alone");
                        alone[k] = cfg.bytes as f64 / t / 1e9;
                    }
                    Task::AllReduce(n) if n == node => {
                        alone[k] = node_all_reduce(node_comm, cfg.bytes, reps[k])
                    }
                    Task::DeviceAllReduce(n) if n == node => {
                        if let Some(g) = device_node {
                            alone[k] =
                                device_all_reduce(g, node_comm, cfg.bytes, reps[k]).unwrap_or(0.0)
                        }
                    }
                    _ => {}
                }
            }
            self.probe.barrier("retakes");
            // A retake's figure is known to its participants (both ends of a
            // pair saw the same exchanges; a node's ranks agree): the largest.
            let mut got = vec![0.0; tasks.len()];
            self.comm
                .all_reduce_into(&alone[..], &mut got[..], SystemOperation::max());
            for (f, g) in figures.iter_mut().zip(got) {
                *f = f64::max(*f, g);
            }
            todo = if passes < verdict::PASSES {
                let again = plan.map(|p| p.still_low(&figures, cfg.threshold));
                world.broadcast_object(again.as_ref(), 0)?
            } else {
                Vec::new()
            };
        }
        Ok((figures, passes))
    }
}

/// Bus bandwidth of an all_reduce of `bytes` over `node_comm`, GB/s: the
/// best of `reps` on each rank, the node's figure its slowest rank's.
fn node_all_reduce(node_comm: &SimpleCommunicator, bytes: usize, reps: usize) -> f64 {
    let n = bytes / 4;
    let send = vec![1.0f32; n];
    let mut recv = vec![0f32; n];
    node_comm.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        node_comm.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mut slowest = 0.0;
    node_comm.all_reduce_into(&best, &mut slowest, SystemOperation::max());
    let p = node_comm.size() as f64;
    bytes as f64 / slowest / 1e9 * 2.0 * (p - 1.0) / p
}

/// Bus bandwidth of a device all_reduce of `bytes` over `g` (a node's
/// ranks), GB/s, as [`node_all_reduce`] on the host. Every rank prepares its
/// buffer first and the node agrees that all did, so a rank that cannot
/// never leaves the others in a collective.
fn device_all_reduce(
    g: &GroupCoordinator<'_>,
    node_comm: &SimpleCommunicator,
    bytes: usize,
    reps: usize,
) -> Result<f64> {
    let prepared = g.device().and_then(|d| {
        let t = d.gpu().zeros([bytes.div_ceil(4)], DType::F32)?;
        Ok((d, t))
    });
    let mut all = 0u8;
    node_comm.all_reduce_into(
        &u8::from(prepared.is_ok()),
        &mut all,
        SystemOperation::min(),
    );
    let (d, mut t) = match (prepared, all) {
        (Ok(p), 1) => p,
        (Err(e), _) => return Err(e),
        (Ok(_), _) => {
            return Err(crate::Error::Gpu(
                "another rank of the node could not prepare its device buffer".into(),
            ))
        }
    };
    d.all_reduce_in_place(&mut t, ReduceOp::Sum)?;
    d.gpu().synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        d.all_reduce_in_place(&mut t, ReduceOp::Sum)?;
        d.gpu().synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    let mut slowest = 0.0;
    node_comm.all_reduce_into(&best, &mut slowest, SystemOperation::max());
    let p = node_comm.size() as f64;
    Ok(bytes as f64 / slowest / 1e9 * 2.0 * (p - 1.0) / p)
}

/// An error's text on one line (a report row or finding).
fn one_line(e: crate::Error) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One rank's finding, sent to rank 0.
#[derive(Serialize, Deserialize)]
enum Step {
    Reach(PairResult),
    Intra(PairResult),
    Inter(PairResult),
}

/// A pair from a latency and a bandwidth time (seconds per exchange of
/// `bytes`; 0 for what was not measured).
fn pair(a: usize, b: usize, latency_s: f64, bw_s: f64, bytes: usize) -> PairResult {
    PairResult {
        a,
        b,
        latency_us: latency_s * 1e6,
        bandwidth_gbs: if bw_s > 0.0 {
            bytes as f64 / bw_s / 1e9
        } else {
            0.0
        },
    }
}
