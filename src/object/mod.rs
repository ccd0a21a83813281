//! The typed object plane: any `Serialize + DeserializeOwned` value over MPI.
//!
//! Values are encoded with `postcard` (a compact, stable, documented serde wire
//! format; no code runs on decode, unlike pickle). A type digest travels in the
//! call descriptor, so ranks that disagree on the type fail before any bytes
//! move; bytes that still fail to decode (or leave trailing data) are an
//! `Error::Decode` naming the group, the sender and the type.
//!
//! A `Vec<u8>` travels as itself: postcard would encode it one element at a
//! time (a 64 MiB byte vector broadcast at 0.3 GB/s), and the receiver
//! takes the received buffer as the value without a copy. Both ends know
//! the type (its digest is agreed), so both take the same path.

pub(crate) mod depth;
mod dict;
mod gather;

pub use dict::{DictValue, Object, TensorDict, TensorDicts};
pub use gather::{ConfigsByRank, Gathers, Ranks};

use crate::agree::fnv1a;
use crate::agree::Descriptor;
use crate::error::{Error, Result};
use crate::group::{AsGroup, GroupCoordinator, Peer};
use crate::op::{Args, Op};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::any::Any;
use std::cell::Cell;

thread_local! {
    /// Bytes of this thread's last encoded object.
    static LAST_ENCODED: Cell<usize> = const { Cell::new(0) };
}

/// The most an encoding reserves up front from [`LAST_ENCODED`].
const HINT_CAP: usize = 64 << 10;

/// Digest of a type's name, carried in descriptors so ranks agree on types.
pub(crate) fn type_digest<T>() -> i64 {
    fnv1a(std::any::type_name::<T>().as_bytes()) as i64
}

pub(crate) fn encode<T: Serialize + 'static>(group: &str, op: Op, v: &T) -> Result<Vec<u8>> {
    if let Some(bytes) = (v as &dyn Any).downcast_ref::<Vec<u8>>() {
        return Ok(bytes.clone());
    }
    // Loops send the same kind of value: start at the last length (capped,
    // so one large object does not inflate every later small one) instead
    // of growing from empty through several reallocations.
    let hint = LAST_ENCODED.get().min(HINT_CAP);
    let encoded = postcard::to_extend(v, Vec::with_capacity(hint));
    if let Ok(bytes) = &encoded {
        LAST_ENCODED.set(bytes.len());
    }
    encoded.map_err(|e| Error::Encode {
        op,
        group: group.to_string(),
        type_name: std::any::type_name::<T>(),
        msg: e.to_string(),
    })
}

/// Decodes received bytes as exactly one `T`, taking the buffer itself
/// when `T` is a byte vector.
pub(crate) fn decode_owned<T: DeserializeOwned + 'static>(
    group: &str,
    op: Op,
    peer: usize,
    bytes: Vec<u8>,
) -> Result<T> {
    let raw: Box<dyn Any> = Box::new(bytes);
    match raw.downcast::<T>() {
        Ok(v) => Ok(*v),
        Err(raw) => {
            let bytes = raw.downcast::<Vec<u8>>().expect("boxed above");
            decode(group, op, peer, &bytes)
        }
    }
}

/// Decodes `bytes` as exactly one `T`.
pub(crate) fn decode<T: DeserializeOwned + 'static>(
    group: &str,
    op: Op,
    peer: usize,
    bytes: &[u8],
) -> Result<T> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<Vec<u8>>() {
        let raw: Box<dyn Any> = Box::new(bytes.to_vec());
        return Ok(*raw.downcast::<T>().expect("T is Vec<u8>"));
    }
    let err = |msg: String| Error::Decode {
        op,
        group: group.to_string(),
        peer,
        type_name: std::any::type_name::<T>(),
        msg,
    };
    crate::object::depth::from_postcard(bytes)
        .map_err(|e| err(format!("{e} ({} bytes received)", bytes.len())))
}

/// Checks a length a peer announced against this rank's bound before
/// anything is allocated for it.
pub(crate) fn within_bound(max: u64, len: u64) -> std::result::Result<(), String> {
    if len > max {
        return Err(format!(
            "an object of {len} bytes exceeds RANKMESH_MAX_OBJECT_BYTES={max}"
        ));
    }
    Ok(())
}

