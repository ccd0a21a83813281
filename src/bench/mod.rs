//! `rankmesh bench`: nccl-tests-compatible collective benchmarks.
//!
//! The harness follows nccl-tests: warm-up at the largest and smallest size,
//! then per size a synchronising call, `iters × agg` back-to-back calls timed
//! with the host clock, the per-iteration time combined across ranks (`-a`),
//! and a separate validation call (`-c`) against exact expected data. Each
//! collective only describes itself (`entries.rs`); output is byte-compatible
//! (`format.rs`); JSON follows nccl-tests' version-3 keys (`json.rs`).

mod baseline;
pub mod config;
mod device;
pub mod entries;
pub mod extras;
pub mod format;
mod host;
pub mod json;
pub mod memory;
pub mod plot;
pub mod workload;

use crate::error::{Error, Result};
use crate::group::Collectives;
use crate::group::Runtime;
use crate::group::{DeviceGroup, GroupCoordinator};
use crate::object::Objects;
use crate::op::Op;
use crate::op::ReduceOp;
use crate::parallel::ParallelState;
use crate::tensor::Tensor;
pub use config::{
    nccl_type_name, parse_dtype, parse_size, sizes, Average, BenchConfig, GroupChoice,
};
use entries::Split;
use extras::Extras;
use format::{Cell, PerIter};
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// One printed row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// Group name (`world`, `tp:1`).
    pub group: String,
    /// Bytes (max of send and receive per rank).
    pub size: usize,
    /// Elements per rank (nccl-tests' count).
    pub count: usize,
    /// nccl-tests type name.
    pub dtype: String,
    /// Reduction name or `none`.
    pub redop: String,
    /// Root or -1.
    pub root: i64,
    /// Out-of-place measurement.
    pub out_of_place: Cell,
    /// In-place measurement (a real in-place call where the op has one).
    pub in_place: Cell,
    /// The raw library's time (MPI or NCCL) for the out-of-place call.
    pub baseline: Option<Cell>,
    /// `--stats`: per-iteration times of the two timing columns.
    pub per_iter: Option<[PerIter; 2]>,
}

/// Everything a run produced, for printing, JSON and exit status.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Rows of every group (world rank 0 only; empty elsewhere).
    pub rows: Vec<Row>,
    /// Groups as (name, world ranks), in report order.
    pub groups: Vec<(String, Vec<usize>)>,
    /// Rows with wrong elements.
    pub wrong_rows: u64,
    /// Mean bus bandwidth over all rows.
    pub avg_busbw: f64,
    /// Every rank's device entry (world rank 0 only).
    pub devices: Vec<json::Device>,
    /// NCCL's version code (0: host plane).
    pub nccl_version: i32,
}

/// Combines a per-rank value across the group as `-a` says.
fn combine(g: &GroupCoordinator<'_>, v: f64, how: Average) -> Result<f64> {
    let t = crate::Tensor::from_vec([1], vec![v])?;
    let op = match how {
        Average::Rank0 => {
            let mut t = t;
            g.broadcast(&mut t, 0)?;
            return Ok(t.as_slice::<f64>()?[0]);
        }
        Average::Mean => ReduceOp::Avg,
        Average::Min => ReduceOp::Min,
        Average::Max => ReduceOp::Max,
    };
    Ok(g.all_reduce(&t, op)?.as_slice::<f64>()?[0])
}

