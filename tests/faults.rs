//! Fault injection under real `mpirun`: ranks that stop (SIGSTOP) between
//! calls or inside a small or a 256 MiB transfer, a rank killed with -9, a
//! rank that returns early, mixed object/tensor calls, and a forged peer
//! speaking raw MPI on the group's communicator (huge length, short or
//! missing payload, deep nesting, wrong magic). Each job must end within
//! `RANKMESH_TIMEOUT` plus a few seconds, non-zero, with a message naming
//! the missing or offending rank, and leave nothing in /dev/shm.
//!
//! The jobs run one at a time (a lock), so /dev/shm can be compared before
//! and after each.

mod support;

use mpi::traits::*;
use rankmesh::agree::Descriptor;
use rankmesh::exec::mpi::{TAG_DATA, TAG_HEADER};
use rankmesh::op::Op;
use rankmesh::Objects as _;
use rankmesh::{Collectives as _, DType, ReduceOp, Runtime, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WORKER: &str = "RANKMESH_FAULT_WORKER";
const TIMEOUT_S: &str = "3";
static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A recursive type, the target of the deep-nesting attack.
#[derive(Serialize, Deserialize, Debug)]
enum Tree {
    Leaf(u8),
    Node(Box<Tree>),
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The type digest rankmesh puts in object descriptors (FNV-1a of the name).
fn type_digest<T>() -> i64 {
    fnv1a(std::any::type_name::<T>().as_bytes()) as i64
}

/// Rank 1 of the forged-peer jobs: a raw-MPI header and payload on the
/// group's own communicator, as a buggy or hostile peer would send them.
fn forge(g: &rankmesh::GroupCoordinator<'_>, attack: &str) {
    let comm = g.communicator();
    let to0 = comm.process_at_rank(0);
    let mut header = Descriptor::new(Op::SendObject, &[type_digest::<Vec<u8>>()]);
    let mut payload = vec![7u8; 100];
    match attack {
        "huge" => header.len = 1 << 40,
        "short" => header.len = 100,
        "missing" => header.len = 100,
        "deep" => {
            header = Descriptor::new(Op::SendObject, &[type_digest::<Tree>()]);
            payload = vec![1u8; 1_000_000]; // a million `Node` tags
            payload.extend([0, 7]);
            header.len = payload.len() as u64;
        }
        "magic" => {
            let mut bytes = bytemuck::bytes_of(&header).to_vec();
            bytes[..8].copy_from_slice(&0xdead_beef_u64.to_le_bytes());
            to0.send_with_tag(&bytes[..], TAG_HEADER);
            std::thread::sleep(Duration::from_secs(30));
            return;
        }
        other => panic!("unknown attack {other}"),
    }
    to0.send_with_tag(bytemuck::bytes_of(&header), TAG_HEADER);
    let mut answer = vec![0u8; std::mem::size_of::<Descriptor>()];
    comm.process_at_rank(0).receive_into(&mut answer[..]);
    match attack {
        "short" => to0.send_with_tag(&payload[..10], TAG_DATA),
        "missing" => {}
        "deep" => to0.send_with_tag(&payload[..], TAG_DATA),
        _ => {}
    }
    // Stay alive: the victim must fail on its own, not because we left.
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    let Ok(mode) = std::env::var(WORKER) else {
        return;
    };
    let rt = Runtime::init().unwrap();
    let g = rt.world_group().unwrap();
    let me = rt.rank();
    let small = Tensor::from_vec([4], vec![1.5f32; 4]).unwrap();
    let report = |r: rankmesh::Result<()>| match r {
        Ok(()) => println!("rank {me}: ok"),
        Err(e) => {
            // One write: the two ranks' lines must not interleave.
            let line = format!("rank {me}: error: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            std::process::exit(1);
        }
    };
    match (mode.as_str(), me) {
        ("stop-between", 1) => {
            g.barrier().unwrap();
            // SAFETY: raise(3) on ourselves.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        ("stop-between", _) => {
            g.barrier().unwrap();
            report(g.all_reduce(&small, ReduceOp::Sum).map(drop));
        }
        ("stop-small", r) => {
            if r == 1 {
                support::signal_self_after(libc::SIGSTOP, Duration::from_millis(300));
            }
            loop {
                g.all_reduce(&small, ReduceOp::Sum).unwrap();
            }
        }
        ("stop-large", r) => {
            let big = Tensor::zeros([64 << 20], DType::F32).unwrap(); // 256 MiB
            g.barrier().unwrap();
            if r == 1 {
                support::signal_self_after(libc::SIGSTOP, Duration::from_millis(400));
            }
            loop {
                g.all_reduce(&big, ReduceOp::Sum).unwrap();
            }
        }
        ("kill9", r) => {
            if r == 1 {
                support::signal_self_after(libc::SIGKILL, Duration::from_millis(300));
            }
            let big = Tensor::zeros([4 << 20], DType::F32).unwrap();
            loop {
                g.all_reduce(&big, ReduceOp::Sum).unwrap();
            }
        }
        ("return-early", 1) => {
            println!("rank 1: returning early");
        }
        ("return-early", _) => {
            std::thread::sleep(Duration::from_millis(200));
            report(g.barrier());
        }
        ("object-vs-barrier", 0) => {
            report(g.broadcast_object(Some(&"hello".to_string()), 0).map(drop))
        }
        ("object-vs-barrier", _) => report(g.barrier()),
        ("forged-huge-broadcast", 1) => {
            // A collective descriptor announcing a 1 TiB object.
            let mut d = Descriptor::new(Op::BroadcastObject, &[1, type_digest::<Vec<u8>>()]);
            d.len = 1 << 40;
            let comm = g.communicator();
            let mut max = [0u64; 5];
            comm.all_reduce_into(
                &d.agreement_record(d.digest(), 1)[..],
                &mut max[..],
                mpi::collective::SystemOperation::max(),
            );
            std::thread::sleep(Duration::from_secs(30));
        }
        ("forged-huge-broadcast", _) => report(g.broadcast_object::<Vec<u8>>(None, 1).map(drop)),
        ("layout-one-rank", r) => {
            let mut ps = rankmesh::ParallelState::new(&rt).unwrap();
            let tp = if r == 1 { 3 } else { 1 };
            report(ps.initialize_model_parallel(tp, 1, None));
        }
        ("stateless-order", r) => {
            let ranks = if r == 0 { [0, 1] } else { [1, 0] };
            report(rankmesh::StatelessGroup::create(&rt, &ranks).map(drop));
        }
        (attack, 1) => forge(&g, attack.trim_start_matches("forged-")),
        ("forged-deep", _) => report(g.recv_object::<Tree>(1).map(drop)),
        (_, _) => report(g.recv_object::<Vec<u8>>(1).map(drop)),
    }
}

fn shm_files() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs fault `mode` on 2 ranks with `env`; checks the bound on time, the
/// non-zero exit and /dev/shm; returns the job for the message checks.
fn run_fault_with(mode: &str, env: &[(&str, &str)]) -> support::Job {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = shm_files();
    let start = Instant::now();
    let job = support::mpirun(
        2,
        &std::env::current_exe().unwrap(),
        &support::rank_body("worker"),
        &[&[(WORKER, mode), ("RANKMESH_TIMEOUT", TIMEOUT_S)], env].concat(),
    );
    let took = start.elapsed().as_secs_f64();
    assert!(!job.ok(), "{mode}: must fail\n{}", job.describe());
    assert!(
        took < 3.0 + 25.0,
        "{mode}: ended in {took:.1} s, not within the timeout plus a few seconds\n{}",
        job.describe()
    );
    std::thread::sleep(Duration::from_millis(300));
    let left: Vec<String> = shm_files().difference(&before).cloned().collect();
    assert!(left.is_empty(), "{mode}: left in /dev/shm: {left:?}");
    job
}

fn run_fault(mode: &str) -> support::Job {
    run_fault_with(mode, &[])
}

/// The agreement ended the job, not the watchdog: no rank printed the
/// watchdog's "waited ... with no progress" report. (Said by the output,
/// not by the job's time, which on a busy machine includes the launch.)
fn ended_by_agreement(job: &support::Job) {
    assert!(
        !job.stderr.contains("with no progress in"),
        "the watchdog, not the agreement, ended it: {}",
        job.describe()
    );
}

fn assert_has(job: &support::Job, needles: &[&str]) {
    for n in needles {
        assert!(job.stderr.contains(n), "missing {n:?}\n{}", job.describe());
    }
}

fn skip_in_worker() -> bool {
    std::env::var(WORKER).is_ok()
}

#[test]
fn a_rank_stopped_between_calls_is_named_as_stopped_and_not_in_the_call() {
    if skip_in_worker() {
        return;
    }
    let traces = std::env::temp_dir().join(format!("rankmesh-traces-{}", std::process::id()));
    let job = run_fault_with(
        "stop-between",
        &[("RANKMESH_TRACE_DIR", traces.to_str().unwrap())],
    );
    assert_eq!(
        job.code,
        Some(rankmesh::error::TIMEOUT_EXIT),
        "{}",
        job.describe()
    );
    // The rank that fired left its flight record for the post-mortem.
    let trace = std::fs::read_to_string(traces.join("rankmesh-trace-rank0.txt")).unwrap();
    assert!(
        trace.contains("#2 world call #1 all_reduce(shape [4] f32, op sum)"),
        "{trace}"
    );
    assert!(trace.contains("process stopped"), "{trace}");
    let _ = std::fs::remove_dir_all(&traces);
    assert_has(
        &job,
        &[
            "rankmesh: rank 0 (host ",
            "with no progress in all_reduce on world (call #1)",
            "group rank 1 (world rank 1, host ",
            "process stopped): has not entered this call; it is in no call, its last call began ",
            "rankmesh: rank 0: flight recorder",
        ],
    );
}

/// A rank stopped mid-loop of all_reduces: named, with its process state.
fn assert_stopped_rank_named(mode: &str) {
    let job = run_fault(mode);
    assert_eq!(
        job.code,
        Some(rankmesh::error::TIMEOUT_EXIT),
        "{}",
        job.describe()
    );
    assert_has(
        &job,
        &[
            "with no progress in all_reduce on world",
            "group rank 1 (world rank 1, host ",
            "process stopped)",
        ],
    );
}

#[test]
fn a_rank_stopped_inside_a_small_transfer_is_named() {
    if skip_in_worker() {
        return;
    }
    assert_stopped_rank_named("stop-small");
}

#[test]
fn a_rank_stopped_inside_a_256_mib_transfer_is_named() {
    if skip_in_worker() {
        return;
    }
    assert_stopped_rank_named("stop-large");
}

#[test]
fn a_rank_killed_mid_collective_ends_the_job() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("kill9");
    // The launcher notices the death first and names the signal (Open MPI's
    // mpirun on stderr, hydra on stdout), or rank 0 names rank 1.
    assert!(
        job.stderr.contains("signal 9")
            || job.stdout.contains("(signal 9)")
            || job.stderr.contains("world rank 1"),
        "{}",
        job.describe()
    );
}

#[test]
fn a_rank_that_returns_early_is_named() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("return-early");
    assert_eq!(
        job.code,
        Some(rankmesh::error::TIMEOUT_EXIT),
        "{}",
        job.describe()
    );
    assert_has(
        &job,
        &[
            "with no progress in barrier on world (call #0)",
            "group rank 1 (world rank 1, host ",
            "has not entered this call; its runtime shut down",
        ],
    );
}

#[test]
fn an_object_call_facing_a_barrier_is_a_named_error_on_both_ranks_at_once() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("object-vs-barrier");
    ended_by_agreement(&job);
    let msg =
        "ranks are in different calls: group rank 0 is in call #0 broadcast_object(src 0, type #";
    assert_eq!(job.stderr.matches(msg).count(), 2, "{}", job.describe());
    assert_has(&job, &["but group rank 1 is in call #0 barrier()"]);
}

