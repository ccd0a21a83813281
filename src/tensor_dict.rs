//! Tensor dictionaries (FastVideo's `broadcast_tensor_dict`, `send_tensor_dict`,
//! `recv_tensor_dict`): metadata on the object plane, tensors on the data plane.

use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::tensor::{numel, DType, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A value in a tensor dictionary: a tensor or any JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum DictValue {
    /// Moved on the data plane.
    Tensor(Tensor),
    /// Moved with the metadata on the object plane.
    Value(serde_json::Value),
}

/// A dictionary of named tensors and values, ordered by key.
pub type TensorDict = BTreeMap<String, DictValue>;

/// What the object plane carries for each entry. JSON values travel as text
/// because the binary object format does not describe itself.
#[derive(Serialize, Deserialize)]
pub(crate) enum EntryMeta {
    Tensor {
        dtype: DType,
        shape: Vec<usize>,
    },
    Value(String),
    /// A device tensor (device dictionaries only; moved through NCCL).
    DeviceTensor {
        dtype: DType,
        shape: Vec<usize>,
    },
}

fn metadata(dict: &TensorDict) -> Vec<(String, EntryMeta)> {
    dict.iter()
        .map(|(k, v)| {
            let meta = match v {
                DictValue::Tensor(t) => EntryMeta::Tensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DictValue::Value(j) => EntryMeta::Value(j.to_string()),
            };
            (k.clone(), meta)
        })
        .collect()
}

pub(crate) fn parse_value(
    g: &GroupCoordinator<'_>,
    key: &str,
    text: &str,
) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::collective(
            "tensor_dict",
            g.name(),
            format!("entry {key:?} is not valid JSON: {e}"),
        )
    })
}

/// The piece of a flattened tensor this rank of an all-gather group moves,
/// when the send-then-all-gather split applies to it.
fn ag_slice(t_numel: usize, ag: Option<&GroupCoordinator<'_>>) -> Option<(usize, usize)> {
    let ag = ag?;
    let n = ag.size();
    (t_numel % n == 0).then(|| (ag.rank_in_group() * t_numel / n, t_numel / n))
}

impl GroupCoordinator<'_> {
    /// Sends group rank `src`'s dictionary to every member. Empty tensors are
    /// not sent (they are recreated from metadata). `dict` is ignored elsewhere.
    pub fn broadcast_tensor_dict(
        &self,
        dict: Option<&TensorDict>,
        src: usize,
    ) -> Result<TensorDict> {
        let meta = dict.map(metadata);
        let meta: Vec<(String, EntryMeta)> = self.broadcast_object(meta.as_ref(), src)?;
        let mut out = TensorDict::new();
        for (key, m) in meta {
            let value = match m {
                EntryMeta::Value(text) => DictValue::Value(parse_value(self, &key, &text)?),
                // A device entry from a device-plane sender: the host broadcast
                // below meets its device broadcast, and every rank gets the
                // agreement error naming both.
                EntryMeta::Tensor { dtype, shape } | EntryMeta::DeviceTensor { dtype, shape } => {
                    let mut t = match dict.and_then(|d| d.get(&key)) {
                        Some(DictValue::Tensor(t)) if self.rank_in_group() == src => t.clone(),
                        _ => Tensor::zeros(shape, dtype),
                    };
                    if t.numel() > 0 {
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
    /// With `all_gather_group`, each tensor whose element count divides by that
    /// group's size is sent as this rank's 1/n slice; the receiver's all-gather
    /// group reassembles it (FastVideo's send-then-all-gather).
    pub fn send_tensor_dict(
        &self,
        dict: &TensorDict,
        dst: Option<usize>,
        all_gather_group: Option<&GroupCoordinator<'_>>,
    ) -> Result<()> {
        let dst = dst.unwrap_or((self.rank_in_group() + 1) % self.size());
        self.send_object(&metadata(dict), dst)?;
        for t in dict.values().filter_map(|v| match v {
            DictValue::Tensor(t) if t.numel() > 0 => Some(t),
            _ => None,
        }) {
            match ag_slice(t.numel(), all_gather_group) {
                Some((start, len)) => {
                    let e = t.dtype().size();
                    let piece = Tensor::from_bytes(
                        [len],
                        t.dtype(),
                        &t.bytes()[start * e..(start + len) * e],
                    )?;
                    self.send(&piece, Some(dst))?;
                }
                None => self.send(t, Some(dst))?,
            }
        }
        Ok(())
    }

    /// Receives a dictionary sent with [`send_tensor_dict`](Self::send_tensor_dict)
    /// from group rank `src` (previous member when `None`); pass the same kind
    /// of `all_gather_group` as the sender.
    pub fn recv_tensor_dict(
        &self,
        src: Option<usize>,
        all_gather_group: Option<&GroupCoordinator<'_>>,
    ) -> Result<TensorDict> {
        let src = src.unwrap_or((self.rank_in_group() + self.size() - 1) % self.size());
        let meta: Vec<(String, EntryMeta)> = self.recv_object(src)?;
        let mut out = TensorDict::new();
        for (key, m) in meta {
            let value = match m {
                EntryMeta::Value(text) => DictValue::Value(parse_value(self, &key, &text)?),
                EntryMeta::Tensor { dtype, shape } | EntryMeta::DeviceTensor { dtype, shape }
                    if numel(&shape) == 0 =>
                {
                    DictValue::Tensor(Tensor::zeros(shape, dtype))
                }
                // As in broadcast: a device entry's host receive fails its
                // handshake with the device send, on both ends.
                EntryMeta::Tensor { dtype, shape } | EntryMeta::DeviceTensor { dtype, shape } => {
                    let t = match (ag_slice(numel(&shape), all_gather_group), all_gather_group) {
                        (Some((_, len)), Some(ag)) => {
                            let piece = self.recv(&[len], dtype, Some(src))?;
                            ag.all_gather(&piece, 0)?.reshape(shape)?
                        }
                        _ => self.recv(&shape, dtype, Some(src))?,
                    };
                    DictValue::Tensor(t)
                }
            };
            out.insert(key, value);
        }
        Ok(out)
    }
}
