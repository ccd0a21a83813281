//! `RANKMESH_ON_HANG=error` and the interrupt check: a call that cannot
//! complete fails on the ranks waiting in it, with the report the watchdog
//! would print, instead of ending the process; every later call fails at
//! once with the same reason; dropping the runtime ends the job with the
//! watchdog's exit code (75 no progress, 76 a member left, 130 interrupt).

mod support;

use rankmesh::{Collectives as _, Error, ReduceOp, Runtime, Tensor};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const WORKER: &str = "RANKMESH_GIVE_UP_WORKER";

static START: OnceLock<Instant> = OnceLock::new();

/// The interrupt check of the `interrupt` mode: fires one second in.
fn one_second_in() -> bool {
    START
        .get()
        .is_some_and(|t| t.elapsed() > Duration::from_secs(1))
}

/// Prints what a failed call was given up for, then the same for the next
/// call, which must fail before it runs.
fn report(rt: &Runtime, g: &rankmesh::GroupCoordinator<'_>, first: rankmesh::Result<Tensor>) {
    let x = Tensor::from_vec([2], vec![0.25f32; 2]).unwrap();
    let Err(Error::Abandoned { why, msg, .. }) = first else {
        panic!(
            "rank {}: expected a call given up, got {first:?}",
            rt.rank()
        );
    };
    println!("GAVE-UP {} {why:?}: {msg}", rt.rank());
    let t = Instant::now();
    let again = g.all_reduce(&x, ReduceOp::Sum);
    let Err(Error::Abandoned { why: again, .. }) = again else {
        panic!("the next call must fail: {again:?}");
    };
    println!(
        "AGAIN {} {again:?} in {} ms",
        rt.rank(),
        t.elapsed().as_millis()
    );
    assert_eq!(rt.given_up().map(|g| g.0), Some(why));
}

#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    let Ok(mode) = std::env::var(WORKER) else {
        return;
    };
    // Fault tolerance asked for where the MPI has none (Open MPI 4,
    // MPICH): refused at start, on every rank.
    if mode == "ft-without-ulfm" {
        match Runtime::init() {
            Err(e) => println!(
                "REFUSED {}: {e}",
                std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default()
            ),
            Ok(rt) => panic!(
                "rank {}: started with fault tolerance and no ULFM",
                rt.rank()
            ),
        }
        return;
    }
    let rt = Runtime::init().unwrap();
    // Shrinking a job without ULFM: a clear error, not undefined behaviour.
    if mode == "shrink-without-ulfm" {
        let rank = rt.rank();
        match rt.shrink() {
            Err(Error::State(msg)) => println!("SHRINK-REFUSED {rank}: {msg}"),
            Err(e) => panic!("rank {rank}: shrink without ULFM: {e}"),
            Ok(_) => panic!("rank {rank}: shrink without ULFM succeeded"),
        }
        return;
    }
    if mode == "retire-without-ulfm" {
        let rank = rt.rank();
        match rt.retire(rank == 0) {
            Err(Error::State(msg)) => println!("RETIRE-REFUSED {rank}: {msg}"),
            Err(e) => panic!("rank {rank}: retire without ULFM: {e}"),
            Ok(_) => panic!("rank {rank}: retire without ULFM succeeded"),
        }
        return;
    }
    let g = rt.world_group().unwrap();
    let x = Tensor::from_vec([2], vec![0.25f32; 2]).unwrap();
    let long = Duration::from_secs(20);
    match (mode.as_str(), rt.rank()) {
        // Rank 1 never calls; the ranks waiting for it fail.
        ("skip", 1) => std::thread::sleep(long),
        ("skip", _) => report(&rt, &g, g.all_reduce(&x, ReduceOp::Sum)),
        // Rank 1 stops inside their run of calls (its peer waits on a
        // window or on MPI requests it has used already).
        ("stopped", r) => {
            for _ in 0..50 {
                let y = g.all_reduce(&x, ReduceOp::Sum).unwrap();
                assert_eq!(y.as_slice::<f32>().unwrap(), &[0.5f32; 2][..]);
            }
            if r == 1 {
                // SAFETY: stops this process; the launcher kills it.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            report(&rt, &g, g.all_reduce(&x, ReduceOp::Sum));
        }
        // Rank 1 panics before the call; ranks 0 and 2 are told at once.
        ("left", 1) => panic!("rank 1 gives up on its own"),
        ("left", _) => report(&rt, &g, g.all_reduce(&x, ReduceOp::Sum)),
        // Rank 0's interrupt check fires while it waits for rank 1;
        // rank 2, waiting too, is told that rank 0 left.
        ("interrupt", 1) => std::thread::sleep(long),
        ("interrupt", r) => {
            if r == 0 {
                START.get_or_init(Instant::now);
                rt.set_interrupt_check(Some(one_second_in));
            }
            report(&rt, &g, g.all_reduce(&x, ReduceOp::Sum));
        }
        _ => unreachable!("mode {mode}"),
    }
}

