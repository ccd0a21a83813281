//! One NCCL communicator, owned. It is created non-blocking
//! (`ncclCommInitRankConfig`, `ncclCommInitRankScalable` or `ncclCommSplit`
//! with `blocking = 0`) and polled while NCCL works in the background, so a
//! creation that never ends is aborted instead of hanging; finalized, then
//! destroyed (or aborted) when dropped; and asked for asynchronous errors
//! while the host waits on device work. A library older than 2.14 (no
//! configs) gets the blocking calls.

use super::result::{check, error_of, moved_as, reduced_as};
use super::sys::{
    Api, Config, NcclResult, RawComm, RawStream, UniqueId, IN_PROGRESS, SHRINK_ABORT,
    SPLIT_NOCOLOR, SUCCESS, WIN_COLL_SYMMETRIC,
};
use crate::dtype::DType;
use crate::error::NcclError;
use crate::op::ReduceOp;
use std::cell::{Cell, RefCell};
use std::os::raw::{c_int, c_void};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What the runtime's waiting loop needs to poll a communicator: its handle,
/// its group's name, and whether it already failed. Shared (weakly) with the
/// [`Gpu`](crate::device::Gpu) so a wait on the stream checks every live one.
pub(crate) struct CommState {
    raw: Cell<RawComm>,
    group: String,
    failure: RefCell<Option<NcclError>>,
}

impl CommState {
    /// The group the communicator belongs to.
    pub(crate) fn group(&self) -> &str {
        &self.group
    }

    /// Polls `ncclCommGetAsyncError`; on an error the communicator is
    /// aborted (so device work waiting on a dead peer is released) and the
    /// error returned.
    pub(crate) fn poll(self: &Rc<Self>, api: &Api) -> Result<(), NcclError> {
        if let Some(f) = self.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        match self.state(api) {
            SUCCESS | IN_PROGRESS => Ok(()),
            bad => {
                let e = error_of(api, self.raw.get(), bad, "asynchronous error");
                self.abort(api, &e.msg);
                Err(e)
            }
        }
    }

    /// `ncclCommGetAsyncError`: the communicator's state (success for one
    /// already gone).
    fn state(&self, api: &Api) -> NcclResult {
        let raw = self.raw.get();
        if raw.is_null() {
            return SUCCESS;
        }
        let mut state: NcclResult = SUCCESS;
        // SAFETY: `raw` is a live communicator (nulled when aborted or destroyed).
        let rc = unsafe { (api.comm_get_async_error)(raw, &mut state) };
        if rc != SUCCESS {
            rc
        } else {
            state
        }
    }

    /// Aborts the communicator (idempotent) and remembers why. Inside an
    /// open `ncclGroupStart` bracket the abort waits for the bracket's end:
    /// the calls queued in it still refer to the communicator, and
    /// `ncclGroupEnd` would touch it after abort freed it.
    pub(crate) fn abort(self: &Rc<Self>, api: &Api, why: &str) {
        {
            let mut f = self.failure.borrow_mut();
            if f.is_none() {
                *f = Some(NcclError::other(format!(
                    "NCCL communicator aborted after: {why}"
                )));
            }
        }
        if BRACKET.with(|b| b.defer(self)) {
            return;
        }
        self.abort_now(api);
    }

    fn abort_now(&self, api: &Api) {
        let raw = self.raw.replace(std::ptr::null_mut());
        if !raw.is_null() {
            // SAFETY: `raw` is live and, after this, never used again.
            unsafe { (api.comm_abort)(raw) };
        }
    }

