//! A stateless group's links across separately launched jobs: a rendezvous
//! at member 0's address, then one TCP connection per pair of members.
//!
//! Member 0 listens at the given address; every other member connects,
//! says who it is (rank, world size, the port of its own listener) and waits
//! for the member table. Member 0 answers once all have arrived, with a
//! random token; then each member connects to the lower-ranked ones and
//! accepts the higher-ranked ones, each proving the token. A connection that
//! does not speak this protocol, claims a taken rank or another world size
//! is refused with a message and does not stop the others.
//!
//! Sends go to one writer thread per peer, so a send returns once its frame
//! is queued (bounded, see [`Links::post`]); receives read the peer's
//! connection on the caller's thread, with `RANKMESH_TIMEOUT` as read
//! timeout.

use super::{Header, Links};
use crate::error::{Error, Result};
use crate::op::Op;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"rmBRIDGE");
const PROTOCOL: u32 = 1;
/// The largest handshake message read from a connecting stranger.
const MAX_HANDSHAKE: u32 = 1 << 20;
/// How long a connecting process may take to say who it is.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);
/// Pause between polls of a listener or retries of a refused connect.
const POLL: Duration = Duration::from_millis(10);

#[derive(Serialize, Deserialize)]
struct Hello {
    magic: u64,
    protocol: u32,
    rank: u64,
    world_size: u64,
    listen_port: u16,
}

#[derive(Serialize, Deserialize)]
enum Answer {
    Welcome {
        token: u64,
        members: Vec<SocketAddr>,
    },
    Refused(String),
}

#[derive(Serialize, Deserialize)]
struct PeerHello {
    magic: u64,
    token: u64,
    rank: u64,
}

fn write_msg<T: Serialize>(s: &mut TcpStream, m: &T) -> std::io::Result<()> {
    let bytes = postcard::to_stdvec(m).map_err(std::io::Error::other)?;
    s.write_all(&(bytes.len() as u32).to_le_bytes())?;
    s.write_all(&bytes)
}

