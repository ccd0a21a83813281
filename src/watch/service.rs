//! The status service: a TCP listener on every rank that answers with its
//! node's status board. It is how a rank that timed out learns where ranks
//! on other nodes are: it needs neither MPI (which may be the thing that is
//! stuck) nor the other rank's main thread (any live rank of a node serves
//! the whole node's board, even for a stopped neighbour). It also takes the
//! notice of a rank on another node that left after an error, for its node's
//! ranks to see.
//!
//! It answers only the job: every request carries the job's secret (128
//! bits drawn by world rank 0 at start-up, sent to every rank over MPI),
//! compared in constant time; a request without it gets nothing. One thread
//! serves every client through `poll(2)`, each with a deadline, so idle or
//! slow clients cannot hold the service.

use super::board::{BoardView, Status};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// IPv4 addresses a rank publishes for its service.
pub(crate) const ADDRS: usize = 4;
/// Largest answer accepted from a peer's service.
const MAX_ANSWER: u32 = 1 << 20;
/// Largest notice the service reads.
const MAX_NOTICE: usize = 4096;
const QUERY: &[u8; 8] = b"rkmstat2";
const NOTICE: &[u8; 8] = b"rkmleft2";
/// Tag, then the secret.
const HEAD: usize = 8 + SECRET_BYTES;
/// Bytes of the job's secret.
pub(crate) const SECRET_BYTES: usize = 16;
/// How long a client may take to send its request.
const CLIENT_DEADLINE: Duration = Duration::from_millis(100);
/// Clients served at once; past it the oldest is dropped.
const MAX_CLIENTS: usize = 256;

/// The job's secret: what a request must carry.
#[derive(Clone, Copy)]
pub(crate) struct Secret([u8; SECRET_BYTES]);

impl Secret {
    pub fn new(bytes: [u8; SECRET_BYTES]) -> Secret {
        Secret(bytes)
    }

