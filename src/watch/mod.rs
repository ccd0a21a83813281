//! Hang detection. Every call a rank makes (agreement, data, point-to-point,
//! object payloads, group creation) is marked on the node's status
//! [board](board) and in the rank's flight [recorder](recorder); long
//! transfers mark progress per piece. A watchdog thread that sees a call
//! with no progress for `RANKMESH_TIMEOUT` prints which members of the group
//! have not entered that call and where each one is (from the board, across
//! nodes through the status [service](service)), dumps the flight record
//! (to stderr, and to `RANKMESH_TRACE_DIR` when set) and ends the job with
//! `MPI_Abort` and exit code [`TIMEOUT_EXIT`]. The hot path only stores a
//! few atomics; the watchdog thread never calls MPI except to abort.

mod arrival;
mod board;
pub(crate) mod clock;
mod recorder;
mod service;
mod startup;

pub(crate) use board::Board;
use board::{BoardView, State, Status};
use clock::{now_ns, secs};
use recorder::Recorder;
pub(crate) use service::{local_ipv4, Service, ADDRS};
pub(crate) use startup::StartupWatch;

use crate::agree::Descriptor;
use crate::op::Op;
use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Exit code of a job the watchdog ends (`MPI_Abort`): `EX_TEMPFAIL` of
/// sysexits.h, apart from `timeout(1)`'s 124 so the two can be told apart.
pub const TIMEOUT_EXIT: i32 = 75;

/// What the watchdog knows about every world rank (gathered at start-up).
pub(crate) struct PeerFacts {
    pub node: usize,
    pub host: String,
    /// Where the rank's status service listens.
    pub service: Vec<SocketAddrV4>,
}

struct GroupFacts {
    name: Arc<str>,
    members: Arc<[usize]>,
}

struct Shared {
    rank: usize,
    board: Arc<BoardView>,
    /// Id of the group of the current call (process-local).
    group: AtomicU64,
    /// Id of the group whose name the board slot holds.
    named: AtomicU64,
    next_group: AtomicU64,
    groups: Mutex<HashMap<u64, GroupFacts>>,
    peers: Vec<PeerFacts>,
    recorder: Recorder,
    trace_dir: Option<PathBuf>,
    stop: AtomicBool,
}

/// Watches one process's calls (owned by the `Runtime`).
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    service: Option<Service>,
    /// Freed last: the thread and the service read it until they stop.
    board: Option<Board>,
}

impl Watchdog {
    /// Starts watching for world rank `rank` (no thread when `limit` is `None`).
    pub fn start(
        rank: usize,
        limit: Option<Duration>,
        board: Board,
        service: Option<Service>,
        peers: Vec<PeerFacts>,
        trace_dir: Option<PathBuf>,
    ) -> Watchdog {
        let shared = Arc::new(Shared {
            rank,
            board: board.view().clone(),
            group: AtomicU64::new(u64::MAX),
            named: AtomicU64::new(u64::MAX),
            next_group: AtomicU64::new(0),
            groups: Mutex::new(HashMap::new()),
            peers,
            recorder: Recorder::default(),
            trace_dir,
            stop: AtomicBool::new(false),
        });
        let thread = limit.map(|limit| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("rankmesh-watchdog".into())
                .spawn(move || watch(&s, limit))
                .expect("cannot start the watchdog thread")
        });
        Watchdog {
            shared,
            thread,
            service,
            board: Some(board),
        }
    }

    /// Registers a group (name and world ranks of its members) until the
    /// returned handle is dropped.
    pub fn register(&self, name: Arc<str>, members: &[usize]) -> GroupWatch {
        let id = self.shared.next_group.fetch_add(1, Ordering::Relaxed);
        let facts = GroupFacts {
            name: name.clone(),
            members: members.into(),
        };
        self.shared.groups().insert(id, facts);
        GroupWatch {
            s: self.shared.clone(),
            id,
            name,
        }
    }

    /// A beat for long transfers: each piece that completes is progress.
    pub fn pulse(&self) -> Pulse<'_> {
        Pulse(&self.shared.board)
    }

    /// The flight record of this rank, oldest call first.
    pub fn flight_record(&self, header: &str) -> String {
        self.shared.recorder.dump(header)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.service.take();
        self.board.take();
    }
}