    /// Polls until NCCL's background work on the communicator (creation, a
    /// call that answered `ncclInProgress`, finalize) is done, at most
    /// `limit`, calling `beat` now and then (a watched call that is still
    /// making progress). The error names `what`; the communicator is not
    /// aborted here.
    fn settle(
        &self,
        api: &Api,
        what: &str,
        limit: Option<Duration>,
        beat: &dyn Fn(),
    ) -> Result<(), Settled> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.state(api) {
                SUCCESS => return Ok(()),
                IN_PROGRESS => {}
                bad => return Err(Settled::Failed(error_of(api, self.raw.get(), bad, what))),
            }
            if limit.is_some_and(|l| start.elapsed() > l) {
                return Err(Settled::TimedOut);
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                if spins.is_multiple_of(2000) {
                    beat();
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

/// How a [`CommState::settle`] ended badly.
enum Settled {
    Failed(NcclError),
    TimedOut,
}

/// The thread's open `ncclGroupStart` brackets: NCCL's group is per
/// thread and spans every communicator (pair communicators share one), so
/// aborts requested inside it are held here until it closes.
struct Bracket {
    depth: Cell<u32>,
    doomed: RefCell<Vec<Rc<CommState>>>,
}

impl Bracket {
    /// Whether a bracket is open (then `c` is aborted when it closes).
    fn defer(&self, c: &Rc<CommState>) -> bool {
        if self.depth.get() == 0 {
            return false;
        }
        self.doomed.borrow_mut().push(c.clone());
        true
    }

    /// After `ncclGroupEnd`: one bracket fewer; at the outermost, the
    /// aborts held back run.
    fn close(&self, api: &Api) {
        let depth = self.depth.get().saturating_sub(1);
        self.depth.set(depth);
        if depth == 0 {
            let doomed = std::mem::take(&mut *self.doomed.borrow_mut());
            for c in doomed {
                c.abort_now(api);
            }
        }
    }
}

thread_local! {
    static BRACKET: Bracket = const {
        Bracket {
            depth: Cell::new(0),
            doomed: RefCell::new(Vec::new()),
        }
    };
}

/// An NCCL communicator for one group. Every method enqueues on the stream
/// it is given and returns once NCCL accepted the call; a refused call
/// aborts the communicator (the other ranks' next wait then fails instead
/// of hanging).
pub struct Communicator<'a> {
    api: &'a Api,
    state: Rc<CommState>,
    /// The lowest compute capability among the members (what NCCL can
    /// reduce depends on it).
    sm: (u32, u32),
    /// Made with `blocking = 0`: calls may answer `ncclInProgress`, and the
    /// communicator can be finalized under a limit.
    non_blocking: bool,
    /// How long NCCL may stay in progress (`RANKMESH_TIMEOUT`).
    limit: Option<Duration>,
    /// The call that created it, for errors while it settles.
    made_by: &'static str,
}

/// An open `ncclGroupStart` bracket; [`end`](GroupGuard::end) closes it and
/// reports the fused calls' outcome. Dropped without `end` (an early
/// return), it still closes the bracket so NCCL's group depth stays balanced.
pub struct GroupGuard<'c, 'a> {
    comm: &'c Communicator<'a>,
    open: bool,
}

impl GroupGuard<'_, '_> {
    /// `ncclGroupEnd`, checked.
    pub fn end(mut self) -> Result<(), NcclError> {
        self.open = false;
        // SAFETY: closes the bracket this guard opened.
        let rc = unsafe { (self.comm.api.group_end)() };
        BRACKET.with(|b| b.close(self.comm.api));
        self.comm.check(rc, "ncclGroupEnd")
    }
}

impl Drop for GroupGuard<'_, '_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: closes the bracket this guard opened; the error (if
            // any) was already reported by the call that failed inside it.
            unsafe { (self.comm.api.group_end)() };
            BRACKET.with(|b| b.close(self.comm.api));
        }
    }
}

/// How a buffer is registered with a communicator (nccl-tests' `-R`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// `ncclCommRegister` (NCCL 2.19): local, NCCL may skip its copies.
    Local,
    /// `ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC` (NCCL 2.27):
    /// collective, every member registers its buffer at the same point.
    Symmetric,
}

impl Registration {
    /// What the library lacks for this registration, when it does.
    pub fn missing(self, api: &Api) -> Option<&'static str> {
        match self {
            _ if api.mem_alloc.is_none() || api.mem_free.is_none() => Some("ncclMemAlloc (2.19)"),
            Registration::Local if api.comm_register.is_none() || api.comm_deregister.is_none() => {
                Some("ncclCommRegister (2.19)")
            }
            Registration::Symmetric
                if api.comm_window_register.is_none() || api.comm_window_deregister.is_none() =>
            {
                Some("ncclCommWindowRegister (2.27)")
            }
            _ => None,
        }
    }
}