/// Runs the benchmark on every rank; world rank 0's report holds every row.
pub fn run(rt: &Runtime, cfg: &BenchConfig, out: &mut dyn Write) -> Result<BenchReport> {
    let mut ps = ParallelState::new(rt)?;
    let group = bench_group(&mut ps, cfg)?;
    cfg.validate(group.size())?;
    let world = ps.world().clone();
    agree_memory(rt, cfg, &group, &world)?;
    let groups = groups_of(&world, &group)?;
    let group_index = groups
        .iter()
        .position(|(n, _)| n == group.name())
        .unwrap_or(0);
    let dg = match cfg.device {
        true => {
            let dg = group.device()?;
            dg.connect()?;
            Some(dg)
        }
        false => None,
    };
    // Device lines gathered in rank order, as nccl-tests prints them.
    let mine = device_entry(rt, &group, group_index, dg.as_ref());
    let devices = world.gather_object(&mine, 0)?.unwrap_or_default();
    let nccl_version = dg.map_or(0, |d| d.gpu().nccl().map_or(0, |n| n.version_code()));
    // -R: what every rank's library can register, agreed (a window is
    // collective); a library without it runs unregistered, as nccl-tests.
    let (registration, register_note) = device::registration(cfg, dg.as_ref(), &world)?;
    if world.is_first_rank() {
        let head = Heading {
            devices: &devices,
            register_note: register_note.as_deref(),
            nccl_version,
        };
        print_heading(out, cfg, &group, &head)?;
    }
    let sweep = sizes(cfg);
    let mut all_rows = Vec::new();
    let mut cycle = 0;
    while cfg.cycles == 0 || cycle < cfg.cycles {
        cycle += 1;
        let rows = match &dg {
            Some(dg) => one_sweep(
                &device::DeviceBench::new(*dg, registration),
                cfg,
                &sweep,
                cycle == 1,
            )?,
            None => one_sweep(&host::HostBench(&group), cfg, &sweep, cycle == 1)?,
        };
        all_rows.extend(print_cycle(out, cfg, &world, &group, &groups, rows)?);
    }
    let (wrong_rows, avg_busbw) = verdict(&world, &all_rows)?;
    if world.is_first_rank() {
        write_out(
            out,
            &format::footer(wrong_rows, avg_busbw, cfg.min_bw, &cfg.op.program()),
        )?;
    }
    Ok(BenchReport {
        rows: all_rows,
        groups,
        wrong_rows,
        avg_busbw,
        devices,
        nccl_version,
    })
}

/// The group `cfg` benchmarks: the world, or a TP, SP or DP group of its
/// model-parallel layout.
fn bench_group<'rt>(
    ps: &mut ParallelState<'rt>,
    cfg: &BenchConfig,
) -> Result<GroupCoordinator<'rt>> {
    Ok(match cfg.group {
        GroupChoice::World => ps.world().clone(),
        kind => {
            ps.initialize_model_parallel(cfg.tp, cfg.sp, None)?;
            match kind {
                GroupChoice::Tp => ps.tp()?,
                GroupChoice::Sp => ps.sp()?,
                _ => ps.dp()?,
            }
        }
    })
}

/// Every rank checks its own memory for the sweep; the first refusal is
/// every rank's error.
fn agree_memory(
    rt: &Runtime,
    cfg: &BenchConfig,
    group: &GroupCoordinator<'_>,
    world: &GroupCoordinator<'_>,
) -> Result<()> {
    let refusal = memory::refuse(cfg, group.size(), rt.world().me().local_size);
    let refusals: Vec<Option<String>> = world.all_gather_object(&refusal)?;
    match refusals
        .iter()
        .enumerate()
        .find_map(|(r, m)| m.as_ref().map(|m| (r, m)))
    {
        Some((r, msg)) => Err(Error::Usage {
            what: "bench",
            group: "world".into(),
            msg: format!("rank {r}: {msg}"),
        }),
        None => Ok(()),
    }
}

/// Every benchmarked group once (its name and world ranks), in the order
/// of their first ranks.
fn groups_of(
    world: &GroupCoordinator<'_>,
    group: &GroupCoordinator<'_>,
) -> Result<Vec<(String, Vec<usize>)>> {
    Ok(world
        .all_gather_object(&(group.name().to_string(), group.ranks().to_vec()))?
        .into_iter()
        .enumerate()
        .filter(|(r, (_, ranks))| ranks[0] == *r)
        .map(|(_, g)| g)
        .collect())
}

