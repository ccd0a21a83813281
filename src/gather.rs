//! Gathering configs and tensors from a list of ranks to the first of them
//! (ModelOpt's `get_configs_parallel` / `get_tensors_parallel`).
//!
//! Only the listed ranks call these; they form their own communicator. Results
//! are keyed or ordered by rank, so a rank without a config stays visible as
//! `None` and positions never shift. Tensors move through an MPI shared-memory
//! window between ranks on the first rank's node and through MPI messages from
//! other nodes.

use crate::collectives::Collectives;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::plane::shm_window::SharedWindow;
use crate::tensor::{DType, Tensor};
use crate::world::check_rank_list;
use mpi::traits::*;
use std::collections::BTreeMap;

/// Configs by group rank: `None` where a rank passed no config.
pub type ConfigsByRank = BTreeMap<usize, Option<serde_json::Value>>;

impl<'rt> GroupCoordinator<'rt> {
    /// The sub-group of `ranks` (positions in this group); only those call it.
    fn members(&self, ranks: &[usize]) -> Result<GroupCoordinator<'rt>> {
        check_rank_list(ranks, self.size(), self.rank_in_group(), self.name())?;
        let global: Vec<usize> = ranks.iter().map(|r| self.ranks()[*r]).collect();
        self.runtime()
            .subgroup(&format!("{}/", self.name()), &global)
    }

    /// Gathers each listed rank's optional JSON config to the first rank of
    /// `ranks` (positions in this group). Returns `Some(configs by group
    /// rank)` there and `None` on the other listed ranks.
    ///
    /// ```
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let cfg = serde_json::json!({"hidden": 4096});
    /// let all: Vec<usize> = (0..world.size()).collect();
    /// if let Some(configs) = world.gather_configs(Some(&cfg), &all)? {
    ///     assert_eq!(configs[&0], Some(cfg)); // keyed by rank; a missing config is None
    /// }
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    pub fn gather_configs(
        &self,
        config: Option<&serde_json::Value>,
        ranks: &[usize],
    ) -> Result<Option<ConfigsByRank>> {
        let sub = self.members(ranks)?;
        // JSON travels as text: the binary object format does not describe itself.
        let text = config.map(|c| c.to_string());
        let Some(all) = sub.gather_object(&text, 0)? else {
            return Ok(None);
        };
        let mut out = ConfigsByRank::new();
        for (rank, text) in ranks.iter().zip(all) {
            let value = text
                .map(|t| {
                    serde_json::from_str(&t).map_err(|e| Error::Usage {
                        what: "gather_configs",
                        group: self.name().to_string(),
                        msg: format!("config of group rank {rank} is not JSON: {e}"),
                    })
                })
                .transpose()?;
            out.insert(*rank, value);
        }
        Ok(Some(out))
    }

    /// Gathers equal-sized tensors from `ranks` (positions in this group) to
    /// the first of them, in list order. Returns `Some` there, `None` on the
    /// other listed ranks. Same-node ranks use a shared-memory window unless
    /// `RANKMESH_GATHER_SHM=0`.
    ///
    /// ```
    /// # let rt = rankmesh::Runtime::init()?;
    /// let world = rt.world_group()?;
    /// let shard = rankmesh::Tensor::from_vec([2], vec![rt.rank() as f32; 2])?;
    /// let all: Vec<usize> = (0..world.size()).collect();
    /// if let Some(shards) = world.gather_tensors(&shard, &all)? {
    ///     assert_eq!(shards.len(), world.size());
    /// }
    /// # Ok::<(), rankmesh::Error>(())
    /// ```
    pub fn gather_tensors(&self, tensor: &Tensor, ranks: &[usize]) -> Result<Option<Vec<Tensor>>> {
        let sub = self.members(ranks)?;
        let meta: Vec<(DType, Vec<usize>)> =
            sub.all_gather_object(&(tensor.dtype(), tensor.shape().to_vec()))?;
        if let Some(r) = meta.iter().position(|m| *m != meta[0]) {
            return Err(Error::Usage {
                what: "gather_tensors",
                group: self.name().to_string(),
                msg: format!(
                    "tensors differ: group rank {} has {:?} {} but group rank {} has {:?} {}",
                    ranks[0], meta[0].1, meta[0].0, ranks[r], meta[r].1, meta[r].0
                ),
            });
        }
        let world = self.runtime().world();
        let node_of = |sub_rank: usize| world.ranks[sub.ranks()[sub_rank]].node;
        let use_shm = std::env::var("RANKMESH_GATHER_SHM").map_or(true, |v| v != "0");
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
            let mut win = SharedWindow::allocate(&node_comm, tensor.nbytes());
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
