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
