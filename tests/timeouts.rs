//! A rank whose peers never enter the matching call is reported by the
//! watchdog (RANKMESH_TIMEOUT) and the job ends, instead of hanging.

mod support;

use rankmesh::Collectives as _;
use std::time::Instant;

const WORKER: &str = "RANKMESH_TIMEOUT_WORKER";

/// Rank 0 enters a barrier while rank 1 sends to it: neither call can match.
#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    let Ok(mode) = std::env::var(WORKER) else {
        return;
    };
    let rt = rankmesh::Runtime::init().unwrap();
    let g = rt.world_group().unwrap();
    let t = rankmesh::Tensor::zeros([4], rankmesh::DType::F32).unwrap();
    match (mode.as_str(), rt.rank()) {
        ("stopped", r) => {
            // Calls that both ranks make first, so the stopped rank's
            // peer waits on a window (or MPI) it has used already.
            let x = rankmesh::Tensor::from_vec([4], vec![1.5f32; 4]).unwrap();
            for _ in 0..100 {
                let y = g.all_reduce(&x, rankmesh::ReduceOp::Sum).unwrap();
                assert_eq!(y.as_slice::<f32>().unwrap(), &[3.0f32; 4][..]);
            }
            if r == 1 {
                // SAFETY: stops this process; only a signal resumes it.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            g.all_reduce(&x, rankmesh::ReduceOp::Sum).unwrap();
        }
        // Ranks 0 and 1 on two (fake) nodes; rank 2, beside rank 1, computes
        // (in no call) while rank 1 stops inside their pair's calls.
        ("stopped-remote", r) => {
            let pair = rt.split_groups("pair", &[vec![0, 1]]).unwrap();
            let x = rankmesh::Tensor::from_vec([4], vec![1.5f32; 4]).unwrap();
            match pair {
                Some(pair) => {
                    for _ in 0..100 {
                        pair.all_reduce(&x, rankmesh::ReduceOp::Sum).unwrap();
                    }
                    if r == 1 {
                        // SAFETY: stops this process; only a signal resumes it.
                        unsafe { libc::raise(libc::SIGSTOP) };
                    }
                    pair.all_reduce(&x, rankmesh::ReduceOp::Sum).unwrap();
                }
                None => std::thread::sleep(std::time::Duration::from_secs(60)),
            }
        }
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
        &support::rank_body("worker"),
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

/// A rank stopped by SIGSTOP while its peer waits in an all-reduce: the
/// peer, asleep in its wait (a futex on the shared-memory executor, MPI's
/// own wait on the MPI executor), is still named by the watchdog.
fn a_stopped_peer_is_named(plane: &str) {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let job = support::mpirun(
        2,
        &exe,
        &support::rank_body("worker"),
        &[
            (WORKER, "stopped"),
            ("RANKMESH_TIMEOUT", "2"),
            ("RANKMESH_HOST_PLANE", plane),
        ],
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 60.0, "ended by the watchdog: {took} s");
    assert!(
        job.stderr.contains(
            "with no progress in all_reduce on world (call #100); aborting the job (RANKMESH_TIMEOUT=2 s)"
        ) && job.stderr.contains("group rank 1 (world rank 1, host "),
        "rank 0 names the stopped rank 1: {}",
        job.describe()
    );
    assert_eq!(job.code, Some(75), "MPI_Abort's code: {}", job.describe());
}

/// The stopped rank is on another node: rank 0 learns where it is from that
/// node's status service (answered by rank 2 there, with the job's secret).
#[test]
fn a_stopped_peer_on_another_node_is_named_through_its_nodes_service() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    if !support::fake_nodes_available() {
        support::skip(
            "a_stopped_peer_on_another_node_is_named_through_its_nodes_service",
            "no UTS namespaces here",
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let job = support::fake_nodes(
        "1,2",
        &exe,
        &support::rank_body("worker"),
        &[(WORKER, "stopped-remote"), ("RANKMESH_TIMEOUT", "2")],
    );
    assert!(!job.ok(), "{}", job.describe());
    assert!(
        job.stderr
            .contains("with no progress in all_reduce on pair:0 (call #100)")
            && job.stderr.contains("group rank 1 (world rank 1, host ")
            && job.stderr.contains(", process stopped): "),
        "rank 0 names the stopped rank 1 on the other node: {}",
        job.describe()
    );
    assert!(
        !job.stderr
            .contains("no answer from its node's status service"),
        "{}",
        job.describe()
    );
    assert_eq!(job.code, Some(75), "{}", job.describe());
}

#[test]
fn a_stopped_peer_is_named_on_shared_memory() {
    a_stopped_peer_is_named("shm");
}

#[test]
fn a_stopped_peer_is_named_on_mpi() {
    a_stopped_peer_is_named("mpi");
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
        &support::rank_body("worker"),
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

const STARTUP: &str = "RANKMESH_STARTUP_WORKER";
/// The launcher's rank of the rank that never starts rankmesh.
const ABSENT: &str = "RANKMESH_STARTUP_ABSENT";

/// One rank of a start-up job: the absent one never calls `Runtime::init`
/// (stuck before it, stopped, or a plain MPI program that sleeps after
/// `MPI_Init`); the others call it and must be ended by the start-up watch.
#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn startup_worker() {
    let Ok(mode) = std::env::var(STARTUP) else {
        return;
    };
    // The launcher's rank: Open MPI's, or hydra's (MPICH, Intel MPI).
    let me: usize = ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .expect("a launcher's rank variable")
        .parse()
        .unwrap();
    let absent: usize = std::env::var(ABSENT).unwrap().parse().unwrap();
    let long = std::time::Duration::from_secs(120);
    if me == absent {
        match mode.as_str() {
            "stall" => std::thread::sleep(long),
            // SAFETY: stops this process; the launcher kills it at the end.
            "stop" => unsafe {
                libc::raise(libc::SIGSTOP);
            },
            _ => {
                let _universe = mpi::initialize().unwrap();
                std::thread::sleep(long);
            }
        }
        return;
    }
    let rt = rankmesh::Runtime::init();
    println!("STARTED {me}: {}", rt.is_ok());
}

/// A 3-rank job whose rank `absent` never starts rankmesh (`mode`): every
/// other rank names it (with its host) within the start-up timeout plus a
/// few seconds, and the job ends non-zero.
fn absent_rank_is_named(mode: &str, absent: usize) {
    if std::env::var(STARTUP).is_ok() || std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let absent_s = absent.to_string();
    let start = Instant::now();
    let job = support::mpirun(
        3,
        &exe,
        &support::rank_body("startup_worker"),
        &[
            (STARTUP, mode),
            (ABSENT, &absent_s),
            ("RANKMESH_INIT_TIMEOUT", "5"),
        ],
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{mode}: {}", job.describe());
    assert!(
        !job.stdout.contains("STARTED"),
        "{mode}: {}",
        job.describe()
    );
    assert!(
        took < 5.0 + 8.0,
        "{mode}: ended {took:.1} s after launch, past the 5 s start-up timeout plus a few seconds: {}",
        job.describe()
    );
    let step = if mode == "plain" {
        "waiting in the world communicator's duplicate (MPI_Comm_dup)"
    } else {
        "waiting in MPI_Init"
    };
    let named = format!("; rank {absent} (on ");
    let reports: Vec<&str> = job
        .stderr
        .lines()
        .filter(|l| l.contains("start-up did not finish within 5.0 s (RANKMESH_INIT_TIMEOUT)"))
        .collect();
    assert_eq!(
        reports.len(),
        2,
        "{mode}: every rank that arrived: {}",
        job.describe()
    );
    for r in &reports {
        assert!(
            r.contains(step)
                && r.contains(&named)
                && r.ends_with("has not started rankmesh; ending the job"),
            "{mode}: {r}\n{}",
            job.describe()
        );
        assert!(!r.starts_with(&format!("rankmesh: rank {absent} ")), "{r}");
    }
    assert!(
        !job.stderr.contains("panicked") && !job.stderr.contains("Signal:"),
        "{mode}: a message, no panic or signal: {}",
        job.describe()
    );
}

#[test]
fn a_rank_stalled_before_init_is_named() {
    absent_rank_is_named("stall", 2);
}

#[test]
fn rank_0_stalled_before_init_is_named() {
    absent_rank_is_named("stall", 0);
}

#[test]
fn a_rank_stopped_before_init_is_named() {
    absent_rank_is_named("stop", 1);
}

#[test]
fn a_plain_mpi_rank_that_never_starts_rankmesh_is_named() {
    absent_rank_is_named("plain", 2);
}

const CREATE: &str = "RANKMESH_CREATE_WORKER";

/// Rank 2 starts rankmesh and then never joins the group creation the
/// others enter (a group of TP/SP/DP start-up, past `Runtime::init`).
#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn create_worker() {
    if std::env::var(CREATE).is_err() {
        return;
    }
    let rt = rankmesh::Runtime::init().unwrap();
    if rt.rank() == 2 {
        std::thread::sleep(std::time::Duration::from_secs(120));
        return;
    }
    let mut ps = rankmesh::ParallelState::new(&rt).unwrap();
    let made = ps.initialize_model_parallel(1, 1, None);
    println!("CREATED {}: {}", rt.rank(), made.is_ok());
}

/// Group creation after start-up is a watched call: a rank that never
/// joins it is named, with where it is, within RANKMESH_TIMEOUT.
#[test]
fn a_rank_missing_from_group_creation_is_named() {
    if std::env::var(CREATE).is_ok()
        || std::env::var(STARTUP).is_ok()
        || std::env::var(WORKER).is_ok()
    {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let job = support::mpirun(
        3,
        &exe,
        &support::rank_body("create_worker"),
        &[(CREATE, "1"), ("RANKMESH_TIMEOUT", "3")],
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 3.0 + 10.0, "{took:.1} s: {}", job.describe());
    assert!(
        job.stderr.contains("group rank 2 (world rank 2, host ")
            && job.stderr.contains(
                "has not entered this call; it has made no call since its runtime started "
            ),
        "{}",
        job.describe()
    );
    assert_eq!(job.code, Some(75), "{}", job.describe());
}