/// This rank's device line: its GPU, or host memory and the executor.
fn device_entry(
    rt: &Runtime,
    group: &GroupCoordinator<'_>,
    group_index: usize,
    dg: Option<&DeviceGroup<'_, '_>>,
) -> json::Device {
    let (device, device_hex, device_info) = match dg {
        Some(dg) => {
            let i = dg.gpu().info();
            (i.ordinal as i32, i.bus_id.clone(), i.name.clone())
        }
        None => {
            let executor = match group.host_executor() {
                "shm" => "shared memory",
                "mpi" => "MPI",
                "hier" => "shared memory within nodes and MPI across them",
                other => other,
            };
            (-1, "0000:00:00".into(), format!("host memory ({executor})"))
        }
    };
    json::Device {
        rank: rt.rank(),
        group: group_index,
        pid: std::process::id(),
        hostname: rt.world().me().host.clone(),
        device,
        device_hex,
        device_info,
    }
}

/// What the heading prints besides the configuration.
struct Heading<'a> {
    devices: &'a [json::Device],
    register_note: Option<&'a str>,
    nccl_version: i32,
}

/// nccl-tests' preamble, the device lines, the host executors by size and
/// the column header (world rank 0).
fn print_heading(
    out: &mut dyn Write,
    cfg: &BenchConfig,
    group: &GroupCoordinator<'_>,
    head: &Heading<'_>,
) -> Result<()> {
    let (step, factor) = if cfg.step_factor > 1 {
        (cfg.step_factor, true)
    } else {
        (cfg.step_bytes, false)
    };
    let pre = format::Preamble {
        program: &cfg.op.program(),
        min_bytes: cfg.min_bytes,
        max_bytes: cfg.max_bytes,
        step: (step, factor),
        warmup: cfg.warmup,
        iters: cfg.iters,
        agg: cfg.agg,
        check: cfg.check,
        blocking: cfg.blocking,
        nccl_version: head.nccl_version,
    };
    write_out(out, &format::preamble(&pre))?;
    if let Some(note) = head.register_note {
        write_out(out, &format!("# {note}\n"))?;
    }
    let lines: String = head
        .devices
        .iter()
        .map(|d| {
            format::device_line(
                d.rank,
                d.group,
                d.pid,
                &d.hostname,
                d.device,
                &d.device_hex,
                &d.device_info,
            )
        })
        .collect();
    write_out(out, &lines)?;
    if !cfg.device {
        if let Some(line) = executors_by_size(group, cfg, &sizes(cfg)) {
            write_out(out, &line)?;
        }
    }
    write_out(out, &format::header())
}

/// One cycle's rows: each group's first rank holds its group's, world
/// rank 0 gathers and prints them all (a heading per group when there are
/// several) and returns them; other ranks return none.
fn print_cycle(
    out: &mut dyn Write,
    cfg: &BenchConfig,
    world: &GroupCoordinator<'_>,
    group: &GroupCoordinator<'_>,
    groups: &[(String, Vec<usize>)],
    rows: Vec<Row>,
) -> Result<Vec<Row>> {
    let extras = Extras {
        baseline: cfg.baseline,
        stats: cfg.stats,
        device: cfg.device,
    };
    let mine = group.is_first_rank().then_some(rows);
    let Some(gathered) = world.gather_object(&mine, 0)? else {
        return Ok(Vec::new());
    };
    let mut printed = Vec::new();
    for rows in gathered.into_iter().flatten() {
        let name = rows.first().map_or("", |r| r.group.as_str());
        if groups.len() > 1 {
            let ranks = groups
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.clone())
                .unwrap_or_default();
            write_out(out, &format!("# Group {name} ranks {ranks:?}\n"))?;
        }
        let text: String = rows.iter().map(render_row).collect();
        write_out(out, &(text + &extras::tables(&rows, extras)))?;
        printed.extend(rows);
    }
    Ok(printed)
}