fn read_msg<T: DeserializeOwned>(s: &mut TcpStream) -> std::io::Result<T> {
    let unreadable = |msg: String| std::io::Error::new(ErrorKind::InvalidData, msg);
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_HANDSHAKE {
        return Err(unreadable(format!(
            "a {len}-byte greeting: not a rankmesh process"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    s.read_exact(&mut bytes)?;
    postcard::from_bytes(&bytes).map_err(|_| unreadable("not a rankmesh greeting".into()))
}

/// Whether a handshake read failed because the other end went away (or
/// gave up on a silent connection) rather than because of what it said.
fn hung_up(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

/// A token only this group's members learn, from the OS's randomness (not
/// a secret against someone who can read the traffic; it keeps strays and
/// old runs out, and no other process can predict it from the clock).
fn random_token() -> Result<u64, String> {
    getrandom::u64().map_err(|e| format!("no randomness from the OS for the group's token: {e}"))
}

/// What the writer threads and the caller share.
struct State {
    /// Frames queued per peer, the front one being written.
    queues: Vec<VecDeque<(Header, Arc<Vec<u8>>)>>,
    /// Payload bytes queued, counted once per destination.
    held: usize,
    /// Why a peer's connection failed for writing.
    failed: Vec<Option<String>>,
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A writer thread never panics holding the lock; recover anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `ready` holds (writers notify after every frame), or
    /// `deadline` passes: then `Err` with the bytes still queued.
    fn wait_until<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        ready: impl Fn(&State) -> bool,
    ) -> std::result::Result<MutexGuard<'a, State>, usize> {
        while !ready(&st) {
            let wait = match deadline {
                Some(d) if Instant::now() >= d => return Err(st.held),
                Some(d) => d - Instant::now(),
                None => Duration::from_secs(3600),
            };
            st = self
                .changed
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(st)
    }
}

impl State {
    /// Why the connection to one of `peers` failed for writing, if one did.
    fn failure(&self, peers: impl IntoIterator<Item = usize>) -> Option<String> {
        peers.into_iter().find_map(|r| {
            self.failed[r]
                .as_ref()
                .map(|why| format!("the connection to rank {r} failed: {why}"))
        })
    }
}

pub(super) struct TcpLinks {
    name: String,
    rank: usize,
    size: usize,
    timeout: Option<Duration>,
    max_object_bytes: u64,
    /// The connection to each peer (`None` for this rank), read here.
    readers: Vec<Option<RefCell<TcpStream>>>,
    /// Why a connection can no longer be read (a timeout inside a frame).
    broken: RefCell<Vec<Option<String>>>,
    shared: Arc<Shared>,
    writers: Vec<JoinHandle<()>>,
    /// Frames this rank sent itself, and the one being read.
    loopback: RefCell<VecDeque<(Header, Vec<u8>)>>,
    reading_self: RefCell<(Vec<u8>, usize)>,
}

impl TcpLinks {
    pub(super) fn connect(
        addr: &str,
        rank: usize,
        size: usize,
        timeout: Option<Duration>,
        max_object_bytes: u64,
    ) -> Result<TcpLinks> {
        let name = format!("tcp://{addr}");
        if rank >= size {
            return Err(Error::invalid(
                Op::CreateGroup,
                &name,
                format!("rank {rank} is not a rank of a group of size {size}"),
            ));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let streams = if rank == 0 {
            host(addr, size, deadline)
        } else {
            join(addr, rank, size, deadline)
        }
        .map_err(|msg| Error::Connection {
            group: name.clone(),
            msg,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queues: (0..size).map(|_| VecDeque::new()).collect(),
                held: 0,
                failed: vec![None; size],
                closing: false,
            }),
            changed: Condvar::new(),
        });
        let mut readers = Vec::with_capacity(size);
        let mut writers = Vec::with_capacity(size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                readers.push(None);
                continue;
            };
            let setup = || -> std::io::Result<TcpStream> {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(timeout.filter(|t| !t.is_zero()))?;
                stream.set_write_timeout(None)?;
                stream.try_clone()
            };
            let out = setup().map_err(|e| Error::Connection {
                group: name.clone(),
                msg: format!("setting up the connection to rank {peer}: {e}"),
            })?;
            let shared = Arc::clone(&shared);
            writers.push(std::thread::spawn(move || write_frames(out, peer, &shared)));
            readers.push(Some(RefCell::new(stream)));
        }
        Ok(TcpLinks {
            name,
            rank,
            size,
            timeout,
            max_object_bytes,
            readers,
            broken: RefCell::new(vec![None; size]),
            shared,
            writers,
            loopback: RefCell::new(VecDeque::new()),
            reading_self: RefCell::new((Vec::new(), 0)),
        })
    }

    fn connection(&self, msg: String) -> Error {
        Error::Connection {
            group: self.name.clone(),
            msg,
        }
    }

    fn timed_out(&self, op: Op, msg: String) -> Error {
        Error::Timeout {
            op,
            group: self.name.clone(),
            msg,
        }
    }

    /// Fills `buf` from `src`'s connection. A timeout before the first byte
    /// leaves the connection usable; one inside a frame does not.
    fn read_exact(&self, op: Op, src: usize, buf: &mut [u8], frame_start: bool) -> Result<()> {
        if let Some(why) = &self.broken.borrow()[src] {
            return Err(self.connection(format!("the connection to rank {src} is unusable: {why}")));
        }
        let reader = self.readers[src].as_ref().expect("a peer has a connection");
        let mut stream = reader.borrow_mut();
        let mut done = 0;
        while done < buf.len() {
            match stream.read(&mut buf[done..]) {
                Ok(0) => {
                    let why = format!(
                        "rank {src} closed its connection (its process ended or dropped the group)"
                    );
                    self.broken.borrow_mut()[src] = Some(why.clone());
                    return Err(self.connection(why));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let waited = self.timeout.unwrap_or_default();
                    if done > 0 || !frame_start {
                        self.broken.borrow_mut()[src] =
                            Some(format!("a timeout after {done} bytes of a frame"));
                    }
                    return Err(self.timed_out(
                        op,
                        format!(
                            "waited {waited:?} (RANKMESH_TIMEOUT) for rank {src} to send; \
                             it is stuck, slow, or not making the matching call"
                        ),
                    ));
                }
                Err(e) => {
                    let why = format!("reading from rank {src}: {e}");
                    self.broken.borrow_mut()[src] = Some(why.clone());
                    return Err(self.connection(why));
                }
            }
        }
        Ok(())
    }
}

/// One peer's writer: writes queued frames in order until the group closes.
fn write_frames(mut out: TcpStream, peer: usize, shared: &Shared) {
    loop {
        let (header, payload) = {
            let mut st = shared.lock();
            loop {
                if let Some((h, p)) = st.queues[peer].front() {
                    break (*h, Arc::clone(p));
                }
                if st.closing {
                    let _ = out.shutdown(Shutdown::Write);
                    return;
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let written = out
            .write_all(bytemuck::cast_slice(&header[..]))
            .and_then(|()| out.write_all(&payload));
        let mut st = shared.lock();
        st.queues[peer].pop_front();
        st.held -= payload.len();
        if let Err(e) = written {
            let dropped: usize = st.queues[peer].drain(..).map(|(_, p)| p.len()).sum();
            st.held -= dropped;
            st.failed[peer] = Some(e.to_string());
            shared.changed.notify_all();
            return;
        }
        shared.changed.notify_all();
    }
}

/// Member 0: listens at `addr` and admits the other members.
fn host(
    addr: &str,
    size: usize,
    deadline: Option<Instant>,
) -> std::result::Result<Vec<Option<TcpStream>>, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let mut joined: Vec<Option<(TcpStream, SocketAddr)>> = (0..size).map(|_| None).collect();
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening on {addr}: {e}"))?;
    let started = Instant::now();
    while joined.iter().skip(1).any(Option::is_none) {
        let (mut s, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let missing: Vec<usize> = (1..size).filter(|r| joined[*r].is_none()).collect();
                    return Err(format!(
                        "after {:?} (RANKMESH_TIMEOUT) ranks {missing:?} of {size} have not \
                         connected to {addr}",
                        started.elapsed()
                    ));
                }
                // Blocks until a member dials (or the deadline): no
                // polling interval added to the group's formation.
                crate::wait::readable(listener.as_raw_fd(), deadline);
                continue;
            }
            Err(e) => return Err(format!("accepting on {addr}: {e}")),
        };
        let greeting = s
            .set_nonblocking(false)
            .and_then(|()| s.set_read_timeout(Some(HANDSHAKE_WAIT)))
            .and_then(|()| read_msg::<Hello>(&mut s));
        let hello = match greeting {
            Ok(h) => h,
            // Silent or gone: nothing to answer. A member that was only
            // slow (a loaded machine) sees the connection end and dials
            // again (see `join`).
            Err(e) if e.kind() != ErrorKind::InvalidData => {
                tracing::warn!("{addr}: dropped a connection from {peer} that said nothing: {e}");
                continue;
            }
            Err(e) => {
                tracing::warn!("{addr}: refused a connection from {peer}: {e}");
                let _ = write_msg(&mut s, &Answer::Refused(e.to_string()));
                continue;
            }
        };
        match admit(&hello, size, &joined, addr) {
            Ok(()) => {
                let member = SocketAddr::new(peer.ip(), hello.listen_port);
                joined[hello.rank as usize] = Some((s, member));
            }
            Err(why) => {
                tracing::warn!("{addr}: refused a connection from {peer}: {why}");
                let _ = write_msg(&mut s, &Answer::Refused(why));
            }
        }
    }
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    welcome(joined, local)
}

/// Member 0 welcomes every member that joined (each at its stream, with
/// the address it listens at), naming them all and the group's token;
/// member 0 itself listens at `local`. The streams by rank (none for 0).
fn welcome(
    joined: Vec<Option<(TcpStream, SocketAddr)>>,
    local: SocketAddr,
) -> std::result::Result<Vec<Option<TcpStream>>, String> {
    let members: Vec<SocketAddr> = joined
        .iter()
        .map(|j| j.as_ref().map_or(local, |(_, a)| *a))
        .collect();
    let token = random_token()?;
    let mut streams = Vec::with_capacity(joined.len());
    streams.push(None);
    for (rank, j) in joined.into_iter().enumerate().skip(1) {
        let (mut s, _) = j.expect("every rank joined");
        write_msg(
            &mut s,
            &Answer::Welcome {
                token,
                members: members.clone(),
            },
        )
        .map_err(|e| format!("welcoming rank {rank}: {e}"))?;
        streams.push(Some(s));
    }
    Ok(streams)
}

/// Why member 0 refuses a greeting, if it does.
fn admit(
    h: &Hello,
    size: usize,
    joined: &[Option<(TcpStream, SocketAddr)>],
    addr: &str,
) -> std::result::Result<(), String> {
    if h.magic != HELLO_MAGIC || h.protocol != PROTOCOL {
        return Err("not a rankmesh process of this protocol version".into());
    }
    if h.world_size != size as u64 {
        return Err(format!(
            "rank {} was given world size {} but rank 0 has {size}",
            h.rank, h.world_size
        ));
    }
    match usize::try_from(h.rank) {
        Ok(0) => Err(format!("rank 0 is the process listening at {addr}")),
        Ok(r) if r < size => match &joined[r] {
            Some((_, from)) => Err(format!("rank {r} has already joined (from {from})")),
            None => Ok(()),
        },
        _ => Err(format!(
            "rank {} is not a rank of a group of size {size}",
            h.rank
        )),
    }
}

/// Time until `deadline` as a socket timeout (never zero, which would mean
/// "no timeout" to the socket).
fn time_left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    })
}

