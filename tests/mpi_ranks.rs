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
}

fn launch(s: &'static scenarios::Scenario, place: Placement) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| Failed::from(e.to_string()))?;
    let mut env: Vec<(&str, &str)> = vec![(SCENARIO_VAR, s.name)];
    env.extend_from_slice(s.env);
    let (job, np) = match place {
        Placement::Local(np) => (support::mpirun(np, &exe, &[], &env), np),
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
        eprintln!("SKIPPED: fake-node trials need `unshare --uts` (root or user namespaces); they are marked ignored");
    }
    let mut trials: Vec<Trial> = Vec::new();
    for s in scenarios::ALL {
        for &np in s.sizes {
            trials.push(Trial::test(format!("{}::np{np}", s.name), move || {
                launch(s, Placement::Local(np))
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
