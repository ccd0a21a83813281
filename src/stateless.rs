//! Stateless groups (FastVideo's `StatelessProcessGroup`), the MPI way: an
//! object group over any list of world ranks, formed by its members only.
//!
//! FastVideo's `send_obj`/`broadcast_obj` write to a TCP store and return;
//! so do these: the object is handed to MPI (non-blocking sends of an owned
//! buffer) and the call returns, so "both send, then both receive" and "the
//! source broadcasts and moves on" work as they do there. MPI matches
//! messages by communicator, source and order, so objects from one sender
//! arrive in the order sent, a message from one sender can never be taken
//! for another's, and nothing expires.

use crate::collectives::Collectives;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::object::{decode, encode, type_digest, within_bound};
use crate::op::Op;
use crate::plane::host::isend_bytes;
use crate::world::Runtime;
use mpi::ffi;
use mpi::traits::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::raw::c_int;

/// Tag of stateless object messages (header, then payload pieces).
const TAG_OBJECT: c_int = 0x5221;
const MAGIC: u64 = u64::from_le_bytes(*b"rmSTATEL");

/// Bytes of sent objects a group holds for receivers that have not taken
/// them yet, by default (see [`StatelessGroup::set_send_buffer`]).
pub const DEFAULT_SEND_BUFFER_BYTES: usize = 64 << 20;

/// What a message is; a receiver expecting one kind and meeting another
/// gets an error naming both.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Send = 1,
    Broadcast = 2,
    /// The sender could not produce the object; the payload is its error text.
    Failed = 3,
}

impl Kind {
    fn of(code: u64) -> Option<Kind> {
        [Kind::Send, Kind::Broadcast, Kind::Failed]
            .into_iter()
            .find(|k| *k as u64 == code)
    }

    fn call(self) -> &'static str {
        match self {
            Kind::Send => "send_obj",
            Kind::Broadcast => "broadcast_obj",
            Kind::Failed => "a failed send",
        }
    }
}

/// A sent object MPI may still be reading.
struct Pending {
    _header: Box<[u64; 4]>,
    payload: Vec<u8>,
    requests: Vec<ffi::MPI_Request>,
}

impl Pending {
    fn done(&mut self) -> bool {
        let mut flag: c_int = 0;
        // SAFETY: live or null requests; their buffers are owned by `self`.
        unsafe {
            ffi::MPI_Testall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        flag != 0
    }

    fn wait(&mut self) {
        // SAFETY: as in `done`.
        unsafe {
            ffi::MPI_Waitall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
    }
}

/// A metadata group over a list of world ranks.
///
/// ```
/// # let rt = rankmesh::Runtime::init()?;
/// use rankmesh::StatelessGroup;
/// let me = rt.rank();
/// let solo = StatelessGroup::create(&rt, &[me])?; // only the listed ranks call this
/// assert_eq!(solo.all_gather_obj(&"hello".to_string())?, vec!["hello".to_string()]);
/// solo.send_obj(&42u32, 0)?; // returns at once, even to itself
/// assert_eq!(solo.recv_obj::<u32>(0)?, 42);
/// # Ok::<(), rankmesh::Error>(())
/// ```
pub struct StatelessGroup<'rt> {
    group: GroupCoordinator<'rt>,
    outbox: RefCell<VecDeque<Pending>>,
    limit: usize,
}

impl<'rt> StatelessGroup<'rt> {
    /// Forms the group; only the listed world ranks call this (see [`Runtime::subgroup`]).
    pub fn create(rt: &'rt Runtime, ranks: &[usize]) -> Result<Self> {
        Ok(StatelessGroup {
            group: rt.subgroup("stateless", ranks)?,
            outbox: RefCell::new(VecDeque::new()),
            limit: DEFAULT_SEND_BUFFER_BYTES,
        })
    }

    /// Sets how many bytes of sent, not yet received objects this rank holds
    /// before a send waits for receivers to take the oldest. One object is
    /// always accepted, whatever its size.
    pub fn set_send_buffer(&mut self, bytes: usize) {
        self.limit = bytes;
    }