    /// All zeros: what a job whose OS gave no randomness holds.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    /// Compares in time independent of where the bytes differ.
    fn matches(&self, other: &[u8]) -> bool {
        other.len() == SECRET_BYTES
            && self
                .0
                .iter()
                .zip(other)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The running listener; stops and joins on drop.
pub(crate) struct Service {
    stop: Arc<AtomicBool>,
    port: u16,
    addrs: Vec<Ipv4Addr>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Listens on `addrs` (the addresses the job publishes, not every
    /// interface), on one port the system picks for the first of them.
    pub fn start(
        board: Arc<BoardView>,
        secret: Secret,
        addrs: &[Ipv4Addr],
    ) -> std::io::Result<Service> {
        Service::start_with(board, secret, addrs, CLIENT_DEADLINE)
    }

    /// [`start`](Self::start) with clients given `deadline` to send their
    /// request (tests lengthen it, so that a wait on one shows).
    fn start_with(
        board: Arc<BoardView>,
        secret: Secret,
        addrs: &[Ipv4Addr],
        deadline: Duration,
    ) -> std::io::Result<Service> {
        let first = *addrs.first().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")
        })?;
        // The port the first address got may be taken on another: retry.
        let mut last = None;
        for _ in 0..8 {
            let l0 = TcpListener::bind((first, 0))?;
            let port = l0.local_addr()?.port();
            let mut listeners = vec![l0];
            let rest: std::io::Result<Vec<TcpListener>> = addrs[1..]
                .iter()
                .map(|a| TcpListener::bind((*a, port)))
                .collect();
            match rest {
                Ok(more) => listeners.extend(more),
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            }
            for l in &listeners {
                l.set_nonblocking(true)?;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let thread = std::thread::Builder::new()
                .name("rankmesh-status".into())
                .spawn(move || serve(&listeners, &board, &secret, &flag, deadline))?;
            return Ok(Service {
                stop,
                port,
                addrs: addrs.to_vec(),
                thread: Some(thread),
            });
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no common port")))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The addresses it listens on.
    pub fn addrs(&self) -> &[Ipv4Addr] {
        &self.addrs
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the poll; the thread then sees the flag.
        if let Some(a) = self.addrs.first() {
            let _ = TcpStream::connect_timeout(
                &SocketAddrV4::new(*a, self.port).into(),
                Duration::from_secs(1),
            );
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A client whose request is still arriving.
struct Client {
    conn: TcpStream,
    got: Vec<u8>,
    until: Instant,
}

fn serve(
    listeners: &[TcpListener],
    board: &BoardView,
    secret: &Secret,
    stop: &AtomicBool,
    deadline: Duration,
) {
    let mut clients: Vec<Client> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        clients.retain(|c| c.until > now);
        let wait = clients
            .iter()
            .map(|c| c.until.saturating_duration_since(now))
            .min()
            .map_or(-1, |d| d.as_millis().clamp(1, 1000) as i32);
        let ls = listeners.len();
        let mut fds: Vec<libc::pollfd> = listeners
            .iter()
            .map(|l| l.as_raw_fd())
            .chain(clients.iter().map(|c| c.conn.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of open descriptors for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if n <= 0 {
            continue;
        }
        // Clients first (their indices shift once new ones are pushed).
        let mut done = vec![false; clients.len()];
        for (i, c) in clients.iter_mut().enumerate() {
            if fds[ls + i].revents != 0 {
                done[i] = advance(c, board, secret);
            }
        }
        let mut i = 0;
        clients.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        for (listener, fd) in listeners.iter().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            while let Ok((conn, _)) = listener.accept() {
                if conn.set_nonblocking(true).is_err() {
                    continue;
                }
                if clients.len() >= MAX_CLIENTS {
                    clients.remove(0);
                }
                clients.push(Client {
                    conn,
                    got: Vec::new(),
                    until: Instant::now() + deadline,
                });
            }
        }
    }
}

/// Reads what `c` sent; answers once its request is whole. True when the
/// client is done with (answered, refused or gone).
fn advance(c: &mut Client, board: &BoardView, secret: &Secret) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match c.conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => c.got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
        if c.got.len() > HEAD + 4 + MAX_NOTICE {
            return true;
        }
    }
    if c.got.len() < HEAD {
        return false;
    }
    let (tag, rest) = c.got.split_at(8);
    if !secret.matches(&rest[..SECRET_BYTES]) {
        return true;
    }
    let body = &rest[SECRET_BYTES..];
    let reply = if tag == QUERY {
        let board = postcard::to_stdvec(&board.read_all()).unwrap_or_default();
        let mut out = (board.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&board);
        out
    } else if tag == NOTICE {
        if body.len() < 4 {
            return false;
        }
        let len = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as usize;
        if len > MAX_NOTICE {
            return true;
        }
        if body.len() < 4 + len {
            return false;
        }
        match postcard::from_bytes::<(u64, String)>(&body[4..4 + len]) {
            Ok((rank, reason)) => vec![u8::from(board.take_notice(rank as usize, &reason))],
            Err(_) => return true,
        }
    } else {
        return true;
    };
    // A short answer to a client that has just asked: written blocking,
    // under the client's deadline.
    let left = c
        .until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    let _ = c.conn.set_nonblocking(false);
    let _ = c.conn.set_write_timeout(Some(left));
    let _ = c.conn.write_all(&reply);
    true
}

fn connect(addr: &SocketAddrV4, timeout: Duration) -> Option<TcpStream> {
    let conn = TcpStream::connect_timeout(&(*addr).into(), timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    conn.set_write_timeout(Some(timeout)).ok()?;
    Some(conn)
}

/// Asks the service at one of `addrs` for its node's board.
pub(crate) fn query(
    addrs: &[SocketAddrV4],
    secret: &Secret,
    timeout: Duration,
) -> Option<Vec<Status>> {
    addrs.iter().find_map(|a| {
        let mut conn = connect(a, timeout)?;
        let mut req = QUERY.to_vec();
        req.extend_from_slice(&secret.0);
        conn.write_all(&req).ok()?;
        let mut len = [0u8; 4];
        conn.read_exact(&mut len).ok()?;
        let len = u32::from_le_bytes(len);
        if len > MAX_ANSWER {
            return None;
        }
        let mut body = vec![0u8; len as usize];
        conn.read_exact(&mut body).ok()?;
        postcard::from_bytes(&body).ok()
    })
}

/// Tells the service at one of `addrs` that world rank `rank` left with
/// `reason`: whether it took the notice.
pub(crate) fn notify(
    addrs: &[SocketAddrV4],
    secret: &Secret,
    rank: usize,
    reason: &str,
    timeout: Duration,
) -> bool {
    let body = postcard::to_stdvec(&(rank as u64, reason)).unwrap_or_default();
    if body.len() > MAX_NOTICE {
        return false;
    }
    addrs.iter().any(|a| {
        let Some(mut conn) = connect(a, timeout) else {
            return false;
        };
        let mut req = NOTICE.to_vec();
        req.extend_from_slice(&secret.0);
        req.extend_from_slice(&(body.len() as u32).to_le_bytes());
        req.extend_from_slice(&body);
        let mut ok = [0u8; 1];
        conn.write_all(&req).is_ok() && conn.read_exact(&mut ok).is_ok() && ok[0] == 1
    })
}

/// This host's IPv4 addresses, outward ones first, loopback last.
pub(crate) fn local_ipv4() -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| match i.ip() {
            std::net::IpAddr::V4(a) => Some(a),
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    out.sort_by_key(|a| a.is_loopback());
    out.dedup();
    if !out.contains(&Ipv4Addr::LOCALHOST) {
        out.push(Ipv4Addr::LOCALHOST);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(secret: [u8; SECRET_BYTES]) -> (Service, Arc<BoardView>, Vec<SocketAddrV4>) {
        service_with(secret, CLIENT_DEADLINE)
    }

    fn service_with(
        secret: [u8; SECRET_BYTES],
        deadline: Duration,
    ) -> (Service, Arc<BoardView>, Vec<SocketAddrV4>) {
        let board = Arc::new(BoardView::in_memory(4));
        let svc = Service::start_with(
            board.clone(),
            Secret::new(secret),
            &[Ipv4Addr::LOCALHOST],
            deadline,
        )
        .unwrap();
        let at = vec![SocketAddrV4::new(Ipv4Addr::LOCALHOST, svc.port())];
        (svc, board, at)
    }

    /// Everything a client gets for `request` (until the service closes).
    fn answer_to(at: SocketAddrV4, request: &[u8]) -> Vec<u8> {
        let mut c = TcpStream::connect(at).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.write_all(request).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        got
    }

    #[test]
    fn only_the_jobs_secret_gets_an_answer() {
        let secret = [7u8; SECRET_BYTES];
        let (_svc, _board, at) = service(secret);
        let theirs = Secret::new([8u8; SECRET_BYTES]);
        assert_eq!(query(&at, &theirs, Duration::from_secs(1)), None);
        assert!(
            answer_to(at[0], b"rkmstat1").is_empty(),
            "the old open request"
        );
        let mut wrong = QUERY.to_vec();
        wrong.extend_from_slice(&[7u8; SECRET_BYTES - 1]);
        wrong.push(6);
        assert!(answer_to(at[0], &wrong).is_empty());
        let board = query(&at, &Secret::new(secret), Duration::from_secs(1)).unwrap();
        assert_eq!(board.len(), 1);
        assert_eq!(board[0].rank, 4);
        assert!(!format!("{:?}", Secret::new(secret)).contains('7'));
    }

    /// A service that waited on an idle or half-sent client would answer
    /// after that client's deadline: made 20 s here, so that any such wait
    /// shows whatever the machine's load, while a service that polls
    /// answers at once.
    #[test]
    fn idle_clients_do_not_delay_an_answer() {
        let secret = [3u8; SECRET_BYTES];
        let deadline = Duration::from_secs(20);
        let (_svc, _board, at) = service_with(secret, deadline);
        let idle: Vec<TcpStream> = (0..200)
            .map(|_| TcpStream::connect(at[0]).unwrap())
            .collect();
        // A slow client that sends half a request and stops.
        let mut slow = TcpStream::connect(at[0]).unwrap();
        slow.write_all(&QUERY[..4]).unwrap();
        let start = Instant::now();
        let board = query(&at, &Secret::new(secret), deadline);
        let took = start.elapsed();
        assert!(board.is_some());
        assert!(
            took < deadline / 2,
            "answered after {took:?} with 200 idle clients of a {deadline:?} deadline"
        );
        drop(idle);
    }

    #[test]
    fn a_notice_reaches_the_board_with_the_secret_only() {
        let secret = [9u8; SECRET_BYTES];
        let (_svc, board, at) = service(secret);
        let t = Duration::from_secs(1);
        assert!(!notify(
            &at,
            &Secret::new([1u8; SECRET_BYTES]),
            3,
            "forged",
            t
        ));
        assert!(board.notices().is_empty());
        assert!(notify(
            &at,
            &Secret::new(secret),
            3,
            "all_reduce on tp:0: ranks are in different calls",
            t
        ));
        assert_eq!(
            board.notices(),
            vec![(
                3,
                "all_reduce on tp:0: ranks are in different calls".to_string()
            )]
        );
    }

    /// Every IPv4 address the kernel lists for this host (`/proc/net/fib_trie`'s
    /// local host routes), outward ones before the loopback.
    #[test]
    fn local_addresses_are_the_kernels_outward_first() {
        let got = local_ipv4();
        assert!(got.contains(&Ipv4Addr::LOCALHOST));
        let first_loopback = got.iter().position(|a| a.is_loopback()).unwrap();
        assert!(got[first_loopback..].iter().all(|a| a.is_loopback()));
        let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
        let lines: Vec<&str> = trie.lines().collect();
        for pair in lines.windows(2) {
            if pair[1].contains("/32 host LOCAL") {
                if let Some(ip) = pair[0].split_whitespace().last() {
                    let ip: Ipv4Addr = ip.parse().unwrap();
                    assert!(got.contains(&ip), "{ip} is this host's but not in {got:?}");
                }
            }
        }
    }
}
