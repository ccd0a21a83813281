//! A rank that leaves (returns an error from `main`, panics) is named at
//! once by the peers blocked in a call with it, with the error it left
//! with, whatever `RANKMESH_TIMEOUT` is; a rank that finishes cleanly
//! changes nothing for the others.

mod support;

use rankmesh::{Collectives as _, DType, Mesh, MeshLayout, P2p, ReduceOp, Runtime, Tensor};
use std::time::Instant;

const WORKER: &str = "RANKMESH_LEAVING_WORKER";

fn x(len: usize) -> Tensor {
    Tensor::from_fn(vec![len], DType::F32, |i| i as f64 * 0.25 + 1.0).unwrap()
}

/// A (pp=2, dp=2, tp=2) step on 8 ranks in which world rank 3 skips a DP
/// all_reduce: the DP pair {1, 3} meets in different calls, and both return
/// the error, as `main` would with `?`.
fn skipped_step(rt: &Runtime) -> rankmesh::Result<()> {
    let layout = MeshLayout::row_major(8, &[("pp", 2), ("dp", 2), ("tp", 2)])?;
    let mesh = Mesh::new(rt, layout, &[])?;
    let (tp, dp) = (mesh.group(&["tp"])?, mesh.group(&["dp"])?);
    let g = tp.all_reduce(&x(64), ReduceOp::Sum)?;
    if rt.rank() != 3 {
        dp.all_reduce(&g, ReduceOp::Sum)?;
    }
    dp.reduce_scatter(&g, 0, ReduceOp::Sum)?;
    tp.all_reduce(&g, ReduceOp::Sum)?;
    rt.world_group()?.barrier()
}

/// World rank 2 panics inside a TP region. `across`: the TP pairs span two
/// (fake) nodes, so its partner learns it from the notice rank 2 sends to
/// the other node's status service.
fn panics_in_tp(rt: &Runtime, across: bool) -> rankmesh::Result<()> {
    let pairs = if across {
        [vec![0, 2], vec![1, 3]]
    } else {
        [vec![0, 1], vec![2, 3]]
    };
    let tp = rt.split_groups("tp", &pairs)?.expect("a TP group");
    for i in 0..20 {
        if rt.rank() == 2 && i == 10 {
            panic!("boom in the TP region (step {i})");
        }
        tp.all_reduce(&x(256), ReduceOp::Sum)?;
    }
    rt.world_group()?.barrier()
}

/// Ranks 0 and 1 wait in a world barrier from the start while ranks 2 and
/// 3 step through TP calls, 100 ms apart; rank 2 panics at step 10. Ranks 0
/// and 1 have been quiet for a second when it leaves, rank 3 only since its
/// last step: the first to look must not end the job before rank 3 names
/// the panic too.
fn panics_while_the_world_waits(rt: &Runtime) -> rankmesh::Result<()> {
    let tp = rt.split_groups("tp", &[vec![0, 1], vec![2, 3]])?;
    let world = rt.world_group()?;
    if rt.rank() >= 2 {
        let tp = tp.expect("a TP group");
        for i in 0..20 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if rt.rank() == 2 && i == 10 {
                panic!("boom while the world waits (step {i})");
            }
            tp.all_reduce(&x(256), ReduceOp::Sum)?;
        }
    }
    world.barrier()
}

/// World rank 1 panics at once while rank 0 waits in a receive from rank
/// 2, which sends 1.5 s later (past the watchdog's grace for a member that
/// left): a point-to-point call waits on its peer only, so rank 0 receives
/// and checks the tensor, and neither it nor rank 2 names rank 1.
fn third_member_leaves_during_a_receive(rt: &Runtime) -> rankmesh::Result<()> {
    let world = rt.world_group()?;
    match rt.rank() {
        1 => panic!("boom beside a point-to-point pair"),
        2 => {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            world.send(&x(1000), Some(0))?;
        }
        _ => {
            let mut out = Tensor::zeros([1000], DType::F32)?;
            world.recv_into(&mut out, Some(2))?;
            let want = x(1000);
            assert_eq!(out.to_f64_vec(), want.to_f64_vec());
            println!("RECEIVED-OK {}", rt.rank());
        }
    }
    Ok(())
}