#[test]
fn a_forged_huge_object_length_is_refused_before_allocating() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("forged-huge");
    assert_has(&job, &["rank 0: error: send_object/recv_object on world: group rank 1 sends an object of 1099511627776 bytes but group rank 0 accepts at most 4294967296 (RANKMESH_MAX_OBJECT_BYTES)"]);
    // The forger speaks the MPI executor's agreement (the shared-memory
    // one reads descriptors from the window, with the same checks).
    let job = run_fault_with("forged-huge-broadcast", &[("RANKMESH_HOST_PLANE", "mpi")]);
    assert_has(&job, &["rank 0: error: broadcast_object on world: group rank 1: an object of 1099511627776 bytes exceeds RANKMESH_MAX_OBJECT_BYTES=4294967296"]);
}

#[test]
fn a_forged_short_payload_is_an_error() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("forged-short");
    assert_has(&job, &["rank 0: error: send_object/recv_object on world: group rank 1 sent 10 bytes in a piece that should hold 100"]);
}

#[test]
fn a_forged_missing_payload_is_caught_by_the_watchdog() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("forged-missing");
    assert_eq!(
        job.code,
        Some(rankmesh::error::TIMEOUT_EXIT),
        "{}",
        job.describe()
    );
    assert_has(
        &job,
        &[
            "with no progress in send_object/recv_object on world",
            "group rank 1 (world rank 1, host ",
        ],
    );
}

