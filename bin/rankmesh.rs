//! `rankmesh`: the command-line front end. Thin: parsing and printing only.

// No function over 80 lines of code (clippy.toml; see src/lib.rs).
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

use clap::{Args, Parser, Subcommand, ValueEnum};
use rankmesh::tools::bench::{self, entries::Entry, Average, BenchConfig, GroupChoice};
use rankmesh::tools::topo::TopoReport;
use rankmesh::Objects as _;
use rankmesh::{placement::BindPolicy, Error, ParallelState, Runtime};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rankmesh",
    version,
    about = "Collective communication runtime for MPI-launched jobs"
)]
struct Cli {
    /// CPU binding applied at start (overrides RANKMESH_BIND).
    #[arg(long, global = true, value_enum)]
    bind: Option<BindPolicy>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show where every rank runs and which TP/SP/DP groups it belongs to.
    Topo {
        /// Tensor-parallel size.
        #[arg(long, default_value_t = 1)]
        tp: usize,
        /// Sequence-parallel size.
        #[arg(long, default_value_t = 1)]
        sp: usize,
        /// Data-parallel size (must equal world size / sp when given).
        #[arg(long)]
        dp: Option<usize>,
        /// Print one JSON document instead of a table.
        #[arg(long)]
        json: bool,
        /// A named mesh instead of TP/SP/DP: sizes such as `pp=2,dp=2,tp=2`,
        /// row-major (the last dimension fastest, as torch's init_device_mesh).
        #[arg(long, conflicts_with_all = ["tp", "sp", "dp"])]
        mesh: Option<String>,
        /// With --mesh: a Megatron order string (`tp-dp-pp`, the first name fastest).
        #[arg(long, requires = "mesh")]
        order: Option<String>,
        /// With --mesh: dimensions whose groups must each lie on one node (`tp`).
        #[arg(long = "intra-node", requires = "mesh", value_delimiter = ',')]
        intra_node: Vec<String>,
    },
    /// nccl-tests-compatible collective benchmark (run under mpirun/srun).
    Bench(Box<BenchArgs>),
    /// A self-checking TP/SP/DP workload (all_reduce, all_to_all_4d, avg).
    Workload {
        /// Tensor-parallel size.
        #[arg(long, default_value_t = 1)]
        tp: usize,
        /// Sequence-parallel size.
        #[arg(long, default_value_t = 1)]
        sp: usize,
        /// Steps to run.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Local sequence length (tokens per rank).
        #[arg(long, default_value_t = 256)]
        tokens: usize,
    },
    /// Find the broken or slow node, rank or link (run under mpirun/srun);
    /// exits non-zero when anything is flagged.
    Doctor(DoctorArgs),
    /// Plot bus bandwidth and time against size from `bench -J` files.
    Plot {
        /// JSON files written by `rankmesh bench -J` (or nccl-tests).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Output SVG file.
        #[arg(short, long)]
        output: PathBuf,
    },
}

#[derive(Args)]
struct DoctorArgs {
    /// Bytes per bandwidth message (K/M/G suffixes are powers of 1024).
    #[arg(long, default_value = "1M")]
    bytes: String,
    /// Timed repetitions per measurement; the best counts.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Longer, more precise run: 16 MiB messages, 20 repetitions.
    #[arg(long)]
    long: bool,
    /// Flag what is below this fraction of the reference: the median of its
    /// kind, measured alone (suspects from the concurrent rounds are
    /// measured again with every other rank idle before they count).
    #[arg(long, default_value_t = 0.8)]
    threshold: f64,
    /// Seconds any single wait may take before the silent peer is named.
    #[arg(long, default_value_t = 30.0)]
    deadline: f64,
    /// Write the measurements and findings as JSON to this file.
    #[arg(short = 'J', long = "output_json")]
    json: Option<PathBuf>,
    /// Write the node-to-node bandwidth heatmap (SVG) to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn doctor_usage(msg: String) -> Error {
    Error::Usage {
        what: "doctor",
        group: "world".into(),
        msg,
    }
}

