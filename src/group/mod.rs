//! Groups: the [`Runtime`] (MPI and the world) and [`GroupCoordinator`]. A
//! group is one MPI communicator, its members, the executor chosen for it,
//! and the one dispatch path every operation on it goes through; here too are
//! the op list ([`Collectives`]) and its two implementations, host and
//! device.

pub(crate) mod batch;
mod call;
mod collectives;
pub(crate) mod connect;
mod device;
mod executors;
mod host;
pub(crate) mod launcher;
mod runtime;
mod state;
mod uneven;

pub use batch::Batch;
pub(crate) use call::{tensor_desc, OutputFit};
pub use collectives::{Collectives, P2p, PlaneTensor};
pub use device::{DeviceEvent, DeviceGroup};
pub use runtime::{MpiCalls, Options, RankInfo, Runtime, Shrunk, SingleCopy, WorldInfo};

use crate::agree::Admitted;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::exec::executor::ExecChoice;
use crate::exec::hier::{self, NodeMap};
use crate::op::rank_in_range;
use crate::tensor::Tensor;
use crate::watch::GroupWatch;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use state::{DeviceState, HostState};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A process group: a sub-communicator of the world plus rank helpers.
///
/// Cloning is cheap and shares the communicator. `src`/`dst` arguments are
/// positions inside the group (as in FastVideo); global ranks appear only where
/// the name says so. A group of size 1 turns every operation into a local copy.
#[derive(Clone)]
pub struct GroupCoordinator<'rt> {
    inner: Rc<Inner<'rt>>,
}

struct Inner<'rt> {
    /// Declared first: dropped first (see [`state`]).
    device: DeviceState<'rt>,
    host: HostState,
    rt: &'rt Runtime,
    /// Under ULFM in the set a survivor revokes.
    comm: crate::ulfm::Kept,
    ranks: Vec<usize>,
    rank_in_group: usize,
    seq: Cell<u64>,
    /// The last call this rank's own checks passed (see [`Admitted`]).
    admitted: Admitted,
    /// The group in the runtime's hang watchdog (holds its name).
    watch: GroupWatch,
    /// Sub-groups made for rank lists (by world ranks), reused by later calls.
    subgroups: RefCell<HashMap<Vec<usize>, GroupCoordinator<'rt>>>,
}

/// Which side of a point-to-point call this rank is.
pub(crate) enum Peer {
    /// Sending to the group rank.
    To(usize),
    /// Receiving from the group rank.
    From(usize),
}

impl<'rt> GroupCoordinator<'rt> {
    /// Wraps a communicator (collective over it: members exchange world ranks).
    /// Call it under a watched creation step (it waits for every member).
    pub(crate) fn new(rt: &'rt Runtime, comm: SimpleCommunicator, name: String) -> Result<Self> {
        let size = comm.size() as usize;
        let choice = rt.options().host_plane;
        let check = rt.options().check;
        let per_root = rt.options().nccl_ranks_per_root;
        let mut facts = vec![[0u64; 4]; size];
        comm.all_gather_into(
            &[
                rt.rank() as u64,
                choice.code(),
                check.code(),
                per_root as u64,
            ][..],
            bytemuck::cast_slice_mut::<_, u64>(&mut facts[..]),
        );
        let ranks: Vec<usize> = facts.iter().map(|f| f[0] as usize).collect();
        // Settings every member must share, each with this rank's value.
        let per_root_here = per_root.to_string();
        let shared = [
            (1, "RANKMESH_HOST_PLANE", choice.code(), choice.name()),
            (2, "RANKMESH_CHECK", check.code(), check.name()),
            (
                3,
                "RANKMESH_NCCL_RANKS_PER_ROOT",
                per_root as u64,
                &per_root_here,
            ),
        ];
        for (col, var, code, here) in shared {
            if let Some(other) = facts.iter().find(|f| f[col] != code) {
                return Err(Error::Launch(format!(
                    "{var} differs among the members of {name}: {here} here, another value on world rank {} (set it alike on every rank)",
                    other[0]
                )));
            }
        }
        let shm_wanted = executors::choose_shm(rt, &name, choice, &facts)?;
        let nodes: Vec<usize> = ranks.iter().map(|r| rt.world().ranks[*r].node).collect();
        let spans_nodes = matches!(choice, ExecChoice::Auto | ExecChoice::Hier);
        let map = NodeMap::new(&nodes);
        let hier_nodes = (spans_nodes && map.worth_it()).then_some(nodes);
        let executor = match (size, shm_wanted, &hier_nodes) {
            (1, ..) => "local (a group of one)".to_string(),
            (_, true, _) => "shared memory (one node)".to_string(),
            (_, _, Some(_)) => hier::describe(&map, choice == ExecChoice::Hier),
            _ => "MPI".to_string(),
        };
        tracing::debug!(group = %name, "host executor: {executor}");
        let watch = rt.watchdog().register(Arc::from(name), &ranks);
        Ok(GroupCoordinator {
            inner: Rc::new(Inner {
                rt,
                rank_in_group: comm.rank() as usize,
                comm: crate::ulfm::Kept::revocable(comm),
                ranks,
                seq: Cell::new(0),
                admitted: Admitted::default(),
                watch,
                subgroups: RefCell::new(HashMap::new()),
                device: DeviceState::new(check),
                host: HostState::new(shm_wanted, hier_nodes, choice == ExecChoice::Hier),
            }),
        })
    }

    /// Unique name, e.g. `tp:1` (kind and index of the group in its layout).
    pub fn name(&self) -> &str {
        self.inner.watch.name()
    }

    /// World ranks of the members, in group-rank order.
    pub fn ranks(&self) -> &[usize] {
        &self.inner.ranks
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.inner.ranks.len()
    }

