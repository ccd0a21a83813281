//! CPU binding policies read back from each rank's /proc/self/status
//! (`Cpus_allowed_list`), under mpirun with and without a launcher binding.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

const WORKER: &str = "RANKMESH_BINDING_WORKER";

fn allowed_list() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().to_string()
}

/// "0-2,5" -> {0, 1, 2, 5}
fn cpus(list: &str) -> BTreeSet<usize> {
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// Each rank prints what the kernel says it may run on after start-up.
#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    if std::env::var(WORKER).is_err() {
        return;
    }
    match rankmesh::Runtime::init() {
        Ok(rt) => println!("CPUS {} {}", rt.rank(), allowed_list()),
        Err(e) => {
            eprintln!("INIT-ERROR {e}");
            std::process::exit(1);
        }
    }
}

/// Runs the worker on `np` ranks; returns each rank's CPU set, or the job.
fn run(np: usize, env: &[(&str, &str)]) -> Result<Vec<BTreeSet<usize>>, support::Job> {
    let exe = std::env::current_exe().unwrap();
    let mut all = vec![(WORKER, "1")];
    all.extend_from_slice(env);
    let job = support::mpirun(np, &exe, &support::rank_body("worker"), &all);
    if !job.ok() {
        return Err(job);
    }
    let mut sets = vec![BTreeSet::new(); np];
    // libtest may print "test worker ... " on the same line first.
    for line in job
        .stdout
        .lines()
        .filter_map(|l| l.find("CPUS ").map(|i| &l[i + 5..]))
    {
        let (rank, list) = line.split_once(' ').unwrap();
        sets[rank.parse::<usize>().unwrap()] = cpus(list);
    }
    assert!(
        sets.iter().all(|s| !s.is_empty()),
        "every rank reported: {}",
        job.describe()
    );
    Ok(sets)
}

fn machine() -> BTreeSet<usize> {
    cpus(&allowed_list())
}

fn disjoint(sets: &[BTreeSet<usize>]) -> bool {
    let total: usize = sets.iter().map(BTreeSet::len).sum();
    sets.iter().flatten().collect::<BTreeSet<_>>().len() == total
}

#[test]
fn binding_policies() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let all = machine();
    let ncores = all.len();
    // No policy, no launcher binding: every rank may use the whole machine.
    let sets = run(2, &[]).unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(sets.iter().all(|s| *s == all), "{sets:?}");
    // cores: disjoint, non-empty, inside the machine.
    let np = ncores.min(4);
    let sets =
        run(np, &[("RANKMESH_BIND", "cores")]).unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(
        disjoint(&sets) && sets.iter().all(|s| s.is_subset(&all)),
        "{sets:?}"
    );
    // numa: each rank inside the machine (one NUMA node here: all of it).
    let sets = run(2, &[("RANKMESH_BIND", "numa")]).unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(
        sets.iter().all(|s| s.is_subset(&all) && !s.is_empty()),
        "{sets:?}"
    );
    // none: explicit no-op.
    let sets = run(2, &[("RANKMESH_BIND", "none")]).unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(sets.iter().all(|s| *s == all));
}

#[test]
fn impossible_requests_fail_on_every_rank() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let np = machine().len() + 1;
    let job = run(np, &[("RANKMESH_BIND", "cores")]).expect_err("more ranks than cores must fail");
    let msg = format!(
        "--bind cores needs a core per rank: {np} ranks on this node but {} cores",
        np - 1
    );
    // Every rank fails (agreed in Runtime::init); mpirun may kill the slower
    // ones before they print, so at least one message must be there.
    assert!(
        job.stderr.contains("INIT-ERROR launch: rank") && job.stderr.contains(&msg),
        "{}",
        job.describe()
    );
    let job = run(2, &[("RANKMESH_BIND", "sockets")]).expect_err("unknown policy");
    assert!(
        job.stderr.contains("unknown binding policy \"sockets\""),
        "{}",
        job.describe()
    );
    if !Path::new("/proc/driver/nvidia").exists() {
        let job = run(2, &[("RANKMESH_BIND", "gpu")]).expect_err("no GPU here");
        assert!(
            job.stderr.contains("--bind gpu: no GPU"),
            "{}",
            job.describe()
        );
    }
}

#[test]
fn launcher_binding_is_respected_unless_overridden() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let all = machine();
    if all.len() < 2 {
        support::skip("launcher_binding_is_respected_unless_overridden", "one CPU");
        return;
    }
    let bound =
        run(2, &[("RANKMESH_MPIRUN_BIND", "core")]).unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(
        bound.iter().all(|s| s.len() < all.len()) && disjoint(&bound),
        "mpirun --bind-to core kept: {bound:?}"
    );
    let over = run(
        2,
        &[("RANKMESH_MPIRUN_BIND", "core"), ("RANKMESH_BIND", "numa")],
    )
    .unwrap_or_else(|j| panic!("{}", j.describe()));
    assert!(
        over.iter().all(|s| s.len() > 1),
        "--bind numa widens each rank to its NUMA node: {over:?}"
    );
    // topo reports who bound each rank.
    let job = support::mpirun(
        2,
        Path::new(env!("CARGO_BIN_EXE_rankmesh")),
        &["topo", "--json"],
        &[("RANKMESH_MPIRUN_BIND", "core")],
    );
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(
        job.stdout.matches(r#""bound_by":"launcher""#).count(),
        2,
        "{}",
        job.stdout
    );
}
