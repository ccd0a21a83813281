//! The shared-memory executor's single-copy all-to-all when it cannot be
//! used: the kernel refuses `process_vm_readv` (a seccomp filter refuses
//! it with EPERM, as a container's profile does), or the ranks differ in
//! `RANKMESH_SINGLE_COPY`. Results are validated by the bench; the
//! results of every layout with single copies off are checked against the
//! serial reference in tests/scenarios/single_copy.rs.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

/// tests/single_copy/deny_cma.c, built once into the target directory.
fn deny_cma() -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deny_cma");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/single_copy/deny_cma.c");
    let built = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(built.success(), "cc {}", src.display());
    out
}

/// Size rows of nccl-tests output with their out-of-place and in-place
/// `#wrong` columns.
fn wrong_counts(stdout: &str) -> Vec<(String, String, String)> {
    stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].into(), f[8].into(), f[12].into())
        })
        .collect()
}

fn assert_validated(job: &support::Job, sizes: usize) {
    assert!(job.ok(), "{}", job.describe());
    let rows = wrong_counts(&job.stdout);
    assert_eq!(rows.len(), sizes, "{}", job.describe());
    for (size, a, b) in rows {
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("0", "0"),
            "size {size}: {}",
            job.describe()
        );
    }
}

/// Arguments for `deny_cma`: rankmesh's bench of `op` at 4 and 16 MiB.
fn denied_bench(op: &str) -> [&str; 13] {
    let exe = exe().to_str().unwrap();
    [
        exe, "bench", op, "-b", "4M", "-e", "16M", "-f", "4", "-n", "3", "-w", "1",
    ]
}

const FALLBACK: &str = "copying through shared memory from now on";

#[test]
fn refused_reads_fall_back_to_the_window_and_say_so_once() {
    let deny = deny_cma();
    for op in ["alltoall", "alltoallv", "all_to_all_4d"] {
        let args = denied_bench(op);
        // Open MPI's own single copy would meet the same refusal. `cma`:
        // with `auto`, the start-up timing meets the refusal first.
        let env = [
            ("RANKMESH_LOG", "debug"),
            ("RANKMESH_SINGLE_COPY", "cma"),
            ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
        ];
        let job = support::mpirun(2, &deny, &args, &env);
        assert_validated(&job, 2);
        let said: Vec<&str> = job
            .stderr
            .lines()
            .filter(|l| l.contains(FALLBACK))
            .collect();
        assert_eq!(said.len(), 2, "{op}: one line per rank: {}", job.describe());
        for line in said {
            assert!(
                line.contains("process_vm_readv was refused (Operation not permitted"),
                "{line}"
            );
        }
    }
}

/// With `auto`, a kernel that refuses is found by the start-up timing:
/// every block moves through the window from the first call, with nothing
/// to fall back from.
#[test]
fn with_auto_a_refusing_kernel_means_the_window_from_the_start() {
    let deny = deny_cma();
    let args = denied_bench("alltoall");
    let env = [
        ("RANKMESH_LOG", "debug"),
        ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ];
    let job = support::mpirun(2, &deny, &args, &env);
    assert_validated(&job, 2);
    assert!(!job.stderr.contains(FALLBACK), "{}", job.describe());
    let refused = job
        .stderr
        .lines()
        .filter(|l| l.contains("single copies refused at start"))
        .count();
    assert_eq!(refused, 2, "one line per rank: {}", job.describe());
}

/// With `auto`, two ranks of the node time a read of a peer's freshly
/// written buffer against the window's two copies of it, and every rank
/// (the third only synchronises) takes the same figures and the same
/// choice; the results are right whichever it is.
#[test]
fn with_auto_one_pair_times_both_and_the_node_agrees() {
    let args = [
        "bench", "alltoall", "-b", "64K", "-e", "4M", "-f", "4", "-n", "3", "-w", "1",
    ];
    let job = support::mpirun(3, exe(), &args, &[("RANKMESH_LOG", "debug")]);
    assert_validated(&job, 4);
    let timed: Vec<&str> = job
        .stderr
        .lines()
        .filter_map(|l| l.split_once("single copies timed at ").map(|(_, t)| t))
        .collect();
    assert_eq!(timed.len(), 3, "one line per rank: {}", job.describe());
    assert!(
        timed.iter().all(|t| *t == timed[0]),
        "the same figures everywhere: {timed:?}"
    );
    // "16 / 1024 KiB between local ranks 0 and 1: a read R1 / R2 us, the
    // window's two copies W1 / W2 us: " and the choice.
    let (figures, choice) = timed[0].rsplit_once(": ").expect("a choice");
    assert!(
        choice == "one read never beats them here"
            || (choice.starts_with("one read beats them from ") && choice.ends_with(" KiB")),
        "{choice}"
    );
    let figures: Vec<f64> = figures
        .split([' ', ',', ':'])
        .filter_map(|w| w.parse::<f64>().ok())
        .collect();
    assert_eq!(figures.len(), 8, "{}", timed[0]);
    assert!(
        figures[4..].iter().all(|t| *t > 0.0),
        "a read and the copies were timed: {}",
        timed[0]
    );
}

#[test]
fn ranks_differing_in_the_setting_move_through_the_window() {
    let args = [
        "bench", "alltoall", "-b", "4M", "-e", "16M", "-f", "4", "-n", "3",
    ];
    let on: &[(&str, &str)] = &[("RANKMESH_LOG", "debug"), ("RANKMESH_SINGLE_COPY", "cma")];
    let off: &[(&str, &str)] = &[("RANKMESH_LOG", "debug"), ("RANKMESH_SINGLE_COPY", "none")];
    let job = support::mpirun_each(exe(), &args, &[on, off, on]);
    assert_validated(&job, 2);
    // Nothing was refused: the window was simply agreed on.
    assert!(!job.stderr.contains(FALLBACK), "{}", job.describe());
    // `auto` times between two ranks, collectively: a rank set `none` (here
    // local rank 0, the timing's reader) takes part, and the node agrees on
    // the window (this start-up hung before every rank took part).
    let auto: &[(&str, &str)] = &[("RANKMESH_LOG", "debug")];
    let job = support::mpirun_each(exe(), &args, &[off, auto, auto]);
    assert_validated(&job, 2);
    assert!(!job.stderr.contains(FALLBACK), "{}", job.describe());
}

#[test]
fn a_bad_setting_is_refused_at_start() {
    let job = support::mpirun(2, exe(), &["topo"], &[("RANKMESH_SINGLE_COPY", "xpmem")]);
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        job.stderr
            .contains("RANKMESH_SINGLE_COPY=\"xpmem\" is not one of auto, cma, none"),
        "{}",
        job.describe()
    );
}
