//! MPI's collectives as the MPI executor (and the call agreement off shared
//! memory) calls them. Each is blocking, unless the ranks of some node share
//! CPUs and the MPI does not yield inside its own blocking calls there; then
//! ([`wait_by_policy`]) each is started as its nonblocking twin and waited
//! for by the host plane's wait policy. The choice is the job's, agreed at
//! start-up: MPI matches a blocking collective only with blocking ones on the
//! other members.
//!
//! Why (4 ranks or 3 on this 2-core VM, 8 B all_reduce on the MPI plane):
//! - MPICH polls inside a blocking call without yielding, so each call
//!   waited for a scheduler tick: 11-12 ms per call blocking, 17-44 µs
//!   started and yielded for (a 7-byte `MPI_Alltoallv` in C: 4.2 ms and
//!   11 µs).
//! - Open MPI with `mpi_yield_when_idle` off (a node crowded by a CPU mask
//!   or a quota its launcher does not see): 8.7-10.6 ms blocking, 24-26 µs
//!   started.
//! - Open MPI yielding (its launcher saw the oversubscription): 10-14 µs
//!   blocking, 39-42 µs started: blocking stays ([`yields_when_idle`]).
//! - Idle: blocking is the faster (8 B `MPI_Allreduce` 0.26 µs against
//!   0.63 µs for `MPI_Iallreduce` and `MPI_Test`, Open MPI 4.1).
//!
//! [`yields_when_idle`]: crate::mpi_ext::yields_when_idle
//!
//! Every function takes the buffers for the length of the call: a started
//! call is complete before the function returns.

use crate::mpi_ext::null_request;
use crate::wait;
use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether calls are started nonblocking and waited for ([`wait_by_policy`]).
static BY_POLICY: AtomicBool = AtomicBool::new(false);

/// Sets how this process calls MPI's collectives: the same on every rank
/// (the runtime agrees on it at start-up, before any group).
pub(crate) fn wait_by_policy(yes: bool) {
    BY_POLICY.store(yes, Ordering::Relaxed);
}

/// Whether this process starts MPI's collectives nonblocking and waits for
/// them by the wait policy (as the job agreed at start-up).
pub(crate) fn waits_by_policy() -> bool {
    BY_POLICY.load(Ordering::Relaxed)
}

/// The communicator of the calls.
#[derive(Clone, Copy)]
pub(crate) struct Calls(pub(crate) ffi::MPI_Comm);

/// Bytes as MPI counts them (the executor cuts pieces to fit `int`).
fn count(n: usize) -> c_int {
    c_int::try_from(n).expect("pieces are cut to fit MPI's int")
}

/// `buf`'s address, or a spare byte's for an empty one: an empty slice's
/// dangling address is Open MPI's `MPI_IN_PLACE`.
fn send_ptr(buf: &[u8], spare: &u8) -> *const c_void {
    match buf.is_empty() {
        true => (spare as *const u8).cast(),
        false => buf.as_ptr().cast(),
    }
}

/// [`send_ptr`] for a receive buffer.
fn recv_ptr(buf: &mut [u8], spare: &mut u8) -> *mut c_void {
    match buf.is_empty() {
        true => (spare as *mut u8).cast(),
        false => buf.as_mut_ptr().cast(),
    }
}

/// Runs one call: `call(None)` blocking, or `call(Some(request))` started
/// and waited for, as the job chose ([`wait_by_policy`]).
fn run(call: impl FnOnce(Option<&mut ffi::MPI_Request>) -> c_int) {
    if !BY_POLICY.load(Ordering::Relaxed) {
        call(None);
        return;
    }
    let mut request = [null_request()];
    call(Some(&mut request[0]));
    wait_all(&mut request, &mut [status()]);
}

/// Bytes a completed receive's `status` says arrived.
pub(crate) fn received(status: &ffi::MPI_Status) -> usize {
    let mut got: c_int = 0;
    // SAFETY: a status MPI filled for a completed receive.
    unsafe { ffi::MPI_Get_count(status, bytes(), &mut got) };
    got.max(0) as usize
}

