//! Hang detection. Every call a rank makes (agreement, data, point-to-point,
//! object payloads, group creation) is marked on the node's status
//! [board](board) and in the rank's flight [recorder](recorder); long
//! transfers mark progress per piece. A watchdog thread that sees a call
//! with no progress for `RANKMESH_TIMEOUT` prints which members of the group
//! have not entered that call and where each one is (from the board, across
//! nodes through the status [service](service)), dumps the flight record
//! (to stderr, and to `RANKMESH_TRACE_DIR` when set) and ends the job with
//! `MPI_Abort` and exit code [`TIMEOUT_EXIT`](crate::error::TIMEOUT_EXIT); with [`OnHang::Error`] it
//! gives the call up instead, which then fails with that report as
//! [`Error::Abandoned`](crate::Error::Abandoned). The hot path only stores a
//! few atomics; the watchdog thread never calls MPI except to abort.

mod arrival;
mod deaths;
mod node_marks;
mod board;
pub(crate) mod clock;
mod recorder;
mod service;
mod startup;

pub(crate) use board::Board;
use board::{BoardView, State, Status};
use clock::{now_ns, secs};
use recorder::Recorder;
pub(crate) use service::{local_ipv4, Secret, Service, ADDRS, SECRET_BYTES};
pub(crate) use startup::StartupWatch;

use crate::agree::Descriptor;
use crate::error::{Abandon, Error, Result, LEFT_EXIT, TIMEOUT_EXIT};
use crate::op::Op;
use crate::wait::give_up;
use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a rank that ends the job waits after its report, for the
/// launcher to forward it.
const ABORT_GRACE: Duration = Duration::from_millis(300);

/// What the watchdog does with a call that cannot complete (no progress
/// for `RANKMESH_TIMEOUT`, or a member that left): `RANKMESH_ON_HANG`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnHang {
    /// Prints the report and ends the job (`MPI_Abort`, exit code
    /// [`TIMEOUT_EXIT`](crate::error::TIMEOUT_EXIT) or [`LEFT_EXIT`]): the default, since a rank
    /// stuck in a call usually cannot do anything useful anyway.
    #[default]
    Abort,
    /// Gives the call up: it fails on this rank with the report as
    /// [`Error::Abandoned`], so the program can run its own handlers (a
    /// Python `except`, a checkpoint) before the job ends. A call waiting
    /// inside a blocking MPI routine cannot be given up; the job is then
    /// ended as with `Abort`, 2 s later.
    Error,
}

/// How long the watchdog waits for a call it gave up to end before it
/// ends the job itself (a call inside a blocking MPI routine never does).
const GIVE_UP_GRACE: Duration = Duration::from_secs(2);

/// How long a runtime that gave up a call waits, when dropped, before it
/// ends the job: time for the peers' watchdogs (a tick or two) to see that
/// it left and give their own calls up with that reason.
const GAVE_UP_EXIT_GRACE: Duration = Duration::from_millis(1200);

/// How often the watchdog looks, at most (a member that left rings every
/// bell of its node, and the watchdogs look at once).
const MAX_TICK: Duration = Duration::from_millis(500);

/// The tick of a job that survives a lost rank (ULFM): a killed member
/// rings no bell, and the survivors' recovery starts when a watchdog sees
/// it gone (20 looks a second, each a read of the node's board and of the
/// waited-on members' process states, only while a call waits).
const SURVIVING_TICK: Duration = Duration::from_millis(50);

/// A call quiet this long asks the other nodes of its group, one node every
/// `REMOTE_EVERY`, whether a member there is gone (a process killed where
/// the launcher does not end the job: `srun` without `--kill-on-bad-exit`).
const REMOTE_AFTER: Duration = Duration::from_millis(1000);
const REMOTE_EVERY: Duration = Duration::from_millis(1000);

/// The tick once a rank of the node left (its bell rang): a call quiet
/// this long looks whether a member of it left.
const ALARMED_TICK: Duration = Duration::from_millis(20);