/// Connects to `addr`, retrying refused attempts until `deadline`.
fn dial(addr: &str, deadline: Option<Instant>) -> std::result::Result<TcpStream, String> {
    let started = Instant::now();
    loop {
        let attempt = addr
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut a| a.next().ok_or_else(|| "resolves to no address".to_string()))
            .and_then(|a| TcpStream::connect(a).map_err(|e| e.to_string()));
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(format!(
                    "{addr} was not reachable within {:?} (RANKMESH_TIMEOUT): {e}",
                    started.elapsed()
                ))
            }
            Err(_) => std::thread::sleep(POLL * 5),
        }
    }
}

/// Member `rank` > 0: joins at `addr`, then links with every other member.
fn join(
    addr: &str,
    rank: usize,
    size: usize,
    deadline: Option<Instant>,
) -> std::result::Result<Vec<Option<TcpStream>>, String> {
    let first = dial(addr, deadline).map_err(|e| format!("rank 0 at {e}"))?;
    let ip = first.local_addr().map_err(|e| e.to_string())?.ip();
    let listener = TcpListener::bind((ip, 0)).map_err(|e| format!("cannot listen on {ip}: {e}"))?;
    let hello = Hello {
        magic: HELLO_MAGIC,
        protocol: PROTOCOL,
        rank: rank as u64,
        world_size: size as u64,
        listen_port: listener.local_addr().map_err(|e| e.to_string())?.port(),
    };
    let (first, answer) = greet_rank_zero(first, addr, &hello, deadline)?;
    let (token, members) = match answer {
        Answer::Welcome { token, members } if members.len() == size => (token, members),
        Answer::Welcome { members, .. } => {
            return Err(format!(
                "rank 0 at {addr} sent a table of {} members for a group of {size}",
                members.len()
            ))
        }
        Answer::Refused(why) => return Err(format!("rank 0 at {addr} refused rank {rank}: {why}")),
    };
    let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    streams[0] = Some(first);
    dial_lower_ranks(&mut streams, &members, rank, token, deadline)?;
    accept_higher_ranks(&mut streams, &listener, rank, token, deadline)?;
    Ok(streams)
}