impl DoctorArgs {
    fn config(&self) -> rankmesh::Result<rankmesh::tools::doctor::DoctorConfig> {
        let bad = doctor_usage;
        let (bytes, reps) = if self.long {
            (16 << 20, 20)
        } else {
            let b = bench::parse_size(&self.bytes)
                .filter(|b| *b > 0 && *b <= 1 << 30)
                .ok_or_else(|| bad(format!("--bytes {:?}: a size from 1 to 1G", self.bytes)))?;
            (b, self.reps)
        };
        if reps == 0 {
            return Err(bad("--reps must be at least 1".into()));
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(bad(format!(
                "--threshold {}: a fraction in (0, 1]",
                self.threshold
            )));
        }
        if !(self.deadline > 0.0 && self.deadline <= 86_400.0) {
            return Err(bad(format!(
                "--deadline {}: seconds in (0, 86400]",
                self.deadline
            )));
        }
        Ok(rankmesh::tools::doctor::DoctorConfig {
            bytes,
            reps,
            threshold: self.threshold,
            deadline: std::time::Duration::from_secs_f64(self.deadline),
        })
    }
}

fn run_doctor(rt: &Runtime, args: &DoctorArgs) -> rankmesh::Result<()> {
    use rankmesh::tools::doctor::{self, report};
    let cfg = args.config()?;
    let Some(o) = doctor::run(rt, &cfg)? else {
        return Ok(());
    };
    let bad = doctor_usage;
    let findings = &o.judgement.findings;
    print!("{}", report::table(&o, cfg.threshold));
    if let Some(path) = &args.json {
        let doc = report::Document::new(&o, cfg.threshold);
        let text = serde_json::to_string_pretty(&doc).expect("report is plain data");
        std::fs::write(path, text)
            .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.svg {
        let svg = report::heatmap(&o.measurements, findings, cfg.threshold);
        std::fs::write(path, svg)
            .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))?;
    }
    if findings.is_empty() {
        Ok(())
    } else {
        Err(bad(format!(
            "{} finding(s): {}",
            findings.len(),
            findings
                .iter()
                .map(|f| format!("{} {}", f.kind, f.subject))
                .collect::<Vec<_>>()
                .join("; ")
        )))
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// MPI on host memory.
    Host,
    /// NCCL on GPU memory.
    Nccl,
    /// NCCL when available, else host.
    Auto,
}

#[derive(Clone, Copy, ValueEnum)]
enum GroupArg {
    World,
    Tp,
    Sp,
    Dp,
}

/// The bench's collectives, from its entry list (nccl-tests' `*_perf`
/// names are taken too).
fn collective_help() -> String {
    let names: Vec<&str> = bench::entries::ALL.iter().map(Entry::name).collect();
    format!("{} (or nccl-tests' *_perf names)", names.join(", "))
}