/// How long a call must stay the same call, with no progress, after the
/// watchdog first saw that a member of it left rankmesh (an error or a
/// panic; not a process that is gone), before it is held to be
/// blocked by that member. A member that did its part of the call and then
/// left (the same error on every rank, found after the call's exchange)
/// does not block it: the others finish it a moment later, unless their
/// node is busy. Without this, a rank still finishing such a call was
/// ended 20 ms into it, naming a member that had not stopped it.
const LEFT_GRACE: Duration = Duration::from_millis(500);

/// How long a rank that ends the job because a member left waits, at most,
/// for the node's other ranks in calls to see it and print their own cause
/// (`MPI_Abort` kills them mid-look otherwise).
const PEER_REPORTS_GRACE: Duration = Duration::from_millis(1500);

/// How long a rank that left after an error waits in MPI finalisation for
/// its peers to notice before it ends the job itself.
const LEAVER_GRACE: Duration = Duration::from_secs(30);

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
    /// The latest failed call's number (the recorder's) and error.
    failure: Mutex<Option<(u64, String)>>,
    /// The application printed its error itself: leaving publishes it but
    /// prints nothing more.
    reported: AtomicBool,
    /// The application's own verdict on how this rank leaves, when it gave
    /// one ([`Watchdog::verdict`]): it replaces the latest failed call's.
    verdict: Mutex<Option<Option<String>>>,
    secret: Secret,
    /// When the watchdog last asked another node's service about a quiet
    /// call (`now_ns`), and which of the call's other nodes is next.
    remote_at: AtomicU64,
    remote_turn: AtomicU64,
    on_hang: OnHang,
    /// This rank's departure is published already (a call it gave up).
    published: AtomicBool,
    /// The error of the first call it gave up, which the slot keeps saying
    /// after later calls fail alike.
    gave_up_first: Mutex<Option<String>>,
    /// World rank + 1 of the only members the current call waits on (a
    /// point-to-point call's peers, [`GroupWatch::call_between`]); 0 and 0:
    /// every member of its group.
    only: [AtomicU64; 2],
}

/// Watches one process's calls (owned by the `Runtime`).
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    service: Option<Service>,
    /// Under ULFM: rings this rank's bell when a local process ends.
    deaths: Option<deaths::Deaths>,
    /// Freed last: the threads and the service read it until they stop.
    board: Option<Board>,
}