/// Sends `hello` to rank 0 on `first` and waits for its answer, which
/// comes once everyone has arrived; greets it again on a new connection
/// when rank 0 hung up first (it gives up on a greeting that takes longer
/// than `HANDSHAKE_WAIT`, which a loaded machine can cause).
fn greet_rank_zero(
    mut first: TcpStream,
    addr: &str,
    hello: &Hello,
    deadline: Option<Instant>,
) -> std::result::Result<(TcpStream, Answer), String> {
    let rank = hello.rank;
    loop {
        let reply = write_msg(&mut first, hello)
            .and_then(|()| first.set_read_timeout(time_left(deadline)))
            .and_then(|()| read_msg::<Answer>(&mut first));
        match reply {
            Ok(answer) => return Ok((first, answer)),
            Err(e) if hung_up(&e) && deadline.is_none_or(|d| Instant::now() < d) => {
                tracing::debug!("rank 0 at {addr} closed rank {rank}'s greeting ({e}); again");
                std::thread::sleep(POLL);
                first = dial(addr, deadline).map_err(|e| {
                    format!(
                        "rank 0 at {e} (it closed rank {rank}'s first connection: a group that \
                         formed without this process closes late arrivals)"
                    )
                })?;
            }
            Err(e) => {
                return Err(format!(
                    "rank 0 at {addr} did not admit rank {rank}: {e} (a group that formed \
                     without this process closes late arrivals: is rank {rank} already taken?)"
                ))
            }
        }
    }
}

