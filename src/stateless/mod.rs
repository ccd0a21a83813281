//! Stateless groups (FastVideo's `StatelessProcessGroup`): an object and
//! host-tensor group that does not touch the job's other groups. One is
//! formed either by a list of world ranks inside one MPI job
//! ([`StatelessGroup::create`]) or over TCP by processes of separately
//! launched jobs ([`StatelessGroup::connect`], FastVideo's
//! `StatelessProcessGroup.create(host, port, rank, world_size)`, which vLLM
//! uses to sync weights from a trainer job into an inference job).
//!
//! FastVideo's `send_obj`/`broadcast_obj` write to a TCP store and return;
//! so do these: the frame is handed off (to `MPI_Isend` as an owned buffer,
//! or to a writer thread per TCP peer) and the call returns, so "both send,
//! then both receive" and "the source broadcasts and moves on" work as they
//! do there. Frames from one sender to one receiver arrive in the order
//! sent, on their own channel (an MPI tag or a TCP connection per pair), so
//! a message is never taken for another's and nothing expires. Every frame
//! carries its kind and type digest: a receiver expecting something else
//! gets an error naming both, and the frame is drained so the next one
//! arrives intact.

mod device;
mod mpi;
mod tcp;

pub use device::StatelessDevice;

use crate::agree::{agree_frame, Frame};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::group::Runtime;
use crate::object::{decode, encode, type_digest, within_bound};
use crate::op::Op;
use crate::tensor::Tensor;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::os::raw::c_int;

/// Tag of stateless frames on MPI (header, then payload pieces).
const TAG_OBJECT: c_int = 0x5221;
const MAGIC: u64 = u64::from_le_bytes(*b"rmSTATEL");

/// Bytes of sent objects a group holds for receivers that have not taken
/// them yet, by default (see [`StatelessGroup::set_send_buffer`]).
pub const DEFAULT_SEND_BUFFER_BYTES: usize = 64 << 20;

/// A frame's header: magic, kind, type digest, payload length.
type Header = [u64; 4];

/// What a frame is; a receiver expecting one kind and meeting another gets
/// an error naming both.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Send = 1,
    Broadcast = 2,
    /// The sender could not produce the object; the payload is its error text.
    Failed = 3,
    Gather = 4,
    Barrier = 5,
    Tensor = 6,
    TensorBroadcast = 7,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Send,
        Kind::Broadcast,
        Kind::Failed,
        Kind::Gather,
        Kind::Barrier,
        Kind::Tensor,
        Kind::TensorBroadcast,
    ];

    fn of(code: u64) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u64 == code)
    }

    fn call(self) -> &'static str {
        match self {
            Kind::Send => "send_obj",
            Kind::Broadcast => "broadcast_obj",
            Kind::Failed => "a failed send",
            Kind::Gather => "all_gather_obj",
            Kind::Barrier => "barrier",
            Kind::Tensor => "send_tensor",
            Kind::TensorBroadcast => "broadcast_tensor",
        }
    }
}

/// How a stateless group moves frames between its members.
trait Links {
    /// The group's name in errors.
    fn name(&self) -> &str;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The largest payload this rank accepts (`RANKMESH_MAX_OBJECT_BYTES`).
    fn max_object_bytes(&self) -> u64;
    /// Runs a wait under the transport's watch (the hang watchdog on MPI;
    /// TCP links time out by themselves).
    fn watch<R>(&self, op: Op, f: impl FnOnce() -> Result<R>) -> Result<R>;
    /// Hands the frame to every member in `dsts` and returns; first waits
    /// while more than `limit` bytes of earlier frames are still unread
    /// (one frame is always accepted, whatever its size).
    fn post(&self, header: Header, payload: Vec<u8>, dsts: &[usize], limit: usize) -> Result<()>;
    /// The next frame's header from `src`.
    fn read_header(&self, op: Op, src: usize) -> Result<Header>;
    /// The payload of the frame whose header was just read (`buf.len()` bytes).
    fn read_payload(&self, op: Op, src: usize, buf: &mut [u8]) -> Result<()>;
    /// Waits until every frame this rank posted has been taken.
    fn flush(&self) -> Result<()>;
}

enum Backend<'rt> {
    Mpi(mpi::MpiLinks<'rt>),
    Tcp(tcp::TcpLinks),
}

/// Runs `$body` with `$l` bound to the backend's [`Links`].
macro_rules! with_links {
    ($self:expr, $l:ident => $body:expr) => {
        match &$self.backend {
            Backend::Mpi($l) => $body,
            Backend::Tcp($l) => $body,
        }
    };
}