fn job(np: usize, mode: &str, env: &[(&str, &str)]) -> support::Job {
    let exe = std::env::current_exe().unwrap();
    let mut all = vec![(WORKER, mode), ("RANKMESH_ON_HANG", "error")];
    all.extend_from_slice(env);
    support::mpirun(np, &exe, &support::rank_body("worker"), &all)
}

fn skipped_call_fails(plane: &str) {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let t = Instant::now();
    let job = job(
        2,
        "skip",
        &[("RANKMESH_TIMEOUT", "2"), ("RANKMESH_HOST_PLANE", plane)],
    );
    let took = t.elapsed().as_secs_f64();
    let out = &job.stdout;
    assert!(
        out.contains("GAVE-UP 0 Timeout: no progress for ")
            && out.contains("(RANKMESH_TIMEOUT=2 s); group rank 1 (world rank 1, host ")
            && out.contains("): has not entered this call; it is in no call"),
        "rank 0's call fails naming rank 1 and where it is: {}",
        job.describe()
    );
    assert!(out.contains("AGAIN 0 Timeout in "), "{}", job.describe());
    assert_eq!(job.code, Some(75), "{}", job.describe());
    assert!(took < 15.0, "took {took} s: {}", job.describe());
    assert!(
        !job.stderr.contains("aborting the job (RANKMESH_TIMEOUT"),
        "given up, not ended by the watchdog: {}",
        job.describe()
    );
}

#[test]
fn a_skipped_call_fails_on_shared_memory() {
    skipped_call_fails("shm");
}

#[test]
fn a_skipped_call_fails_on_mpi() {
    skipped_call_fails("mpi");
}

#[test]
fn a_call_with_a_stopped_peer_fails_on_mpi() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let job = job(
        2,
        "stopped",
        &[("RANKMESH_TIMEOUT", "2"), ("RANKMESH_HOST_PLANE", "mpi")],
    );
    assert!(
        job.stdout.contains("GAVE-UP 0 Timeout: no progress for ")
            && job.stdout.contains("group rank 1 (world rank 1, host ")
            && job
                .stdout
                .contains(", process stopped): has not entered this call"),
        "{}",
        job.describe()
    );
    assert_eq!(job.code, Some(75), "{}", job.describe());
}

#[test]
fn a_member_that_left_fails_the_call_on_the_others() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let t = Instant::now();
    let job = job(3, "left", &[("RANKMESH_TIMEOUT", "600")]);
    // Each names the first member it finds gone (rank 1, or rank 0 once it
    // gave up in turn), and the cause travels with it.
    for r in [0, 2] {
        let line = job
            .stdout
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "GAVE-UP {r} PeerLeft: cannot complete: group rank "
                ))
            })
            .unwrap_or_else(|| panic!("rank {r}: {}", job.describe()));
        assert!(
            line.contains("left after: panicked: rank 1 gives up on its own"),
            "rank {r}: {}",
            job.describe()
        );
    }
    assert!(t.elapsed() < Duration::from_secs(30), "{}", job.describe());
    assert_ne!(job.code, Some(0), "{}", job.describe());
}

#[test]
fn an_interrupt_fails_the_call_and_its_peers_are_told() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let job = job(3, "interrupt", &[("RANKMESH_TIMEOUT", "600")]);
    assert!(
        job.stdout
            .contains("GAVE-UP 0 Interrupted: interrupted while waiting"),
        "{}",
        job.describe()
    );
    assert!(
        job.stdout
            .contains("GAVE-UP 2 PeerLeft: cannot complete: group rank 0 (world rank 0, host ")
            && job
                .stdout
                .contains("left after: all_reduce on world: interrupted"),
        "{}",
        job.describe()
    );
    assert!(
        matches!(job.code, Some(130) | Some(76)),
        "the interrupted rank's 130, or its peer's 76 if first: {}",
        job.describe()
    );
}

#[test]
fn shrink_retire_and_fault_tolerance_are_refused_without_ulfm() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let shrunk = job(2, "shrink-without-ulfm", &[]);
    assert!(shrunk.ok(), "{}", shrunk.describe());
    for rank in 0..2 {
        assert!(
            shrunk.stdout.contains(&format!(
                "SHRINK-REFUSED {rank}: shrink needs a job that survives a lost rank"
            )),
            "rank {rank} names why: {}",
            shrunk.describe()
        );
    }
    let retired = job(2, "retire-without-ulfm", &[]);
    assert!(retired.ok(), "{}", retired.describe());
    assert_eq!(
        retired
            .stdout
            .matches(": retire needs a job that survives a lost rank")
            .count(),
        2,
        "both ranks refuse: {}",
        retired.describe()
    );
    let started = job(2, "ft-without-ulfm", &[("OMPI_MCA_mpi_ft_enable", "1")]);
    assert_eq!(
        started
            .stdout
            .matches("OMPI_MCA_mpi_ft_enable asks for fault tolerance")
            .count(),
        2,
        "both ranks refuse: {}",
        started.describe()
    );
}