#[derive(Args)]
struct BenchArgs {
    #[arg(help = collective_help())]
    collective: String,
    /// Minimum size in bytes (K/M/G suffixes are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    min_bytes: String,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    max_bytes: String,
    /// Size increment (when -f is 1).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M")]
    step_bytes: String,
    /// Size multiplication factor.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    step_factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Calls aggregated per timed iteration.
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1)]
    agg: usize,
    /// Repeat the sweep this many times (0: until killed).
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    cycles: usize,
    /// Validation runs per size (0: off).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: usize,
    /// Reduction: sum, prod, max, min, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Data type: float, half, bfloat16, double, f8e4m3, f8e5m2, int8, uint8, int32, uint32, int64,
    /// uint64 (nccl-tests' names), bool, int16, uint16.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Root rank (broadcast, reduce).
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Uneven entries (alltoallv and the _v ones): per-member counts ramp
    /// from (1 - skew) to (1 + skew) times the nominal block, 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    skew: f64,
    /// Blocking: 1 wait and barrier after each call, 2 wait after each call
    /// (no barrier), 3 wait and barrier after each iteration (barrier not timed).
    #[arg(short = 'z', long = "blocking", default_value_t = 0)]
    blocking: usize,
    /// Time across ranks: 0 rank 0, 1 mean, 2 min, 3 max.
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    average: u8,
    /// Abort the run after this many seconds (0: never).
    #[arg(short = 'T', long = "timeout", default_value_t = 0)]
    timeout: u64,
    /// Write nccl-tests-style JSON (version 3) to this file.
    #[arg(short = 'J', long = "output_json")]
    json: Option<PathBuf>,
    /// Data plane.
    #[arg(long, value_enum, default_value = "auto")]
    backend: Backend,
    /// Run every group of this kind at once and report per group.
    #[arg(long, value_enum, default_value = "world")]
    group: GroupArg,
    /// Tensor-parallel size for --group.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Sequence-parallel size for --group.
    #[arg(long, default_value_t = 1)]
    sp: usize,
    /// Also time direct MPI calls (`mpi`, host plane) or NCCL calls (`nccl`,
    /// device plane) on the same buffers and print the ratio; each size is
    /// then warmed (-w rounds of both) before either is timed.
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
    /// Append per-iteration min/max/avg/p50/p99 across ranks.
    #[arg(long)]
    stats: bool,
    /// Fail when the average bus bandwidth is below 90% of this (GB/s), as NCCL_TESTS_MIN_BW.
    #[arg(long = "min-bw")]
    min_bw: Option<f64>,
    /// Flip one output byte on rank 0 before the first validation (tests the checker).
    #[arg(long)]
    corrupt: bool,
    /// nccl-tests options with no meaning here; accepted and reported as ignored.
    #[arg(short = 't', long = "nthreads", hide = true)]
    nthreads: Option<String>,
    #[arg(short = 'g', long = "ngpus", hide = true)]
    ngpus: Option<String>,
    #[arg(short = 'p', long = "parallel_init", hide = true)]
    parallel_init: Option<String>,
    #[arg(short = 'y', long = "stream_null", hide = true)]
    stream_null: Option<String>,
    #[arg(short = 'G', long = "cudagraph", hide = true)]
    cudagraph: Option<String>,
    #[arg(short = 'C', long = "report_cputime", hide = true)]
    report_cputime: Option<String>,
    /// Buffer registration, as nccl-tests: 0 none, 1 ncclCommRegister, 2 symmetric windows (ncclCommWindowRegister); buffers from ncclMemAlloc (--backend nccl).
    #[arg(short = 'R', long = "local_register", default_value_t = 0)]
    local_register: u8,
}

/// What `--baseline` times beside rankmesh's calls.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Baseline {
    /// Direct MPI calls (host plane).
    Mpi,
    /// Direct NCCL calls (device plane).
    Nccl,
}

fn usage(msg: String) -> Error {
    Error::Usage {
        what: "bench",
        group: "world".into(),
        msg,
    }
}

impl BenchArgs {
    /// Notes for nccl-tests options that do not apply, printed like nccl-tests' own.
    fn ignored(&self) -> Vec<String> {
        [
            ("-t", &self.nthreads),
            ("-g", &self.ngpus),
            ("-p", &self.parallel_init),
            ("-y", &self.stream_null),
            ("-G", &self.cudagraph),
            ("-C", &self.report_cputime),
        ]
        .iter()
        .filter_map(|(flag, v)| {
            v.as_ref()
                .map(|v| format!("Option {flag} {v} is not supported by rankmesh. Ignoring"))
        })
        .collect()
    }

