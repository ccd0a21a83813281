//! `ParallelState`: the world, TP, SP and DP groups of a job, per-model
//! groups, and scoped overrides (FastVideo's `parallel_state`, without globals).

mod autograd;
mod layout;
mod mesh;
mod survival;

pub use autograd::Differentiable;
pub use layout::{consecutive_group_count, consecutive_groups, GroupKind, Layout};
pub use mesh::{MegatronSizes, Mesh, MeshLayout};
pub use survival::Survival;

use crate::device::DeviceTensor;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::group::Runtime;
use crate::group::{Collectives, PlaneTensor};
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use std::cell::RefCell;

struct Groups<'rt> {
    layout: Layout,
    tp: GroupCoordinator<'rt>,
    sp: GroupCoordinator<'rt>,
    dp: GroupCoordinator<'rt>,
}

/// The parallel groups of this rank.
pub struct ParallelState<'rt> {
    rt: &'rt Runtime,
    world: GroupCoordinator<'rt>,
    groups: Option<Groups<'rt>>,
    tp_override: RefCell<Option<GroupCoordinator<'rt>>>,
    sp_override: RefCell<Option<GroupCoordinator<'rt>>>,
}

/// Tensors FastVideo's module-level helpers on [`ParallelState`] accept: a
/// host [`Tensor`] runs on the group's MPI plane, a [`DeviceTensor`] on its
/// NCCL plane, as FastVideo's helpers run on whatever device `x` lives on.
/// Either way the group is the one in force, overrides included.
pub trait OnGroup: PlaneTensor {
    /// `all_reduce` of `self` on `g`'s plane for this tensor.
    fn all_reduce_on(&self, g: &GroupCoordinator<'_>, op: ReduceOp) -> Result<Self>;
    /// `all_gather` along `dim`.
    fn all_gather_on(&self, g: &GroupCoordinator<'_>, dim: isize) -> Result<Self>;
    /// FastVideo's `all_to_all_4D`.
    fn all_to_all_4d_on(
        &self,
        g: &GroupCoordinator<'_>,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<Self>;
}

impl OnGroup for Tensor {
    fn all_reduce_on(&self, g: &GroupCoordinator<'_>, op: ReduceOp) -> Result<Self> {
        g.all_reduce(self, op)
    }
    fn all_gather_on(&self, g: &GroupCoordinator<'_>, dim: isize) -> Result<Self> {
        g.all_gather(self, dim)
    }
    fn all_to_all_4d_on(&self, g: &GroupCoordinator<'_>, s: usize, d: usize) -> Result<Self> {
        g.all_to_all_4d(self, s, d)
    }
}

impl OnGroup for DeviceTensor {
    fn all_reduce_on(&self, g: &GroupCoordinator<'_>, op: ReduceOp) -> Result<Self> {
        g.device()?.all_reduce(self, op)
    }
    fn all_gather_on(&self, g: &GroupCoordinator<'_>, dim: isize) -> Result<Self> {
        g.device()?.all_gather(self, dim)
    }
    fn all_to_all_4d_on(&self, g: &GroupCoordinator<'_>, s: usize, d: usize) -> Result<Self> {
        g.device()?.all_to_all_4d(self, s, d)
    }
}

/// Restores an override slot when the scope ends, panics included.
struct Restore<'a, 'rt>(&'a RefCell<Option<GroupCoordinator<'rt>>>);

impl Drop for Restore<'_, '_> {
    fn drop(&mut self) {
        self.0.borrow_mut().take();
    }
}

impl<'rt> ParallelState<'rt> {
    /// A state holding only the world group (collective over the world).
    pub fn new(rt: &'rt Runtime) -> Result<Self> {
        Ok(ParallelState {
            rt,
            world: rt.world_group()?,
            groups: None,
            tp_override: RefCell::new(None),
            sp_override: RefCell::new(None),
        })
    }

    /// Builds TP groups of size `tp`, SP groups of size `sp` and DP groups of
    /// size `W / sp` (`dp`, when given, must equal it), one `MPI_Comm_split` per
    /// kind. Invalid sizes are an error on every rank before any communicator
    /// is made. Collective over the world.
    pub fn initialize_model_parallel(
        &mut self,
        tp: usize,
        sp: usize,
        dp: Option<usize>,
    ) -> Result<()> {
        if self.groups.is_some() {
            return Err(Error::State(
                "model parallel groups are already initialised".into(),
            ));
        }
        // A layout that only some ranks reject is the same error everywhere,
        // before any communicator is made.
        let layout = Layout::new(self.rt.size(), tp, sp, dp);
        let asked = format!("tp={tp}, sp={sp}, dp={dp:?}");
        let digest = crate::agree::fnv1a(asked.as_bytes());
        let what = format!("the model-parallel layout ({asked} on this rank)");
        let verdict = self
            .rt
            .creating(|| self.rt.agree_on_world(&what, digest, layout.is_ok()));
        let layout = layout?;
        verdict?;
        let make = |kind: GroupKind| -> Result<GroupCoordinator<'rt>> {
            self.rt
                .split_groups(kind.name(), &layout.groups(kind))?
                .ok_or_else(|| {
                    Error::State(format!(
                        "rank {} is in no {} group",
                        self.rt.rank(),
                        kind.name()
                    ))
                })
        };
        self.groups = Some(Groups {
            layout,
            tp: make(GroupKind::Tp)?,
            sp: make(GroupKind::Sp)?,
            dp: make(GroupKind::Dp)?,
        });
        Ok(())
    }

    /// Whether TP, SP and DP groups exist.
    pub fn model_parallel_is_initialized(&self) -> bool {
        self.groups.is_some()
    }

    /// Frees the TP/SP/DP groups (their communicators are freed once no clone remains).
    pub fn destroy_model_parallel(&mut self) {
        self.groups = None;
    }

    fn groups(&self) -> Result<&Groups<'rt>> {
        self.groups
            .as_ref()
            .ok_or_else(|| Error::State("model parallel groups are not initialised".into()))
    }

    /// The validated layout.
    pub fn layout(&self) -> Result<Layout> {
        Ok(self.groups()?.layout)
    }

    /// The world group.
    pub fn world(&self) -> &GroupCoordinator<'rt> {
        &self.world
    }

