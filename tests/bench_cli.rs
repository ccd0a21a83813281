//! `rankmesh bench` and `rankmesh plot` under real mpirun: nccl-tests' text
//! layout, validation failures, JSON, per-group runs and bad input.

mod support;

use rankmesh::tools::bench::json::Document;
use std::path::Path;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

fn bench(np: usize, args: &[&str]) -> support::Job {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    support::mpirun(np, exe(), &all, &[])
}

/// Rows are the lines that start with a size.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn output_has_nccl_tests_layout() {
    let job = bench(
        2,
        &[
            "all_reduce_perf",
            "-b",
            "8",
            "-e",
            "128",
            "-f",
            "2",
            "-n",
            "3",
            "-w",
            "1",
        ],
    );
    assert!(job.ok(), "{}", job.describe());
    let out = &job.stdout;
    assert!(out.starts_with("# nccl-tests version rankmesh-"), "{out}");
    assert!(out.contains("# Collective test starting: all_reduce_perf\n"));
    assert!(out.contains("# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 1 iters: 3 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"));
    assert_eq!(out.matches("#  Rank ").count(), 2);
    assert!(out.contains("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n"));
    let rows = rows(out);
    assert_eq!(rows.len(), 5, "sizes 8..128 by 2: {out}");
    for (r, size) in rows.iter().zip([8, 16, 32, 64, 128]) {
        assert_eq!(r.len(), 13, "13 columns: {r:?}");
        assert_eq!(r[0], size.to_string());
        assert_eq!(r[1], (size / 4).to_string());
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[4].as_str()),
            ("float", "sum", "-1")
        );
        assert_eq!(
            (r[8].as_str(), r[12].as_str()),
            ("0", "0"),
            "no wrong elements"
        );
        let (algbw, busbw): (f64, f64) = (r[6].parse().unwrap(), r[7].parse().unwrap());
        assert!(
            (busbw - algbw).abs() <= 0.011,
            "2(n-1)/n = 1 on 2 ranks: {r:?}"
        );
    }
    assert!(out.contains("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : "));
    assert!(out.contains("#\n# Collective test concluded: all_reduce_perf\n"));
}

#[test]
fn every_collective_runs_with_zero_wrong_elements() {
    for (np, coll, dtype) in [
        (3, "all_gather", "bfloat16"),
        (4, "reduce_scatter_perf", "int32"),
        (3, "broadcast", "double"),
        (2, "reduce", "half"),
        (4, "alltoall_perf", "uint64"),
        (3, "sendrecv", "int8"),
        (4, "all_to_all_4d", "float"),
        (2, "broadcast_object", "uint8"),
        (3, "alltoallv_perf", "float"),
        (4, "all_gather_v", "bfloat16"),
    ] {
        let job = bench(
            np,
            &[
                coll, "-b", "1K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "-d", dtype, "-r",
                "1", "--skew", "0.7",
            ],
        );
        assert!(job.ok(), "{coll}: {}", job.describe());
        let rows = rows(&job.stdout);
        assert_eq!(rows.len(), 4, "{coll}: {}", job.stdout);
        assert!(
            rows.iter().all(|r| r[8] == "0" && r[12] == "0"),
            "{coll}: {}",
            job.stdout
        );
        assert!(
            job.stdout.contains("# Out of bounds values : 0 OK"),
            "{coll}"
        );
    }
}

#[test]
fn corrupted_results_are_detected_and_fail_the_run() {
    let job = bench(
        2,
        &[
            "all_reduce",
            "-b",
            "64",
            "-e",
            "256",
            "-f",
            "2",
            "-n",
            "2",
            "-w",
            "1",
            "--corrupt",
        ],
    );
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        job.stdout.contains("# Out of bounds values : 1 FAILED"),
        "{}",
        job.stdout
    );
    assert_eq!(rows(&job.stdout)[0][8], "1", "{}", job.stdout);
    assert!(
        job.stderr.contains("1 sizes had wrong results"),
        "{}",
        job.stderr
    );
}