    fn config(&self) -> rankmesh::Result<BenchConfig> {
        let op = Entry::parse(&self.collective)
            .ok_or_else(|| usage(format!("unknown collective {:?}", self.collective)))?;
        let size = |what: &str, s: &str| {
            bench::parse_size(s)
                .ok_or_else(|| usage(format!("invalid size specified for '{what}': {s:?}")))
        };
        let min_bw = match (self.min_bw, std::env::var("NCCL_TESTS_MIN_BW")) {
            (Some(v), _) => Some(v),
            (None, Ok(v)) => Some(
                v.trim()
                    .parse()
                    .map_err(|_| usage(format!("NCCL_TESTS_MIN_BW={v:?} is not a number")))?,
            ),
            (None, Err(_)) => None,
        };
        Ok(BenchConfig {
            op,
            min_bytes: size("minbytes", &self.min_bytes)?,
            max_bytes: size("maxbytes", &self.max_bytes)?,
            step_bytes: size("stepbytes", &self.step_bytes)?,
            step_factor: self.step_factor,
            iters: self.iters,
            warmup: self.warmup,
            agg: self.agg,
            cycles: self.cycles,
            check: self.check,
            redop: self.op.parse().map_err(usage)?,
            dtype: bench::parse_dtype(&self.dtype)
                .ok_or_else(|| usage(format!("invalid type {:?}", self.dtype)))?,
            root: self.root,
            skew: self.skew,
            blocking: self.blocking,
            average: match self.average {
                0 => Average::Rank0,
                1 => Average::Mean,
                2 => Average::Min,
                3 => Average::Max,
                a => {
                    return Err(usage(format!(
                        "-a {a}: use 0 (rank 0), 1 (mean), 2 (min) or 3 (max)"
                    )))
                }
            },
            group: match self.group {
                GroupArg::World => GroupChoice::World,
                GroupArg::Tp => GroupChoice::Tp,
                GroupArg::Sp => GroupChoice::Sp,
                GroupArg::Dp => GroupChoice::Dp,
            },
            tp: self.tp,
            sp: self.sp,
            device: false,
            baseline: self.baseline.is_some(),
            stats: self.stats,
            corrupt: self.corrupt,
            min_bw,
            progress: true,
            register: match self.local_register {
                r @ 0..=2 => r,
                r => {
                    return Err(usage(format!(
                        "-R {r}: use 0 (none), 1 (ncclCommRegister) or 2 (symmetric windows)"
                    )))
                }
            },
        })
    }
}

