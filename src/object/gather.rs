//! Gathering configs and tensors from a list of ranks to the first of them
//! (ModelOpt's `get_configs_parallel` / `get_tensors_parallel`).
//!
//! Only the listed ranks call these; they form their own communicator, made
//! once per distinct list and reused by later calls (ModelOpt calls these per
//! layer). Rank lists say in their type whether they hold world ranks
//! (ModelOpt's meaning) or positions in the group ([`Ranks`]). Results are
//! keyed or ordered by rank, so a rank without a config stays visible as
//! `None` and positions never shift. Tensors move through an MPI shared-memory
//! window between ranks on the first rank's node and through MPI messages from
//! other nodes.

use crate::agree::check_rank_list;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::group::Collectives;
use crate::group::{AsGroup, GroupCoordinator};
use crate::mpi_ext::SlotWindow;
use crate::object::Objects;
use crate::tensor::Tensor;
use mpi::traits::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::any::{Any, TypeId};
use std::collections::BTreeMap;

/// Configs by rank (numbered as the [`Ranks`] passed): `None` where a rank
/// passed no config.
pub type ConfigsByRank<T = serde_json::Value> = BTreeMap<usize, Option<T>>;

/// A list of ranks, saying which numbering it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks<'a> {
    /// World ranks (ModelOpt's `ranks`); each must be a member of the group.
    World(&'a [usize]),
    /// Positions in the group the call is made on.
    Group(&'a [usize]),
}

impl Ranks<'_> {
    fn list(&self) -> &[usize] {
        match self {
            Ranks::World(r) | Ranks::Group(r) => r,
        }
    }
}

/// A config on the wire: JSON values as text (the binary object format does
/// not describe itself, and `serde_json::Value` needs a format that does),
/// every other type in the object plane's format.
fn encode_config<T: Serialize + 'static>(c: &T) -> std::result::Result<Vec<u8>, String> {
    match (c as &dyn Any).downcast_ref::<serde_json::Value>() {
        Some(v) => Ok(v.to_string().into_bytes()),
        None => postcard::to_stdvec(c).map_err(|e| e.to_string()),
    }
}

fn decode_config<T: DeserializeOwned + 'static>(bytes: &[u8]) -> std::result::Result<T, String> {
    if TypeId::of::<T>() == TypeId::of::<serde_json::Value>() {
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let boxed: Box<dyn Any> = Box::new(v);
        return Ok(*boxed.downcast::<T>().expect("T is serde_json::Value"));
    }
    crate::object::depth::from_postcard(bytes)
}

