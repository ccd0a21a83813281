//! One NCCL communicator, owned: created with `ncclCommInitRank`, destroyed
//! (or aborted after an error) when dropped, and asked for asynchronous
//! errors while the host waits on device work.

use super::result::{check, error_of, moved_as, reduced_as};
use super::sys::{Api, NcclResult, RawComm, RawStream, UniqueId, IN_PROGRESS, SUCCESS};
use crate::dtype::DType;
use crate::error::NcclError;
use crate::op::ReduceOp;
use std::cell::{Cell, RefCell};
use std::os::raw::{c_int, c_void};
use std::rc::Rc;

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
    pub(crate) fn poll(&self, api: &Api) -> Result<(), NcclError> {
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
        let e = error_of(api, raw, bad, "asynchronous error");
        self.abort(api, &e.msg);
        Err(e)
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
            *f = Some(NcclError::other(format!(
                "NCCL communicator aborted after: {why}"
            )));
        }
    }
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
        self.comm.check(rc, "ncclGroupEnd")
    }
}

impl Drop for GroupGuard<'_, '_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: closes the bracket this guard opened; the error (if
            // any) was already reported by the call that failed inside it.
            unsafe { (self.comm.api.group_end)() };
        }
    }
}

impl<'a> Communicator<'a> {
    /// `ncclCommInitRank` (blocking: every member must call it with the same
    /// id); `sm` is the lowest compute capability among the members.
    pub fn init(
        api: &'a Api,
        id: UniqueId,
        (size, rank): (usize, usize),
        group: &str,
        sm: (u32, u32),
    ) -> Result<Communicator<'a>, NcclError> {
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` came from ncclGetUniqueId on the first rank.
        let rc = unsafe { (api.comm_init_rank)(&mut raw, size as c_int, id, rank as c_int) };
        if rc != SUCCESS {
            return Err(error_of(api, raw, rc, "ncclCommInitRank failed"));
        }
        Ok(Communicator {
            api,
            state: Rc::new(CommState {
                raw: Cell::new(raw),
                group: group.to_string(),
                failure: RefCell::new(None),
            }),
            sm,
        })
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
        let r = check(self.api, self.state.raw.get(), rc, what);
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