/// Waits by the policy until every request of `requests` completes, their
/// statuses into `statuses`.
///
/// Under ULFM a call given up after a loss does not leave its requests
/// behind: MPI would still write into the buffers (a survivor's send
/// arriving after the receiver's call returned `PeerLost`, into a tensor
/// the program freed or reuses). The communicators are revoked by then
/// (the error handler, `ulfm::revoke_all`), and MPI completes a revoked
/// communicator's pending requests with an error: they are waited for,
/// at most [`LET_GO`], then cancelled, and only then does the call unwind.
pub(crate) fn wait_all(requests: &mut [ffi::MPI_Request], statuses: &mut [ffi::MPI_Status]) {
    let mut test_all = || {
        let mut done: c_int = 0;
        // SAFETY: live or null requests, one status each.
        unsafe {
            ffi::MPI_Testall(
                requests.len() as c_int,
                requests.as_mut_ptr(),
                &mut done,
                statuses.as_mut_ptr(),
            )
        };
        done != 0
    };
    wait::until(None, || test_all() || given_up_after_loss());
    let_go_after_loss(requests, statuses);
}

/// Whether this process gave its call up after a loss (ULFM): a wait on
/// MPI requests stops waiting and lets them go ([`let_go_after_loss`]).
#[inline]
pub(crate) fn given_up_after_loss() -> bool {
    crate::ulfm::active() && wait::give_up::gave_up()
}

/// After a wait on `requests`: where the call was given up after a loss,
/// completes them (see [`wait_all`]) and unwinds to the call.
pub(crate) fn let_go_after_loss(
    requests: &mut [ffi::MPI_Request],
    statuses: &mut [ffi::MPI_Status],
) {
    if given_up_after_loss() {
        let_go(requests, statuses);
        wait::give_up::unwind_if_given_up();
    }
}

/// How long a call given up after a loss waits for MPI to complete its
/// requests (see [`wait_all`]) before cancelling them.
const LET_GO: std::time::Duration = std::time::Duration::from_secs(2);

/// Completes `requests` after a loss: waited for (they end in error on a
/// revoked communicator), then cancelled where still pending.
#[cold]
fn let_go(requests: &mut [ffi::MPI_Request], statuses: &mut [ffi::MPI_Status]) {
    let null = null_request();
    if settled(requests, statuses, LET_GO) {
        return;
    }
    for r in requests.iter_mut().filter(|r| **r != null) {
        // SAFETY: a live request of this call.
        unsafe { ffi::MPI_Cancel(r) };
    }
    if !settled(requests, statuses, LET_GO) {
        tracing::error!(
            "{} MPI request(s) still pending after a loss, cancelled and left: their \
             buffers may still be written",
            requests.iter().filter(|r| **r != null).count()
        );
    }
}