/// Dials every member between rank 0 and `rank` (at the addresses rank 0
/// sent) and proves membership with the group's `token`.
fn dial_lower_ranks(
    streams: &mut [Option<TcpStream>],
    members: &[SocketAddr],
    rank: usize,
    token: u64,
    deadline: Option<Instant>,
) -> std::result::Result<(), String> {
    for (peer, at) in members.iter().enumerate().take(rank).skip(1) {
        let mut s = dial(&at.to_string(), deadline).map_err(|e| format!("rank {peer} at {e}"))?;
        let proof = PeerHello {
            magic: HELLO_MAGIC,
            token,
            rank: rank as u64,
        };
        write_msg(&mut s, &proof).map_err(|e| format!("greeting rank {peer}: {e}"))?;
        streams[peer] = Some(s);
    }
    Ok(())
}

/// Accepts every member above `rank` on `listener`, each proving itself
/// with the group's `token`; strays and second connections are refused
/// (and logged), and members missing at `deadline` are named.
fn accept_higher_ranks(
    streams: &mut [Option<TcpStream>],
    listener: &TcpListener,
    rank: usize,
    token: u64,
    deadline: Option<Instant>,
) -> std::result::Result<(), String> {
    let size = streams.len();
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    while streams.iter().skip(rank + 1).any(Option::is_none) {
        let (mut s, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let missing: Vec<usize> =
                        (rank + 1..size).filter(|r| streams[*r].is_none()).collect();
                    return Err(format!(
                        "ranks {missing:?} did not connect to rank {rank} within RANKMESH_TIMEOUT"
                    ));
                }
                // Blocks until a member dials (or the deadline): no
                // polling interval added to the group's formation.
                crate::wait::readable(listener.as_raw_fd(), deadline);
                continue;
            }
            Err(e) => return Err(format!("accepting peers: {e}")),
        };
        let greeting = s
            .set_nonblocking(false)
            .and_then(|()| s.set_read_timeout(Some(HANDSHAKE_WAIT)))
            .and_then(|()| read_msg::<PeerHello>(&mut s));
        match greeting {
            Ok(p) if p.magic == HELLO_MAGIC && p.token == token => {
                let r = p.rank as usize;
                if r > rank && r < size && streams[r].is_none() {
                    streams[r] = Some(s);
                    continue;
                }
                tracing::warn!("rank {rank}: refused a second or unexpected rank {r} from {from}");
            }
            _ => tracing::warn!(
                "rank {rank}: refused a connection from {from} without the group's token"
            ),
        }
    }
    Ok(())
}

