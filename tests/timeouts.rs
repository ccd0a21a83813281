//! A rank whose peers never enter the matching call is reported by the
//! watchdog (RANKMESH_TIMEOUT) and the job ends, instead of hanging.

mod support;

use rankmesh::Collectives as _;
use std::time::Instant;

const WORKER: &str = "RANKMESH_TIMEOUT_WORKER";

/// Rank 0 enters a barrier while rank 1 sends to it: neither call can match.
#[test]
fn worker() {
    let Ok(mode) = std::env::var(WORKER) else {
        return;
    };
    let rt = rankmesh::Runtime::init().unwrap();
    let g = rt.world_group().unwrap();
    let t = rankmesh::Tensor::zeros([4], rankmesh::DType::F32).unwrap();
    match (mode.as_str(), rt.rank()) {
        ("mismatch", 0) => g.barrier().unwrap(),
        ("mismatch", _) => g.send(&t, Some(0)).unwrap(),
        // A long but legitimate wait shorter than the timeout must pass.
        (_, 0) => {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            g.barrier().unwrap();
        }
        _ => g.barrier().unwrap(),
    }
    println!("WORKER-DONE {}", rt.rank());
}

#[test]
fn mismatched_calls_end_the_job_with_a_message() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let job = support::mpirun(
        2,
        &exe,
        &["--exact", "worker", "--nocapture"],
        &[(WORKER, "mismatch"), ("RANKMESH_TIMEOUT", "2")],
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        took < 60.0,
        "ended by the watchdog, not the test's own timeout: {took} s"
    );
    // Whichever rank fires first names the other and where it is.
    let rank0 = job.stderr.contains(
        "with no progress in barrier on world (call #0); aborting the job (RANKMESH_TIMEOUT=2 s)",
    ) && job.stderr.contains("group rank 1 (world rank 1, host ")
        && job
            .stderr
            .contains("has not entered this call; it is in send/recv on world (call #0) for ");
    let rank1 = job.stderr.contains(
        "with no progress in send/recv on world (call #0); aborting the job (RANKMESH_TIMEOUT=2 s)",
    ) && job.stderr.contains("group rank 0 (world rank 0, host ")
        && job
            .stderr
            .contains("has not entered this call; it is in barrier on world (call #0) for ");
    assert!(rank0 || rank1, "{}", job.describe());
    assert!(
        job.stderr.contains("flight recorder, last 2 of 2 calls"),
        "{}",
        job.describe()
    );
    assert_eq!(job.code, Some(75), "MPI_Abort's code: {}", job.describe());
    assert!(
        !job.stderr.contains("stack backtrace") && !job.stderr.contains("Signal:"),
        "a clean abort, no signal handler output: {}",
        job.describe()
    );
}

#[test]
fn waits_shorter_than_the_timeout_pass() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let job = support::mpirun(
        2,
        &exe,
        &["--exact", "worker", "--nocapture"],
        &[(WORKER, "slow"), ("RANKMESH_TIMEOUT", "5")],
    );
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(
        job.stdout.matches("WORKER-DONE").count(),
        2,
        "{}",
        job.describe()
    );
}