/// A group known to the watchdog; unregistered on drop (no name is kept
/// after its group is gone).
pub(crate) struct GroupWatch {
    s: Arc<Shared>,
    id: u64,
    name: Arc<str>,
}

impl GroupWatch {
    /// Marks the start of call `desc` on this group; the call is watched
    /// until the returned guard is dropped.
    pub fn call(&self, desc: &Descriptor) -> Call<'_> {
        let s = &*self.s;
        let now = now_ns();
        // Only this rank's thread writes `named`: a load, and a store when
        // it changes, instead of an atomic swap on every call.
        let rename = s.named.load(Ordering::Relaxed) != self.id;
        if rename {
            s.named.store(self.id, Ordering::Relaxed);
        }
        s.group.store(self.id, Ordering::Relaxed);
        s.board
            .enter(desc.op_code(), desc.seq, rename.then_some(&*self.name), now);
        let number = s.recorder.begin(self.id, &self.name, desc, now);
        Call {
            s,
            number,
            ok: false,
        }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for GroupWatch {
    fn drop(&mut self) {
        self.s.groups().remove(&self.id);
    }
}

/// A call in progress (see [`GroupWatch::call`]).
pub(crate) struct Call<'w> {
    s: &'w Shared,
    number: u64,
    ok: bool,
}

impl Call<'_> {
    /// Ends the call, recording whether `result` succeeded; returns it.
    pub fn finish<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        self.ok = result.is_ok();
        result
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.s.board.leave();
        self.s.recorder.end(self.number, self.ok);
    }
}

/// Marks progress of the current call.
#[derive(Clone, Copy)]
pub(crate) struct Pulse<'w>(&'w BoardView);

impl Pulse<'_> {
    /// A piece of the transfer completed.
    pub fn beat(&self) {
        self.0.beat(now_ns());
    }
}

impl Shared {
    fn groups(&self) -> std::sync::MutexGuard<'_, HashMap<u64, GroupFacts>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn watch(s: &Shared, limit: Duration) {
    let tick = (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let limit_ns = limit.as_nanos().min(u64::MAX as u128) as u64;
    while !s.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(tick);
        let Some(me) = s.board.read_own() else {
            continue;
        };
        if me.state == State::InCall && me.quiet_ns > limit_ns {
            fire(s, &me, limit);
        }
    }
}

/// Reports the hang and ends the job.
fn fire(s: &Shared, me: &Status, limit: Duration) -> ! {
    let host = s.peers.get(s.rank).map_or("?", |p| &p.host);
    let op = Op::from_code(me.op).map_or("a call", Op::name);
    let mut msg = format!(
        "rankmesh: rank {} (host {host}, pid {}) waited {} with no progress in {op} on {} (call #{}); \
         aborting the job (RANKMESH_TIMEOUT={} s)\n",
        s.rank,
        me.pid,
        secs(me.quiet_ns),
        me.group,
        me.seq,
        limit.as_secs_f64()
    );
    let members = {
        let groups = s.groups();
        groups
            .get(&s.group.load(Ordering::Relaxed))
            .map(|g| (g.name.clone(), g.members.clone()))
    };
    if let Some((name, members)) = members {
        msg.push_str(&describe_members(s, me, &name, &members));
    }
    let header = format!("rankmesh: rank {}", s.rank);
    let record = s.recorder.dump(&header);
    let mut out = std::io::stderr().lock();
    let _ = std::io::Write::write_all(&mut out, msg.as_bytes());
    let _ = std::io::Write::write_all(&mut out, record.as_bytes());
    drop(out);
    if let Some(dir) = &s.trace_dir {
        let path = dir.join(format!("rankmesh-trace-rank{}.txt", s.rank));
        let _ = std::fs::write(&path, format!("{msg}{record}"));
    }
    // SAFETY: MPI is initialised (the Runtime owns this thread and stops it
    // before finalising); the main thread is blocked inside MPI, and
    // MPI_Abort only asks the launcher to end the job.
    unsafe { mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, TIMEOUT_EXIT) };
    std::process::exit(TIMEOUT_EXIT)
}