impl Links for TcpLinks {
    fn name(&self) -> &str {
        &self.name
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn max_object_bytes(&self) -> u64 {
        self.max_object_bytes
    }

    fn watch<R>(&self, _op: Op, f: impl FnOnce() -> Result<R>) -> Result<R> {
        f()
    }

    fn post(&self, header: Header, payload: Vec<u8>, dsts: &[usize], limit: usize) -> Result<()> {
        let payload = Arc::new(payload);
        let remote: Vec<usize> = dsts.iter().copied().filter(|d| *d != self.rank).collect();
        if remote.len() < dsts.len() {
            self.loopback
                .borrow_mut()
                .push_back((header, payload.as_ref().clone()));
        }
        if remote.is_empty() {
            return Ok(());
        }
        let add = payload.len() * remote.len();
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let st = self.shared.lock();
        let mut st = self
            .shared
            .wait_until(st, deadline, |st| {
                remote.iter().any(|d| st.failed[*d].is_some())
                    || st.held == 0
                    || st.held + add <= limit
            })
            .map_err(|held| {
                self.timed_out(
                    Op::SendObject,
                    format!(
                        "waited {:?} (RANKMESH_TIMEOUT) for members to take {held} bytes of \
                         earlier objects (send buffer {limit} bytes)",
                        self.timeout.unwrap_or_default()
                    ),
                )
            })?;
        if let Some(why) = st.failure(remote.iter().copied()) {
            return Err(self.connection(why));
        }
        for d in remote {
            st.queues[d].push_back((header, Arc::clone(&payload)));
        }
        st.held += add;
        self.shared.changed.notify_all();
        Ok(())
    }

    fn read_header(&self, op: Op, src: usize) -> Result<Header> {
        if src == self.rank {
            let Some((header, payload)) = self.loopback.borrow_mut().pop_front() else {
                return Err(Error::mismatch(
                    op,
                    &self.name,
                    "this rank has sent nothing to itself: receiving would wait forever",
                ));
            };
            *self.reading_self.borrow_mut() = (payload, 0);
            return Ok(header);
        }
        let mut header = [0u64; 4];
        self.read_exact(op, src, bytemuck::cast_slice_mut(&mut header[..]), true)?;
        Ok(header)
    }

    fn read_payload(&self, op: Op, src: usize, buf: &mut [u8]) -> Result<()> {
        if src == self.rank {
            let mut cur = self.reading_self.borrow_mut();
            let (payload, at) = &mut *cur;
            buf.copy_from_slice(&payload[*at..*at + buf.len()]);
            *at += buf.len();
            return Ok(());
        }
        self.read_exact(op, src, buf, false)
    }

    fn flush(&self) -> Result<()> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let st = self.shared.lock();
        let st = self
            .shared
            .wait_until(st, deadline, |st| st.held == 0)
            .map_err(|held| {
                self.timed_out(
                    Op::SendObject,
                    format!(
                        "waited {:?} (RANKMESH_TIMEOUT) for members to take {held} bytes",
                        self.timeout.unwrap_or_default()
                    ),
                )
            })?;
        match st.failure(0..self.size) {
            Some(why) => Err(self.connection(why)),
            None => Ok(()),
        }
    }
}

impl Drop for TcpLinks {
    fn drop(&mut self) {
        let unsent = {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.changed.notify_all();
            st.held > 0
        };
        if unsent {
            // A flush timed out: a writer may be blocked on a peer that never
            // reads; shutting the sockets down releases it.
            for r in self.readers.iter().flatten() {
                let _ = r.borrow().shutdown(Shutdown::Both);
            }
        }
        for w in self.writers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens drawn back to back are all different and follow no order (a
    /// clock-derived token would rise with every draw).
    #[test]
    fn tokens_come_from_the_os_not_the_clock() {
        let tokens: Vec<u64> = (0..32).map(|_| random_token().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = tokens.iter().collect();
        assert_eq!(distinct.len(), tokens.len());
        assert!(tokens.windows(2).any(|w| w[0] > w[1]));
        assert!(tokens.windows(2).any(|w| w[0] < w[1]));
    }

    /// A rank 0 that drops the first greeting unanswered (as it does with
    /// one that took longer than `HANDSHAKE_WAIT`) still admits the member
    /// on its next connection.
    #[test]
    fn a_member_whose_greeting_was_dropped_greets_again() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let host = std::thread::spawn(move || {
            drop(listener.accept().unwrap());
            let (mut s, _) = listener.accept().unwrap();
            let hello: Hello = read_msg(&mut s).unwrap();
            assert_eq!((hello.rank, hello.world_size), (1, 2));
            let members = vec![addr, addr];
            write_msg(&mut s, &Answer::Welcome { token: 7, members }).unwrap();
            s
        });
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        let streams = join(&addr.to_string(), 1, 2, deadline).expect("joined on the second try");
        assert!(streams[0].is_some() && streams[1].is_none());
        host.join().unwrap();
    }

    /// A refusal is final: the member gets rank 0's reason, not a retry.
    #[test]
    fn a_refused_member_does_not_retry() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let host = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _: Hello = read_msg(&mut s).unwrap();
            write_msg(&mut s, &Answer::Refused("rank 1 has already joined".into())).unwrap();
            listener.set_nonblocking(true).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            assert!(listener.accept().is_err(), "no second connection");
        });
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        let err = join(&addr.to_string(), 1, 2, deadline).unwrap_err();
        assert!(
            err.contains("refused rank 1: rank 1 has already joined"),
            "{err}"
        );
        host.join().unwrap();
    }
}