/// An object and host-tensor group over some processes: world ranks of this
/// job ([`create`](Self::create)) or processes of several jobs meeting at a
/// TCP address ([`connect`](Self::connect)). Members are numbered `0..world_size`.
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
    rt: &'rt Runtime,
    backend: Backend<'rt>,
    limit: usize,
}

impl<'rt> StatelessGroup<'rt> {
    /// Forms the group of the listed world ranks of this job; only they call
    /// this (see [`Runtime::subgroup`]).
    pub fn create(rt: &'rt Runtime, ranks: &[usize]) -> Result<Self> {
        let group = rt.subgroup("stateless", ranks)?;
        Ok(StatelessGroup {
            rt,
            backend: Backend::Mpi(mpi::MpiLinks::new(group)),
            limit: DEFAULT_SEND_BUFFER_BYTES,
        })
    }

    /// Forms a group of `world_size` processes that may belong to different
    /// jobs (a trainer and an inference server, say), meeting at `addr`
    /// (`host:port`): member 0 listens there, the others connect to it and
    /// then to each other, one TCP connection per pair. Each process calls
    /// this once with its own `rank`. Waits at most `RANKMESH_TIMEOUT` (as
    /// does every later receive); a process presenting the wrong world size,
    /// a taken rank, or not speaking rankmesh's protocol is refused with an
    /// error naming why (a stray connection does not stop the others).
    pub fn connect(rt: &'rt Runtime, addr: &str, rank: usize, world_size: usize) -> Result<Self> {
        let options = rt.options();
        let links = tcp::TcpLinks::connect(
            addr,
            rank,
            world_size,
            options.timeout,
            options.max_object_bytes,
        )?;
        Ok(StatelessGroup {
            rt,
            backend: Backend::Tcp(links),
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
        with_links!(self, l => l.rank())
    }

    /// Number of members.
    pub fn world_size(&self) -> usize {
        with_links!(self, l => l.size())
    }

    /// The group's name in errors (`stateless[..]` or `tcp://ADDR`).
    pub fn name(&self) -> &str {
        with_links!(self, l => l.name())
    }

    /// The underlying MPI group (for tensor collectives as well); `None` for
    /// a group formed over TCP, which has no MPI communicator.
    pub fn group(&self) -> Option<&GroupCoordinator<'rt>> {
        match &self.backend {
            Backend::Mpi(l) => Some(&l.group),
            Backend::Tcp(_) => None,
        }
    }

    /// Sends `obj` to group rank `dst` (which may be this rank) and returns
    /// once it is handed off, before `dst` receives it. Objects from one
    /// sender to one receiver arrive in the order sent.
    pub fn send_obj<T: Serialize + 'static>(&self, obj: &T, dst: usize) -> Result<()> {
        let op = Op::SendObject;
        let dst = self.check_rank(op, "dst", dst)?;
        let message = encode(self.name(), op, obj);
        self.post(Kind::Send, type_digest::<T>(), message, &[dst])
    }