/// One line per other member of the stuck group: where it is.
fn describe_members(s: &Shared, me: &Status, group: &str, members: &[usize]) -> String {
    let local = s.board.read_all();
    let mut remote: HashMap<usize, Option<Vec<Status>>> = HashMap::new();
    let my_node = s.peers.get(s.rank).map(|p| p.node);
    let mut out = String::new();
    for (g, &w) in members.iter().enumerate() {
        if w == s.rank {
            continue;
        }
        let facts = s.peers.get(w);
        let node = facts.map(|p| p.node);
        let status = if node == my_node {
            local.iter().find(|st| st.rank == w).cloned()
        } else {
            let node = node.unwrap_or(usize::MAX);
            let board = remote
                .entry(node)
                .or_insert_with(|| query_node(s, node, w))
                .as_ref();
            match board {
                Some(b) => b.iter().find(|st| st.rank == w).cloned(),
                None => {
                    out.push_str(&format!(
                        "rankmesh:   group rank {g} (world rank {w}, host {}): no answer from its node's status service\n",
                        facts.map_or("?", |p| &p.host)
                    ));
                    continue;
                }
            }
        };
        let who = format!(
            "group rank {g} (world rank {w}, host {}",
            facts.map_or("?", |p| &p.host)
        );
        let line = match status {
            None => format!("{who}): not on the status board"),
            Some(st) => {
                let proc_state = match st.process {
                    None if node == my_node => ", process gone".to_string(),
                    Some('T') | Some('t') => ", process stopped".to_string(),
                    Some('Z') => ", process exited".to_string(),
                    _ => String::new(),
                };
                let who = format!("{who}, pid {}{proc_state})", st.pid);
                let same_call = st.state == State::InCall
                    && st.group == group
                    && st.op == me.op
                    && st.seq == me.seq;
                match st.state {
                    _ if same_call => {
                        format!("{who}: in this call, no progress for {}", secs(st.quiet_ns))
                    }
                    State::InCall => format!(
                        "{who}: has not entered this call; it is in {} on {} (call #{}) for {}",
                        Op::from_code(st.op).map_or("a call", Op::name),
                        st.group,
                        st.seq,
                        secs(st.for_ns)
                    ),
                    // A slot names no group until its first call.
                    State::Idle if st.group.is_empty() => format!(
                        "{who}: has not entered this call; it has made no call since its runtime started {} ago",
                        secs(st.for_ns)
                    ),
                    State::Idle => format!(
                        "{who}: has not entered this call; it is in no call, its last call began {} ago",
                        secs(st.for_ns)
                    ),
                    State::Finished => format!(
                        "{who}: has not entered this call; its runtime shut down {} ago",
                        secs(st.for_ns)
                    ),
                }
            }
        };
        out.push_str(&format!("rankmesh:   {line}\n"));
    }
    out
}

/// The board of `node`, from the status service of `first` or of another
/// rank on that node.
fn query_node(s: &Shared, node: usize, first: usize) -> Option<Vec<Status>> {
    let candidates = std::iter::once(first).chain(
        s.peers
            .iter()
            .enumerate()
            .filter(|(r, p)| p.node == node && *r != first)
            .map(|(r, _)| r),
    );
    candidates.take(3).find_map(|r| {
        let addrs = &s.peers.get(r)?.service;
        service::query(addrs, Duration::from_millis(500))
    })
}