/// Tests each of `requests` until all are done (`true`) or `within` passed.
pub(crate) fn settled(
    requests: &mut [ffi::MPI_Request],
    statuses: &mut [ffi::MPI_Status],
    within: std::time::Duration,
) -> bool {
    let (null, until) = (null_request(), std::time::Instant::now() + within);
    loop {
        for (r, st) in requests.iter_mut().zip(statuses.iter_mut()) {
            let mut done: c_int = 0;
            if *r != null {
                // SAFETY: a live request of this call; its status is ours.
                unsafe { ffi::MPI_Test(r, &mut done, st) };
            }
        }
        if requests.iter().all(|r| *r == null) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// A zeroed status for MPI to fill.
pub(crate) fn status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is plain data.
    unsafe { std::mem::zeroed() }
}

/// `MPI_UINT8_T`.
fn bytes() -> ffi::MPI_Datatype {
    // SAFETY: reading an MPI constant.
    unsafe { ffi::RSMPI_UINT8_T }
}

impl Calls {
    /// `MPI_Barrier`.
    pub(crate) fn barrier(self) {
        // SAFETY: a valid communicator; the request outlives the call (`run`).
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Barrier(self.0),
                Some(q) => ffi::MPI_Ibarrier(self.0, q),
            }
        });
    }

    /// `MPI_Bcast` of `buf` from `root`.
    pub(crate) fn broadcast(self, buf: &mut [u8], root: usize) {
        let (n, at) = (count(buf.len()), buf.as_mut_ptr().cast());
        let root = root as c_int;
        // SAFETY: `buf` holds `n` bytes and stays borrowed through the call.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Bcast(at, n, bytes(), root, self.0),
                Some(q) => ffi::MPI_Ibcast(at, n, bytes(), root, self.0, q),
            }
        });
    }

    /// `MPI_Allgather`: every rank's `mine` into `out` in rank order.
    pub(crate) fn all_gather(self, mine: &[u8], out: &mut [u8]) {
        let n = count(mine.len());
        let (s, r) = (mine.as_ptr().cast(), out.as_mut_ptr().cast());
        // SAFETY: `out` holds one block of `n` bytes per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Allgather(s, n, bytes(), r, n, bytes(), self.0),
                Some(q) => ffi::MPI_Iallgather(s, n, bytes(), r, n, bytes(), self.0, q),
            }
        });
    }

    /// `MPI_Allgatherv`: member `r`'s `counts[r]` bytes at `displs[r]` of `out`.
    pub(crate) fn all_gather_v(
        self,
        mine: &[u8],
        out: &mut [u8],
        counts: &[c_int],
        displs: &[c_int],
    ) {
        let mut spare = [0u8; 2];
        let [s_spare, r_spare] = &mut spare;
        let s = send_ptr(mine, s_spare);
        let r = recv_ptr(out, r_spare);
        let n = count(mine.len());
        let (c, d) = (counts.as_ptr(), displs.as_ptr());
        // SAFETY: every block lies inside `out` (the caller's counts and
        // displacements); the arrays have one entry per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Allgatherv(s, n, bytes(), r, c, d, bytes(), self.0),
                Some(q) => ffi::MPI_Iallgatherv(s, n, bytes(), r, c, d, bytes(), self.0, q),
            }
        });
    }

    /// `MPI_Gather` of `mine` into `out` on `root` (`None` elsewhere).
    pub(crate) fn gather(self, mine: &[u8], out: Option<&mut [u8]>, root: usize) {
        let n = count(mine.len());
        let s = mine.as_ptr().cast();
        let r = out.map_or(std::ptr::null_mut(), |o| o.as_mut_ptr().cast());
        let root = root as c_int;
        // SAFETY: on the root `out` holds one block of `n` bytes per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Gather(s, n, bytes(), r, n, bytes(), root, self.0),
                Some(q) => ffi::MPI_Igather(s, n, bytes(), r, n, bytes(), root, self.0, q),
            }
        });
    }

    /// `MPI_Gatherv` of `mine` into `out` on `root` (`None` elsewhere; the
    /// counts and displacements are read on the root only).
    pub(crate) fn gather_v(
        self,
        mine: &[u8],
        out: Option<(&mut [u8], &[c_int], &[c_int])>,
        root: usize,
    ) {
        let mut spare = [0u8; 2];
        let [s_spare, r_spare] = &mut spare;
        let (s, n) = (send_ptr(mine, s_spare), count(mine.len()));
        let (r, c, d) = match out {
            Some((out, counts, displs)) => {
                (recv_ptr(out, r_spare), counts.as_ptr(), displs.as_ptr())
            }
            None => (std::ptr::null_mut(), std::ptr::null(), std::ptr::null()),
        };
        let root = root as c_int;
        // SAFETY: on the root every block lies inside `out`.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Gatherv(s, n, bytes(), r, c, d, bytes(), root, self.0),
                Some(q) => ffi::MPI_Igatherv(s, n, bytes(), r, c, d, bytes(), root, self.0, q),
            }
        });
    }

    /// `MPI_Scatter`: block `r` of `send` (on `root`) into member `r`'s `recv`.
    pub(crate) fn scatter(self, send: Option<&[u8]>, recv: &mut [u8], root: usize) {
        let n = count(recv.len());
        let s = send.map_or(std::ptr::null(), |s| s.as_ptr().cast());
        let r = recv.as_mut_ptr().cast();
        let root = root as c_int;
        // SAFETY: on the root `send` holds one block of `n` bytes per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Scatter(s, n, bytes(), r, n, bytes(), root, self.0),
                Some(q) => ffi::MPI_Iscatter(s, n, bytes(), r, n, bytes(), root, self.0, q),
            }
        });
    }

    /// `MPI_Alltoall` of one element of `types` (send, receive) per member
    /// from `send` into `recv`.
    ///
    /// # Safety
    /// Each buffer holds one element of its type per member.
    pub(crate) unsafe fn all_to_all_typed(
        self,
        (send, stype): (*const c_void, ffi::MPI_Datatype),
        (recv, rtype): (*mut c_void, ffi::MPI_Datatype),
        n: c_int,
    ) {
        // SAFETY: the caller's promise.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Alltoall(send, n, stype, recv, n, rtype, self.0),
                Some(q) => ffi::MPI_Ialltoall(send, n, stype, recv, n, rtype, self.0, q),
            }
        });
    }

    /// `MPI_Alltoall` of blocks of `send.len() / P` bytes.
    pub(crate) fn all_to_all(self, send: &[u8], recv: &mut [u8], block: usize) {
        // SAFETY: both buffers hold one block per member.
        unsafe {
            self.all_to_all_typed(
                (send.as_ptr().cast(), bytes()),
                (recv.as_mut_ptr().cast(), bytes()),
                count(block),
            )
        }
    }

    /// `MPI_Alltoallv` of bytes: (buffer, counts, displacements) each way.
    pub(crate) fn all_to_all_v(
        self,
        (send, sc, sd): (&[u8], &[c_int], &[c_int]),
        (recv, rc, rd): (&mut [u8], &[c_int], &[c_int]),
    ) {
        let mut spare = [0u8; 2];
        let [s_spare, r_spare] = &mut spare;
        let (s, r) = (send_ptr(send, s_spare), recv_ptr(recv, r_spare));
        let (sc, sd, rc, rd) = (sc.as_ptr(), sd.as_ptr(), rc.as_ptr(), rd.as_ptr());
        // SAFETY: each block (count at displacement) lies inside its buffer
        // (the caller's counts), and each array has one entry per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Alltoallv(s, sc, sd, bytes(), r, rc, rd, bytes(), self.0),
                Some(q) => ffi::MPI_Ialltoallv(s, sc, sd, bytes(), r, rc, rd, bytes(), self.0, q),
            }
        });
    }

    /// `MPI_Alltoallw`: one element of `types[r]` at byte displacement
    /// `displs[r]`, where `counts[r]` is 1, each way.
    ///
    /// # Safety
    /// Every block the counts name lies inside its buffer; the arrays have
    /// one entry per member.
    pub(crate) unsafe fn all_to_all_w(
        self,
        (send, sd, st): (*const c_void, &[c_int], &[ffi::MPI_Datatype]),
        (recv, rd, rt): (*mut c_void, &[c_int], &[ffi::MPI_Datatype]),
        counts: &[c_int],
    ) {
        let c = counts.as_ptr();
        let (sd, st, rd, rt) = (sd.as_ptr(), st.as_ptr(), rd.as_ptr(), rt.as_ptr());
        // SAFETY: the caller's promise.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Alltoallw(send, c, sd, st, recv, c, rd, rt, self.0),
                Some(q) => ffi::MPI_Ialltoallw(send, c, sd, st, recv, c, rd, rt, self.0, q),
            }
        });
    }

    /// `MPI_Allreduce` of `send` into `recv` (equal lengths) by `op`.
    pub(crate) fn all_reduce<T: Equivalence>(self, send: &[T], recv: &mut [T], op: ffi::MPI_Op) {
        let (n, t) = (count(send.len()), T::equivalent_datatype().as_raw());
        let (s, r) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
        // SAFETY: both buffers hold `n` elements of `t`.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Allreduce(s, r, n, t, op, self.0),
                Some(q) => ffi::MPI_Iallreduce(s, r, n, t, op, self.0, q),
            }
        });
    }

    /// `MPI_Reduce` of `send` into `recv` on `root` (`None` elsewhere).
    pub(crate) fn reduce<T: Equivalence>(
        self,
        send: &[T],
        recv: Option<&mut [T]>,
        root: usize,
        op: ffi::MPI_Op,
    ) {
        let (n, t) = (count(send.len()), T::equivalent_datatype().as_raw());
        let s = send.as_ptr().cast();
        let r = recv.map_or(std::ptr::null_mut(), |r| r.as_mut_ptr().cast());
        let root = root as c_int;
        // SAFETY: `send`, and `recv` on the root, hold `n` elements of `t`.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Reduce(s, r, n, t, op, root, self.0),
                Some(q) => ffi::MPI_Ireduce(s, r, n, t, op, root, self.0, q),
            }
        });
    }

    /// `MPI_Reduce_scatter_block`: `send` holds one block of `recv.len()`
    /// elements per member; member `r` gets the reduction of block `r`.
    pub(crate) fn reduce_scatter_block<T: Equivalence>(
        self,
        send: &[T],
        recv: &mut [T],
        op: ffi::MPI_Op,
    ) {
        let (n, t) = (count(recv.len()), T::equivalent_datatype().as_raw());
        let (s, r) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
        // SAFETY: `send` holds one block of `n` elements per member.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Reduce_scatter_block(s, r, n, t, op, self.0),
                Some(q) => ffi::MPI_Ireduce_scatter_block(s, r, n, t, op, self.0, q),
            }
        });
    }

    /// `MPI_Send` of `buf` to `dst` with `tag`.
    pub(crate) fn send(self, buf: &[u8], dst: usize, tag: c_int) {
        let (n, at, dst) = (count(buf.len()), buf.as_ptr().cast(), dst as c_int);
        // SAFETY: `buf` holds `n` bytes and stays borrowed through the call.
        run(|q| unsafe {
            match q {
                None => ffi::MPI_Send(at, n, bytes(), dst, tag, self.0),
                Some(q) => ffi::MPI_Isend(at, n, bytes(), dst, tag, self.0, q),
            }
        });
    }

    /// `MPI_Recv` into `buf` from `src` with `tag`: the bytes that arrived
    /// (a longer message is MPI's truncation error).
    pub(crate) fn recv(self, buf: &mut [u8], src: usize, tag: c_int) -> usize {
        let (n, at, src) = (count(buf.len()), buf.as_mut_ptr().cast(), src as c_int);
        let mut st = [status()];
        // SAFETY: `buf` holds `n` bytes and stays borrowed through the call.
        unsafe {
            if !BY_POLICY.load(Ordering::Relaxed) {
                ffi::MPI_Recv(at, n, bytes(), src, tag, self.0, &mut st[0]);
            } else {
                let mut q = [null_request()];
                ffi::MPI_Irecv(at, n, bytes(), src, tag, self.0, &mut q[0]);
                wait_all(&mut q, &mut st);
            }
        }
        received(&st[0])
    }

    /// `MPI_Sendrecv`: `send` to its rank with its tag while `recv` comes
    /// from its rank with its tag; the bytes that arrived.
    pub(crate) fn send_recv(
        self,
        (send, dst, out_tag): (&[u8], usize, c_int),
        (recv, src, in_tag): (&mut [u8], usize, c_int),
    ) -> usize {
        let (sn, s, dst) = (count(send.len()), send.as_ptr().cast(), dst as c_int);
        let (rn, r, src) = (count(recv.len()), recv.as_mut_ptr().cast(), src as c_int);
        let mut st = [status(), status()];
        // SAFETY: each buffer holds its count and stays borrowed through
        // the call.
        unsafe {
            if !BY_POLICY.load(Ordering::Relaxed) {
                ffi::MPI_Sendrecv(
                    s,
                    sn,
                    bytes(),
                    dst,
                    out_tag,
                    r,
                    rn,
                    bytes(),
                    src,
                    in_tag,
                    self.0,
                    &mut st[0],
                );
            } else {
                let mut q = [null_request(), null_request()];
                ffi::MPI_Irecv(r, rn, bytes(), src, in_tag, self.0, &mut q[0]);
                ffi::MPI_Isend(s, sn, bytes(), dst, out_tag, self.0, &mut q[1]);
                wait_all(&mut q, &mut st);
            }
        }
        received(&st[0])
    }
}