/// ModelOpt's gathers to the first rank of a rank list: any serde config,
/// and host tensors through a node's shared memory.
pub trait Gathers<'rt>: AsGroup<'rt> {
    /// Gathers each listed rank's optional config to the first rank of
    /// `ranks`. Returns `Some(configs by rank)` there, numbered as `ranks`
    /// is, and `None` on the other listed ranks. Any serde type: a struct
    /// carrying weights travels in the binary object format, a
    /// `serde_json::Value` as JSON (a struct *holding* a `Value` cannot
    /// travel: the binary format does not describe itself).
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// use rankmesh::object::Ranks;
    /// let world = rt.world_group()?;
    /// let cfg = serde_json::json!({"hidden": 4096});
    /// let all: Vec<usize> = (0..world.size()).collect();
    /// if let Some(configs) = world.gather_configs(Some(&cfg), Ranks::World(&all))? {
    ///     assert_eq!(configs[&0], Some(cfg)); // keyed by rank; a missing config is None
    /// }
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn gather_configs<T>(
        &self,
        config: Option<&T>,
        ranks: Ranks<'_>,
    ) -> Result<Option<ConfigsByRank<T>>>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let g = self.as_group();
        let (sub, _) = members(g, ranks)?;
        let what = "gather_configs";
        let usage = |msg: String| Error::Usage {
            what,
            group: g.name().to_string(),
            msg,
        };
        let bytes = config.map(encode_config).transpose().map_err(|e| {
            usage(format!(
                "cannot encode `{}`: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        // The type travels with the bytes so ranks that disagree on it fail together.
        let mine = (std::any::type_name::<T>().to_string(), bytes);
        let Some(all) = sub.gather_object(&mine, 0)? else {
            return Ok(None);
        };
        let mut out = ConfigsByRank::new();
        for (rank, (type_name, bytes)) in ranks.list().iter().zip(all) {
            if type_name != std::any::type_name::<T>() {
                return Err(usage(format!(
                    "rank {rank} sent a `{type_name}` config but the first rank expects `{}`",
                    std::any::type_name::<T>()
                )));
            }
            let value = bytes
                .map(|b| {
                    decode_config::<T>(&b)
                        .map_err(|e| usage(format!("config of rank {rank} does not decode: {e}")))
                })
                .transpose()?;
            out.insert(*rank, value);
        }
        Ok(Some(out))
    }

    /// Gathers equal-sized tensors from `ranks` to the first of them, in
    /// list order. Returns `Some` there, `None` on the
    /// other listed ranks. Same-node ranks use a shared-memory window unless
    /// `RANKMESH_GATHER_SHM=0`.
    ///
    /// ```
    /// # use rankmesh::prelude::*;
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let shard = rankmesh::Tensor::from_vec([2], vec![rt.rank() as f32; 2])?;
    /// let all: Vec<usize> = (0..world.size()).collect();
    /// if let Some(shards) = world.gather_tensors(&shard, rankmesh::object::Ranks::Group(&all))? {
    ///     assert_eq!(shards.len(), world.size());
    /// }
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    fn gather_tensors(&self, tensor: &Tensor, ranks: Ranks<'_>) -> Result<Option<Vec<Tensor>>> {
        let g = self.as_group();
        let (sub, ranks) = members(g, ranks)?;
        let meta: Vec<(DType, Vec<usize>)> =
            sub.all_gather_object(&(tensor.dtype(), tensor.shape().to_vec()))?;
        if let Some(r) = meta.iter().position(|m| *m != meta[0]) {
            return Err(Error::Usage {
                what: "gather_tensors",
                group: g.name().to_string(),
                msg: format!(
                    "tensors differ: group rank {} has {:?} {} but group rank {} has {:?} {}",
                    ranks[0], meta[0].1, meta[0].0, ranks[r], meta[r].1, meta[r].0
                ),
            });
        }
        let world = g.runtime().world();
        let node_of = |sub_rank: usize| world.ranks[sub.ranks()[sub_rank]].node;
        let use_shm = g.runtime().options().gather_shm;
        let local_to_first = |r: usize| use_shm && node_of(r) == node_of(0);
        let me = sub.rank_in_group();

        let mut slots: Vec<Option<Vec<u8>>> = vec![None; sub.size()];
        if local_to_first(me) {
            // The ranks on the first rank's node share one window, ordered by sub-group rank.
            let node_comm = sub
                .raw_comm()
                .split_by_color_with_key(mpi::topology::Color::with_value(0), me as i32);
            let node_comm = node_comm.expect("every caller passes a defined colour");
            let local: Vec<usize> = (0..sub.size()).filter(|r| local_to_first(*r)).collect();
            let mut win = SlotWindow::allocate(&node_comm, tensor.nbytes());
            win.write_own(tensor.bytes());
            win.fence();
            if me == 0 {
                for (slot, r) in local.iter().enumerate() {
                    slots[*r] = Some(win.read(slot));
                }
            }
            win.fence();
        } else {
            let _ = sub
                .raw_comm()
                .split_by_color(mpi::topology::Color::undefined());
            if me == 0 {
                slots[0] = Some(tensor.bytes().to_vec());
            }
        }
        for r in (1..sub.size()).filter(|r| !local_to_first(*r)) {
            if me == r {
                sub.send(tensor, Some(0))?;
            } else if me == 0 {
                slots[r] = Some(
                    sub.recv(tensor.shape(), tensor.dtype(), Some(r))?
                        .bytes()
                        .to_vec(),
                );
            }
        }
        if me != 0 {
            return Ok(None);
        }
        slots
            .into_iter()
            .map(|b| {
                Tensor::from_bytes(
                    tensor.shape().to_vec(),
                    tensor.dtype(),
                    &b.expect("every slot is filled"),
                )
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

impl<'rt> Gathers<'rt> for GroupCoordinator<'rt> {}

/// The sub-group of `ranks`; only those call it. Made once per list
/// and kept with this group (every member makes the same calls, so
/// every member holds the same communicators).
fn members<'rt>(
    g: &GroupCoordinator<'rt>,
    ranks: Ranks<'_>,
) -> Result<(GroupCoordinator<'rt>, Vec<usize>)> {
    let positions: Vec<usize> = match ranks {
        Ranks::Group(r) => {
            check_rank_list(r, g.size(), g.rank_in_group(), g.name())?;
            r.to_vec()
        }
        Ranks::World(r) => {
            check_rank_list(r, g.runtime().size(), g.global_rank(), "the world")?;
            r.iter()
                .map(|w| {
                    g.ranks().iter().position(|m| m == w).ok_or_else(|| {
                        Error::Layout(format!(
                            "world rank {w} in {r:?} is not a member of {}",
                            g.name()
                        ))
                    })
                })
                .collect::<Result<_>>()?
        }
    };
    let global: Vec<usize> = positions.iter().map(|r| g.ranks()[*r]).collect();
    let sub = g.cached_subgroup(&global, || {
        g.runtime().subgroup(&format!("{}/", g.name()), &global)
    })?;
    Ok((sub, positions))
}
