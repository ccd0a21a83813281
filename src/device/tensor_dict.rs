//! Tensor dictionaries on the device plane: host tensors move through MPI,
//! device tensors through NCCL, values with the metadata (as FastVideo sends
//! CPU tensors on its CPU group and GPU tensors on its device group).

use super::{DeviceGroup, DeviceTensor};
use crate::error::Result;
use crate::tensor::{numel, Tensor};
use crate::tensor_dict::{parse_value, EntryMeta};
use std::collections::BTreeMap;

/// A value in a device tensor dictionary.
#[derive(Debug)]
pub enum DeviceDictValue {
    /// Moved through MPI.
    Host(Tensor),
    /// Moved through NCCL.
    Device(DeviceTensor),
    /// Moved with the metadata.
    Value(serde_json::Value),
}

/// A dictionary of named host tensors, device tensors and values, ordered by key.
pub type DeviceTensorDict = BTreeMap<String, DeviceDictValue>;

fn metadata(dict: &DeviceTensorDict) -> Vec<(String, EntryMeta)> {
    dict.iter()
        .map(|(k, v)| {
            let meta = match v {
                DeviceDictValue::Host(t) => EntryMeta::Tensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DeviceDictValue::Device(t) => EntryMeta::DeviceTensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                DeviceDictValue::Value(j) => EntryMeta::Value(j.to_string()),
            };
            (k.clone(), meta)
        })
        .collect()
}

impl DeviceGroup<'_, '_> {
    /// Sends group rank `src`'s dictionary to every member (`dict` is ignored
    /// elsewhere). Device results are enqueued; see [`synchronize`](Self::synchronize).
    pub fn broadcast_tensor_dict(
        &self,
        dict: Option<&DeviceTensorDict>,
        src: usize,
    ) -> Result<DeviceTensorDict> {
        let g = self.group();
        let meta = dict.map(metadata);
        let meta: Vec<(String, EntryMeta)> = g.broadcast_object(meta.as_ref(), src)?;
        let mine = g.rank_in_group() == src;
        let mut out = DeviceTensorDict::new();
        for (key, m) in meta {
            let own = dict.and_then(|d| d.get(&key)).filter(|_| mine);
            let value = match m {
                EntryMeta::Value(text) => DeviceDictValue::Value(parse_value(g, &key, &text)?),
                EntryMeta::Tensor { dtype, shape } => {
                    let mut t = match own {
                        Some(DeviceDictValue::Host(t)) => t.clone(),
                        _ => Tensor::zeros(shape, dtype),
                    };
                    if t.numel() > 0 {
                        g.broadcast(&mut t, src)?;
                    }
                    DeviceDictValue::Host(t)
                }
                EntryMeta::DeviceTensor { dtype, shape } => {
                    let mut t = self.gpu().empty(shape.clone(), dtype)?;
                    if let Some(DeviceDictValue::Device(s)) = own {
                        self.copy(s, &mut t)?;
                    }
                    if numel(&shape) > 0 {
                        self.broadcast(&mut t, src)?;
                    }
                    DeviceDictValue::Device(t)
                }
            };
            out.insert(key, value);
        }
        Ok(out)
    }

    /// Sends a dictionary to group rank `dst` (next member when `None`).
    /// Device tensors need the group's communicator ([`connect`](Self::connect)).
    pub fn send_tensor_dict(&self, dict: &DeviceTensorDict, dst: Option<usize>) -> Result<()> {
        let g = self.group();
        let dst = dst.unwrap_or((g.rank_in_group() + 1) % g.size());
        g.send_object(&metadata(dict), dst)?;
        for v in dict.values() {
            match v {
                DeviceDictValue::Host(t) if t.numel() > 0 => g.send(t, Some(dst))?,
                DeviceDictValue::Device(t) if t.numel() > 0 => self.send(t, Some(dst))?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Receives a dictionary sent with [`send_tensor_dict`](Self::send_tensor_dict)
    /// from group rank `src` (previous member when `None`).
    pub fn recv_tensor_dict(&self, src: Option<usize>) -> Result<DeviceTensorDict> {
        let g = self.group();
        let src = src.unwrap_or((g.rank_in_group() + g.size() - 1) % g.size());
        let meta: Vec<(String, EntryMeta)> = g.recv_object(src)?;
        let mut out = DeviceTensorDict::new();
        for (key, m) in meta {
            let value = match m {
                EntryMeta::Value(text) => DeviceDictValue::Value(parse_value(g, &key, &text)?),
                EntryMeta::Tensor { dtype, shape } if numel(&shape) == 0 => {
                    DeviceDictValue::Host(Tensor::zeros(shape, dtype))
                }
                EntryMeta::Tensor { dtype, shape } => {
                    DeviceDictValue::Host(g.recv(&shape, dtype, Some(src))?)
                }
                EntryMeta::DeviceTensor { dtype, shape } if numel(&shape) == 0 => {
                    DeviceDictValue::Device(self.gpu().empty(shape, dtype)?)
                }
                EntryMeta::DeviceTensor { dtype, shape } => {
                    DeviceDictValue::Device(self.recv(&shape, dtype, Some(src))?)
                }
            };
            out.insert(key, value);
        }
        Ok(out)
    }
}