/// Ranks 0 and 2 swap two tensors each way in one `batch_send_recv`, rank 2
/// 1.5 s late; rank 1, not one of their peers, panics first.
fn third_member_leaves_during_a_batch(rt: &Runtime) -> rankmesh::Result<()> {
    let world = rt.world_group()?;
    let me = rt.rank();
    if me == 1 {
        panic!("boom beside a point-to-point pair");
    }
    if me == 2 {
        std::thread::sleep(std::time::Duration::from_millis(1500));
    }
    let peer = 2 - me;
    let (a, b) = (mine(me, 1000), mine(me, 300));
    let mut got_a = Tensor::zeros([1000], DType::F32)?;
    let mut got_b = Tensor::zeros([300], DType::F32)?;
    world.batch_send_recv(&mut [
        P2p::Recv(&mut got_a, peer),
        P2p::Recv(&mut got_b, peer),
        P2p::Send(&a, peer),
        P2p::Send(&b, peer),
    ])?;
    assert_eq!(got_a.to_f64_vec(), mine(peer, 1000).to_f64_vec());
    assert_eq!(got_b.to_f64_vec(), mine(peer, 300).to_f64_vec());
    println!("RECEIVED-OK {me}");
    Ok(())
}

/// `n` non-integer f32 values that differ by rank.
fn mine(rank: usize, n: usize) -> Tensor {
    Tensor::from_fn(vec![n], DType::F32, |i| {
        rank as f64 * 1000.0 + i as f64 * 0.37
    })
    .unwrap()
}

/// Rank 0 finishes at once; the others compute for 3 s, then run calls among
/// themselves: a correct program, nothing to report.
fn finishes_early(rt: &Runtime) -> rankmesh::Result<()> {
    let world = rt.world_group()?;
    world.all_reduce(&x(8), ReduceOp::Sum)?;
    let rest = rt.split_groups("rest", &[(1..rt.size()).collect()])?;
    if let Some(rest) = rest {
        std::thread::sleep(std::time::Duration::from_secs(3));
        for _ in 0..10 {
            rest.all_reduce(&x(32), ReduceOp::Sum)?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() -> rankmesh::Result<()> {
    let Ok(mode) = std::env::var(WORKER) else {
        return Ok(());
    };
    let rt = Runtime::init()?;
    match mode.as_str() {
        "skip" => skipped_step(&rt)?,
        "panic" => panics_in_tp(&rt, false)?,
        "panic-across" => panics_in_tp(&rt, true)?,
        "panic-waited" => panics_while_the_world_waits(&rt)?,
        "third-leaves" => third_member_leaves_during_a_receive(&rt)?,
        "third-leaves-batch" => third_member_leaves_during_a_batch(&rt)?,
        _ => finishes_early(&rt)?,
    }
    println!("WORKER-DONE {}", rt.rank());
    Ok(())
}

fn run(np: usize, env: &[(&str, &str)]) -> (support::Job, f64) {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let job = support::mpirun(np, &exe, &support::rank_body("worker"), env);
    (job, start.elapsed().as_secs_f64())
}

/// The new user's case at np 8, with the default RANKMESH_TIMEOUT (600 s).
#[test]
fn a_rank_returning_an_error_is_named_with_it_and_the_job_ends() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, took) = run(8, &[(WORKER, "skip")]);
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 10.0, "ended in {took:.1} s: {}", job.describe());
    // The two ranks that met in different calls print why they leave.
    let cause = "ranks are in different calls";
    let leavers = job
        .stderr
        .lines()
        .filter(|l| l.contains(") leaves after: ") && l.contains(cause))
        .count();
    assert_eq!(leavers, 2, "{}", job.describe());
    // A rank blocked in a later call names a leaver and its error.
    assert!(
        job.stderr
            .lines()
            .any(|l| l.contains("cannot complete: group rank ")
                && l.contains(" left after: ")
                && l.contains(cause)),
        "{}",
        job.describe()
    );
    assert_eq!(job.code, Some(76), "{}", job.describe());
    assert!(
        !job.stderr.contains("flight recorder"),
        "the cause, not 167 lines of flight records: {}",
        job.describe()
    );
}

fn a_panic_is_named(plane: &str) {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, took) = run(4, &[(WORKER, "panic"), ("RANKMESH_HOST_PLANE", plane)]);
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 8.0, "ended in {took:.1} s: {}", job.describe());
    assert!(
        job.stderr.lines().any(|l| l
            .contains("cannot complete: group rank 0 (world rank 2, host ")
            && l.contains(
                "left after: panicked: boom in the TP region (step 10) at tests/leaving.rs"
            )),
        "rank 3 names rank 2 and its panic: {}",
        job.describe()
    );
    assert_eq!(job.code, Some(76), "{}", job.describe());
}