/// `bytes` of device memory from `ncclMemAlloc`, registered with a
/// communicator; deregistered (while the communicator lives) and freed when
/// dropped. The caller makes sure no work uses it by then.
pub struct RegisteredBuffer<'a> {
    api: &'a Api,
    state: Rc<CommState>,
    ptr: *mut c_void,
    handle: *mut c_void,
    kind: Registration,
    /// How long a deregistration may stay in progress before the memory
    /// is freed anyway (`RANKMESH_TIMEOUT`).
    limit: Option<Duration>,
}

impl RegisteredBuffer<'_> {
    /// The buffer's device address.
    pub fn address(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for RegisteredBuffer<'_> {
    fn drop(&mut self) {
        let raw = self.state.raw.get();
        // SAFETY: `handle` came from registering `ptr` with this communicator
        // (skipped once it is gone: its registrations went with it); `ptr`
        // from ncclMemAlloc, unused by now (the caller's promise).
        unsafe {
            if !raw.is_null() && !self.handle.is_null() {
                let rc = match self.kind {
                    Registration::Local => self.api.comm_deregister.map(|f| f(raw, self.handle)),
                    Registration::Symmetric => {
                        self.api.comm_window_deregister.map(|f| f(raw, self.handle))
                    }
                };
                if let Some(rc) = rc.filter(|rc| *rc != SUCCESS && *rc != IN_PROGRESS) {
                    tracing::warn!("NCCL deregistration failed: {}", self.api.error_string(rc));
                }
                // A non-blocking communicator may deregister in the
                // background: the memory is freed once it is at rest.
                if let Err(Settled::Failed(e)) =
                    self.state
                        .settle(self.api, "NCCL deregistration", self.limit, &|| {})
                {
                    tracing::warn!("{}", e.msg);
                }
            }
            if let Some(free) = self.api.mem_free {
                free(self.ptr);
            }
        }
    }
}

/// The native rooted collectives.
#[derive(Clone, Copy, Debug)]
pub enum Rooted {
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
}

/// How a communicator comes to be.
pub(crate) enum Origin<'p, 'a> {
    /// From unique ids: one (`ncclCommInitRankConfig`) or several roots'
    /// (`ncclCommInitRankScalable`).
    Ids(&'p [UniqueId]),
    /// From a parent's bootstrap (`ncclCommSplit`); `None` as color: this
    /// rank joins none of the split's communicators.
    Split {
        parent: &'p Communicator<'a>,
        color: Option<usize>,
        key: usize,
    },
    /// The parent's members but `exclude` (its ranks, lost), renumbered in
    /// parent order (`ncclCommShrink` with `NCCL_SHRINK_ABORT`): only the
    /// survivors call it.
    Shrink {
        parent: &'p Communicator<'a>,
        exclude: &'p [usize],
    },
}

/// What a communicator's members share: their count, this one's rank, the
/// group's name, its lowest compute capability, and how long NCCL may take.
pub(crate) struct Membership<'g> {
    pub size: usize,
    pub rank: usize,
    pub group: &'g str,
    pub sm: (u32, u32),
    pub limit: Option<Duration>,
}

