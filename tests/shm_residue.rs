//! A rank killed while shared-memory windows are alive leaves nothing behind
//! in /dev/shm or Open MPI's session directory.
//!
//! Its own test binary, so no other MPI job runs meanwhile (cargo runs test
//! binaries one after another) and every new file can be attributed to it.

mod support;

use rankmesh::Collectives as _;
use rankmesh::Gathers as _;
use rankmesh::{DType, Runtime, Tensor};
use std::collections::BTreeSet;
use std::path::Path;

const WORKER: &str = "RANKMESH_RESIDUE_WORKER";
/// What rank 1 prints the moment before it aborts.
const ABORTING: &str = "residue worker: rank 1 aborts now";

/// Every file under /dev/shm and the Open MPI session directories in /tmp.
fn shared_memory_files() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.insert(p.display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/dev/shm"), &mut out);
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("ompi."))
        {
            walk(&e.path(), &mut out);
        }
    }
    out
}

/// Run by each rank: rank 1 aborts (no unwinding, no MPI_Finalize) while the
/// ranks loop over 64 MiB gathers, each of which lives in a shared window,
/// and all-reduces on the shared-memory executor (the group's window), or
/// on the hierarchical one across fake nodes (a window per node), as the
/// worker variable says.
#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    if std::env::var(WORKER).is_err() {
        return;
    }
    let rt = Runtime::init().unwrap();
    let g = rt.world_group().unwrap();
    let all: Vec<usize> = (0..g.size()).collect();
    let t = Tensor::zeros([16 << 20], DType::F32).unwrap();
    let mut u = Tensor::zeros([1 << 20], DType::F32).unwrap();
    let executor = std::env::var(WORKER).unwrap();
    assert_eq!(g.host_executor(), executor);
    if g.rank_in_group() == 1 {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(400));
            eprintln!("{ABORTING}");
            std::process::abort();
        });
    }
    for _ in 0..1000 {
        g.gather_tensors(&t, rankmesh::object::Ranks::Group(&all))
            .unwrap();
        g.all_reduce_in_place(&mut u, rankmesh::ReduceOp::Sum)
            .unwrap();
    }
    panic!("rank 1 should have aborted long before 1000 gathers");
}

/// One test for both layouts, one after the other: a job running beside
/// another's would leave files the other is blamed for.
#[test]
fn killed_rank_leaves_no_shared_memory_behind() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let args = support::rank_body("worker");
    let before = shared_memory_files();
    let job = support::mpirun(3, &exe, &args, &[(WORKER, "shm")]);
    expect_aborted_and_clean(&job, &before);
    if !support::fake_nodes_available() {
        support::skip(
            "killed_rank_leaves_no_shared_memory_behind (its hierarchical case)",
            "fake nodes need `unshare --uts`",
        );
        return;
    }
    let before = shared_memory_files();
    let env = [(WORKER, "hier"), ("RANKMESH_HOST_PLANE", "hier")];
    let job = support::fake_nodes("2,2", &exe, &args, &env);
    expect_aborted_and_clean(&job, &before);
}

fn expect_aborted_and_clean(job: &support::Job, before: &BTreeSet<String>) {
    assert!(
        !job.ok(),
        "the job must fail when a rank aborts: {}",
        job.describe()
    );
    // The job ended because rank 1 aborted, not because a rank failed some
    // other way first: rank 1 said it was aborting, and no rank panicked
    // (a call that returned an error would have, at its unwrap).
    let output = format!("{}{}", job.stdout, job.stderr);
    assert!(output.contains(ABORTING), "{}", job.describe());
    assert!(!output.contains("panicked"), "{}", job.describe());
    // Open MPI's mpirun names the signal. Hydra's banner is no witness: it
    // shows the first failed process in rank order with its status, and
    // rank 0, killed by hydra's cleanup, is sometimes first ("EXIT CODE: 9").
    if support::open_mpi_build() {
        assert!(
            job.stderr.contains("signal 6") || job.stderr.contains("Aborted"),
            "{}",
            job.describe()
        );
    }
    let after = shared_memory_files();
    let left: Vec<&String> = after.difference(before).collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}