impl Watchdog {
    /// Starts watching for world rank `rank`: hangs past `limit` (`None`:
    /// never), and members of its calls that leave (always).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        rank: usize,
        limit: Option<Duration>,
        on_hang: OnHang,
        board: Board,
        service: Option<Service>,
        peers: Vec<PeerFacts>,
        trace_dir: Option<PathBuf>,
        secret: Secret,
    ) -> Watchdog {
        // Under ULFM a lost member's call is given up whatever `on_hang`.
        if on_hang == OnHang::Error || crate::ulfm::active() {
            give_up::arm();
        }
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
            failure: Mutex::new(None),
            reported: AtomicBool::new(false),
            verdict: Mutex::new(None),
            secret,
            remote_at: AtomicU64::new(0),
            remote_turn: AtomicU64::new(0),
            on_hang,
            published: AtomicBool::new(false),
            gave_up_first: Mutex::new(None),
            only: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let s = shared.clone();
        let thread = Some(
            std::thread::Builder::new()
                .name("rankmesh-watchdog".into())
                .spawn(move || watch(&s, limit))
                .expect("cannot start the watchdog thread"),
        );
        let deaths = crate::ulfm::active()
            .then(|| deaths::Deaths::start(board.view().clone()))
            .flatten();
        Watchdog {
            shared,
            thread,
            service,
            deaths,
            board: Some(board),
        }
    }

    /// Where this rank's status service listens (empty when it did not start).
    pub fn service_addrs(&self) -> Vec<SocketAddrV4> {
        self.service
            .as_ref()
            .map(|svc| {
                svc.addrs()
                    .iter()
                    .map(|ip| SocketAddrV4::new(*ip, svc.port()))
                    .collect()
            })
            .unwrap_or_default()
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

    /// The runtime is being dropped. When its latest call failed, or during
    /// a panic (`panic`: its message), this rank
    /// prints why, once, and publishes that it left with that text: on its
    /// node's board, and to one rank's status service on every other node.
    /// Peers blocked in a call with it are then named the reason at once
    /// instead of waiting for `RANKMESH_TIMEOUT`. Nothing for a clean exit.
    pub fn leaving(&self, panic: Option<String>) {
        let s = &*self.shared;
        let verdict = s.verdict.lock().unwrap_or_else(|e| e.into_inner()).take();
        let reason = match (panic, verdict) {
            (Some(p), _) => Some(format!("panicked: {p}")),
            (None, Some(verdict)) => verdict,
            (None, None) => s.recorder.last_failed().and_then(|last| {
                let failure = s.failure.lock().unwrap_or_else(|e| e.into_inner());
                failure
                    .as_ref()
                    .filter(|(number, _)| *number == last)
                    .map(|(_, text)| text.clone())
            }),
        };
        let Some(reason) = reason else {
            return;
        };
        let host = s.peers.get(s.rank).map_or("?", |p| &p.host);
        if !s.reported.load(Ordering::Relaxed) {
            eprintln!(
                "rankmesh: rank {} (host {host}) leaves after: {reason}",
                s.rank
            );
        }
        if !s.published.swap(true, Ordering::Relaxed) {
            s.publish_left(&reason);
        }
        // If no peer ends the job (none is waiting on this rank), finishing
        // MPI may wait on peers forever: end it after a grace period.
        let _ = std::thread::Builder::new()
            .name("rankmesh-left".into())
            .spawn(|| {
                std::thread::sleep(LEAVER_GRACE);
                abort_job(LEFT_EXIT)
            });
    }

    /// How this rank leaves, in the application's words: `None` when it
    /// ends cleanly (a failed call it handled is no reason to name), or the
    /// error it ends with (which need not be rankmesh's).
    pub fn verdict(&self, failure: Option<String>) {
        *self
            .shared
            .verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(failure);
    }

    /// The application has printed its error: [`leaving`](Self::leaving)
    /// still publishes it, without printing it again.
    pub fn error_reported(&self) {
        self.shared.reported.store(true, Ordering::Relaxed);
    }

    /// Ends the job after this process gave a call up (`why`): MPI cannot
    /// be finalised under calls that never completed, and the peers may be
    /// in them still. Waits [`GAVE_UP_EXIT_GRACE`] first, for the peers to
    /// see that this rank left and give up their own calls.
    pub fn end_after_giving_up(&self, why: Abandon) -> ! {
        std::thread::sleep(GAVE_UP_EXIT_GRACE);
        abort_job(why.exit_code())
    }

    /// The flight record of this rank, oldest call first.
    pub fn flight_record(&self, header: &str) -> String {
        self.shared.recorder.dump(header)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            self.shared.board.ring_own();
            let _ = t.join();
        }
        self.service.take();
        self.deaths.take();
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
            between: false,
        }
    }

    /// [`call`](Self::call) for a call that waits on world ranks `peers`
    /// only (a point-to-point call: its peer, or a ring shift's two): a
    /// member of the group that leaves blocks it only if it is one of them.
    pub fn call_between(&self, desc: &Descriptor, peers: [usize; 2]) -> Call<'_> {
        for (only, peer) in self.s.only.iter().zip(peers) {
            only.store(peer as u64 + 1, Ordering::Relaxed);
        }
        let mut call = self.call(desc);
        call.between = true;
        call
    }

    /// Runs `f`, a whole call of this group (its [`call`](Self::call)
    /// guard inside), so that its waits can be given up, as
    /// [`Call::run`] does: for a hot caller that runs `f` itself when
    /// [`give_up::armed`] is false, keeping its own code inline.
    pub fn catching<T>(&self, op: Op, group: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match give_up::run(f) {
            Ok(result) => result,
            Err((why, msg)) => Err(self.s.gave_up(op, group, why, msg)),
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
    /// Made by [`GroupWatch::call_between`]: its peers are cleared at its end.
    between: bool,
}

impl Call<'_> {
    /// Runs the call's body `f` so that its waits can be given up
    /// ([`give_up`]), then ends the call as [`finish`](Self::finish) does.
    /// A call given up is [`Error::Abandoned`] of `op` on `group`, and this
    /// rank is published as gone with it: the members waiting for it are
    /// told at once, as after an error from `main`.
    #[inline]
    pub fn run<T>(self, op: Op, group: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match give_up::run(f) {
            Ok(result) => self.finish(result),
            Err((why, msg)) => self.given_up(op, group, why, msg),
        }
    }

    #[cold]
    #[inline(never)]
    fn given_up<T>(self, op: Op, group: &str, why: Abandon, msg: String) -> Result<T> {
        let s = self.s;
        // Off the call first: the guard's drop marks the slot idle.
        drop(self);
        Err(s.gave_up(op, group, why, msg))
    }

    /// Ends the call, recording whether `result` succeeded (a failure's
    /// text is kept for [`Watchdog::leaving`]); returns it.
    #[inline]
    pub fn finish<T, E: std::fmt::Display>(mut self, result: Result<T, E>) -> Result<T, E> {
        self.ok = result.is_ok();
        if let Err(e) = &result {
            self.s.record_failure(self.number, e);
        }
        result
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.s.board.leave();
        self.s.recorder.end(self.number, self.ok);
        if self.between {
            for only in &self.s.only {
                only.store(0, Ordering::Relaxed);
            }
        }
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
    /// The error of a call given up (its guard dropped already), recorded
    /// as the call's failure; the rank is published as gone with it (the
    /// slot says so again after a later call; other nodes are told once).
    #[cold]
    #[inline(never)]
    fn gave_up(&self, op: Op, group: &str, why: Abandon, msg: String) -> Error {
        let group = group.to_string();
        let survives = why == Abandon::PeerLeft && crate::ulfm::active();
        if survives {
            crate::ulfm::revoke_all();
        }
        let e = match survives {
            true => Error::PeerLost {
                op,
                group,
                lost: crate::ulfm::lost_after_notice(),
                msg,
            },
            false => Error::Abandoned {
                op,
                group,
                why,
                msg,
            },
        };
        let text = e.to_string();
        if let Some(number) = self.recorder.last_failed() {
            self.record_failure(number, &text);
        }
        let mut first = self.gave_up_first.lock().unwrap_or_else(|p| p.into_inner());
        match &*first {
            Some(first) => self.board.set_left(first, now_ns()),
            None if self.published.swap(true, Ordering::Relaxed) => {
                self.board.set_left(&text, now_ns())
            }
            None => self.publish_left(&text),
        }
        first.get_or_insert(text);
        e
    }

    /// Publishes that this rank left with `reason`: on its node's board,
    /// and to one rank's status service on every other node.
    fn publish_left(&self, reason: &str) {
        self.board.set_left(reason, now_ns());
        let my_node = self.peers.get(self.rank).map(|p| p.node);
        let mut told: Vec<usize> = Vec::new();
        for p in &self.peers {
            if Some(p.node) == my_node || told.contains(&p.node) {
                continue;
            }
            let node = p.node;
            let took = self
                .peers
                .iter()
                .filter(|q| q.node == node)
                .take(4)
                .any(|q| {
                    service::notify(
                        &q.service,
                        &self.secret,
                        self.rank,
                        reason,
                        Duration::from_millis(300),
                    )
                });
            if took {
                told.push(node);
            }
        }
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, HashMap<u64, GroupFacts>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cold]
    #[inline(never)]
    fn record_failure(&self, number: u64, e: &dyn std::fmt::Display) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some((number, e.to_string()));
    }
}

