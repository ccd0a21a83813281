//! One NCCL communicator, owned: created with `ncclCommInitRank`, destroyed
//! (or aborted after an error) when dropped, and asked for asynchronous
//! errors while the host waits on device work.

use super::sys::{Api, NcclResult, RawComm, RawStream, UniqueId, IN_PROGRESS, SUCCESS};
use std::cell::{Cell, RefCell};
use std::os::raw::{c_int, c_void};
use std::rc::Rc;

/// What the runtime's waiting loop needs to poll a communicator: its handle,
/// its group's name, and whether it already failed. Shared (weakly) with the
/// [`Gpu`](crate::device::Gpu) so a wait on the stream checks every live one.
pub(crate) struct CommState {
    raw: Cell<RawComm>,
    group: String,
    failure: RefCell<Option<String>>,
}

impl CommState {
    /// The group the communicator belongs to.
    pub(crate) fn group(&self) -> &str {
        &self.group
    }

    /// Polls `ncclCommGetAsyncError`; on an error the communicator is
    /// aborted (so device work waiting on a dead peer is released) and the
    /// error returned, naming the group.
    pub(crate) fn poll(&self, api: &Api) -> Result<(), String> {
        if let Some(f) = self.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        let raw = self.raw.get();
        if raw.is_null() {
            return Ok(());
        }
        let mut state: NcclResult = SUCCESS;
        // SAFETY: `raw` is a live communicator (nulled when destroyed).
        let rc = unsafe { (api.comm_get_async_error)(raw, &mut state) };
        let bad = if rc != SUCCESS { rc } else { state };
        if bad == SUCCESS || bad == IN_PROGRESS {
            return Ok(());
        }
        let msg = describe(api, raw, bad, "asynchronous error");
        self.abort(api, &msg);
        Err(msg)
    }

    /// Aborts the communicator (idempotent) and remembers why.
    pub(crate) fn abort(&self, api: &Api, why: &str) {
        let raw = self.raw.replace(std::ptr::null_mut());
        if !raw.is_null() {
            // SAFETY: `raw` is live and, after this, never used again.
            unsafe { (api.comm_abort)(raw) };
        }
        let mut f = self.failure.borrow_mut();
        if f.is_none() {
            *f = Some(format!("NCCL communicator aborted after: {why}"));
        }
    }
}

/// `"NCCL <what>: <ncclGetErrorString> (code N): <ncclGetLastError>"`.
fn describe(api: &Api, raw: RawComm, rc: NcclResult, what: &str) -> String {
    let mut msg = format!("NCCL {what}: {} (code {rc})", api.error_string(rc));
    if let Some(last) = api.last_error(raw) {
        msg += &format!(": {last}");
    }
    msg
}

/// An NCCL communicator for one group.
pub struct Communicator<'a> {
    api: &'a Api,
    state: Rc<CommState>,
    rank: usize,
    size: usize,
}

impl<'a> Communicator<'a> {
    /// `ncclCommInitRank` (blocking: every member must call it with the same id).
    pub fn init(
        api: &'a Api,
        id: UniqueId,
        size: usize,
        rank: usize,
        group: &str,
    ) -> Result<Communicator<'a>, String> {
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` came from ncclGetUniqueId on the first rank.
        let rc = unsafe { (api.comm_init_rank)(&mut raw, size as c_int, id, rank as c_int) };
        if rc != SUCCESS {
            return Err(describe(api, raw, rc, "ncclCommInitRank failed"));
        }
        Ok(Communicator {
            api,
            state: Rc::new(CommState {
                raw: Cell::new(raw),
                group: group.to_string(),
                failure: RefCell::new(None),
            }),
            rank,
            size,
        })
    }

    /// The shared state the runtime polls.
    pub(crate) fn state(&self) -> &Rc<CommState> {
        &self.state
    }

    /// This rank's position in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The raw handle, or the reason the communicator is no longer usable.
    pub fn raw(&self) -> Result<RawComm, String> {
        if let Some(f) = self.state.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        Ok(self.state.raw.get())
    }

    /// Turns an enqueue's return code into a result; an error aborts the
    /// communicator (the other ranks' next wait then fails instead of hanging).
    pub fn check(&self, rc: NcclResult, what: &str) -> Result<(), String> {
        if rc == SUCCESS {
            return Ok(());
        }
        let msg = describe(
            self.api,
            self.state.raw.get(),
            rc,
            &format!("{what} failed"),
        );
        self.state.abort(self.api, &msg);
        Err(msg)
    }

    /// The loaded entry points, for calls the wrappers below do not cover.
    pub fn api(&self) -> &'a Api {
        self.api
    }

    /// Runs `enqueue` between `ncclGroupStart` and `ncclGroupEnd` (fused
    /// point-to-point calls); the first failing code is reported.
    pub fn grouped(
        &self,
        what: &str,
        enqueue: impl FnOnce(&Api, RawComm) -> NcclResult,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        // SAFETY: plain NCCL group brackets around calls on a live communicator.
        let start = unsafe { (self.api.group_start)() };
        self.check(start, "ncclGroupStart")?;
        let rc = enqueue(self.api, raw);
        let end = unsafe { (self.api.group_end)() };
        self.check(rc, what)?;
        self.check(end, "ncclGroupEnd")
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
        dtype: c_int,
        op: c_int,
        stream: RawStream,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        self.check(
            (self.api.all_reduce)(send, recv, count, dtype, op, raw, stream),
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
        dtype: c_int,
        op: c_int,
        root: usize,
        stream: RawStream,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        self.check(
            (self.api.reduce)(send, recv, count, dtype, op, root as c_int, raw, stream),
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
        dtype: c_int,
        op: c_int,
        stream: RawStream,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        self.check(
            (self.api.reduce_scatter)(send, recv, recv_count, dtype, op, raw, stream),
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
        dtype: c_int,
        stream: RawStream,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        self.check(
            (self.api.all_gather)(send, recv, send_count, dtype, raw, stream),
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
        dtype: c_int,
        root: usize,
        stream: RawStream,
    ) -> Result<(), String> {
        let raw = self.raw()?;
        self.check(
            (self.api.broadcast)(send, recv, count, dtype, root as c_int, raw, stream),
            "ncclBroadcast",
        )
    }
}

impl Drop for Communicator<'_> {
    fn drop(&mut self) {
        let raw = self.state.raw.replace(std::ptr::null_mut());
        if raw.is_null() {
            return; // aborted already
        }
        // Destroy waits for outstanding work; a communicator with a pending
        // asynchronous error would never finish it, so abort that one instead.
        let mut state: NcclResult = SUCCESS;
        // SAFETY: `raw` is live and not used after this block.
        unsafe {
            let rc = (self.api.comm_get_async_error)(raw, &mut state);
            if rc == SUCCESS && (state == SUCCESS || state == IN_PROGRESS) {
                (self.api.comm_destroy)(raw);
            } else {
                (self.api.comm_abort)(raw);
            }
        }
    }
}