/// Logging filter from `RANKMESH_LOG` (default `warn`); an invalid filter
/// is an error, not silently ignored.
fn init_logging() -> Result<(), String> {
    let filter = match std::env::var("RANKMESH_LOG") {
        Err(_) => tracing_subscriber::EnvFilter::new("warn"),
        Ok(v) => tracing_subscriber::EnvFilter::try_new(&v).map_err(|e| {
            format!(
                "RANKMESH_LOG={v:?} is not a log filter ({e}); e.g. warn, debug, rankmesh=trace"
            )
        })?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

fn topo(rt: &Runtime, tp: usize, sp: usize, dp: Option<usize>, json: bool) -> rankmesh::Result<()> {
    let mut ps = ParallelState::new(rt)?;
    ps.initialize_model_parallel(tp, sp, dp)?;
    let report = TopoReport::new(&ps)?;
    print_report(rt, json, &report, || report.table());
    Ok(())
}

/// Rank 0 prints `report` as one JSON line, or as `table` for terminals.
fn print_report(
    rt: &Runtime,
    json: bool,
    report: &impl serde::Serialize,
    table: impl FnOnce() -> String,
) {
    if rt.rank() == 0 {
        if json {
            let line = serde_json::to_string(report).expect("report is plain data");
            println!("{line}");
        } else {
            print!("{}", table());
        }
    }
}

/// `topo --mesh pp=2,dp=2,tp=2 [--order tp-dp-pp] [--intra-node tp]`.
fn topo_mesh(
    rt: &Runtime,
    mesh: &str,
    order: Option<&str>,
    intra_node: &[String],
    json: bool,
) -> rankmesh::Result<()> {
    let mut sizes: Vec<(&str, usize)> = Vec::new();
    for part in mesh.split(',') {
        let parsed = part
            .split_once('=')
            .and_then(|(n, s)| Some((n.trim(), s.trim().parse::<usize>().ok()?)));
        let Some(dim) = parsed else {
            return Err(Error::Layout(format!(
                "mesh: {part:?} is not NAME=SIZE (e.g. --mesh pp=2,dp=2,tp=2)"
            )));
        };
        sizes.push(dim);
    }
    let layout = match order {
        Some(order) => rankmesh::MeshLayout::ordered(rt.size(), order, &sizes)?,
        None => rankmesh::MeshLayout::row_major(rt.size(), &sizes)?,
    };
    let intra: Vec<&str> = intra_node.iter().map(String::as_str).collect();
    let report = rankmesh::tools::topo::MeshReport::new(rt, layout, &intra)?;
    print_report(rt, json, &report, || report.table());
    Ok(())
}

/// Decides the data plane on every rank alike: the device plane needs a
/// usable GPU stack (driver, device, NCCL) on every rank of the world.
fn choose_plane(rt: &Runtime, backend: Backend) -> rankmesh::Result<bool> {
    if let Backend::Host = backend {
        return Ok(false);
    }
    let mine: Option<String> = rt.gpu().err().map(|e| match e {
        Error::Gpu(m) => m,
        e => e.to_string(),
    });
    let all: Vec<Option<String>> = rt.world_group()?.all_gather_object(&mine)?;
    let failure = all
        .iter()
        .enumerate()
        .find_map(|(r, m)| m.as_ref().map(|m| (r, m.clone())));
    match (backend, failure) {
        (_, None) => Ok(true),
        (Backend::Nccl, Some((r, m))) => Err(usage(format!("--backend nccl: rank {r}: {m}"))),
        (_, Some((r, m))) => {
            if rt.rank() == 0 {
                let first = m.lines().next().unwrap_or_default();
                let _ = std::io::stderr().write_all(
                    format!(
                        "rankmesh bench: --backend auto: rank {r}: {first}; using the host plane\n"
                    )
                    .as_bytes(),
                );
            }
            Ok(false)
        }
    }
}

fn run_bench(rt: &Runtime, args: &BenchArgs) -> rankmesh::Result<()> {
    // Every rank parses the same arguments, so every rank fails alike.
    let cfg = args.config()?;
    let start = bench::json::now_secs();
    if args.timeout > 0 {
        let secs = args.timeout;
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(secs));
            let _ = std::io::stderr().write_all(
                format!("rankmesh bench: timeout ({secs}s) reached, aborting\n").as_bytes(),
            );
            std::process::exit(124);
        });
    }
    let main = rt.rank() == 0;
    let mut cfg = cfg;
    cfg.device = choose_plane(rt, args.backend)?;
    match (args.baseline, cfg.device) {
        (Some(Baseline::Mpi), true) => {
            return Err(usage(
                "--baseline mpi compares the host plane; the device plane compares with --baseline nccl".into(),
            ))
        }
        (Some(Baseline::Nccl), false) => {
            return Err(usage(
                "--baseline nccl needs the device plane (--backend nccl, or auto on a GPU host)".into(),
            ))
        }
        _ => {}
    }
    let mut stdout = std::io::stdout().lock();
    // The report file is claimed before the run, as nccl-tests does, so the
    // name printed is the name written and an existing file is never replaced.
    let mut json_file = None;
    if main {
        for note in args.ignored() {
            let _ = writeln!(stdout, "{note}");
        }
        if let Some(path) = &args.json {
            match bench::json::create_report_file(path) {
                Ok((name, file)) => {
                    let _ = writeln!(stdout, "# Writing JSON output to {}", name.display());
                    json_file = Some((name, file));
                }
                Err(e) => {
                    let _ = writeln!(
                        stdout,
                        "# skipping json output; {} not accessible ({e})",
                        path.display()
                    );
                }
            }
        }
    }
    let mut sink = std::io::sink();
    let out: &mut dyn Write = if main { &mut stdout } else { &mut sink };
    let report = bench::run(rt, &cfg, out)?;
    if let Some((name, mut file)) = json_file {
        let doc = bench::json::document(&cfg, &report, start, std::env::args().collect());
        let text = serde_json::to_string_pretty(&doc).expect("report is plain data");
        file.write_all(text.as_bytes())
            .map_err(|e| usage(format!("cannot write {}: {e}", name.display())))?;
    }
    if report.wrong_rows > 0 {
        return Err(usage(format!(
            "{} sizes had wrong results",
            report.wrong_rows
        )));
    }
    if let Some(min) = cfg.min_bw {
        if report.avg_busbw < 0.9 * min {
            return Err(usage(format!(
                "average bus bandwidth {:.4} GB/s is below 90% of the minimum {min} GB/s",
                report.avg_busbw
            )));
        }
    }
    Ok(())
}