fn watch(s: &Shared, limit: Option<Duration>) {
    let mut tick = limit.map_or(MAX_TICK, |l| {
        (l / 10).clamp(Duration::from_millis(10), MAX_TICK)
    });
    if crate::ulfm::active() {
        tick = tick.min(SURVIVING_TICK);
    }
    // The departure seen in the current call, not yet held against it.
    let mut suspect: Option<Suspect> = None;
    loop {
        let seen = s.board.bell();
        // `drop` stores `stop`, then rings: one of the two is seen here.
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        s.board.doze(seen, tick);
        if s.board.bell() != seen {
            // A rank left: its peers are about to end the job, and every
            // rank blocked with it should name it first.
            tick = tick.min(ALARMED_TICK);
        }
        // Before the read: a call with no progress since `now` is quiet
        // at least as long as `now` is old.
        let now = now_ns();
        let Some(me) = s.board.read_own() else {
            continue;
        };
        // A process that gave up has nothing more to name: its calls
        // fail at once.
        if me.state != State::InCall || give_up::gave_up() {
            suspect = None;
            continue;
        }
        if let Some(limit) = limit {
            if me.quiet_ns > limit.as_nanos().min(u64::MAX as u128) as u64 {
                fire(s, &me, limit);
                continue;
            }
        }
        let call = (me.op, me.seq, s.group.load(Ordering::Relaxed));
        match &mut suspect {
            Some(x) if x.call == call => {
                if x.blocks(me.quiet_ns, now, now_ns()) {
                    fire_left(s, &me, &x.why);
                }
            }
            // A call quiet past a tick: has a member left?
            _ if u128::from(me.quiet_ns) > tick.as_nanos() => match departed_member(s, &me) {
                Some(Departure {
                    why,
                    maybe_done: false,
                }) => fire_left(s, &me, &why),
                Some(Departure { why, .. }) => {
                    suspect = Some(Suspect {
                        call,
                        seen_ns: now,
                        why,
                    });
                    tick = tick.min(ALARMED_TICK);
                }
                None => suspect = None,
            },
            _ => suspect = None,
        }
    }
}