    /// The TP group in force (an override, if one is active).
    pub fn tp(&self) -> Result<GroupCoordinator<'rt>> {
        match self.tp_override.borrow().as_ref() {
            Some(g) => Ok(g.clone()),
            None => Ok(self.groups()?.tp.clone()),
        }
    }

    /// The SP group in force (an override, if one is active).
    pub fn sp(&self) -> Result<GroupCoordinator<'rt>> {
        match self.sp_override.borrow().as_ref() {
            Some(g) => Ok(g.clone()),
            None => Ok(self.groups()?.sp.clone()),
        }
    }

    /// FastVideo's `tensor_model_parallel_all_reduce`: sum over the TP group
    /// in force, on the plane `t` lives on ([`OnGroup`]).
    pub fn tensor_model_parallel_all_reduce<T: OnGroup>(&self, t: &T) -> Result<T> {
        t.all_reduce_on(&self.tp()?, ReduceOp::Sum)
    }

    /// FastVideo's `tensor_model_parallel_all_gather` (FastVideo's default `dim` is -1).
    pub fn tensor_model_parallel_all_gather<T: OnGroup>(&self, t: &T, dim: isize) -> Result<T> {
        t.all_gather_on(&self.tp()?, dim)
    }

    /// FastVideo's `sequence_model_parallel_all_gather` (default `dim` -1).
    pub fn sequence_model_parallel_all_gather<T: OnGroup>(&self, t: &T, dim: isize) -> Result<T> {
        t.all_gather_on(&self.sp()?, dim)
    }

    /// FastVideo's `sequence_model_parallel_all_to_all_4D` over the SP group
    /// in force (FastVideo's defaults: `scatter_dim` 2, `gather_dim` 1).
    pub fn sequence_model_parallel_all_to_all_4d<T: OnGroup>(
        &self,
        t: &T,
        scatter_dim: usize,
        gather_dim: usize,
    ) -> Result<T> {
        t.all_to_all_4d_on(&self.sp()?, scatter_dim, gather_dim)
    }

    /// The DP group.
    pub fn dp(&self) -> Result<GroupCoordinator<'rt>> {
        Ok(self.groups()?.dp.clone())
    }

    /// World rank.
    pub fn world_rank(&self) -> usize {
        self.rt.rank()
    }

    /// World size.
    pub fn world_size(&self) -> usize {
        self.rt.size()
    }

    /// Rank in the TP group in force.
    pub fn tp_rank(&self) -> Result<usize> {
        Ok(self.tp()?.rank_in_group())
    }

    /// Size of the TP group in force.
    pub fn tp_world_size(&self) -> Result<usize> {
        Ok(self.tp()?.size())
    }

    /// Rank in the SP group in force.
    pub fn sp_rank(&self) -> Result<usize> {
        Ok(self.sp()?.rank_in_group())
    }

    /// Size of the SP group in force.
    pub fn sp_world_size(&self) -> Result<usize> {
        Ok(self.sp()?.size())
    }

    /// Rank in the DP group.
    pub fn dp_rank(&self) -> Result<usize> {
        Ok(self.dp()?.rank_in_group())
    }

    /// Size of the DP group.
    pub fn dp_world_size(&self) -> Result<usize> {
        Ok(self.dp()?.size())
    }

    /// A TP group of `size` consecutive ranks for one model, named
    /// `tp_{suffix}:{index}` (FastVideo's `initialize_tensor_parallel_group`).
    pub fn new_tensor_parallel_group(
        &self,
        size: usize,
        suffix: &str,
    ) -> Result<GroupCoordinator<'rt>> {
        self.consecutive_group("tp", "tensor-parallel", size, suffix)
    }

    /// An SP group of `size` consecutive ranks for one model, named
    /// `sp_{suffix}:{index}` (FastVideo's `initialize_sequence_parallel_group`).
    pub fn new_sequence_parallel_group(
        &self,
        size: usize,
        suffix: &str,
    ) -> Result<GroupCoordinator<'rt>> {
        self.consecutive_group("sp", "sequence-parallel", size, suffix)
    }

    fn consecutive_group(
        &self,
        kind: &str,
        what: &str,
        size: usize,
        suffix: &str,
    ) -> Result<GroupCoordinator<'rt>> {
        consecutive_group_count(self.rt.size(), size, what)?;
        let name = if suffix.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}_{suffix}")
        };
        self.rt
            .split_groups(&name, &consecutive_groups(self.rt.size(), size))?
            .ok_or_else(|| Error::State(format!("rank {} is in no {name} group", self.rt.rank())))
    }

    /// Runs `f` with `group` as the TP group (FastVideo's
    /// `patch_tensor_parallel_group`). Nesting is an error.
    pub fn with_tp_group<R>(
        &self,
        group: &GroupCoordinator<'rt>,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        Self::with_override(&self.tp_override, "tensor", group, f)
    }

    /// Runs `f` with `group` as the SP group. Nesting is an error.
    pub fn with_sp_group<R>(
        &self,
        group: &GroupCoordinator<'rt>,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        Self::with_override(&self.sp_override, "sequence", group, f)
    }

    fn with_override<R>(
        slot: &RefCell<Option<GroupCoordinator<'rt>>>,
        what: &str,
        group: &GroupCoordinator<'rt>,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        if let Some(active) = slot.borrow().as_ref() {
            return Err(Error::State(format!(
                "the {what}-parallel group is already overridden by {}; overrides do not nest",
                active.name()
            )));
        }
        *slot.borrow_mut() = Some(group.clone());
        let _restore = Restore(slot);
        Ok(f())
    }
}
