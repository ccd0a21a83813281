//! Groups across separately launched jobs: `StatelessGroup::connect` between
//! two (or more) real `mpirun` jobs on loopback, as a trainer job and an
//! inference job would form one (FastVideo's `StatelessProcessGroup.create`).
//!
//! One binary, two roles. Started by the test runner it is the driver: it
//! picks a free port and launches jobs of itself concurrently. Started with
//! `RANKMESH_2J_ROLE` it is a member: its group rank is
//! `RANKMESH_2J_OFFSET + its MPI rank`, the group has `RANKMESH_2J_WORLD`
//! members, and it prints `2J-OK rank R` or `2J-ERR rank R: <error>`.

mod support;

use libtest_mimic::{Arguments, Failed, Trial};
use rankmesh::{DType, Runtime, StatelessGroup, Tensor};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct Config {
    step: u64,
    lr: f64,
    names: Vec<String>,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// Member `r`'s weights: non-integer values every member can recompute.
fn weights(r: usize, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_fn(shape.to_vec(), dtype, |i| {
        ((i * 37 + r * 101) % 1000) as f64 / 7.0 - 50.0
    })
    .unwrap()
}

/// The full exchange: objects and host tensors in FastVideo's patterns.
fn exchange(g: &mut StatelessGroup<'_>, job: &str) -> rankmesh::Result<()> {
    let (me, n) = (g.rank(), g.world_size());
    assert!(g.group().is_none(), "a TCP group has no MPI communicator");
    // Who is here, in rank order, from both jobs.
    let who: Vec<(usize, String)> = g.all_gather_obj(&(me, job.to_string()))?;
    assert_eq!(
        who.iter().map(|w| w.0).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    assert!(
        who.iter().any(|w| w.1 != who[0].1),
        "members from two jobs: {who:?}"
    );

    // The source broadcasts and moves on; a config carrying floats.
    let cfg = Config {
        step: 7,
        lr: 3.0e-4,
        names: vec!["q_proj".into(), "k_proj".into()],
    };
    let got = g.broadcast_obj((me == 0).then_some(&cfg), 0)?;
    assert_eq!(got, cfg);

    // Weight sync: member 0 broadcasts f32 and bf16 tensors.
    for (shape, dtype) in [
        (&[64usize, 33][..], DType::F32),
        (&[5, 7, 3][..], DType::BF16),
    ] {
        let w = weights(0, shape, dtype);
        let got = g.broadcast_tensor((me == 0).then_some(&w), 0)?;
        assert_eq!(got, w, "broadcast_tensor {dtype}");
    }

    // Everyone sends to everyone (self included), then receives: no deadlock.
    for dst in 0..n {
        g.send_obj(&(me, dst, 0.25 * me as f64), dst)?;
    }
    for src in 0..n {
        let (from, to, x): (usize, usize, f64) = g.recv_obj(src)?;
        assert_eq!((from, to, x), (src, me, 0.25 * src as f64));
    }

    // Ring of tensors larger than the send buffer: one is always accepted,
    // so both send, then receive. (A second send before receiving would
    // wait for the first to be taken: the bound is the bound.)
    g.set_send_buffer(1 << 20);
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let big = weights(me, &[3, 1 << 20], DType::F32); // 12 MiB
    g.send_tensor(&big, next)?;
    assert_eq!(
        g.recv_tensor(prev)?,
        weights(prev, &[3, 1 << 20], DType::F32)
    );
    g.send_tensor(&weights(me, &[4], DType::I64), next)?;
    assert_eq!(g.recv_tensor(prev)?, weights(prev, &[4], DType::I64));
    g.set_send_buffer(rankmesh::stateless::DEFAULT_SEND_BUFFER_BYTES);

    // Bad ranks are errors naming the value, before anything is sent.
    let e = g
        .send_tensor(&weights(me, &[4], DType::I64), n)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("dst {n} is not a rank of this group of size {n}")),
        "{e}"
    );
    let e = g.broadcast_obj(Some(&1u8), n + 3).unwrap_err().to_string();
    assert!(e.contains(&format!("src {} is not a rank", n + 3)), "{e}");

    // A kind mismatch is an error naming both calls, and the next message is intact.
    if me == 0 {
        g.send_obj(&1u8, 1)?;
        g.send_obj(&2u8, 1)?;
    }
    if me == 1 {
        let e = g.recv_tensor(0).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 called send_obj but this rank called send_tensor"),
            "{e}"
        );
        assert_eq!(g.recv_obj::<u8>(0)?, 2);
    }
    g.barrier()?;
    g.flush()
}