/// A member of the current call that has left ([`departed_member`]).
struct Departure {
    /// The member and why it left.
    why: String,
    /// It left rankmesh with an error or a panic, and may have done its
    /// part of the call first (the call is held blocked only after
    /// [`LEFT_GRACE`]). A process that is gone, or a runtime that shut
    /// down before it entered the call, blocks it at once: the launcher is
    /// about to end a job with a killed rank, and the job's message must
    /// come first.
    maybe_done: bool,
}

/// A member of the current call that left, seen at `seen_ns`: the call is
/// held to be blocked by it once it stayed quiet [`LEFT_GRACE`] since.
struct Suspect {
    /// The call's op, number and group id.
    call: (u32, u64, u64),
    seen_ns: u64,
    /// The member and its reason, as [`departed_member`] described it.
    why: String,
}

impl Suspect {
    /// Whether the call, read quiet `quiet_ns` at `read` (taken just
    /// before the read), is now (`now`) held to be blocked. Progress since
    /// the departure was seen means the call was waiting for something
    /// else then: the grace starts again from `read`.
    fn blocks(&mut self, quiet_ns: u64, read: u64, now: u64) -> bool {
        let held = now.saturating_sub(self.seen_ns);
        if quiet_ns < read.saturating_sub(self.seen_ns) {
            self.seen_ns = read;
            return false;
        }
        u128::from(held) >= LEFT_GRACE.as_nanos()
    }
}