    /// Receives the next object sent by group rank `src` with
    /// [`send_obj`](Self::send_obj).
    pub fn recv_obj<T: DeserializeOwned + 'static>(&self, src: usize) -> Result<T> {
        let op = Op::SendObject;
        let src = self.check_rank(op, "src", src)?;
        let bytes = self.take(op, Kind::Send, ty::<T>(), src)?;
        decode(self.name(), op, src, &bytes)
    }

    /// Group rank `src`'s object on every member. The source returns once
    /// the object is handed off (it does not wait for the others); the
    /// others wait for it. A source without an object (`None`) gets an
    /// error, and so does every member that receives from it.
    pub fn broadcast_obj<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: Option<&T>,
        src: usize,
    ) -> Result<T> {
        let op = Op::BroadcastObject;
        let src = self.check_rank(op, "src", src)?;
        if self.rank() != src {
            let bytes = self.take(op, Kind::Broadcast, ty::<T>(), src)?;
            return decode(self.name(), op, src, &bytes);
        }
        let message = match obj {
            Some(v) => encode(self.name(), op, v),
            None => Err(self.no_object(op)),
        };
        let bytes = message
            .as_ref()
            .map(Vec::clone)
            .map_err(|e| self.failed(op, e));
        self.post(Kind::Broadcast, type_digest::<T>(), message, &self.others())?;
        decode(self.name(), op, src, &bytes?)
    }

    /// Every member's object, in group-rank order (every member calls it).
    /// Each member hands its object to the others, then takes theirs, as
    /// FastVideo's broadcast round does.
    pub fn all_gather_obj<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: &T,
    ) -> Result<Vec<T>> {
        let op = Op::AllGatherObject;
        let mine = encode(self.name(), op, obj);
        let own = mine.as_ref().map(Vec::clone).map_err(|e| e.to_string());
        // Take the others' objects even when ours failed, so no frame is left unread.
        let posted = self.post(Kind::Gather, type_digest::<T>(), mine, &self.others());
        let gathered = self.each_member(|r| {
            let bytes = if r == self.rank() {
                own.clone().map_err(|msg| Error::Failed {
                    op: op.name(),
                    group: self.name().to_string(),
                    rank: r,
                    msg,
                })?
            } else {
                self.take(op, Kind::Gather, ty::<T>(), r)?
            };
            decode(self.name(), op, r, &bytes)
        });
        posted.and(gathered)
    }

    /// Waits for every member.
    pub fn barrier(&self) -> Result<()> {
        let op = Op::Barrier;
        self.post(Kind::Barrier, 0, Ok(Vec::new()), &self.others())?;
        self.each_member(|r| {
            if r != self.rank() {
                self.take(op, Kind::Barrier, (0, "()"), r)?;
            }
            Ok(())
        })
        .map(|_| ())
    }

    /// Sends a host tensor to group rank `dst` (which may be this rank) and
    /// returns once it is handed off; its dtype and shape travel with it.
    pub fn send_tensor(&self, t: &Tensor, dst: usize) -> Result<()> {
        let dst = self.check_rank(Op::Send, "dst", dst)?;
        self.post(
            Kind::Tensor,
            type_digest::<Tensor>(),
            Ok(tensor_frame(t)),
            &[dst],
        )
    }

    /// Receives the next tensor sent by group rank `src` with
    /// [`send_tensor`](Self::send_tensor).
    pub fn recv_tensor(&self, src: usize) -> Result<Tensor> {
        let op = Op::Send;
        let src = self.check_rank(op, "src", src)?;
        let bytes = self.take(op, Kind::Tensor, ty::<Tensor>(), src)?;
        self.tensor_of(op, src, &bytes)
    }

    /// Group rank `src`'s host tensor on every member (the source returns
    /// once it is handed off). A source without a tensor gets an error, and
    /// so does every member receiving from it.
    pub fn broadcast_tensor(&self, t: Option<&Tensor>, src: usize) -> Result<Tensor> {
        let op = Op::Broadcast;
        let src = self.check_rank(op, "src", src)?;
        let digest = type_digest::<Tensor>();
        if self.rank() != src {
            let bytes = self.take(op, Kind::TensorBroadcast, ty::<Tensor>(), src)?;
            return self.tensor_of(op, src, &bytes);
        }
        let frame = t.map(tensor_frame).ok_or_else(|| self.no_object(op));
        // A missing tensor is posted as a failure (receivers fail too) and returned here.
        self.post(Kind::TensorBroadcast, digest, frame, &self.others())?;
        t.cloned().ok_or_else(|| self.no_object(op))
    }

    /// Waits until every object this rank sent has been received. Dropping
    /// the group does the same (within the timeout).
    pub fn flush(&self) -> Result<()> {
        with_links!(self, l => l.flush())
    }

    fn others(&self) -> Vec<usize> {
        (0..self.world_size())
            .filter(|r| *r != self.rank())
            .collect()
    }

    fn check_rank(&self, op: Op, what: &str, rank: usize) -> Result<usize> {
        if rank < self.world_size() {
            return Ok(rank);
        }
        Err(Error::invalid(
            op,
            self.name(),
            format!(
                "{what} {rank} is not a rank of this group of size {}",
                self.world_size()
            ),
        ))
    }

    fn no_object(&self, op: Op) -> Error {
        Error::invalid(op, self.name(), "no object given on the source rank")
    }

    fn failed(&self, op: Op, e: &Error) -> Error {
        Error::Failed {
            op: op.name(),
            group: self.name().to_string(),
            rank: self.rank(),
            msg: e.to_string(),
        }
    }

    /// Runs `f` for every member in rank order and returns every result,
    /// or the first error once all were tried: a failure from one member
    /// must not leave the others' frames unread.
    fn each_member<R>(&self, mut f: impl FnMut(usize) -> Result<R>) -> Result<Vec<R>> {
        let results: Vec<Result<R>> = (0..self.world_size()).map(&mut f).collect();
        results.into_iter().collect()
    }

    /// Hands `message` (or the error that replaced it, so receivers fail
    /// too instead of waiting) to each of `dsts`.
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
        let header = [MAGIC, kind as u64, digest as u64, payload.len() as u64];
        with_links!(self, l => l.post(header, payload, dsts, self.limit))?;
        result
    }

    /// The payload of the next frame from `src`, which must be `kind` for
    /// the type `ty` (digest, name).
    fn take(&self, op: Op, kind: Kind, ty: (i64, &str), src: usize) -> Result<Vec<u8>> {
        with_links!(self, l => l.watch(op, || take_from(l, op, kind, ty, src)))
    }

    fn tensor_of(&self, op: Op, src: usize, frame: &[u8]) -> Result<Tensor> {
        tensor_from_frame(frame).map_err(|msg| {
            Error::mismatch(
                op,
                self.name(),
                format!("group rank {src} sent a corrupt tensor: {msg}"),
            )
        })
    }
}

