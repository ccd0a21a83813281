//! The status service: a TCP listener on every rank that answers with its
//! node's status board. It is how a rank that timed out learns where ranks
//! on other nodes are: it needs neither MPI (which may be the thing that is
//! stuck) nor the other rank's main thread (any live rank of a node serves
//! the whole node's board, even for a stopped neighbour).

use super::board::{BoardView, Status};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// IPv4 addresses a rank publishes for its service.
pub(crate) const ADDRS: usize = 4;
/// Largest answer accepted from a peer's service.
const MAX_ANSWER: u32 = 1 << 20;
const REQUEST: &[u8; 8] = b"rkmstat1";

/// The running listener; stops and joins on drop.
pub(crate) struct Service {
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Listens on every interface, on a port the system picks.
    pub fn start(board: Arc<BoardView>) -> std::io::Result<Service> {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rankmesh-status".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        let _ = answer(conn, &board);
                    }
                }
            })?;
        Ok(Service {
            stop,
            port,
            thread: Some(thread),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the blocking accept; the thread then sees the flag.
        let _ = TcpStream::connect_timeout(
            &SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port).into(),
            Duration::from_secs(1),
        );
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut conn: TcpStream, board: &BoardView) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    conn.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut req = [0u8; 8];
    conn.read_exact(&mut req)?;
    if &req != REQUEST {
        return Ok(());
    }
    let body = postcard::to_stdvec(&board.read_all()).unwrap_or_default();
    conn.write_all(&(body.len() as u32).to_le_bytes())?;
    conn.write_all(&body)
}

/// Asks the service at one of `addrs` for its node's board.
pub(crate) fn query(addrs: &[SocketAddrV4], timeout: Duration) -> Option<Vec<Status>> {
    addrs.iter().find_map(|a| {
        let mut conn = TcpStream::connect_timeout(&(*a).into(), timeout).ok()?;
        conn.set_read_timeout(Some(timeout)).ok()?;
        conn.set_write_timeout(Some(timeout)).ok()?;
        conn.write_all(REQUEST).ok()?;
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

/// This host's IPv4 addresses, outward ones first, loopback last.
pub(crate) fn local_ipv4() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } == 0 {
        let mut cur = list;
        while !cur.is_null() {
            // SAFETY: a node of the list getifaddrs returned.
            let ifa = unsafe { &*cur };
            if !ifa.ifa_addr.is_null()
                // SAFETY: non-null sockaddr from getifaddrs.
                && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET
            {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            cur = ifa.ifa_next;
        }
        // SAFETY: the list getifaddrs allocated.
        unsafe { libc::freeifaddrs(list) };
    }
    out.sort_by_key(|a| a.is_loopback());
    out.dedup();
    if !out.contains(&Ipv4Addr::LOCALHOST) {
        out.push(Ipv4Addr::LOCALHOST);
    }
    out
}