impl<'a> Communicator<'a> {
    /// Starts creating a communicator (collective over its members; over
    /// the parent's for a split). Non-blocking where the library can: the
    /// result may still be in progress, and [`ready`](Self::ready) waits for
    /// it. `None`: a split this rank does not join.
    pub(crate) fn start(
        api: &'a Api,
        origin: Origin<'_, 'a>,
        m: &Membership<'_>,
    ) -> Result<Option<Communicator<'a>>, NcclError> {
        let non_blocking = api.comm_init_rank_config.is_some() && api.comm_finalize.is_some();
        let mut config = Config::new(!non_blocking);
        let mut raw: RawComm = std::ptr::null_mut();
        let (size, rank) = (m.size as c_int, m.rank as c_int);
        // SAFETY: `raw` and `config` are valid for the call; ids came from
        // ncclGetUniqueId on their roots; the parent is live.
        let (rc, what) = unsafe {
            match origin {
                Origin::Ids([id]) => match api.comm_init_rank_config.filter(|_| non_blocking) {
                    Some(f) => (
                        f(&mut raw, size, *id, rank, &mut config),
                        "ncclCommInitRankConfig",
                    ),
                    None => (
                        (api.comm_init_rank)(&mut raw, size, *id, rank),
                        "ncclCommInitRank",
                    ),
                },
                Origin::Ids(ids) => {
                    let f = api.comm_init_rank_scalable.ok_or_else(|| {
                        NcclError::other(
                            "this NCCL has no ncclCommInitRankScalable (2.23 or newer)",
                        )
                    })?;
                    let mut ids = ids.to_vec();
                    let n = ids.len() as c_int;
                    (
                        f(&mut raw, size, rank, n, ids.as_mut_ptr(), &mut config),
                        "ncclCommInitRankScalable",
                    )
                }
                Origin::Split { parent, color, key } => {
                    let f = api.comm_split.ok_or_else(|| {
                        NcclError::other("this NCCL has no ncclCommSplit (2.18 or newer)")
                    })?;
                    let parent_raw = parent.raw()?;
                    let color = color.map_or(SPLIT_NOCOLOR, |c| c as c_int);
                    let rc = f(parent_raw, color, key as c_int, &mut raw, &mut config);
                    // A non-blocking parent runs the split in the background,
                    // even when the call answers ncclSuccess (NCCL 2.28 on an
                    // H100 did): NCCL writes `raw` when it is done, and the
                    // parent refuses every call until then. So the parent is
                    // polled to rest here, while `raw` is still in scope.
                    (parent.settled_after(rc, "ncclCommSplit"), "ncclCommSplit")
                }
                Origin::Shrink { parent, exclude } => {
                    let f = api.comm_shrink.ok_or_else(|| {
                        NcclError::other("this NCCL has no ncclCommShrink (2.27 or newer)")
                    })?;
                    let parent_raw = parent.raw()?;
                    let mut list: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
                    let n = list.len() as c_int;
                    let rc = f(
                        parent_raw,
                        list.as_mut_ptr(),
                        n,
                        &mut raw,
                        &mut config,
                        SHRINK_ABORT,
                    );
                    // As a split: the parent is polled to rest before `raw`.
                    (parent.settled_after(rc, "ncclCommShrink"), "ncclCommShrink")
                }
            }
        };
        if rc != SUCCESS && rc != IN_PROGRESS {
            let e = error_of(api, raw, rc, &format!("{what} failed"));
            if !raw.is_null() {
                // SAFETY: a communicator NCCL handed out before failing; never used again.
                unsafe { (api.comm_abort)(raw) };
            }
            return Err(e);
        }
        if raw.is_null() {
            return Ok(None); // NCCL_SPLIT_NOCOLOR
        }
        Ok(Some(Communicator {
            api,
            state: Rc::new(CommState {
                raw: Cell::new(raw),
                group: m.group.to_string(),
                failure: RefCell::new(None),
            }),
            sm: m.sm,
            non_blocking,
            limit: m.limit,
            made_by: what,
        }))
    }

    /// Waits until NCCL finished creating the communicator, at most the
    /// limit; `beat` marks progress for the watchdog meanwhile. On an error
    /// or at the limit the communicator is aborted.
    pub(crate) fn ready(&self, beat: &dyn Fn()) -> Result<(), NcclError> {
        let failed = format!("{} failed", self.made_by);
        match self.state.settle(self.api, &failed, self.limit, beat) {
            Ok(()) => Ok(()),
            Err(Settled::Failed(e)) => {
                self.state.abort(self.api, &e.msg);
                Err(e)
            }
            Err(Settled::TimedOut) => {
                let why = format!(
                    "{} did not finish within {} s (RANKMESH_TIMEOUT); aborted",
                    self.made_by,
                    self.limit.unwrap_or_default().as_secs_f64()
                );
                self.state.abort(self.api, &why);
                Err(NcclError {
                    code: IN_PROGRESS,
                    msg: why,
                })
            }
        }
    }

    /// A call's code once NCCL is done with it: `ncclInProgress` (a
    /// non-blocking communicator working in the background) is polled until
    /// it settles, at most the limit. Inline: every enqueue passes here.
    #[inline]
    fn settled(&self, rc: NcclResult, what: &str) -> NcclResult {
        if rc == IN_PROGRESS {
            self.settle_in_progress(what)
        } else {
            rc
        }
    }

    /// After a call NCCL may finish in the background on a non-blocking
    /// communicator although it answered `ncclSuccess` (a split, a window
    /// registration): polls the communicator to rest before its out-pointers
    /// are read or the next call is made.
    fn settled_after(&self, rc: NcclResult, what: &str) -> NcclResult {
        if self.non_blocking && (rc == SUCCESS || rc == IN_PROGRESS) {
            self.settle_in_progress(what)
        } else {
            rc
        }
    }

    /// A call that answered `ncclInProgress`: NCCL enqueues it in the
    /// background, and what the poll then reports is the communicator's
    /// asynchronous error (a failed peer, say), named as such rather than
    /// as the call's own refusal.
    #[cold]
    #[inline(never)]
    fn settle_call(&self, what: &str) -> Result<(), NcclError> {
        match self
            .state
            .settle(self.api, "asynchronous error", self.limit, &|| {})
        {
            Ok(()) => Ok(()),
            Err(Settled::Failed(e)) => Err(e),
            Err(Settled::TimedOut) => Err(NcclError {
                code: IN_PROGRESS,
                msg: format!(
                    "NCCL {what} still in progress after {} s (RANKMESH_TIMEOUT)",
                    self.limit.unwrap_or_default().as_secs_f64()
                ),
            }),
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_in_progress(&self, what: &str) -> NcclResult {
        match self.state.settle(self.api, what, self.limit, &|| {}) {
            Ok(()) => SUCCESS,
            Err(Settled::Failed(e)) => e.code,
            Err(Settled::TimedOut) => IN_PROGRESS,
        }
    }

    /// The entry points it calls.
    pub(crate) fn api(&self) -> &'a Api {
        self.api
    }

    /// The shared state the runtime polls.
    pub(crate) fn state(&self) -> &Rc<CommState> {
        &self.state
    }

    fn raw(&self) -> Result<RawComm, NcclError> {
        if let Some(f) = self.state.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        Ok(self.state.raw.get())
    }

    /// A return code as a result; an error aborts the communicator.
    fn check(&self, rc: NcclResult, what: &str) -> Result<(), NcclError> {
        let r = if rc == IN_PROGRESS {
            self.settle_call(what)
        } else {
            check(self.api, self.state.raw.get(), rc, what)
        };
        if let Err(e) = &r {
            self.state.abort(self.api, &e.msg);
        }
        r
    }

    /// `ncclGroupStart`: the calls until the guard's `end` are fused (NCCL
    /// runs grouped sends and receives together, so none waits for another).
    pub fn group(&self) -> Result<GroupGuard<'_, 'a>, NcclError> {
        self.raw()?;
        // SAFETY: opens a group bracket; the guard closes it.
        let rc = unsafe { (self.api.group_start)() };
        self.check(rc, "ncclGroupStart")?;
        BRACKET.with(|b| b.depth.set(b.depth.get() + 1));
        Ok(GroupGuard {
            comm: self,
            open: true,
        })
    }

    /// `ncclAllReduce` of `count` elements (`send == recv` for in place).
    ///
    /// # Safety
    /// Both pointers address `count` elements of `dtype` on this communicator's
    /// device, alive until `stream` has run the call.
    pub unsafe fn all_reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        // Before `raw()`: a dtype NCCL cannot reduce is the caller's error,
        // not the communicator's, so it stays usable.
        let (dt, op) = reduced_as(dtype, op, self.api.version, self.sm)?;
        let raw = self.raw()?;
        self.check(
            (self.api.all_reduce)(send, recv, count, dt, op, raw, stream),
            "ncclAllReduce",
        )
    }

    /// `ncclReduce` onto `root`.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce); `recv` is only written on `root`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        // Before `raw()`: a dtype NCCL cannot reduce is the caller's error,
        // not the communicator's, so it stays usable.
        let (dt, op) = reduced_as(dtype, op, self.api.version, self.sm)?;
        let raw = self.raw()?;
        self.check(
            (self.api.reduce)(send, recv, count, dt, op, root as c_int, raw, stream),
            "ncclReduce",
        )
    }

    /// `ncclReduceScatter`: `recv_count` elements land on each rank.
    ///
    /// # Safety
    /// `send` holds `recv_count × size` elements, `recv` `recv_count`.
    pub unsafe fn reduce_scatter(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        // Before `raw()`: a dtype NCCL cannot reduce is the caller's error,
        // not the communicator's, so it stays usable.
        let (dt, op) = reduced_as(dtype, op, self.api.version, self.sm)?;
        let raw = self.raw()?;
        self.check(
            (self.api.reduce_scatter)(send, recv, recv_count, dt, op, raw, stream),
            "ncclReduceScatter",
        )
    }

    /// `ncclAllGather`: `send_count` elements from each rank, in rank order.
    ///
    /// # Safety
    /// `send` holds `send_count` elements, `recv` `send_count × size`.
    pub unsafe fn all_gather(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let raw = self.raw()?;
        let (dt, send_count) = moved_as(dtype, send_count);
        self.check(
            (self.api.all_gather)(send, recv, send_count, dt, raw, stream),
            "ncclAllGather",
        )
    }

    /// `ncclBroadcast` from `root` (`send == recv` for in place).
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce).
    pub unsafe fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        root: usize,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let raw = self.raw()?;
        let (dt, count) = moved_as(dtype, count);
        self.check(
            (self.api.broadcast)(send, recv, count, dt, root as c_int, raw, stream),
            "ncclBroadcast",
        )
    }

    /// `bytes` from `ncclMemAlloc`, registered as `kind` asks (collective
    /// over the members for [`Registration::Symmetric`]).
    pub fn alloc_registered(
        &self,
        bytes: usize,
        kind: Registration,
    ) -> Result<RegisteredBuffer<'a>, NcclError> {
        if let Some(missing) = kind.missing(self.api) {
            return Err(NcclError::other(format!("this NCCL has no {missing}")));
        }
        let raw = self.raw()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let alloc = self.api.mem_alloc.expect("checked above");
        check(
            self.api,
            raw,
            // SAFETY: `ptr` is a valid out-pointer; at least one byte is asked for.
            unsafe { alloc(&mut ptr, bytes.max(1)) },
            "ncclMemAlloc",
        )?;
        let mut buf = RegisteredBuffer {
            api: self.api,
            state: self.state.clone(),
            ptr,
            handle: std::ptr::null_mut(),
            kind,
            limit: self.limit,
        };
        // SAFETY: `ptr` holds `bytes` from ncclMemAlloc; `handle` is an out-pointer.
        let rc = unsafe {
            match kind {
                Registration::Local => (self.api.comm_register.expect("checked"))(
                    raw,
                    ptr,
                    bytes.max(1),
                    &mut buf.handle,
                ),
                Registration::Symmetric => (self.api.comm_window_register.expect("checked"))(
                    raw,
                    ptr,
                    bytes.max(1),
                    &mut buf.handle,
                    WIN_COLL_SYMMETRIC,
                ),
            }
        };
        let what = match kind {
            Registration::Local => "ncclCommRegister",
            Registration::Symmetric => "ncclCommWindowRegister",
        };
        // Settled before `buf` moves: NCCL may write the handle later.
        let rc = self.settled_after(rc, what);
        self.check(rc, what)?;
        Ok(buf)
    }

    /// Whether `ncclAlltoAll`, `ncclGather` and `ncclScatter` exist (NCCL
    /// 2.28): callers use them instead of grouped sends and receives.
    pub fn has_native_collectives(&self) -> bool {
        self.api.all_to_all.is_some() && self.api.gather.is_some() && self.api.scatter.is_some()
    }

    /// `ncclAlltoAll`: block `r` (`count` elements) of `send` to rank `r`,
    /// block `r` of `recv` from it.
    ///
    /// # Safety
    /// Both buffers hold `count × size` elements on this device, apart,
    /// alive until `stream` has run the call. Only where
    /// [`has_native_collectives`](Self::has_native_collectives).
    pub unsafe fn all_to_all(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let f = self
            .api
            .all_to_all
            .ok_or_else(|| NcclError::other("this NCCL has no ncclAlltoAll"))?;
        let raw = self.raw()?;
        let (dt, count) = moved_as(dtype, count);
        self.check(f(send, recv, count, dt, raw, stream), "ncclAlltoAll")
    }

    /// `ncclGather` (`count` elements of every rank's `send`, in rank order,
    /// into `recv` on `root`; `recv` null elsewhere) or `ncclScatter` (block
    /// `r` of `send` on `root` into rank `r`'s `recv`; `send` null off the root).
    ///
    /// # Safety
    /// As [`all_to_all`](Self::all_to_all); the root's side holds
    /// `count × size` elements, the other `count`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rooted(
        &self,
        op: Rooted,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        root: usize,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let (f, name) = match op {
            Rooted::Gather => (self.api.gather, "ncclGather"),
            Rooted::Scatter => (self.api.scatter, "ncclScatter"),
        };
        let f = f.ok_or_else(|| NcclError::other(format!("this NCCL has no {name}")))?;
        let raw = self.raw()?;
        let (dt, count) = moved_as(dtype, count);
        self.check(f(send, recv, count, dt, root as c_int, raw, stream), name)
    }

    /// `ncclSend` of `count` elements to `peer` (inside a [`group`](Self::group)
    /// when the peer sends back, so neither side waits for the other).
    ///
    /// # Safety
    /// `buf` addresses `count` elements of `dtype` on this device, alive
    /// until `stream` has run the call.
    pub unsafe fn send(
        &self,
        buf: *const c_void,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let raw = self.raw()?;
        let (dt, count) = moved_as(dtype, count);
        self.check(
            (self.api.send)(buf, count, dt, peer as c_int, raw, stream),
            "ncclSend",
        )
    }

    /// `ncclRecv` of `count` elements from `peer`.
    ///
    /// # Safety
    /// As [`send`](Self::send), with `buf` written.
    pub unsafe fn recv(
        &self,
        buf: *mut c_void,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: RawStream,
    ) -> Result<(), NcclError> {
        let raw = self.raw()?;
        let (dt, count) = moved_as(dtype, count);
        self.check(
            (self.api.recv)(buf, count, dt, peer as c_int, raw, stream),
            "ncclRecv",
        )
    }
}