/// A type's digest and name, as frames carry and errors show them.
fn ty<T>() -> (i64, &'static str) {
    (type_digest::<T>(), std::any::type_name::<T>())
}

fn take_from(
    l: &impl Links,
    op: Op,
    kind: Kind,
    (digest, type_name): (i64, &str),
    src: usize,
) -> Result<Vec<u8>> {
    let [magic, code, sent_digest, len] = l.read_header(op, src)?;
    let mismatch = |msg: String| Error::mismatch(op, l.name(), msg);
    let Some(sent) = Kind::of(code).filter(|_| magic == MAGIC) else {
        return Err(mismatch(format!(
            "group rank {src} sent a corrupt object header (magic {magic:#x}, kind {code})"
        )));
    };
    // A failed send's frame carries the sender's error, whatever was asked.
    let verdict = match sent {
        Kind::Failed => Ok(()),
        _ => agree_frame(
            Frame {
                call: sent.call(),
                digest: sent_digest as i64,
            },
            Frame {
                call: kind.call(),
                digest,
            },
            type_name,
            src,
        ),
    };
    let problem = verdict
        .and_then(|()| within_bound(l.max_object_bytes(), len))
        .err();
    if let Some(msg) = problem {
        // Take the payload off the wire so the next frame starts clean
        // (unless its length is absurd: then the link is unusable anyway).
        if within_bound(l.max_object_bytes(), len).is_ok() {
            let mut sink = vec![0u8; (len as usize).min(1 << 20)];
            let mut left = len as usize;
            while left > 0 {
                let n = left.min(sink.len());
                l.read_payload(op, src, &mut sink[..n])?;
                left -= n;
            }
        }
        return Err(mismatch(msg));
    }
    let mut bytes = vec![0u8; len as usize];
    l.read_payload(op, src, &mut bytes)?;
    if sent == Kind::Failed {
        return Err(Error::Failed {
            op: kind.call(),
            group: l.name().to_string(),
            rank: src,
            msg: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    Ok(bytes)
}

/// A tensor as a frame: dtype code, rank, dims (little-endian u64s), then
/// the bytes.
fn tensor_frame(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 8 * t.ndim() + t.nbytes());
    out.extend_from_slice(&u64::from(t.dtype().code()).to_le_bytes());
    out.extend_from_slice(&(t.ndim() as u64).to_le_bytes());
    for d in t.shape() {
        out.extend_from_slice(&(*d as u64).to_le_bytes());
    }
    out.extend_from_slice(t.bytes());
    out
}

fn tensor_from_frame(frame: &[u8]) -> std::result::Result<Tensor, String> {
    let word = |i: usize| -> std::result::Result<u64, String> {
        frame
            .get(i * 8..i * 8 + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("{} bytes end inside its header", frame.len()))
    };
    let code = word(0)?;
    let dtype = u32::try_from(code)
        .ok()
        .and_then(DType::from_code)
        .ok_or_else(|| format!("unknown dtype code {code}"))?;
    let ndim = word(1)?;
    if ndim > 64 {
        return Err(format!("{ndim} dimensions"));
    }
    let shape = (0..ndim as usize)
        .map(|i| word(2 + i).map(|d| d as usize))
        .collect::<std::result::Result<Vec<usize>, String>>()?;
    let data = &frame[(2 + ndim as usize) * 8..];
    Tensor::from_bytes(shape, dtype, data).map_err(|e| e.to_string())
}

impl Drop for StatelessGroup<'_> {
    fn drop(&mut self) {
        // Receivers may still read the buffers: wait for them before freeing.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_frames_round_trip_and_refuse_garbage() {
        let t = Tensor::from_vec([2, 3], vec![1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5]).unwrap();
        assert_eq!(tensor_from_frame(&tensor_frame(&t)).unwrap(), t);
        let mut bad = tensor_frame(&t);
        bad.pop();
        assert!(tensor_from_frame(&bad)
            .unwrap_err()
            .contains("needs 24 bytes"));
        assert!(tensor_from_frame(&[1, 2, 3])
            .unwrap_err()
            .contains("header"));
        let mut odd = tensor_frame(&t);
        odd[0] = 99;
        assert!(tensor_from_frame(&odd)
            .unwrap_err()
            .contains("dtype code 99"));
    }
}
