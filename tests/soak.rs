//! 20,000 group create/drop cycles: the process must not keep anything per
//! group once the group is gone (the watchdog used to keep every name).

mod support;

const WORKER: &str = "RANKMESH_SOAK_WORKER";
const CYCLES: usize = 20_000;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    if std::env::var(WORKER).is_err() {
        return;
    }
    let rt = rankmesh::Runtime::init().unwrap();
    let lists = vec![vec![0], vec![1]];
    // Warm up allocators and MPI's own pools first.
    for _ in 0..1000 {
        drop(rt.world_group().unwrap());
    }
    let before = rss_kib();
    for i in 0..CYCLES {
        // Long names, as in the report: 4 KiB each.
        let name = format!("{:>4096}", i);
        let g = rt.split_groups(&name, &lists).unwrap().unwrap();
        assert_eq!(g.size(), 1);
        drop(g);
    }
    let grown = rss_kib().saturating_sub(before);
    println!(
        "SOAK rank {} grew {grown} KiB over {CYCLES} cycles",
        rt.rank()
    );
}

#[test]
fn group_create_drop_cycles_do_not_grow_memory() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let job = support::mpirun(
        2,
        &std::env::current_exe().unwrap(),
        &support::rank_body("worker"),
        &[(WORKER, "1")],
    );
    assert!(job.ok(), "{}", job.describe());
    let grown: Vec<u64> = job
        .stdout
        .lines()
        .filter_map(|l| l.split(" grew ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(grown.len(), 2, "{}", job.describe());
    // 4 KiB names × 20,000 would be 80 MB if kept; allow MPI's own noise.
    for g in grown {
        assert!(g < 4096, "RSS grew {g} KiB: {}", job.describe());
    }
}