/// Rows with a wrong element, and the average bus bandwidth over every
/// cell: rank 0's figures, on every rank, so every rank exits alike.
fn verdict(world: &GroupCoordinator<'_>, rows: &[Row]) -> Result<(u64, f64)> {
    let wrong_rows = rows
        .iter()
        .filter(|r| r.out_of_place.wrong.unwrap_or(0) + r.in_place.wrong.unwrap_or(0) > 0)
        .count() as u64;
    let cells: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
        .collect();
    let avg_busbw = match cells.is_empty() {
        true => 0.0,
        false => cells.iter().sum::<f64>() / cells.len() as f64,
    };
    world.broadcast_object(Some(&(wrong_rows, avg_busbw)), 0)
}

fn write_out(out: &mut dyn Write, s: &str) -> Result<()> {
    out.write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Error::Usage {
            what: "bench",
            group: "world".into(),
            msg: format!("cannot write the report: {e}"),
        })
}

/// One row exactly as nccl-tests prints it.
pub fn render_row(r: &Row) -> String {
    let mut line = format::row_start(r.size, r.count, &r.dtype, &r.redop, r.root);
    line += &format::cell(&r.out_of_place);
    line += &format::cell(&r.in_place);
    line + "\n"
}

/// What the harness needs from a data plane; everything else (sweep,
/// warm-up, timing, validation, rows) is one harness for every plane.
pub(crate) trait BenchPlane<'rt> {
    /// The plane's collectives.
    type C: Collectives<'rt>;

    /// The plane's group.
    fn coll(&self) -> &Self::C;

    /// A plane tensor holding `t`.
    fn upload(&self, t: &Tensor) -> Result<PlaneT<'rt, Self>>;

    /// A benchmark buffer holding `t`, and what keeps its memory (a
    /// registered buffer, `-R`): by default an upload, with nothing held.
    fn buffer(&self, t: &Tensor) -> Result<(PlaneT<'rt, Self>, Option<HeldBox<'rt>>)> {
        Ok((self.upload(t)?, None))
    }

    /// Overwrites `d` with `t` (same shape and dtype).
    fn upload_into(&self, t: &Tensor, d: &mut PlaneT<'rt, Self>) -> Result<()>;

    /// `d` on the host, after the work enqueued before.
    fn download(&self, d: &PlaneT<'rt, Self>) -> Result<Tensor>;

    /// Waits for enqueued work (the device stream; nothing on the host).
    fn settle(&self) -> Result<()>;

    /// The same data movement with the plane's raw library (no rankmesh
    /// layer); `Ok(false)` when it has no equivalent.
    fn baseline(
        &self,
        cfg: &BenchConfig,
        input: &PlaneT<'rt, Self>,
        output: &mut PlaneT<'rt, Self>,
        split: &Split,
    ) -> Result<bool>;

    /// Ops outside the tensor op list (the object plane).
    fn run_other(
        &self,
        cfg: &BenchConfig,
        input: &PlaneT<'rt, Self>,
        output: &mut PlaneT<'rt, Self>,
    ) -> Result<()>;
}

/// Memory a bench buffer lives in, released when dropped (after the
/// buffer's tensor, which only borrows it).
pub(crate) trait Held {}

/// What a plane holds for one buffer.
pub(crate) type HeldBox<'rt> = Box<dyn Held + 'rt>;

/// The tensor type of a bench plane.
pub(crate) type PlaneT<'rt, P> = <<P as BenchPlane<'rt>>::C as Collectives<'rt>>::Tensor;

/// One call of the benchmarked collective through the plane's [`Collectives`].
fn run_op<'rt, P: BenchPlane<'rt>>(
    p: &P,
    cfg: &BenchConfig,
    input: &PlaneT<'rt, P>,
    output: &mut PlaneT<'rt, P>,
    split: &Split,
) -> Result<()> {
    let (red, root) = (cfg.redop, cfg.root);
    cfg.op
        .call(p.coll(), (red, root), input, output, split)
        .unwrap_or_else(|| p.run_other(cfg, input, output))
}

/// Whether the in-place column makes a real in-place call: all_reduce on
/// the output buffer (broadcast is in place in both columns). The other
/// collectives have no in-place form; their column is a second,
/// independently timed run of the out-of-place call.
fn really_in_place(cfg: &BenchConfig, in_place: bool) -> bool {
    in_place && cfg.op.op == Op::AllReduce
}

/// One call of the out-of-place (`in_place == false`) or in-place column.
fn run_column<'rt, P: BenchPlane<'rt>>(
    p: &P,
    cfg: &BenchConfig,
    in_place: bool,
    input: &PlaneT<'rt, P>,
    output: &mut PlaneT<'rt, P>,
    split: &Split,
) -> Result<()> {
    if really_in_place(cfg, in_place) {
        p.coll().all_reduce_in_place(output, cfg.redop)
    } else {
        run_op(p, cfg, input, output, split)
    }
}

/// Plane buffers for one size, with the host data they are reset from.
struct Buffers<'rt, P: BenchPlane<'rt>> {
    host: (Tensor, Tensor),
    input: PlaneT<'rt, P>,
    output: PlaneT<'rt, P>,
    /// The uneven entries' counts on this rank.
    split: Split,
    /// The memory under `input` and `output` when the plane keeps it
    /// (dropped after them: fields drop in order).
    _held: [Option<HeldBox<'rt>>; 2],
}

impl<'rt, P: BenchPlane<'rt>> Buffers<'rt, P> {
    fn new(p: &P, cfg: &BenchConfig, count: usize) -> Result<Self> {
        let g = p.coll().group();
        let who = (g.rank_in_group(), g.size());
        let split = cfg.op.split(count, who, cfg.dtype.size(), cfg.skew);
        let host = cfg
            .op
            .buffers(count, cfg.dtype, who, cfg.redop, cfg.root, &split)?;
        let (input, held_in) = p.buffer(&host.0)?;
        let (output, held_out) = p.buffer(&host.1)?;
        Ok(Buffers {
            input,
            output,
            host,
            split,
            _held: [held_in, held_out],
        })
    }

    /// Restores the initial data. A real in-place call starts from the
    /// input in the output buffer, as nccl-tests' in-place runs do.
    fn reset(&mut self, p: &P, cfg: &BenchConfig, in_place: bool) -> Result<()> {
        p.upload_into(&self.host.0, &mut self.input)?;
        let out = if really_in_place(cfg, in_place) {
            &self.host.0
        } else {
            &self.host.1
        };
        p.upload_into(out, &mut self.output)
    }
}

/// One cycle of the sweep on one plane: warm-up, then every size.
fn one_sweep<'rt, P: BenchPlane<'rt>>(
    p: &P,
    cfg: &BenchConfig,
    sweep: &[usize],
    first_cycle: bool,
) -> Result<Vec<Row>> {
    let is_main = p.coll().group().runtime().rank() == 0;
    let progress = cfg.progress && is_main && std::io::stderr().is_terminal();
    warm_up(p, cfg, sweep)?;
    let mut rows = Vec::new();
    for (k, &size) in sweep.iter().enumerate() {
        if progress {
            eprint!(
                "\r[rankmesh bench] {} B ({}/{})   ",
                size,
                k + 1,
                sweep.len()
            );
        }
        rows.push(measure_size(p, cfg, size, first_cycle && k == 0)?);
    }
    if progress {
        eprint!("\r{:60}\r", "");
    }
    Ok(rows)
}

/// Warm-up calls at the largest and smallest size, as nccl-tests does.
fn warm_up<'rt, P: BenchPlane<'rt>>(p: &P, cfg: &BenchConfig, sweep: &[usize]) -> Result<()> {
    for &size in [sweep.last(), sweep.first()].into_iter().flatten() {
        let mut b = Buffers::new(p, cfg, size / cfg.dtype.size())?;
        for _ in 0..cfg.warmup {
            run_op(p, cfg, &b.input, &mut b.output, &b.split)?;
        }
    }
    p.settle()
}

/// Times `iters × agg` calls of `call` after one synchronising call, as
/// nccl-tests does; returns this rank's seconds per call (not yet combined
/// across ranks) and, with `--stats`, its per-iteration samples (µs).
/// `settle` waits for enqueued work (the device stream; nothing on the host
/// plane). `-z` as nccl-tests: 1 waits and barriers after each call, 2 waits
/// after each call, 3 waits and barriers after each outer iteration with the
/// barrier left out of the time.
fn time_calls(
    g: &GroupCoordinator<'_>,
    cfg: &BenchConfig,
    mut call: impl FnMut() -> Result<()>,
    mut settle: impl FnMut() -> Result<()>,
) -> Result<(f64, Vec<f64>)> {
    call()?;
    settle()?;
    g.barrier()?;
    let mut samples = Vec::with_capacity(if cfg.stats { cfg.iters } else { 0 });
    let mut excluded = 0.0;
    let start = Instant::now();
    for _ in 0..cfg.iters {
        let it = cfg.stats.then(Instant::now);
        for _ in 0..cfg.agg {
            call()?;
            if cfg.blocking == 1 || cfg.blocking == 2 {
                settle()?;
            }
            if cfg.blocking == 1 {
                g.barrier()?;
            }
        }
        if cfg.stats || cfg.blocking == 3 {
            settle()?;
        }
        if cfg.stats {
            let it = it.expect("set when stats are on");
            samples.push(it.elapsed().as_secs_f64() * 1e6 / cfg.agg as f64);
        }
        if cfg.blocking == 3 {
            let b = Instant::now();
            g.barrier()?;
            excluded += b.elapsed().as_secs_f64();
        }
    }
    settle()?;
    let busy = start.elapsed().as_secs_f64() - excluded;
    Ok((busy / (cfg.iters * cfg.agg) as f64, samples))
}

/// One size of the sweep, as nccl-tests reports it: bytes moved per rank,
/// the printed element count, and the bus-bandwidth factor.
struct Sizing {
    bytes: usize,
    count: usize,
    param: usize,
    bus_factor: f64,
}

impl Sizing {
    fn new(g: &GroupCoordinator<'_>, cfg: &BenchConfig, size: usize) -> Sizing {
        let elem = cfg.dtype.size();
        let count = size / elem;
        let (send, recv, param) = cfg.op.counts(count, g.size(), elem);
        Sizing {
            bytes: send.max(recv) * elem,
            count,
            param,
            bus_factor: cfg.op.bus_factor(g.size()),
        }
    }

    /// A measured cell from (combined) seconds per call.
    fn cell(&self, secs: f64, wrong: Option<u64>) -> Cell {
        let algbw = if secs > 0.0 {
            self.bytes as f64 / 1e9 / secs
        } else {
            0.0
        };
        Cell {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * self.bus_factor,
            wrong,
        }
    }

    /// The printed row.
    fn row(
        &self,
        g: &GroupCoordinator<'_>,
        cfg: &BenchConfig,
        cells: [Cell; 2],
        baseline: Option<Cell>,
        per_iter: Option<[PerIter; 2]>,
    ) -> Row {
        let op = cfg.op;
        Row {
            group: g.name().to_string(),
            size: self.bytes,
            count: self.param,
            dtype: nccl_type_name(cfg.dtype).to_string(),
            redop: if op.shows_redop() {
                cfg.redop.name().to_string()
            } else {
                "none".to_string()
            },
            root: if op.rooted() { cfg.root as i64 } else { -1 },
            out_of_place: cells[0],
            in_place: cells[1],
            baseline,
            per_iter,
        }
    }
}

/// `-c`: up to `cfg.check` validation runs, each counting this rank's wrong
/// elements with `run_and_count`; the group's total of the first failing
/// run (or 0). `None` when validation is off.
fn validate(
    g: &GroupCoordinator<'_>,
    cfg: &BenchConfig,
    mut run_and_count: impl FnMut() -> Result<u64>,
) -> Result<Option<u64>> {
    let mut wrong = None;
    for _ in 0..cfg.check {
        let t = crate::Tensor::from_vec([1], vec![run_and_count()?])?;
        let total = g.all_reduce(&t, ReduceOp::Sum)?.as_slice::<u64>()?[0];
        wrong = Some(total);
        if total > 0 {
            break;
        }
    }
    Ok(wrong)
}

/// Measures one size: out-of-place, in-place, baseline and statistics.
fn measure_size<'rt, P: BenchPlane<'rt>>(
    p: &P,
    cfg: &BenchConfig,
    size: usize,
    first: bool,
) -> Result<Row> {
    let g = p.coll().group();
    let sizing = Sizing::new(g, cfg, size);
    let mut b = Buffers::new(p, cfg, sizing.count)?;
    let who = (g.rank_in_group(), g.size());
    if cfg.baseline {
        // Warm the size for both loops before timing either: otherwise
        // rankmesh's loop, timed first, pays for first touches (buffers,
        // MPI's state for this message size) that the raw loop, timed
        // last, does not. Without `--baseline` the run is nccl-tests'.
        b.reset(p, cfg, false)?;
        for _ in 0..cfg.warmup {
            p.baseline(cfg, &b.input, &mut b.output, &b.split)?;
            run_column(p, cfg, false, &b.input, &mut b.output, &b.split)?;
        }
        p.settle()?;
    }
    let mut cells = Vec::new();
    let mut per_iter = Vec::new();
    for in_place in [false, true] {
        b.reset(p, cfg, in_place)?;
        let (secs, samples) = time_calls(
            g,
            cfg,
            || run_column(p, cfg, in_place, &b.input, &mut b.output, &b.split),
            || p.settle(),
        )?;
        let secs = combine(g, secs, cfg.average)?;
        if cfg.stats {
            per_iter.push(PerIter::of(g.all_gather_object(&samples)?));
        }
        g.barrier()?;
        let corrupt = cfg.corrupt && first && !in_place && g.is_first_rank();
        let wrong = validate(g, cfg, || {
            b.reset(p, cfg, in_place)?;
            run_column(p, cfg, in_place, &b.input, &mut b.output, &b.split)?;
            let mut got = p.download(&b.output)?;
            if corrupt && got.numel() > 0 {
                got.bytes_mut()[0] ^= 0x5a;
            }
            let (len, how) = (b.host.0.numel(), (cfg.redop, cfg.root));
            Ok(cfg.op.count_wrong(who, len, &got, how, &b.split))
        })?;
        cells.push(sizing.cell(secs, wrong));
    }
    let baseline = if cfg.baseline {
        b.reset(p, cfg, false)?;
        let mut supported = true;
        let (secs, _) = time_calls(
            g,
            cfg,
            || {
                supported = p.baseline(cfg, &b.input, &mut b.output, &b.split)?;
                Ok(())
            },
            || p.settle(),
        )?;
        let secs = combine(g, secs, cfg.average)?;
        supported.then(|| sizing.cell(secs, None))
    } else {
        None
    };
    let per_iter = <[PerIter; 2]>::try_from(per_iter).ok();
    Ok(sizing.row(g, cfg, [cells[0], cells[1]], baseline, per_iter))
}

/// For a group spanning nodes, which host executor each size of the sweep
/// runs on (the node-aware stages pay from a crossover per op), as one `#`
/// line of ranges; `None` where one executor runs every size (the device
/// lines name it).
fn executors_by_size(
    group: &GroupCoordinator,
    cfg: &BenchConfig,
    sweep: &[usize],
) -> Option<String> {
    if group.host_executor() != "hier" {
        return None;
    }
    let name = |e: &str| match e {
        "hier" => "node-aware (shared memory within nodes, MPI across them)",
        _ => "MPI (flat)",
    };
    let mut runs: Vec<(usize, usize, &str)> = Vec::new();
    for &size in sweep {
        let e = group.host_executor_for(cfg.op.op, size);
        match runs.last_mut() {
            Some(last) if last.2 == e => last.1 = size,
            _ => runs.push((size, size, e)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|(lo, hi, e)| match lo == hi {
            true => format!("{lo} B {}", name(e)),
            false => format!("{lo}-{hi} B {}", name(e)),
        })
        .collect();
    Some(format!("#  Host executor by size: {}\n", parts.join("; ")))
}
