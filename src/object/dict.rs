//! Tensor dictionaries (FastVideo's `broadcast_tensor_dict`,
//! `send_tensor_dict`, `recv_tensor_dict`), one protocol for every data
//! plane. Metadata goes on the object plane, the plane's tensors through the
//! plane's collectives, and host tensors of a device dictionary through MPI
//! (as FastVideo sends CPU tensors on its CPU group and GPU tensors on its
//! device group).
//!
//! Keys keep their insertion order (FastVideo's dicts are ordered). A
//! dictionary sent point to point moves its tensors the way FastVideo's
//! async sends do: every payload is posted at once and waited for once
//! (non-blocking MPI on the host plane, one NCCL group on a device plane).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::group::PlaneTensor;
use crate::object::Objects;
use crate::op::Op;
use crate::tensor::{numel, Tensor};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

/// A value of any serde type in a tensor dictionary, kept encoded (the
/// object plane's format) until [`get`](Self::get) asks for it by type.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    type_name: String,
    bytes: Vec<u8>,
}

impl Object {
    /// Encodes `value`.
    pub fn new<T: Serialize>(value: &T) -> Result<Self> {
        let bytes = postcard::to_stdvec(value).map_err(|e| {
            Error::Tensor(format!(
                "cannot encode `{}` for a tensor dict: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        Ok(Object {
            type_name: std::any::type_name::<T>().to_string(),
            bytes,
        })
    }

    /// The value, decoded as `T`: the type it was made from (another type
    /// is an error naming both, never a reinterpretation of the bytes).
    pub fn get<T: DeserializeOwned>(&self) -> Result<T> {
        let want = std::any::type_name::<T>();
        if want != self.type_name {
            return Err(Error::Tensor(format!(
                "tensor dict value holds `{}`, not `{want}`",
                self.type_name
            )));
        }
        crate::object::depth::from_postcard(&self.bytes)
            .map_err(|e| Error::Tensor(format!("tensor dict value `{want}`: {e}")))
    }

    /// Name of the Rust type the value was made from.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }
}

/// A value in a tensor dictionary of plane tensors `T`.
#[derive(Clone, Debug, PartialEq)]
pub enum DictValue<T = Tensor> {
    /// A tensor of the dictionary's plane (host: MPI; device: NCCL).
    Tensor(T),
    /// A host tensor in a device dictionary, moved through MPI (on the host
    /// plane the same as `Tensor`).
    Host(Tensor),
    /// A JSON value, moved with the metadata on the object plane.
    Value(serde_json::Value),
    /// A value of any serde type (see [`Object`]), moved with the metadata.
    Object(Object),
}

impl<T> DictValue<T> {
    /// An [`Object`] entry holding `value`.
    pub fn object<V: Serialize>(value: &V) -> Result<Self> {
        Object::new(value).map(DictValue::Object)
    }
}

/// A dictionary of named tensors and values, in insertion order.
pub type TensorDict<T = Tensor> = indexmap::IndexMap<String, DictValue<T>>;

/// What the object plane carries for each entry. JSON values travel as text
/// because the binary object format does not describe itself.
#[derive(Serialize, Deserialize)]
enum EntryMeta {
    /// A tensor of the dictionary's plane.
    Plane {
        dtype: DType,
        shape: Vec<usize>,
    },
    /// A host tensor (of a device dictionary, or `DictValue::Host` anywhere).
    Host {
        dtype: DType,
        shape: Vec<usize>,
    },
    Value(String),
    Object {
        type_name: String,
        bytes: Vec<u8>,
    },
}

/// A dictionary's metadata, typed by the sender's plane: the object plane's
/// type agreement then makes a device dictionary meeting a host receiver
/// (or the reverse) an error on both ends before any tensor moves.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
struct DictMeta<T> {
    entries: Vec<(String, EntryMeta)>,
    #[serde(skip)]
    plane: PhantomData<fn() -> T>,
}

fn metadata<T: PlaneTensor>(dict: &TensorDict<T>) -> DictMeta<T> {
    let entries = dict
        .iter()
        .map(|(k, v)| {
            let meta = match v {
                DictValue::Tensor(t) => EntryMeta::Plane {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Host(t) => EntryMeta::Host {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Value(j) => EntryMeta::Value(j.to_string()),
                DictValue::Object(o) => EntryMeta::Object {
                    type_name: o.type_name.clone(),
                    bytes: o.bytes.clone(),
                },
            };
            (k.clone(), meta)
        })
        .collect();
    DictMeta {
        entries,
        plane: PhantomData,
    }
}

fn parse_value(g: &GroupCoordinator<'_>, key: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::invalid(
            Op::BroadcastObject,
            g.name(),
            format!("tensor_dict entry {key:?} is not valid JSON: {e}"),
        )
    })
}

/// The piece of a flattened tensor this rank of an all-gather group moves,
/// when the send-then-all-gather split applies to it.
fn ag_slice(t_numel: usize, ag: Option<&GroupCoordinator<'_>>) -> Option<(usize, usize)> {
    let ag = ag?;
    let n = ag.size();
    t_numel
        .is_multiple_of(n)
        .then(|| (ag.rank_in_group() * t_numel / n, t_numel / n))
}

/// Checks a `dst`/`src` argument and says whether the call has anything to
/// do: on a group of one it does not (FastVideo bypasses it).
fn has_peer(g: &GroupCoordinator<'_>, op: Op, what: &str, rank: Option<usize>) -> Result<bool> {
    if let Some(r) = rank {
        g.check_rank(op, what, r)?;
    }
    Ok(g.size() > 1)
}

/// Tensor dictionaries on any data plane (every [`Collectives`](crate::Collectives) has them).
pub trait TensorDicts<'rt>: crate::group::Batch<'rt> {
    /// Sends group rank `src`'s dictionary to every member (`dict` is
    /// ignored elsewhere). After the metadata, every tensor is posted at
    /// once and waited for once (host tensors as `MPI_Ibcast`s, plane
    /// tensors in one NCCL group). Empty tensors are not sent (they are
    /// recreated from metadata).
    fn broadcast_tensor_dict(
        &self,
        dict: Option<&TensorDict<Self::Tensor>>,
        src: usize,
    ) -> Result<TensorDict<Self::Tensor>> {
        let g = self.group();
        let meta: DictMeta<Self::Tensor> = g.broadcast_object(dict.map(metadata).as_ref(), src)?;
        let mine = g.rank_in_group() == src;
        let mut out = TensorDict::with_capacity(meta.entries.len());
        for (key, m) in meta.entries {
            let own = dict.and_then(|d| d.get(&key)).filter(|_| mine);
            let value = match m {
                EntryMeta::Value(text) => DictValue::Value(parse_value(g, &key, &text)?),
                EntryMeta::Object { type_name, bytes } => {
                    DictValue::Object(Object { type_name, bytes })
                }
                EntryMeta::Host { dtype, shape } => DictValue::Host(match own {
                    Some(DictValue::Host(t)) => t.clone(),
                    _ => Tensor::zeros(shape, dtype)?,
                }),
                EntryMeta::Plane { dtype, shape } => DictValue::Tensor(match own {
                    Some(DictValue::Tensor(t)) => {
                        self.copy_flat(t, 0, numel(&shape))?.reshape(shape)?
                    }
                    _ => self.empty(shape, dtype)?,
                }),
            };
            out.insert(key, value);
        }
        let mut host: Vec<&mut Tensor> = Vec::new();
        let mut plane: Vec<&mut Self::Tensor> = Vec::new();
        for v in out.values_mut() {
            match v {
                DictValue::Host(t) if t.numel() > 0 => host.push(t),
                DictValue::Tensor(t) if numel(t.shape()) > 0 => plane.push(t),
                _ => {}
            }
        }
        if !host.is_empty() {
            crate::group::batch::broadcast_host(g, &mut host, src)?;
        }
        if !plane.is_empty() {
            self.broadcast_batch(&mut plane, src)?;
        }
        Ok(out)
    }