#[test]
fn minimum_bandwidth_fails_the_run() {
    let job = bench(
        2,
        &[
            "broadcast",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
            "-w",
            "1",
            "--min-bw",
            "100000",
        ],
    );
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        job.stdout
            .contains("FAILED\n#\n# Collective test concluded"),
        "{}",
        job.stdout
    );
    assert!(
        job.stderr.contains("below 90% of the minimum 100000 GB/s"),
        "{}",
        job.stderr
    );
}

#[test]
fn json_follows_nccl_tests_keys_and_plots() {
    let dir = std::env::temp_dir().join(format!("rankmesh-bench-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let job = bench(
        2,
        &[
            "all_gather",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "-J",
            json.to_str().unwrap(),
            "--baseline",
            "mpi",
            "--stats",
        ],
    );
    assert!(job.ok(), "{}", job.describe());
    assert!(job
        .stdout
        .contains(&format!("# Writing JSON output to {}\n", json.display())));
    let text = std::fs::read_to_string(&json).unwrap();
    let doc: Document = serde_json::from_str(&text).unwrap();
    assert_eq!(doc.version, 3);
    assert_eq!(doc.results.len(), 3);
    assert_eq!(doc.config.devices.len(), 2, "devices sit inside config");
    assert_eq!(doc.config.step_factor, Some(4));
    assert_eq!(doc.config.per_iter_timing, "true");
    assert_eq!(doc.out_of_bounds.okay, "true");
    assert_eq!(doc.average_bus_bandwidth.okay, "unchecked");
    let r = &doc.results[0];
    assert_eq!(
        (r.size, r.dtype.as_str(), r.redop.as_str(), r.root.as_str()),
        (1024, "float", "none", "    -1")
    );
    assert_eq!((r.actual_iterations, r.experiment_name.as_str()), (2, ""));
    assert!(r.mpi_baseline.is_some());
    assert_eq!(r.out_of_place.nwrong, Some(0.0));
    // Per-iteration reports as nccl-tests writes them: each iteration is its
    // slowest process, every process's own times beside them.
    for p in [&r.out_of_place_per_iter, &r.in_place_per_iter] {
        let p = p
            .as_ref()
            .expect("--stats writes both per-iteration reports");
        assert_eq!(p.times_us.len(), 2);
        let procs = p.per_process_max_times_us.as_ref().expect("2 processes");
        assert_eq!(procs.len(), 2);
        for (i, t) in p.times_us.iter().enumerate() {
            assert_eq!(*t, procs[0][i].max(procs[1][i]));
        }
        let min = p.times_us.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!((p.min_us, p.skipped_iterations), (min, 0));
    }
    // Round trip: the document re-serialises to the same value.
    let again: serde_json::Value = serde_json::to_value(&doc).unwrap();
    assert_eq!(
        again,
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    );
    let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<&str> = raw
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "version",
            "start_time",
            "args",
            "env",
            "nccl_version",
            "config",
            "results",
            "out_of_bounds",
            "average_bus_bandwidth",
            "errors",
            "end_time",
            "rankmesh"
        ],
        "nccl-tests' keys in nccl-tests' order, then rankmesh's"
    );
    // A second run never overwrites the first report: it writes run.json.0.
    let again = bench(
        2,
        &[
            "all_gather",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
            "-w",
            "0",
            "-J",
            json.to_str().unwrap(),
        ],
    );
    assert!(again.ok(), "{}", again.describe());
    let second = dir.join("run.json.0");
    assert!(again
        .stdout
        .contains(&format!("# Writing JSON output to {}\n", second.display())));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), text);
    let second: Document =
        serde_json::from_str(&std::fs::read_to_string(&second).unwrap()).unwrap();
    assert_eq!(second.results.len(), 1);

    let svg = dir.join("plot.svg");
    let plot = support::singleton(
        exe(),
        &[
            "plot",
            json.to_str().unwrap(),
            json.to_str().unwrap(),
            "-o",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert!(plot.ok(), "{}", plot.describe());
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    let parsed = roxmltree::Document::parse(&svg_text).expect("well-formed SVG");
    assert_eq!(parsed.root_element().tag_name().name(), "svg");
    let lines: Vec<_> = parsed
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .collect();
    assert_eq!(
        lines.len(),
        8,
        "2 runs x 2 panels, each with its raw baseline"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|n| n.attribute("stroke-dasharray").is_some())
            .count(),
        4,
        "the --baseline mpi lines are dashed"
    );
    assert!(svg_text.contains(">run (raw MPI)</text>"));
    assert!(svg_text.contains(">run</text>"), "legend names the run");
    let bad = support::singleton(
        exe(),
        &["plot", svg.to_str().unwrap(), "-o", svg.to_str().unwrap()],
        &[],
    );
    assert!(
        !bad.ok() && bad.stderr.contains("not JSON"),
        "{}",
        bad.describe()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn groups_run_at_once_and_report_separately() {
    let job = bench(
        4,
        &[
            "all_reduce",
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--group",
            "tp",
            "--tp",
            "2",
        ],
    );
    assert!(job.ok(), "{}", job.describe());
    assert!(
        job.stdout.contains("# Group tp:0 ranks [0, 1]\n"),
        "{}",
        job.stdout
    );
    assert!(
        job.stdout.contains("# Group tp:1 ranks [2, 3]\n"),
        "{}",
        job.stdout
    );
    assert_eq!(rows(&job.stdout).len(), 4, "2 sizes x 2 groups");
    assert!(
        job.stdout.contains("#  Rank  2 Group  1 "),
        "{}",
        job.stdout
    );
}

/// A sweep that cannot fit is refused before anything is allocated, naming
/// both numbers; a size past any machine is a usage error, not a panic.
#[test]
fn sizes_that_cannot_fit_are_refused_with_both_numbers() {
    let job = bench(2, &["all_reduce", "-b", "200G", "-e", "200G"]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    let msg = "bench on world: rank 0: the sweep needs about 2200.0 GiB per rank at its largest size (214748364800 bytes) but this rank can have ";
    assert_eq!(job.stderr.matches(msg).count(), 2, "{}", job.describe());
    assert!(
        job.stderr.contains("rank(s) on this node); lower -e"),
        "{}",
        job.describe()
    );
    let job = bench(2, &["all_reduce", "-b", "1e30", "-e", "1e30"]);
    assert_eq!(job.code, Some(1), "{}", job.describe());
    assert!(
        job.stderr
            .contains("invalid size specified for 'minbytes': \"1e30\""),
        "{}",
        job.describe()
    );
    assert!(!job.stderr.contains("panicked"), "{}", job.describe());
}

#[test]
fn ignored_and_bad_options() {
    let job = bench(
        2,
        &[
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-w",
            "1",
            "-g",
            "1",
            "-G",
            "2",
        ],
    );
    assert!(job.ok(), "{}", job.describe());
    assert!(job
        .stdout
        .contains("Option -g 1 is not supported by rankmesh. Ignoring\n"));
    assert!(job
        .stdout
        .contains("Option -G 2 is not supported by rankmesh. Ignoring\n"));

    for (args, msg) in [
        (
            vec!["hypercube_perf"],
            "unknown collective \"hypercube_perf\"",
        ),
        (
            vec!["all_reduce", "-d", "float8"],
            "invalid type \"float8\"",
        ),
        (vec!["all_reduce", "-z", "4"], "-z 4: use 0 (none)"),
        (
            vec!["all_reduce", "-R", "3"],
            "-R 3: use 0 (none), 1 (ncclCommRegister) or 2 (symmetric windows)",
        ),
        (
            vec!["all_reduce", "-b", "12X"],
            "invalid size specified for 'minbytes'",
        ),
        (
            vec!["all_reduce", "-o", "mulsum"],
            "unknown reduction \"mulsum\"",
        ),
        (
            vec!["broadcast", "-r", "5"],
            "root 5 is not a rank of a group of size 2",
        ),
        (
            vec!["all_reduce", "-b", "1M", "-e", "1K"],
            "minimum size 1048576 is above maximum size 1024",
        ),
        (
            vec!["all_reduce", "--backend", "nccl"],
            // Every rank names the rank without a GPU stack (no driver in CI).
            "--backend nccl: rank 0: ",
        ),
        (
            vec!["all_reduce", "--backend", "host", "--baseline", "nccl"],
            "--baseline nccl needs the device plane",
        ),
        (
            vec!["all_reduce", "--group", "tp", "--tp", "3"],
            "not divisible by tensor-parallel size 3",
        ),
        (
            vec!["alltoallv", "--skew", "1.5"],
            "--skew 1.5: use a value from 0 to 1",
        ),
    ] {
        let job = bench(2, &args);
        assert!(!job.ok(), "{args:?} must fail");
        let lines = job
            .stderr
            .lines()
            .filter(|l| l.starts_with("rankmesh: error (rank") && l.contains(msg))
            .count();
        assert!(lines >= 1, "{args:?}: {}", job.describe());
    }
}

#[test]
fn cycles_aggregation_blocking_and_averaging() {
    let job = bench(
        3,
        &[
            "reduce_scatter",
            "-b",
            "96",
            "-e",
            "384",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "0",
            "-N",
            "2",
            "-m",
            "3",
            "-z",
            "1",
            "-a",
            "3",
            "-c",
            "2",
            "-o",
            "max",
        ],
    );
    assert!(job.ok(), "{}", job.describe());
    let rows = rows(&job.stdout);
    assert_eq!(rows.len(), 4, "2 sizes x 2 cycles: {}", job.stdout);
    assert_eq!(
        rows[0][..5],
        rows[2][..5],
        "the second cycle repeats the first"
    );
    assert!(job
        .stdout
        .contains("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"));
    assert!(job.stdout.contains("agg iters: 3 validation: 2"));
}

/// This process's memory cgroup directory and the file that sets its limit
/// (v1's memory controller, else v2), from /proc/self/cgroup.
fn own_memory_cgroup() -> Option<(std::path::PathBuf, &'static str)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    if let Some(path) = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    }) {
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        return Some((dir, "memory.limit_in_bytes"));
    }
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    Some((dir, "memory.max"))
}

/// Under Slurm or systemd a job's memory limit sits on its own cgroup, not on
/// the hierarchy's root: bench runs in a child cgroup limited to 256 MiB and
/// refuses a sweep that MemAvailable alone would allow (it would meet the
/// OOM killer instead).
#[test]
fn the_jobs_own_cgroup_limit_is_what_bench_compares() {
    let Some((parent, limit_file)) = own_memory_cgroup() else {
        support::skip(
            "the_jobs_own_cgroup_limit_is_what_bench_compares",
            "no memory cgroup in /proc/self/cgroup",
        );
        return;
    };
    let dir = parent.join(format!("rankmesh-bench-test-{}", std::process::id()));
    if let Err(e) =
        std::fs::create_dir(&dir).and_then(|()| std::fs::write(dir.join(limit_file), "268435456"))
    {
        let _ = std::fs::remove_dir(&dir);
        return support::skip(
            "the_jobs_own_cgroup_limit_is_what_bench_compares",
            &format!(
                "cannot make a memory cgroup under {}: {e}",
                parent.display()
            ),
        );
    }
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {} bench all_reduce -b 64M -e 64M -n 1 -w 0",
            dir.display(),
            exe().display()
        ))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("but this rank can have")
            && stderr
                .contains("(the cgroup memory limit shared by 1 rank(s) on this node); lower -e"),
        "{stderr}"
    );
}
