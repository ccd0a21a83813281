//! Integration tests that run real `mpirun -np {1,2,3,4}` jobs.
//!
//! This binary is both the driver and the ranks: started by the test runner
//! it launches itself under mpirun with `RANKMESH_TEST_SCENARIO` set; started
//! that way it runs one scenario as one rank. A scenario compares every result
//! with a serial reference (panicking on a mismatch, which fails the job) and
//! ends by printing `SCENARIO-OK rank N`; the driver requires one such line per
//! rank, so a rank that silently skipped its checks fails the test.

mod scenarios;
mod support;

use libtest_mimic::{Arguments, Failed, Trial};
use rankmesh::Runtime;

const SCENARIO_VAR: &str = "RANKMESH_TEST_SCENARIO";

fn worker(name: &str) -> i32 {
    let Some(s) = scenarios::ALL.iter().find(|s| s.name == name) else {
        eprintln!("unknown scenario {name}");
        return 2;
    };
    let rt = match Runtime::init() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("init failed: {e}");
            return 3;
        }
    };
    (s.run)(&rt);
    let rank = rt.rank();
    drop(rt);
    println!("SCENARIO-OK rank {rank}");
    0
}

/// Where a trial's ranks run.
#[derive(Clone, Copy)]
enum Placement {
    /// `np` ranks on this host.
    Local(usize),
    /// Fake nodes with these ranks per node ("2,3").
    Nodes(&'static str),
    /// `np` ranks on this host beside a process that spins for the whole
    /// job (a busy node: a data-loader worker, a monitoring agent).
    Busy(usize),
    /// `np` ranks on this host, all confined to one CPU (`taskset -c 0`, as a
    /// CPU mask or Slurm's `--cpus-per-task=1` would leave them).
    OneCpu(usize),
}

/// Scenarios that also run on a busy node and on one CPU: the host
/// collectives (every op, dtypes and shapes, through shared memory and MPI)
/// the single-copy all-to-alls and the streamed calls. They assert values only; timing lives
/// in scripts/bench-busy.sh.
const CROWDED: &[&str] = &[
    "collectives",
    "collectives_mpi",
    "single_copy",
    "stream_ring",
];

fn launch(s: &'static scenarios::Scenario, place: Placement) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| Failed::from(e.to_string()))?;
    let mut env: Vec<(&str, &str)> = vec![(SCENARIO_VAR, s.name)];
    env.extend_from_slice(s.env);
    let (job, np) = match place {
        Placement::Local(np) => (support::mpirun(np, &exe, &[], &env), np),
        Placement::Busy(np) => {
            // Bounded on its own too (bash's SECONDS, no forks): it ends
            // itself if this test dies.
            let mut hog = std::process::Command::new("bash")
                .args(["-c", "while [ $SECONDS -lt 300 ]; do :; done"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| Failed::from(format!("cannot start the busy process: {e}")))?;
            let job = support::mpirun(np, &exe, &[], &env);
            let _ = hog.kill();
            let _ = hog.wait();
            (job, np)
        }
        Placement::OneCpu(np) => (
            support::mpirun_under(&["taskset", "-c", "0"], np, &exe, &[], &env),
            np,
        ),
        Placement::Nodes(spec) => {
            env.push(("RANKMESH_TEST_NODES", spec));
            let np = spec
                .split(',')
                .map(|n| n.parse::<usize>().unwrap_or(0))
                .sum();
            (support::fake_nodes(spec, &exe, &[], &env), np)
        }
    };
    let oks = job
        .stdout
        .lines()
        .filter(|l| l.starts_with("SCENARIO-OK rank "))
        .count();
    if !job.ok() || oks != np {
        return Err(format!("{oks} of {np} ranks finished; {}", job.describe()).into());
    }
    Ok(())
}

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        std::process::exit(worker(&name));
    }
    let args = Arguments::from_args();
    let fake_nodes = support::fake_nodes_available();
    if !fake_nodes {
        support::skip(
            "mpi_ranks (the fake-node trials, marked ignored)",
            "fake nodes need `unshare --uts` (root or user namespaces)",
        );
    }
    let mut trials: Vec<Trial> = Vec::new();
    for s in scenarios::ALL {
        for &np in s.sizes {
            trials.push(Trial::test(format!("{}::np{np}", s.name), move || {
                launch(s, Placement::Local(np))
            }));
        }
        if CROWDED.contains(&s.name) {
            trials.push(Trial::test(
                format!("{}::np2_busy_node", s.name),
                move || launch(s, Placement::Busy(2)),
            ));
            trials.push(Trial::test(format!("{}::np3_one_cpu", s.name), move || {
                launch(s, Placement::OneCpu(3))
            }));
        }
        for &spec in s.nodes {
            let name = format!("{}::nodes[{spec}]", s.name);
            trials.push(
                Trial::test(name, move || launch(s, Placement::Nodes(spec)))
                    .with_ignored_flag(!fake_nodes),
            );
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