fn plot(files: &[PathBuf], output: &PathBuf) -> rankmesh::Result<()> {
    let series = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .map_err(|e| usage(format!("cannot read {}: {e}", f.display())))?;
            let label = f.file_stem().map_or_else(
                || f.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            bench::plot::series_from_json(&label, &text)
        })
        .collect::<rankmesh::Result<Vec<_>>>()?;
    std::fs::write(output, bench::plot::svg(&series))
        .map_err(|e| usage(format!("cannot write {}: {e}", output.display())))
}

/// Runs the command; MPI is finalised (the runtime dropped) before returning.
/// Prints the error line in one write, so lines of several ranks sharing a
/// terminal do not interleave.
fn report(e: &Error, rank: Option<usize>) {
    let who = rank.map_or(String::new(), |r| format!(" (rank {r})"));
    let line = format!("rankmesh: error{who}: {e}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Runs the command; an error is reported here, while MPI is still up:
/// finalisation then waits for every rank, so no rank's message is lost to
/// mpirun killing the job at the first non-zero exit.
fn run(cli: Cli) -> std::result::Result<(), ()> {
    if let Command::Plot { files, output } = &cli.command {
        return plot(files, output).map_err(|e| report(&e, None));
    }
    let rt = Runtime::init_adjusted(|options| {
        if let Some(b) = cli.bind {
            options.bind = Some(b);
        }
    })
    .map_err(|e| {
        // A start-up refusal was printed by every rank already.
        if !matches!(e, Error::Startup(_)) {
            report(&e, None);
        }
    })?;
    let result = command(&rt, &cli);
    if let Err(e) = &result {
        report(e, Some(rt.rank()));
        rt.error_reported();
    }
    let _ = std::io::stderr().flush();
    drop(rt);
    result.map_err(|_| ())
}

fn command(rt: &Runtime, cli: &Cli) -> rankmesh::Result<()> {
    match &cli.command {
        Command::Topo {
            mesh: Some(mesh),
            order,
            intra_node,
            json,
            ..
        } => topo_mesh(rt, mesh, order.as_deref(), intra_node, *json),
        Command::Topo {
            tp, sp, dp, json, ..
        } => topo(rt, *tp, *sp, *dp, *json),
        Command::Bench(args) => run_bench(rt, args),
        Command::Doctor(args) => run_doctor(rt, args),
        Command::Workload {
            tp,
            sp,
            steps,
            tokens,
        } => {
            let r = rankmesh::tools::bench::workload::run(rt, *tp, *sp, *steps, *tokens)?;
            if rt.rank() == 0 {
                println!(
                    "workload OK: {} ranks on {} node(s), tp={tp} sp={sp}, {} steps of {} elements, {:.1} us per step (slowest rank)",
                    rt.size(),
                    rt.world().node_count,
                    r.steps,
                    r.elements,
                    r.step_secs * 1e6
                );
            }
            Ok(())
        }
        Command::Plot { .. } => unreachable!("handled before MPI starts"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(msg) = init_logging() {
        eprintln!("rankmesh: {msg}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(()) => ExitCode::FAILURE,
    }
}