fn member() -> i32 {
    let rt = Runtime::init().expect("MPI init");
    let rank = var("RANKMESH_2J_OFFSET").parse::<usize>().unwrap() + rt.rank();
    let world: usize = var("RANKMESH_2J_WORLD").parse().unwrap();
    let addr = var("RANKMESH_2J_ADDR");
    let role = var("RANKMESH_2J_ROLE");
    // A rank outside the group is refused at once, before any connection.
    let e = StatelessGroup::connect(&rt, &addr, world, world)
        .err()
        .map(|e| e.to_string());
    assert!(
        e.as_deref().is_some_and(|m| m.contains(&format!(
            "rank {world} is not a rank of a group of size {world}"
        ))),
        "{e:?}"
    );
    let outcome = (|| -> rankmesh::Result<()> {
        let mut g = StatelessGroup::connect(&rt, &addr, rank, world)?;
        match role.as_str() {
            "exchange" => exchange(&mut g, &var("RANKMESH_2J_JOB")),
            // Member 0 never sends: member 1's receive must time out.
            "silent" if rank == 0 => {
                std::thread::sleep(Duration::from_secs(4));
                Ok(())
            }
            "silent" => g.recv_obj::<u32>(0).map(|_| ()),
            // Member 0 leaves at once: member 1's receive must say so.
            "leaves" if rank == 0 => Ok(()),
            "leaves" => g.recv_obj::<u32>(0).map(|_| ()),
            other => panic!("unknown role {other}"),
        }
    })();
    match outcome {
        Ok(()) => println!("2J-OK rank {rank}"),
        Err(e) => println!("2J-ERR rank {rank}: {e}"),
    }
    0
}

/// A loopback address nobody listens on yet.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

struct JobSpec<'a> {
    np: usize,
    offset: usize,
    world: usize,
    role: &'a str,
    extra: &'a [(&'a str, &'a str)],
}

/// Runs the jobs concurrently (after `delays`) and returns their outputs.
fn run_jobs(addr: &str, jobs: &[JobSpec<'_>], delays: &[u64]) -> Vec<support::Job> {
    let exe = std::env::current_exe().unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let exe = &exe;
                let delay = delays.get(i).copied().unwrap_or(0);
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(delay));
                    let (offset, world, name) =
                        (j.offset.to_string(), j.world.to_string(), format!("job{i}"));
                    let mut env = vec![
                        ("RANKMESH_2J_ROLE", j.role),
                        ("RANKMESH_2J_ADDR", addr),
                        ("RANKMESH_2J_OFFSET", offset.as_str()),
                        ("RANKMESH_2J_WORLD", world.as_str()),
                        ("RANKMESH_2J_JOB", name.as_str()),
                    ];
                    env.extend_from_slice(j.extra);
                    support::mpirun(j.np, exe, &[], &env)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn lines_with<'a>(jobs: &'a [support::Job], needle: &str) -> Vec<&'a str> {
    jobs.iter()
        .flat_map(|j| j.stdout.lines())
        .filter(|l| l.contains(needle))
        .collect()
}

fn describe(jobs: &[support::Job]) -> String {
    jobs.iter()
        .enumerate()
        .map(|(i, j)| format!("=== job {i}\n{}", j.describe()))
        .collect()
}

fn expect(ok: bool, jobs: &[support::Job]) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(describe(jobs).into())
    }
}

/// A trainer job of `a` ranks and an inference job of `b` ranks form one group.
fn two_jobs_exchange(a: usize, b: usize) -> Result<(), Failed> {
    let addr = free_addr();
    let n = a + b;
    let spec = |np, offset| JobSpec {
        np,
        offset,
        world: n,
        role: "exchange",
        extra: &[],
    };
    // The second job starts first: members wait for member 0 to listen.
    let jobs = run_jobs(&addr, &[spec(a, 0), spec(b, a)], &[700, 0]);
    let ok = (0..n).all(|r| lines_with(&jobs, &format!("2J-OK rank {r}")).len() == 1);
    expect(ok && jobs.iter().all(|j| j.ok()), &jobs)
}