/// Adds this rank's type name to a type-digest disagreement.
fn name_type<T>(e: Error) -> Error {
    match e {
        Error::Mismatch { ref msg, .. } if msg.contains("type #") => e.noted(format_args!(
            "types differ; this rank uses `{}`",
            std::any::type_name::<T>()
        )),
        e => e,
    }
}

/// The object plane on a group: any `Serialize + DeserializeOwned` value,
/// agreed on by type before any byte moves (FastVideo's `*_object` calls).
pub trait Objects<'rt>: AsGroup<'rt> {
    /// Sends `obj` from group rank `src` to every member; `obj` is ignored (and
    /// may be `None`) elsewhere.
    fn broadcast_object<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: Option<&T>,
        src: usize,
    ) -> Result<T> {
        let g = self.as_group();
        let op = Op::BroadcastObject;
        let is_src = g.rank_in_group() == src;
        let bytes = match (is_src, obj) {
            (true, Some(v)) => Some(encode(g.name(), op, v)?),
            (true, None) => None,
            (false, _) => Some(Vec::new()),
        };
        // A source without a value reports length u64::MAX; every rank then fails.
        let len = bytes.as_ref().map_or(u64::MAX, |b| b.len() as u64);
        object_broadcast::<T, _>(g, len, src, |n| {
            let mut bytes = bytes.expect("checked by dispatch");
            broadcast_bytes(g, &mut bytes, n, src)?;
            decode_owned(g.name(), op, src, bytes)
        })
    }

    /// [`broadcast_object`](Self::broadcast_object) into `obj`: on every
    /// member `obj` becomes group rank `src`'s value. A `Vec<u8>` moves
    /// straight between the members' own buffers — the source sends from
    /// its vector without a copy, a receiver's vector is resized to the
    /// source's length and received into (no allocation when its capacity
    /// suffices) — so a loop broadcasting bytes allocates nothing. Other
    /// types are encoded and decoded as by `broadcast_object`.
    fn broadcast_object_into<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: &mut T,
        src: usize,
    ) -> Result<()> {
        let g = self.as_group();
        let op = Op::BroadcastObject;
        let is_src = g.rank_in_group() == src;
        if let Some(v) = (obj as &mut dyn Any).downcast_mut::<Vec<u8>>() {
            let len = if is_src { v.len() as u64 } else { 0 };
            return object_broadcast::<T, _>(g, len, src, |n| broadcast_bytes(g, v, n, src));
        }
        let mut bytes = if is_src {
            encode(g.name(), op, &*obj)?
        } else {
            Vec::new()
        };
        object_broadcast::<T, _>(g, bytes.len() as u64, src, |n| {
            broadcast_bytes(g, &mut bytes, n, src)?;
            if !is_src {
                *obj = decode(g.name(), op, src, &bytes)?;
            }
            Ok(())
        })
    }

    /// FastVideo's `broadcast_object_list`: `list` becomes group rank
    /// `src`'s list on every member (its length included; the list passed
    /// elsewhere is only overwritten).
    fn broadcast_object_list<T: Serialize + DeserializeOwned + 'static>(
        &self,
        list: &mut Vec<T>,
        src: usize,
    ) -> Result<()> {
        let g = self.as_group();
        let mine = (g.rank_in_group() == src).then_some(&*list);
        let got: Vec<T> = g.broadcast_object(mine, src)?;
        if g.rank_in_group() != src {
            *list = got;
        }
        Ok(())
    }

    /// Every member's `obj`, indexed by group rank, on every member.
    fn all_gather_object<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: &T,
    ) -> Result<Vec<T>> {
        let g = self.as_group();
        let op = Op::AllGatherObject;
        let bytes = encode(g.name(), op, obj)?;
        let mut desc = Descriptor::of_args(Args::object(op, type_digest::<T>()));
        desc.len = bytes.len() as u64;
        g.collective(
            desc,
            |d| within_bound(g.runtime().options().max_object_bytes, d.len),
            |descs| {
                let lens: Vec<usize> = descs.iter().map(|d| d.len as usize).collect();
                let all = if g.size() == 1 {
                    vec![bytes]
                } else {
                    g.host_for(op, bytes.len())
                        .gather_varcount(&bytes, &lens, None)
                        .map_err(|f| f.into_error(op, g.name()))?
                        .expect("every rank gets an all-gather")
                };
                all.iter()
                    .enumerate()
                    .map(|(r, b)| decode(g.name(), op, r, b))
                    .collect()
            },
        )
        .map_err(name_type::<T>)
    }

    /// Every member's `obj`, indexed by group rank, on group rank `dst`
    /// (`Some`); `None` on the others.
    fn gather_object<T: Serialize + DeserializeOwned + 'static>(
        &self,
        obj: &T,
        dst: usize,
    ) -> Result<Option<Vec<T>>> {
        let g = self.as_group();
        let op = Op::GatherObject;
        let bytes = encode(g.name(), op, obj)?;
        let mut desc = Descriptor::of_args(Args::gather_object(dst, type_digest::<T>()));
        desc.len = bytes.len() as u64;
        let size = g.size();
        g.collective(
            desc,
            |d| {
                d.validate(op, size)?;
                within_bound(g.runtime().options().max_object_bytes, d.len)
            },
            |descs| {
                let lens: Vec<usize> = descs.iter().map(|d| d.len as usize).collect();
                let all = if size == 1 {
                    Some(vec![bytes])
                } else {
                    g.host_for(op, bytes.len())
                        .gather_varcount(&bytes, &lens, Some(dst))
                        .map_err(|f| f.into_error(op, g.name()))?
                };
                all.map(|all| {
                    all.iter()
                        .enumerate()
                        .map(|(r, b)| decode(g.name(), op, r, b))
                        .collect()
                })
                .transpose()
            },
        )
        .map_err(name_type::<T>)
    }

    /// Sends `obj` to group rank `dst`; synchronous like [`send`](crate::Collectives::send).
    fn send_object<T: Serialize + 'static>(&self, obj: &T, dst: usize) -> Result<()> {
        let g = self.as_group();
        let op = Op::SendObject;
        let bytes = encode(g.name(), op, obj)?;
        let mut desc = Descriptor::of_args(Args::object(op, type_digest::<T>()));
        desc.len = bytes.len() as u64;
        g.point_to_point(desc, Peer::To(dst), |_| {
            g.mpi().send(&bytes, dst);
            Ok(())
        })
        .map_err(name_type::<T>)
    }

    /// Receives an object sent by group rank `src` with [`send_object`](Self::send_object).
    fn recv_object<T: DeserializeOwned + 'static>(&self, src: usize) -> Result<T> {
        let g = self.as_group();
        let op = Op::SendObject;
        let mut desc = Descriptor::of_args(Args::object(op, type_digest::<T>()));
        // The most this rank accepts; both peers check the sender's length
        // against it and agree before any byte moves.
        desc.len = g.runtime().options().max_object_bytes;
        g.point_to_point(desc, Peer::From(src), |sent| {
            let mut bytes = vec![0u8; sent.len as usize];
            g.mpi().recv(&mut bytes, src)?;
            Ok(decode_owned(g.name(), op, src, bytes)?)
        })
        .map_err(name_type::<T>)
    }
}

