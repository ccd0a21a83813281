//! The job's own listeners answer only the job: a client without the job's
//! secret gets nothing from any rank's status service, the service listens
//! only on the job's addresses (never 0.0.0.0), and the job runs on
//! untroubled while strangers knock and hold connections open.

mod support;

use rankmesh::{Collectives as _, ReduceOp, Runtime, Tensor};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

const WORKER: &str = "RANKMESH_LISTENERS_WORKER";

/// This process's listening TCP sockets: their inodes among its open files,
/// found in the kernel's socket table.
fn own_listeners() -> Vec<SocketAddrV4> {
    let inodes: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(String::from)
        })
        .collect();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address st ... inode: LISTEN is state 0A.
            if f.get(3) != Some(&"0A") || !inodes.iter().any(|i| Some(&i.as_str()) == f.get(9)) {
                return None;
            }
            let (ip, port) = f[1].split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(SocketAddrV4::new(Ipv4Addr::from(ip.swap_bytes()), port))
        })
        .collect()
}

/// What a stranger gets for `request`.
fn knock(at: SocketAddrV4, request: &[u8]) -> usize {
    let Ok(mut c) = TcpStream::connect_timeout(&at.into(), Duration::from_secs(1)) else {
        return 0;
    };
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = c.write_all(request);
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    got.len()
}

#[test]
#[ignore = "rank body: run under mpirun by its test"]
fn worker() {
    if std::env::var(WORKER).is_err() {
        return;
    }
    let rt = Runtime::init().unwrap();
    let world = rt.world_group().unwrap();
    // The service's addresses, as the runtime reports them, are this
    // process's listeners: one port on the job's addresses, none on 0.0.0.0
    // (MPI's own listeners are the MPI's business: Open MPI binds 0.0.0.0,
    // UCX a port per interface).
    let all = own_listeners();
    let mine = rt.status_service();
    assert!(
        !mine.is_empty(),
        "rank {}: no status service (listeners: {all:?})",
        rt.rank()
    );
    assert!(
        mine.iter()
            .all(|a| !a.ip().is_unspecified() && a.port() == mine[0].port() && all.contains(a))
            && !all
                .iter()
                .any(|a| a.ip().is_unspecified() && a.port() == mine[0].port()),
        "rank {}: the service {mine:?} is on one port, never on 0.0.0.0: {all:?}",
        rt.rank()
    );
    // Open MPI's own listeners all bind 0.0.0.0, so there every listener on
    // a specific address is the service's: rankmesh opens no other.
    if support::open_mpi_build() {
        assert!(
            all.iter()
                .filter(|a| !a.ip().is_unspecified())
                .all(|a| mine.contains(a)),
            "rank {}: listeners besides the service {mine:?}: {all:?}",
            rt.rank()
        );
    }
    for at in &mine {
        // The old open request, the new one with a guessed secret, and noise.
        let mut guessed = b"rkmstat2".to_vec();
        guessed.extend_from_slice(&[0u8; 16]);
        for request in [&b"rkmstat1"[..], &guessed, b"GET / HTTP/1.0\r\n\r\n"] {
            let got = knock(*at, request);
            assert_eq!(
                got,
                0,
                "rank {}: {at} answered a stranger with {got} bytes",
                rt.rank()
            );
        }
    }
    // Strangers holding 200 connections open on every rank's service while
    // the job runs its calls.
    let held: Vec<TcpStream> = mine
        .iter()
        .flat_map(|at| (0..200).filter_map(|_| TcpStream::connect(*at).ok()))
        .collect();
    // The claim is about 200 held connections: fewer would test less.
    assert_eq!(
        held.len(),
        200 * mine.len(),
        "rank {}: only {} of {} strangers' connections opened",
        rt.rank(),
        held.len(),
        200 * mine.len()
    );
    let x = Tensor::from_vec([4], vec![1.5f32; 4]).unwrap();
    for _ in 0..50 {
        let y = world.all_reduce(&x, ReduceOp::Sum).unwrap();
        assert_eq!(y.as_slice::<f32>().unwrap()[0], 1.5 * rt.size() as f32);
    }
    drop(held);
    println!("LISTENERS-OK rank {} {}", rt.rank(), mine.len());
}

#[test]
fn strangers_get_nothing_and_the_job_runs_on() {
    if std::env::var(WORKER).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let job = support::mpirun(2, &exe, &support::rank_body("worker"), &[(WORKER, "1")]);
    assert!(job.ok(), "{}", job.describe());
    assert_eq!(
        job.stdout.matches("LISTENERS-OK").count(),
        2,
        "{}",
        job.describe()
    );
    assert!(
        !job.stderr.contains("rankmesh"),
        "nothing printed: {}",
        job.describe()
    );
}