/// The first member of the current call's group that has left, described
/// ("group rank 1 (world rank 3, host n0) left after: …"): its runtime
/// dropped after an error or a panic (its node's board, or a notice from
/// its node), its process gone, or its runtime shut down cleanly before it
/// entered this call. A member that is only slow has not left. A
/// point-to-point call looks at its peers only: a third member's departure
/// does not stop it.
fn departed_member(s: &Shared, me: &Status) -> Option<Departure> {
    let members = {
        let groups = s.groups();
        groups
            .get(&s.group.load(Ordering::Relaxed))?
            .members
            .clone()
    };
    let only = s.only.each_ref().map(|w| w.load(Ordering::Relaxed));
    let waited_on = |w: usize| only == [0, 0] || only.contains(&(w as u64 + 1));
    let my_node = s.peers.get(s.rank).map(|p| p.node);
    let local: Vec<Status> = s.board.read_all();
    let notices = s.board.notices();
    let remote = remote_board(s, me, &members, my_node);
    members.iter().enumerate().find_map(|(g, &w)| {
        if w == s.rank || !waited_on(w) {
            return None;
        }
        let facts = s.peers.get(w);
        let who = format!(
            "group rank {g} (world rank {w}, host {})",
            facts.map_or("?", |p| &p.host)
        );
        let left = |why: String| Departure {
            why,
            maybe_done: true,
        };
        // Under ULFM a process gone is the answer's `lost` (Error::PeerLost);
        // a rank that left rankmesh may be a survivor that gave its call
        // up, and MPI names the lost ranks then.
        let gone = |why: String| {
            crate::ulfm::note_lost([w]);
            Departure {
                why,
                maybe_done: false,
            }
        };
        if let Some((_, reason)) = notices.iter().find(|(r, _)| *r == w) {
            return Some(left(format!("{who} left after: {reason}")));
        }
        let st = if facts.map(|p| p.node) == my_node {
            local.iter().find(|st| st.rank == w)?
        } else {
            remote.iter().find(|st| st.rank == w)?
        };
        match st.state {
            State::Left => Some(left(format!("{who} left after: {}", st.reason))),
            // Calls on a group are sequential for each member: a clean
            // finisher whose last call was an earlier one on this group
            // never entered this one. Its last call elsewhere proves
            // nothing (it may have done this one first).
            State::Finished if same_sequence(st, me) && st.seq < me.seq => Some(gone(format!(
                "{who} left: its runtime shut down {} ago, before it entered this call",
                secs(st.for_ns)
            ))),
            State::Finished => None,
            _ if matches!(st.process, None | Some('Z')) => Some(gone(format!(
                "{who} is gone: its process (pid {}) ended without leaving rankmesh",
                st.pid
            ))),
            _ => None,
        }
    })
}

/// Whether two board entries count calls on one sequence: the same group,
/// and both group creations or both calls of the group (the world's
/// creations and the world group's calls share the name "world" but not
/// their numbering).
fn same_sequence(a: &Status, b: &Status) -> bool {
    let creation = Op::CreateGroup as u32;
    a.group == b.group && (a.op == creation) == (b.op == creation)
}

/// The board of one other node of the call's group, asked in turn and at
/// most every `REMOTE_EVERY` once the call is quiet past `REMOTE_AFTER`
/// (empty otherwise, or when its node does not answer: only what a node
/// says counts, never its silence).
fn remote_board(s: &Shared, me: &Status, members: &[usize], my_node: Option<usize>) -> Vec<Status> {
    if me.quiet_ns < REMOTE_AFTER.as_nanos() as u64 {
        return Vec::new();
    }
    let now = now_ns();
    let last = s.remote_at.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < REMOTE_EVERY.as_nanos() as u64 {
        return Vec::new();
    }
    let mut nodes: Vec<(usize, usize)> = members
        .iter()
        .filter_map(|&w| s.peers.get(w).map(|p| (p.node, w)))
        .filter(|(n, _)| Some(*n) != my_node)
        .collect();
    nodes.sort_unstable();
    nodes.dedup_by_key(|(n, _)| *n);
    if nodes.is_empty() {
        return Vec::new();
    }
    s.remote_at.store(now, Ordering::Relaxed);
    let turn = s.remote_turn.fetch_add(1, Ordering::Relaxed) as usize;
    let (node, first) = nodes[turn % nodes.len()];
    query_node(s, node, first).unwrap_or_default()
}