impl Drop for Communicator<'_> {
    /// Destroying waits for the communicator's work, and a peer that left
    /// without an error would hold it forever: a non-blocking communicator
    /// is finalized and polled at most the limit first, and aborted when
    /// that fails or runs out. One that failed is aborted.
    fn drop(&mut self) {
        if self.state.failure.borrow().is_some() {
            self.state.abort_now(self.api);
            return;
        }
        let raw = self.state.raw.get();
        if raw.is_null() {
            return;
        }
        let finalized = match self.api.comm_finalize.filter(|_| self.non_blocking) {
            Some(finalize) => {
                // SAFETY: `raw` is live; finalize only flushes it.
                let rc = unsafe { finalize(raw) };
                match self.settled(rc, "ncclCommFinalize") {
                    SUCCESS => true,
                    rc => {
                        let why = if rc == IN_PROGRESS {
                            format!(
                                "its work did not finish within {} s (RANKMESH_TIMEOUT)",
                                self.limit.unwrap_or_default().as_secs_f64()
                            )
                        } else {
                            error_of(self.api, raw, rc, "ncclCommFinalize failed").msg
                        };
                        tracing::warn!(group = %self.state.group, "NCCL communicator aborted at drop: {why}");
                        false
                    }
                }
            }
            // Blocking (NCCL < 2.14): destroy unless an error shows.
            None => self.state.state(self.api) == SUCCESS,
        };
        self.state.raw.set(std::ptr::null_mut());
        // SAFETY: `raw` is live and not used after this block.
        unsafe {
            if finalized {
                (self.api.comm_destroy)(raw);
            } else {
                (self.api.comm_abort)(raw);
            }
        }
    }
}