#[test]
fn a_forged_deeply_nested_object_is_a_decode_error_not_a_crash() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("forged-deep");
    assert_has(
        &job,
        &[
            "rank 0: error: send_object/recv_object on world: cannot decode",
            "sent by group rank 1: value nested deeper than 128 levels",
        ],
    );
}

#[test]
fn a_forged_header_with_a_wrong_magic_is_named() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("forged-magic");
    assert_has(&job, &["rank 0: error: send_object/recv_object on world: group rank 1 sent a corrupt message header (magic 0xdeadbeef)"]);
}

#[test]
fn a_layout_only_one_rank_rejects_is_an_error_on_every_rank() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("layout-one-rank");
    ended_by_agreement(&job);
    assert_has(
        &job,
        &[
            "rank 1: error: invalid parallel layout",
            "rank 0: error: invalid parallel layout: rank 1 rejected the model-parallel layout (tp=1, sp=1, dp=None on this rank)",
        ],
    );
}

#[test]
fn stateless_rank_lists_in_different_orders_are_an_error_on_both_members() {
    if skip_in_worker() {
        return;
    }
    let job = run_fault("stateless-order");
    ended_by_agreement(&job);
    assert_has(
        &job,
        &[
            "rank 0: error: invalid parallel layout: world rank 1 passed a rank list with the same members in a different order than this rank's [0, 1]",
            "rank 1: error: invalid parallel layout: world rank 0 passed a rank list with the same members in a different order than this rank's [1, 0]",
        ],
    );
}