    /// Sends a dictionary to group rank `dst` (next member when `None`).
    /// Its tensors are all posted at once and waited for once. On a group
    /// of one there is no peer and nothing is sent (FastVideo returns the
    /// dictionary there; here the caller still holds it).
    ///
    /// With `all_gather_group`, each plane tensor whose element count divides
    /// by that group's size is sent as this rank's 1/n slice; the receiver's
    /// all-gather group reassembles it (FastVideo's send-then-all-gather).
    fn send_tensor_dict(
        &self,
        dict: &TensorDict<Self::Tensor>,
        dst: Option<usize>,
        all_gather_group: Option<&Self>,
    ) -> Result<()> {
        let g = self.group();
        if !has_peer(g, Op::SendObject, "dst", dst)? {
            return Ok(());
        }
        let (dst, _) = g.ring_peers(dst, None);
        g.send_object(&metadata(dict), dst)?;
        enum Piece<'a, T> {
            Slice(T),
            Whole(&'a T),
        }
        let ag = all_gather_group.map(|a| a.group());
        let mut host: Vec<&Tensor> = Vec::new();
        let mut pieces: Vec<Piece<'_, Self::Tensor>> = Vec::new();
        for v in dict.values() {
            match v {
                DictValue::Host(t) if t.numel() > 0 => host.push(t),
                DictValue::Tensor(t) if numel(t.shape()) > 0 => {
                    pieces.push(match ag_slice(numel(t.shape()), ag) {
                        Some((start, len)) => Piece::Slice(self.copy_flat(t, start, len)?),
                        None => Piece::Whole(t),
                    })
                }
                _ => {}
            }
        }
        let plane: Vec<&Self::Tensor> = pieces
            .iter()
            .map(|p| match p {
                Piece::Slice(t) => t,
                Piece::Whole(t) => *t,
            })
            .collect();
        if !host.is_empty() {
            crate::group::batch::send_host(g, &host, dst)?;
        }
        if !plane.is_empty() {
            self.send_batch(&plane, dst)?;
        }
        Ok(())
    }