/// Strays during the rendezvous: a client speaking HTTP, a process with the
/// wrong world size, and two processes claiming the same rank. The group
/// still forms, of three jobs; each refused process gets an error saying why.
fn bad_peers_are_refused() -> Result<(), Failed> {
    let addr = free_addr();
    let stray = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let until = Instant::now() + Duration::from_secs(20);
            while Instant::now() < until {
                if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                    let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        })
    };
    let job = |np, offset, world| JobSpec {
        np,
        offset,
        world,
        role: "exchange",
        extra: &[("RANKMESH_TIMEOUT", "20")],
    };
    // Member 0; rank 1 with the wrong world size; rank 2; a second rank 2
    // (whichever of the two comes second is refused) while rank 1 is still
    // missing; then the real rank 1.
    let jobs = run_jobs(
        &addr,
        &[
            job(1, 0, 3),
            job(1, 1, 4),
            job(1, 2, 3),
            job(1, 2, 3),
            job(1, 1, 3),
        ],
        &[0, 300, 300, 1500, 5000],
    );
    let stray_connected = stray.join().unwrap();
    let wrong_size = lines_with(&jobs, "2J-ERR rank 1: tcp://");
    let wrong_size_ok = wrong_size
        .iter()
        .any(|l| l.contains("refused rank 1: rank 1 was given world size 4 but rank 0 has 3"));
    let dup = lines_with(&jobs, "refused rank 2: rank 2 has already joined");
    let ok = stray_connected
        && wrong_size_ok
        && dup.len() == 1
        && (0..3).all(|r| lines_with(&jobs, &format!("2J-OK rank {r}")).len() == 1);
    expect(ok, &jobs)
}

/// Nobody else arrives: member 0 and a lone member each fail within the
/// timeout with an error naming what is missing.
fn rendezvous_timeouts() -> Result<(), Failed> {
    let spec = |offset| JobSpec {
        np: 1,
        offset,
        world: 2,
        role: "exchange",
        extra: &[("RANKMESH_TIMEOUT", "2")],
    };
    let host = run_jobs(&free_addr(), &[spec(0)], &[]);
    let alone = run_jobs(&free_addr(), &[spec(1)], &[]);
    let ok = lines_with(&host, "2J-ERR rank 0: tcp://")
        .iter()
        .any(|l| l.contains("ranks [1] of 2 have not connected"))
        && lines_with(&alone, "2J-ERR rank 1: tcp://")
            .iter()
            .any(|l| l.contains("rank 0 at 127.0.0.1:") && l.contains("was not reachable within"));
    let mut all = host;
    all.extend(alone);
    expect(ok, &all)
}

/// A connected peer that never sends, or leaves: the receive is an error
/// naming it (a timeout, or a closed connection), not a hang.
fn lost_peers_are_named() -> Result<(), Failed> {
    let spec = |offset, role| JobSpec {
        np: 1,
        offset,
        world: 2,
        role,
        extra: &[("RANKMESH_TIMEOUT", "2")],
    };
    let addr = free_addr();
    let silent = run_jobs(&addr, &[spec(0, "silent"), spec(1, "silent")], &[0, 200]);
    let addr = free_addr();
    let leaves = run_jobs(&addr, &[spec(0, "leaves"), spec(1, "leaves")], &[0, 200]);
    let ok = lines_with(&silent, "2J-ERR rank 1:").iter().any(|l| {
        l.contains("send_object/recv_object on tcp://") && l.contains("for rank 0 to send")
    }) && lines_with(&leaves, "2J-ERR rank 1:")
        .iter()
        .any(|l| l.contains("rank 0 closed its connection"));
    let mut all = silent;
    all.extend(leaves);
    expect(ok, &all)
}

fn main() {
    if std::env::var_os("RANKMESH_2J_ROLE").is_some() {
        std::process::exit(member());
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("two jobs 1+1 exchange objects and host tensors", || {
            two_jobs_exchange(1, 1)
        }),
        Trial::test("two jobs 2+2 exchange objects and host tensors", || {
            two_jobs_exchange(2, 2)
        }),
        Trial::test(
            "five jobs: bad peers are refused, the group forms",
            bad_peers_are_refused,
        ),
        Trial::test(
            "rendezvous timeouts name the missing members",
            rendezvous_timeouts,
        ),
        Trial::test(
            "a silent or departed peer is an error, not a hang",
            lost_peers_are_named,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