/// Names the member that left and ends the job (`LEFT_EXIT`), or gives the
/// call up ([`OnHang`]).
fn fire_left(s: &Shared, me: &Status, why: &str) {
    let host = s.peers.get(s.rank).map_or("?", |p| &p.host);
    let op = Op::from_code(me.op).map_or("a call", Op::name);
    let msg = format!(
        "rankmesh: rank {} (host {host}): {op} on {} (call #{}) cannot complete: {why}; aborting the job\n",
        s.rank, me.group, me.seq
    );
    // A job that survives a lost rank (ULFM) answers with the loss.
    if s.on_hang == OnHang::Error || crate::ulfm::active() {
        let text = format!("cannot complete: {why}");
        if give_up_call(s, me, Abandon::PeerLeft, text, &msg) {
            return;
        }
    }
    // The cause is the message; the flight record goes to the trace only.
    end_job(s, &msg, false, LEFT_EXIT)
}

/// Waits, [`PEER_REPORTS_GRACE`] at most, until no other rank of the node
/// is in a call: each one blocked with the member that left has named it
/// and is ending the job too (or left, or finished).
fn await_peer_reports(s: &Shared) {
    let until = std::time::Instant::now() + PEER_REPORTS_GRACE;
    while std::time::Instant::now() < until {
        let busy = s.board.read_all().iter().any(|st| {
            st.rank != s.rank
                && st.state == State::InCall
                && !matches!(st.process, None | Some('Z' | 'T' | 't'))
        });
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reports the hang and ends the job (or gives the call up, [`OnHang`]).
fn fire(s: &Shared, me: &Status, limit: Duration) {
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
    let described = members.map_or(String::new(), |(name, members)| {
        describe_members(s, me, &name, &members)
    });
    msg.push_str(&described);
    if s.on_hang == OnHang::Error {
        let mut text = format!(
            "no progress for {} (RANKMESH_TIMEOUT={} s)",
            secs(me.quiet_ns),
            limit.as_secs_f64()
        );
        for line in described.lines() {
            text.push_str("; ");
            text.push_str(line.trim_start_matches("rankmesh:").trim());
        }
        if give_up_call(s, me, Abandon::Timeout, text, &msg) {
            return;
        }
    }
    end_job(s, &msg, true, TIMEOUT_EXIT)
}

/// Gives the current call `me` up (`text`: the error it fails with) and
/// waits up to [`GIVE_UP_GRACE`] for it to end: whether it did (if not, a
/// blocking MPI routine, the caller ends the job with `report`).
fn give_up_call(s: &Shared, me: &Status, why: Abandon, text: String, report: &str) -> bool {
    keep_trace(s, report, &flight_record(s));
    give_up::give_up(why, text);
    let until = std::time::Instant::now() + GIVE_UP_GRACE;
    while std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
        let open = s
            .board
            .read_own()
            .is_some_and(|st| st.state == State::InCall && st.seq == me.seq && st.op == me.op);
        if !open {
            // The call failed; its thread goes on.
            return true;
        }
    }
    eprintln!(
        "rankmesh: rank {}: the call could not be given up within {} s (it waits inside MPI); \
         ending the job",
        s.rank,
        GIVE_UP_GRACE.as_secs_f64()
    );
    false
}

/// Prints `msg` (and the flight record after it, with `record_too`), keeps
/// both in `RANKMESH_TRACE_DIR` when set, and ends the job with `code`.
fn end_job(s: &Shared, msg: &str, record_too: bool, code: i32) -> ! {
    let record = flight_record(s);
    let mut out = std::io::stderr().lock();
    let _ = std::io::Write::write_all(&mut out, msg.as_bytes());
    if record_too {
        let _ = std::io::Write::write_all(&mut out, record.as_bytes());
    }
    drop(out);
    keep_trace(s, msg, &record);
    s.board.set_ending();
    if code == LEFT_EXIT {
        await_peer_reports(s);
    }
    abort_job(code)
}

/// This rank's flight record, headed with its rank.
fn flight_record(s: &Shared) -> String {
    s.recorder.dump(&format!("rankmesh: rank {}", s.rank))
}

/// Writes `msg` and `record` to `RANKMESH_TRACE_DIR`, when set.
fn keep_trace(s: &Shared, msg: &str, record: &str) {
    if let Some(dir) = &s.trace_dir {
        let path = dir.join(format!("rankmesh-trace-rank{}.txt", s.rank));
        let _ = std::fs::write(&path, format!("{msg}{record}"));
    }
}

/// Asks the launcher to end the whole job with `code` (`MPI_Abort`).
fn abort_job(code: i32) -> ! {
    // hydra's proxy on another node ends with the job and drops the output
    // it has not forwarded yet (the whole report was lost under MPICH on
    // fake nodes); a moment lets the lines already written reach the
    // launcher. Only a job that is ending pays it.
    std::thread::sleep(ABORT_GRACE);
    // SAFETY: MPI is initialised (the Runtime owns the watchdog's threads
    // and stops them before finalising, or, after `leaving`, the main thread
    // waits in finalisation); MPI_Abort only asks the launcher to end the job.
    unsafe { mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code) };
    std::process::exit(code)
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
        let host = facts.map_or("?", |p| &p.host);
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
                        "rankmesh:   group rank {g} (world rank {w}, host {host}): no answer from its node's status service\n"
                    ));
                    continue;
                }
            }
        };
        let who = format!("group rank {g} (world rank {w}, host {host}");
        let line = match status {
            None => format!("{who}): not on the status board"),
            Some(st) => where_member_is(&st, &who, node == my_node, (me, group)),
        };
        out.push_str(&format!("rankmesh:   {line}\n"));
    }
    out
}