    /// Receives a dictionary sent with [`send_tensor_dict`](Self::send_tensor_dict)
    /// from group rank `src` (previous member when `None`); pass the same kind
    /// of `all_gather_group` as the sender. `None` on a group of one, where
    /// there is no peer (as in FastVideo).
    fn recv_tensor_dict(
        &self,
        src: Option<usize>,
        all_gather_group: Option<&Self>,
    ) -> Result<Option<TensorDict<Self::Tensor>>> {
        let g = self.group();
        if !has_peer(g, Op::SendObject, "src", src)? {
            return Ok(None);
        }
        let (_, src) = g.ring_peers(None, src);
        let meta: DictMeta<Self::Tensor> = g.recv_object(src)?;
        // Allocate every receive first, then post them all at once.
        enum Slot<T> {
            Ready(DictValue<T>),
            Host(Tensor),
            Plane(T),
            Gathered(T, Vec<usize>),
        }
        let mut slots: Vec<(String, Slot<Self::Tensor>)> = Vec::with_capacity(meta.entries.len());
        for (key, m) in meta.entries {
            let slot = match m {
                EntryMeta::Value(text) => {
                    Slot::Ready(DictValue::Value(parse_value(g, &key, &text)?))
                }
                EntryMeta::Object { type_name, bytes } => {
                    Slot::Ready(DictValue::Object(Object { type_name, bytes }))
                }
                EntryMeta::Host { dtype, shape } if numel(&shape) == 0 => {
                    Slot::Ready(DictValue::Host(Tensor::zeros(shape, dtype)?))
                }
                EntryMeta::Host { dtype, shape } => Slot::Host(Tensor::zeros(shape, dtype)?),
                EntryMeta::Plane { dtype, shape } if numel(&shape) == 0 => {
                    Slot::Ready(DictValue::Tensor(self.empty(shape, dtype)?))
                }
                EntryMeta::Plane { dtype, shape } => {
                    let n = numel(&shape);
                    match all_gather_group.filter(|a| ag_slice(n, Some(a.group())).is_some()) {
                        Some(ag) => {
                            Slot::Gathered(self.empty(vec![n / ag.group().size()], dtype)?, shape)
                        }
                        None => Slot::Plane(self.empty(shape, dtype)?),
                    }
                }
            };
            slots.push((key, slot));
        }
        let mut host: Vec<&mut Tensor> = Vec::new();
        let mut plane: Vec<&mut Self::Tensor> = Vec::new();
        for (_, slot) in slots.iter_mut() {
            match slot {
                Slot::Host(t) => host.push(t),
                Slot::Plane(t) | Slot::Gathered(t, _) => plane.push(t),
                Slot::Ready(_) => {}
            }
        }
        if !host.is_empty() {
            crate::group::batch::recv_host(g, &mut host, src)?;
        }
        if !plane.is_empty() {
            self.recv_batch(&mut plane, src)?;
        }
        let mut out = TensorDict::with_capacity(slots.len());
        for (key, slot) in slots {
            let value = match slot {
                Slot::Ready(v) => v,
                Slot::Host(t) => DictValue::Host(t),
                Slot::Plane(t) => DictValue::Tensor(t),
                Slot::Gathered(piece, shape) => {
                    let ag = all_gather_group.expect("a gathered slot has a group");
                    DictValue::Tensor(ag.all_gather(&piece, 0)?.reshape(shape)?)
                }
            };
            out.insert(key, value);
        }
        Ok(Some(out))
    }
}

impl<'rt, C: crate::group::Batch<'rt>> TensorDicts<'rt> for C {}