    /// Position of this process in the group.
    pub fn rank(&self) -> usize {
        self.group.rank_in_group()
    }

    /// Number of members.
    pub fn world_size(&self) -> usize {
        self.group.size()
    }

    /// Sends `obj` to group rank `dst` (which may be this rank) and returns
    /// once it is handed off, before `dst` receives it. Objects from one
    /// sender to one receiver arrive in the order sent.
    pub fn send_obj<T: Serialize>(&self, obj: &T, dst: usize) -> Result<()> {
        let op = Op::SendObject;
        let dst = self.group.check_rank(op, "dst", dst)?;
        let message = encode(&self.group, op, obj);
        self.post(Kind::Send, type_digest::<T>(), message, &[dst])
    }

    /// Receives the next object sent by group rank `src` with
    /// [`send_obj`](Self::send_obj).
    pub fn recv_obj<T: DeserializeOwned>(&self, src: usize) -> Result<T> {
        let op = Op::SendObject;
        let src = self.group.check_rank(op, "src", src)?;
        let bytes = self.take::<T>(op, Kind::Send, src)?;
        decode(&self.group, op, src, &bytes)
    }

    /// Group rank `src`'s object on every member. The source returns once
    /// the object is handed off (it does not wait for the others); the
    /// others wait for it. A source without an object (`None`) gets an
    /// error, and so does every member that receives from it.
    pub fn broadcast_obj<T: Serialize + DeserializeOwned>(
        &self,
        obj: Option<&T>,
        src: usize,
    ) -> Result<T> {
        let op = Op::BroadcastObject;
        let src = self.group.check_rank(op, "src", src)?;
        if self.rank() != src {
            let bytes = self.take::<T>(op, Kind::Broadcast, src)?;
            return decode(&self.group, op, src, &bytes);
        }
        let others: Vec<usize> = (0..self.world_size()).filter(|r| *r != src).collect();
        let message = match obj {
            Some(v) => encode(&self.group, op, v),
            None => Err(Error::invalid(
                op,
                self.group.name(),
                "no object given on the source rank",
            )),
        };
        let bytes = message
            .as_ref()
            .map(Vec::clone)
            .map_err(|e| self.failed(op, e));
        self.post(Kind::Broadcast, type_digest::<T>(), message, &others)?;
        decode(&self.group, op, src, &bytes?)
    }

    /// Every member's object, in group-rank order (collective: every member
    /// calls it).
    pub fn all_gather_obj<T: Serialize + DeserializeOwned>(&self, obj: &T) -> Result<Vec<T>> {
        self.reap();
        self.group.all_gather_object(obj)
    }

    /// Waits for every member.
    pub fn barrier(&self) -> Result<()> {
        self.reap();
        self.group.barrier()
    }

    /// Waits until every object this rank sent has been received. Dropping
    /// the group does the same (under the hang watchdog).
    pub fn flush(&self) -> Result<()> {
        let call = self.group.watched(Op::SendObject);
        while let Some(mut oldest) = self.outbox.borrow_mut().pop_front() {
            oldest.wait();
        }
        call.finish(Ok(()))
    }

    /// The underlying group (for tensor collectives as well).
    pub fn group(&self) -> &GroupCoordinator<'rt> {
        &self.group
    }

    fn failed(&self, op: Op, e: &Error) -> Error {
        Error::Failed {
            op: op.name(),
            group: self.group.name().to_string(),
            rank: self.rank(),
            msg: e.to_string(),
        }
    }

    /// Forgets sends MPI has finished with.
    fn reap(&self) {
        self.outbox.borrow_mut().retain_mut(|p| !p.done());
    }