#[test]
fn a_panic_is_named_on_shared_memory() {
    a_panic_is_named("shm");
}

#[test]
fn a_panic_is_named_on_mpi() {
    a_panic_is_named("mpi");
}

/// Every rank blocked with the one that left names it, not only the first
/// to look (its `MPI_Abort` used to kill the others mid-look).
#[test]
fn every_rank_blocked_with_a_leaver_names_it() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, took) = run(4, &[(WORKER, "panic-waited")]);
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 10.0, "ended in {took:.1} s: {}", job.describe());
    let cause = "left after: panicked: boom while the world waits (step 10)";
    for (rank, call) in [
        (0, "barrier on world"),
        (1, "barrier on world"),
        (3, "all_reduce on tp"),
    ] {
        assert!(
            job.stderr
                .lines()
                .any(|l| l.starts_with(&format!("rankmesh: rank {rank} (host "))
                    && l.contains(call)
                    && l.contains("(world rank 2, host ")
                    && l.contains(cause)),
            "rank {rank} names rank 2 and its panic: {}",
            job.describe()
        );
    }
    assert_eq!(job.code, Some(76), "{}", job.describe());
}

/// A member that is not a point-to-point call's peer does not stop it
/// when it leaves (the call used to be named blocked by any member of its
/// group that left).
#[test]
fn a_third_member_leaving_does_not_stop_a_point_to_point_call() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, took) = run(3, &[(WORKER, "third-leaves")]);
    assert!(!job.ok(), "rank 1 panicked: {}", job.describe());
    assert!(took < 20.0, "ended in {took:.1} s: {}", job.describe());
    assert!(
        job.stdout.contains("RECEIVED-OK 0"),
        "rank 0 received from rank 2: {}",
        job.describe()
    );
    assert!(
        job.stderr
            .contains("leaves after: panicked: boom beside a point-to-point pair"),
        "{}",
        job.describe()
    );
    assert!(
        !job.stderr.contains("cannot complete"),
        "{}",
        job.describe()
    );
}

/// The same with a batch of sends and receives between ranks 0 and 2.
#[test]
fn a_third_member_leaving_does_not_stop_a_batch_between_two_others() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, took) = run(3, &[(WORKER, "third-leaves-batch")]);
    assert!(!job.ok(), "rank 1 panicked: {}", job.describe());
    assert!(took < 20.0, "ended in {took:.1} s: {}", job.describe());
    for r in [0, 2] {
        assert!(
            job.stdout.contains(&format!("RECEIVED-OK {r}")),
            "rank {r} got its peer's tensors: {}",
            job.describe()
        );
    }
    assert!(
        !job.stderr.contains("cannot complete"),
        "{}",
        job.describe()
    );
}

/// Two fake nodes of two ranks; rank 2 (node 1) panics while its TP partner,
/// rank 0, waits on node 0.
#[test]
fn a_panic_on_another_node_is_named() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    if !support::fake_nodes_available() {
        support::skip("a_panic_on_another_node_is_named", "no UTS namespaces here");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let job = support::fake_nodes(
        "2,2",
        &exe,
        &support::rank_body("worker"),
        &[(WORKER, "panic-across")],
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{}", job.describe());
    assert!(took < 15.0, "ended in {took:.1} s: {}", job.describe());
    assert!(
        job.stderr.lines().any(|l| l.contains("rank 0 (host ")
            && l.contains("cannot complete: group rank 1 (world rank 2, host ")
            && l.contains("left after: panicked: boom in the TP region (step 10)")),
        "rank 0 names rank 2 on the other node: {}",
        job.describe()
    );
}

#[test]
fn a_rank_that_finishes_first_changes_nothing() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let (job, _) = run(4, &[(WORKER, "early")]);
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(
        job.stdout.matches("WORKER-DONE").count(),
        4,
        "{}",
        job.describe()
    );
    assert!(!job.stderr.contains("left"), "{}", job.describe());
}

#[test]
fn an_error_from_main_prints_its_message() {
    let e = rankmesh::Error::Layout("tp 3 does not divide a world of 8".into());
    assert_eq!(format!("{e:?}"), e.to_string());
    assert_eq!(
        format!("{e:?}"),
        "invalid parallel layout: tp 3 does not divide a world of 8"
    );
}