    /// This process's position in the group.
    pub fn rank_in_group(&self) -> usize {
        self.inner.rank_in_group
    }

    /// This process's world rank.
    pub fn global_rank(&self) -> usize {
        self.inner.rt.rank()
    }

    /// World rank of group rank 0.
    pub fn first_rank(&self) -> usize {
        self.inner.ranks[0]
    }

    /// World rank of the last member.
    pub fn last_rank(&self) -> usize {
        self.inner.ranks[self.size() - 1]
    }

    /// Whether this process is group rank 0.
    pub fn is_first_rank(&self) -> bool {
        self.rank_in_group() == 0
    }

    /// Whether this process is the last member.
    pub fn is_last_rank(&self) -> bool {
        self.rank_in_group() == self.size() - 1
    }

    /// World rank of the next member (wrapping).
    pub fn next_rank(&self) -> usize {
        self.inner.ranks[(self.rank_in_group() + 1) % self.size()]
    }

    /// World rank of the previous member (wrapping).
    pub fn prev_rank(&self) -> usize {
        self.inner.ranks[(self.rank_in_group() + self.size() - 1) % self.size()]
    }

    /// The runtime this group belongs to.
    pub fn runtime(&self) -> &'rt Runtime {
        self.inner.rt
    }

    /// Positions (group ranks) of the members on the same node as group rank `src`.
    pub fn same_node_ranks(&self, src: usize) -> Result<Vec<usize>> {
        Ok(self
            .is_the_same_node_as(src)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, same)| same.then_some(i))
            .collect())
    }

    /// For each member, whether it shares a node (an MPI shared-memory domain)
    /// with group rank `src`. Local: node identity was gathered at start-up.
    pub fn is_the_same_node_as(&self, src: usize) -> Result<Vec<bool>> {
        let src = rank_in_range("src", src as i64, self.size()).map_err(|msg| Error::Usage {
            what: "is_the_same_node_as",
            group: self.name().to_string(),
            msg,
        })?;
        let nodes: Vec<usize> = self
            .ranks()
            .iter()
            .map(|r| self.inner.rt.world().ranks[*r].node)
            .collect();
        Ok(nodes.iter().map(|n| *n == nodes[src]).collect())
    }

    pub(crate) fn raw_comm(&self) -> &SimpleCommunicator {
        &self.inner.comm
    }

    /// The group's MPI communicator, for code that speaks MPI directly next
    /// to rankmesh. Its traffic bypasses the agreement and the watchdog, and
    /// must not interleave with rankmesh's own calls on the group.
    pub fn communicator(&self) -> &SimpleCommunicator {
        &self.inner.comm
    }

    /// Runs `f` on two scratch buffers of `a` and `b` bytes (contents unspecified).
    pub(crate) fn with_scratch<R>(
        &self,
        a: usize,
        b: usize,
        f: impl FnOnce(&mut [u8], &mut [u8]) -> R,
    ) -> R {
        let mut bufs = self.inner.host.scratch.borrow_mut();
        let [x, y] = &mut *bufs;
        x.resize(a, 0);
        y.resize(b, 0);
        f(x, y)
    }

    /// The group's kept copy of an in-place call's input
    /// ([`HostMoves::all_reduce_in_place`](crate::exec::moves::HostMoves)).
    pub(crate) fn scratch_tensor(&self) -> std::cell::RefMut<'_, Option<Tensor>> {
        self.inner.host.scratch_tensor.borrow_mut()
    }

    /// Runs `f` with two flat scratch tensors of `dtype`, of `a` and `b`
    /// elements, kept while the dtype and sizes stay, so a loop of such
    /// calls allocates (and faults in) no memory. They hold what the last
    /// call left.
    pub(crate) fn with_typed_scratch<R>(
        &self,
        dtype: DType,
        (a, b): (usize, usize),
        f: impl FnOnce(&mut Tensor, &mut Tensor) -> R,
    ) -> Result<R> {
        let mut slot = self.inner.host.typed_scratch.borrow_mut();
        let fits =
            |(x, y): &(Tensor, Tensor)| x.dtype() == dtype && x.numel() == a && y.numel() == b;
        if !slot.as_ref().is_some_and(fits) {
            // The old pair goes first: both never live at once.
            *slot = None;
            *slot = Some((Tensor::zeros([a], dtype)?, Tensor::zeros([b], dtype)?));
        }
        let (x, y) = slot.as_mut().expect("set above");
        Ok(f(x, y))
    }

    /// The sub-group of world ranks `global`, made by `make` the first time.
    pub(crate) fn cached_subgroup(
        &self,
        global: &[usize],
        make: impl FnOnce() -> Result<GroupCoordinator<'rt>>,
    ) -> Result<GroupCoordinator<'rt>> {
        if let Some(g) = self.inner.subgroups.borrow().get(global) {
            return Ok(g.clone());
        }
        let g = make()?;
        self.inner
            .subgroups
            .borrow_mut()
            .insert(global.to_vec(), g.clone());
        Ok(g)
    }
}

/// The group that the traits of the layers above (objects, gathers, main-rank
/// helpers) work on. Sealed: unnameable outside the crate, implemented by
/// [`GroupCoordinator`] alone.
pub trait AsGroup<'rt> {
    /// The group itself.
    fn as_group(&self) -> &GroupCoordinator<'rt>;
}

impl<'rt> AsGroup<'rt> for GroupCoordinator<'rt> {
    fn as_group(&self) -> &GroupCoordinator<'rt> {
        self
    }
}

impl std::fmt::Debug for GroupCoordinator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator")
            .field("name", &self.name())
            .field("ranks", &self.ranks())
            .field("rank_in_group", &self.rank_in_group())
            .finish()
    }
}