    /// Hands `message` (or the error that replaced it, so receivers fail
    /// too instead of waiting) to MPI for each of `dsts`, after making room
    /// in the send buffer.
    fn post(
        &self,
        kind: Kind,
        digest: i64,
        message: Result<Vec<u8>>,
        dsts: &[usize],
    ) -> Result<()> {
        let (kind, payload, result) = match message {
            Ok(bytes) => (kind, bytes, Ok(())),
            Err(e) => (Kind::Failed, e.to_string().into_bytes(), Err(e)),
        };
        if dsts.is_empty() {
            return result;
        }
        self.reap();
        let held = |o: &VecDeque<Pending>| o.iter().map(|p| p.payload.len()).sum::<usize>();
        if held(&self.outbox.borrow()) + payload.len() > self.limit {
            let call = self.group.watched(Op::SendObject);
            while held(&self.outbox.borrow()) + payload.len() > self.limit {
                let Some(mut oldest) = self.outbox.borrow_mut().pop_front() else {
                    break;
                };
                oldest.wait();
            }
            drop(call);
        }
        let header = Box::new([MAGIC, kind as u64, digest as u64, payload.len() as u64]);
        let piece = self.group.plane().max_piece();
        let comm = self.group.raw_comm().as_raw();
        let mut requests = Vec::new();
        for dst in dsts {
            let header_bytes: &[u8] = bytemuck::cast_slice(&header[..]);
            for buf in std::iter::once(header_bytes).chain(payload.chunks(piece)) {
                // SAFETY: `header` and `payload` move into the outbox with the
                // request and stay there (heap buffers do not move) until
                // MPI reports it complete.
                requests.push(unsafe { isend_bytes(comm, buf, *dst, TAG_OBJECT) });
            }
        }
        self.outbox.borrow_mut().push_back(Pending {
            _header: header,
            payload,
            requests,
        });
        result
    }

    /// Receives the next message from `src`, which must be `kind` for a `T`.
    fn take<T>(&self, op: Op, kind: Kind, src: usize) -> Result<Vec<u8>> {
        self.reap();
        let call = self.group.watched(op);
        call.finish(self.take_now::<T>(op, kind, src))
    }

    fn take_now<T>(&self, op: Op, kind: Kind, src: usize) -> Result<Vec<u8>> {
        let g = &self.group;
        let plane = g.plane();
        let mut header = [0u64; 4];
        plane.recv_header(bytemuck::cast_slice_mut(&mut header[..]), src, TAG_OBJECT);
        let [magic, code, digest, len] = header;
        let mismatch = |msg: String| Error::mismatch(op, g.name(), msg);
        let Some(sent) = Kind::of(code).filter(|_| magic == MAGIC) else {
            return Err(mismatch(format!(
                "group rank {src} sent a corrupt object header (magic {magic:#x}, kind {code})"
            )));
        };
        let problem = if sent != kind && sent != Kind::Failed {
            Some(format!(
                "group rank {src} called {} but this rank called {}",
                sent.call(),
                kind.call()
            ))
        } else if sent == kind && digest as i64 != type_digest::<T>() {
            Some(format!(
                "group rank {src} sent another type than this rank's `{}`",
                std::any::type_name::<T>()
            ))
        } else {
            within_bound(g, len).err()
        };
        if let Some(msg) = problem {
            // Take the payload off the wire so the next message starts clean.
            let piece = plane.max_piece().min(len as usize);
            let mut sink = vec![0u8; piece];
            let mut left = len as usize;
            while left > 0 {
                let n = left.min(piece);
                plane
                    .recv_tagged(&mut sink[..n], src, TAG_OBJECT)
                    .map_err(|f| f.into_error(op, g.name()))?;
                left -= n;
            }
            return Err(mismatch(msg));
        }
        let mut bytes = vec![0u8; len as usize];
        plane
            .recv_tagged(&mut bytes, src, TAG_OBJECT)
            .map_err(|f| f.into_error(op, g.name()))?;
        if sent == Kind::Failed {
            return Err(Error::Failed {
                op: kind.call(),
                group: g.name().to_string(),
                rank: src,
                msg: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        Ok(bytes)
    }
}

impl Drop for StatelessGroup<'_> {
    fn drop(&mut self) {
        // MPI may still read the buffers: wait for receivers before freeing.
        let _ = self.flush();
    }
}
