//! Tensor dictionaries (FastVideo's `broadcast_tensor_dict`, `send_tensor_dict`,
//! `recv_tensor_dict`), one protocol for every data plane: metadata on the
//! object plane, the plane's tensors through the plane's collectives, host
//! tensors of a device dictionary through MPI (as FastVideo sends CPU
//! tensors on its CPU group and GPU tensors on its device group).

use crate::collectives::{Collectives, PlaneTensor};
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::op::Op;
use crate::tensor::{numel, DType, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A value in a tensor dictionary of plane tensors `T`.
#[derive(Clone, Debug, PartialEq)]
pub enum DictValue<T = Tensor> {
    /// A tensor of the dictionary's plane (host: MPI; device: NCCL).
    Tensor(T),
    /// A host tensor in a device dictionary, moved through MPI (on the host
    /// plane the same as `Tensor`).
    Host(Tensor),
    /// Moved with the metadata on the object plane.
    Value(serde_json::Value),
}

/// A dictionary of named tensors and values, ordered by key.
pub type TensorDict<T = Tensor> = BTreeMap<String, DictValue<T>>;

/// What the object plane carries for each entry. JSON values travel as text
/// because the binary object format does not describe itself.
#[derive(Serialize, Deserialize)]
enum EntryMeta {
    Tensor { dtype: DType, shape: Vec<usize> },
    Value(String),
    DeviceTensor { dtype: DType, shape: Vec<usize> },
}

fn metadata<T: PlaneTensor>(dict: &TensorDict<T>) -> Vec<(String, EntryMeta)> {
    dict.iter()
        .map(|(k, v)| {
            let meta = match v {
                DictValue::Tensor(t) if T::ON_DEVICE => EntryMeta::DeviceTensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Tensor(t) => EntryMeta::Tensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Host(t) => EntryMeta::Tensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Value(j) => EntryMeta::Value(j.to_string()),
            };
            (k.clone(), meta)
        })
        .collect()
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

/// Where an entry's tensor moves, as the receiving plane sees it. An entry
/// of the other plane (a device entry reaching a host dictionary) is moved
/// as this plane's: its call then meets the sender's call of the other
/// plane, and both ends get the agreement error naming the two.
enum Entry {
    Value(String),
    Plane(DType, Vec<usize>),
    Host(DType, Vec<usize>),
}

fn entry<T: PlaneTensor>(m: EntryMeta) -> Entry {
    match m {
        EntryMeta::Value(text) => Entry::Value(text),
        EntryMeta::DeviceTensor { dtype, shape } => Entry::Plane(dtype, shape),
        EntryMeta::Tensor { dtype, shape } if T::ON_DEVICE => Entry::Host(dtype, shape),
        EntryMeta::Tensor { dtype, shape } => Entry::Plane(dtype, shape),
    }
}

/// The piece of a flattened tensor this rank of an all-gather group moves,
/// when the send-then-all-gather split applies to it.
fn ag_slice(t_numel: usize, ag: Option<&GroupCoordinator<'_>>) -> Option<(usize, usize)> {
    let ag = ag?;
    let n = ag.size();
    (t_numel % n == 0).then(|| (ag.rank_in_group() * t_numel / n, t_numel / n))
}

/// Tensor dictionaries on any data plane (every [`Collectives`] has them).
pub trait TensorDicts<'rt>: Collectives<'rt> {
    /// Sends group rank `src`'s dictionary to every member (`dict` is
    /// ignored elsewhere). Empty tensors are not sent (they are recreated
    /// from metadata).
    fn broadcast_tensor_dict(
        &self,
        dict: Option<&TensorDict<Self::Tensor>>,
        src: usize,
    ) -> Result<TensorDict<Self::Tensor>> {
        let g = self.group();
        let meta: Vec<(String, EntryMeta)> =
            g.broadcast_object(dict.map(metadata).as_ref(), src)?;
        let mine = g.rank_in_group() == src;
        let mut out = TensorDict::new();
        for (key, m) in meta {
            let own = dict.and_then(|d| d.get(&key)).filter(|_| mine);
            let value = match entry::<Self::Tensor>(m) {
                Entry::Value(text) => DictValue::Value(parse_value(g, &key, &text)?),
                Entry::Host(dtype, shape) => {
                    let mut t = match own {
                        Some(DictValue::Host(t)) => t.clone(),
                        _ => Tensor::zeros(shape, dtype)?,
                    };
                    if t.numel() > 0 {
                        g.broadcast(&mut t, src)?;
                    }
                    DictValue::Host(t)
                }
                Entry::Plane(dtype, shape) => {
                    let mut t = match own {
                        Some(DictValue::Tensor(t)) => {
                            self.copy_flat(t, 0, numel(&shape))?.reshape(shape)?
                        }
                        _ => self.empty(shape, dtype)?,
                    };
                    if numel(t.shape()) > 0 {
                        self.broadcast(&mut t, src)?;
                    }
                    DictValue::Tensor(t)
                }
            };
            out.insert(key, value);
        }
        Ok(out)
    }

    /// Sends a dictionary to group rank `dst` (next member when `None`).
    ///
    /// With `all_gather_group`, each plane tensor whose element count divides
    /// by that group's size is sent as this rank's 1/n slice; the receiver's
    /// all-gather group reassembles it (FastVideo's send-then-all-gather).
    /// Device tensors need the group's communicator
    /// ([`DeviceGroup::connect`](crate::DeviceGroup::connect)).
    fn send_tensor_dict(
        &self,
        dict: &TensorDict<Self::Tensor>,
        dst: Option<usize>,
        all_gather_group: Option<&Self>,
    ) -> Result<()> {
        let g = self.group();
        let (dst, _) = g.ring_peers(dst, None);
        g.send_object(&metadata(dict), dst)?;
        for v in dict.values() {
            match v {
                DictValue::Host(t) if t.numel() > 0 => g.send(t, Some(dst))?,
                DictValue::Tensor(t) if numel(t.shape()) > 0 => {
                    match ag_slice(numel(t.shape()), all_gather_group.map(|a| a.group())) {
                        Some((start, len)) => {
                            self.send(&self.copy_flat(t, start, len)?, Some(dst))?
                        }
                        None => self.send(t, Some(dst))?,
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Receives a dictionary sent with [`send_tensor_dict`](Self::send_tensor_dict)
    /// from group rank `src` (previous member when `None`); pass the same kind
    /// of `all_gather_group` as the sender.
    fn recv_tensor_dict(
        &self,
        src: Option<usize>,
        all_gather_group: Option<&Self>,
    ) -> Result<TensorDict<Self::Tensor>> {
        let g = self.group();
        let (_, src) = g.ring_peers(None, src);
        let meta: Vec<(String, EntryMeta)> = g.recv_object(src)?;
        let mut out = TensorDict::new();
        for (key, m) in meta {
            let value = match entry::<Self::Tensor>(m) {
                Entry::Value(text) => DictValue::Value(parse_value(g, &key, &text)?),
                Entry::Host(dtype, shape) if numel(&shape) == 0 => {
                    DictValue::Host(Tensor::zeros(shape, dtype)?)
                }
                Entry::Host(dtype, shape) => DictValue::Host(g.recv(&shape, dtype, Some(src))?),
                Entry::Plane(dtype, shape) if numel(&shape) == 0 => {
                    DictValue::Tensor(self.empty(shape, dtype)?)
                }
                Entry::Plane(dtype, shape) => {
                    let n = numel(&shape);
                    let ag = all_gather_group.filter(|a| ag_slice(n, Some(a.group())).is_some());
                    let t = match ag {
                        Some(ag) => {
                            let piece = self.recv(&[n / ag.group().size()], dtype, Some(src))?;
                            ag.all_gather(&piece, 0)?.reshape(shape)?
                        }
                        None => self.recv(&shape, dtype, Some(src))?,
                    };
                    DictValue::Tensor(t)
                }
            };
            out.insert(key, value);
        }
        Ok(out)
    }
}

impl<'rt, C: Collectives<'rt>> TensorDicts<'rt> for C {}