/// Where the member of status `st` is, against this rank's call `me` on
/// `group` (`who`: its names so far; `local`: on this rank's node, where a
/// process that is gone is seen).
fn where_member_is(st: &Status, who: &str, local: bool, (me, group): (&Status, &str)) -> String {
    let proc_state = match st.process {
        None if local => ", process gone",
        Some('T') | Some('t') => ", process stopped",
        Some('Z') => ", process exited",
        _ => "",
    };
    let who = format!("{who}, pid {}{proc_state})", st.pid);
    let same_call =
        st.state == State::InCall && st.group == group && st.op == me.op && st.seq == me.seq;
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
        State::Left => format!(
            "{who}: has not entered this call; it left {} ago after: {}",
            secs(st.for_ns),
            st.reason
        ),
        State::Ending => format!(
            "{who}: ending the job: a call of it cannot complete ({} ago)",
            secs(st.for_ns)
        ),
    }
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
        service::query(addrs, &s.secret, Duration::from_millis(500))
    })
}

#[cfg(test)]
mod tests {
    use super::{Suspect, LEFT_GRACE};

    const MS: u64 = 1_000_000;

    fn seen_at(ns: u64) -> Suspect {
        Suspect {
            call: (1, 7, 0),
            seen_ns: ns,
            why: String::new(),
        }
    }

    #[test]
    fn a_call_quiet_since_the_departure_is_blocked_only_after_the_grace() {
        let grace = LEFT_GRACE.as_nanos() as u64;
        let mut x = seen_at(1000 * MS);
        // Quiet since long before the departure was seen.
        assert!(!x.blocks(900 * MS, 1020 * MS, 1020 * MS));
        assert!(!x.blocks(
            900 * MS + grace - 30 * MS,
            1000 * MS + grace - 10 * MS,
            1000 * MS + grace - 10 * MS
        ));
        assert!(x.blocks(
            900 * MS + grace + 100 * MS,
            1000 * MS + grace,
            1000 * MS + grace
        ));
    }

    #[test]
    fn progress_after_the_departure_starts_the_grace_again() {
        let grace = LEFT_GRACE.as_nanos() as u64;
        let mut x = seen_at(1000 * MS);
        // A piece completed 5 ms before this read, 195 ms after the departure.
        let read = 1200 * MS;
        assert!(!x.blocks(5 * MS, read, read));
        assert_eq!(x.seen_ns, read);
        // Quiet since that piece, but not yet for a grace after this read.
        assert!(!x.blocks(
            grace - 10 * MS,
            read + grace - 15 * MS,
            read + grace - 15 * MS
        ));
        assert!(x.blocks(
            grace + 10 * MS,
            read + grace + 5 * MS,
            read + grace + 5 * MS
        ));
    }
}