impl<'rt> Objects<'rt> for GroupCoordinator<'rt> {}

/// Group rank `src`'s `n` bytes into every member's `bytes` (resized to
/// them; the source's already has that length).
fn broadcast_bytes(
    g: &GroupCoordinator<'_>,
    bytes: &mut Vec<u8>,
    n: usize,
    src: usize,
) -> Result<()> {
    if g.size() > 1 {
        bytes.resize(n, 0);
        g.host_for(Op::BroadcastObject, n)
            .broadcast(bytes, src)
            .map_err(|f| f.into_error(Op::BroadcastObject, g.name()))?;
    }
    Ok(())
}

/// The dispatch path of an object broadcast from `src`: `len` is this
/// rank's encoded length (the source's value's; `u64::MAX` for a source
/// without one; anything elsewhere), `body` gets the source's.
fn object_broadcast<T: 'static, R>(
    g: &GroupCoordinator<'_>,
    len: u64,
    src: usize,
    body: impl FnOnce(usize) -> Result<R>,
) -> Result<R> {
    let args = Args::broadcast_object(src, type_digest::<T>());
    let mut desc = Descriptor::of_args(args);
    desc.len = len;
    let size = g.size();
    let check = |d: &Descriptor| {
        d.validate(args.op(), size)?;
        if d.len == u64::MAX {
            return Err("no object given on the source rank".into());
        }
        within_bound(g.runtime().options().max_object_bytes, d.len)
    };
    g.collective(desc, check, |descs| body(descs[src].len as usize))
        .map_err(name_type::<T>)
}
