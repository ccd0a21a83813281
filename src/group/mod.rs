//! Groups: the [`Runtime`] (MPI and the world), and [`GroupCoordinator`]: one
//! MPI communicator, its members, the executor chosen for it, and the one
//! dispatch path every operation on it goes through; the op list
//! ([`Collectives`]) and its two implementations, host and device.

pub(crate) mod batch;
mod collectives;
mod connect;
mod device;
mod host;
pub(crate) mod launcher;
mod runtime;

pub use batch::Batch;
pub use collectives::{Collectives, PlaneTensor};
pub use device::{DeviceEvent, DeviceGroup};
pub use runtime::{Options, RankInfo, Runtime, WorldInfo};

use crate::agree::{agree, agree_peers, Admitted, Descriptor};
use crate::agree::{Deferred, Posts};
use crate::dtype::DType;
use crate::error::Rejection;
use crate::error::{Error, Fault, Result};
use crate::exec::executor::{ExecChoice, HostExec};
use crate::exec::hier::{Hier, HierCall, NodeMap};
use crate::exec::mpi::{MpiExec, TAG_ANSWER, TAG_HEADER};
use crate::exec::shm::{ShmCall, ShmExec, ShmWindow};
use crate::nccl::comm::Communicator as NcclComm;
use crate::op::CheckMode;
use crate::op::{rank_in_range, Op};
use crate::tensor::Tensor;
use crate::watch::{Call, GroupWatch};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::{Cell, OnceCell, Ref, RefCell};
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
    /// Posted device agreements (check mode `deferred`), made at the first
    /// such call. First field: dropped (its agreements completed) before
    /// the communicator they run on.
    deferred: OnceCell<Rc<Deferred>>,
    rt: &'rt Runtime,
    comm: SimpleCommunicator,
    ranks: Vec<usize>,
    rank_in_group: usize,
    seq: Cell<u64>,
    /// The last call this rank's own checks passed (see [`Admitted`]).
    admitted: Admitted,
    /// The group in the runtime's hang watchdog (holds its name).
    watch: GroupWatch,
    /// The group's NCCL communicator, created at its first device operation.
    /// Declared after `comm`, but dropped with the group, always before the
    /// `Runtime` (the borrow guarantees it), so before MPI finalisation.
    nccl: RefCell<Option<NcclComm<'rt>>>,
    /// Two-member NCCL communicators for point-to-point calls made before
    /// the group's own communicator exists, by peer group rank.
    nccl_pairs: RefCell<HashMap<usize, NcclComm<'rt>>>,
    /// Host scratch buffers for packing (kept, so a hot loop allocates nothing).
    scratch: RefCell<[Vec<u8>; 2]>,
    /// Host scratch tensor for in-place reductions.
    scratch_tensor: RefCell<Option<Tensor>>,
    /// Sub-groups made for rank lists (by world ranks), reused by later calls.
    subgroups: RefCell<HashMap<Vec<usize>, GroupCoordinator<'rt>>>,
    /// Whether host collectives run on shared memory (decided, alike on
    /// every member, when the group is made).
    shm_wanted: bool,
    /// The shared-memory executor, made at the group's first collective.
    shm: OnceCell<ShmExec>,
    /// For a hierarchical group (decided, alike on every member, when the
    /// group is made): each member's node, by group rank.
    hier_nodes: Option<Vec<usize>>,
    /// The hierarchical executor, made at the group's first collective.
    hier: OnceCell<Hier>,
    /// When device calls agree (alike on every member).
    check: Cell<CheckMode>,
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
        let mut facts = vec![[0u64; 3]; size];
        comm.all_gather_into(
            &[rt.rank() as u64, choice.code(), check.code()][..],
            bytemuck::cast_slice_mut::<_, u64>(&mut facts[..]),
        );
        let ranks: Vec<usize> = facts.iter().map(|f| f[0] as usize).collect();
        // Settings every member must share, each with this rank's value.
        let shared = [
            (1, "RANKMESH_HOST_PLANE", choice.code(), choice.name()),
            (2, "RANKMESH_CHECK", check.code(), check.name()),
        ];
        for (col, var, code, here) in shared {
            if let Some(other) = facts.iter().find(|f| f[col] != code) {
                return Err(Error::Launch(format!(
                    "{var} differs among the members of {name}: {here} here, another value on world rank {} (set it alike on every rank)",
                    other[0]
                )));
            }
        }
        let shm_wanted = choose_shm(rt, &name, choice, &facts)?;
        let nodes: Vec<usize> = ranks.iter().map(|r| rt.world().ranks[*r].node).collect();
        let hier_nodes =
            (choice == ExecChoice::Hier && NodeMap::new(&nodes).worth_it()).then_some(nodes);
        let watch = rt.watchdog().register(Arc::from(name), &ranks);
        Ok(GroupCoordinator {
            inner: Rc::new(Inner {
                rt,
                rank_in_group: comm.rank() as usize,
                comm,
                ranks,
                seq: Cell::new(0),
                admitted: Admitted::default(),
                watch,
                nccl: RefCell::new(None),
                nccl_pairs: RefCell::new(HashMap::new()),
                scratch: RefCell::new([Vec::new(), Vec::new()]),
                scratch_tensor: RefCell::new(None),
                subgroups: RefCell::new(HashMap::new()),
                shm_wanted,
                shm: OnceCell::new(),
                hier_nodes,
                hier: OnceCell::new(),
                check: Cell::new(check),
                deferred: OnceCell::new(),
            }),
        })
    }

    /// Which executor the group's host collectives use: `"shm"` (a
    /// shared-memory window on the members' node), `"hier"` (a window per
    /// node and MPI among the nodes' leaders), `"mpi"`, or `"local"` (a
    /// group of one: every op is a copy).
    pub fn host_executor(&self) -> &'static str {
        if self.size() == 1 {
            "local"
        } else if self.inner.shm_wanted {
            "shm"
        } else if self.inner.hier_nodes.is_some() {
            "hier"
        } else {
            "mpi"
        }
    }

    /// The shared-memory executor, its window made on first use. Collective
    /// the first time: only the dispatch path calls it, where every member does.
    fn shm(&self) -> Option<&ShmExec> {
        if !self.inner.shm_wanted {
            return None;
        }
        let (rt, comm) = (self.inner.rt, &self.inner.comm);
        Some(
            self.inner
                .shm
                .get_or_init(|| shm_plane(rt, comm, self.rank_in_group())),
        )
    }

    /// The hierarchical executor, its windows and communicators made on
    /// first use. Collective the first time, like [`shm`](Self::shm).
    fn hier(&self) -> Option<&Hier> {
        let nodes = self.inner.hier_nodes.as_ref()?;
        Some(self.inner.hier.get_or_init(|| {
            let rt = self.inner.rt;
            Hier::new(
                &self.inner.comm,
                NodeMap::new(nodes),
                self.rank_in_group(),
                rt.options().max_message_bytes,
                |node_comm, local| shm_plane(rt, node_comm, local),
            )
        }))
    }

    /// The executor of a host call's bytes (inside the dispatch path).
    pub(crate) fn host(&self) -> HostExec<'_> {
        let pulse = self.inner.rt.watchdog().pulse();
        if let Some(plane) = self.shm() {
            return HostExec::Shm(ShmCall { plane, pulse });
        }
        match self.hier() {
            Some(hier) => HostExec::Hier(HierCall {
                hier,
                flat: self.mpi(),
                pulse,
            }),
            None => HostExec::Mpi(self.mpi()),
        }
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
        let mut bufs = self.inner.scratch.borrow_mut();
        let [x, y] = &mut *bufs;
        x.resize(a, 0);
        y.resize(b, 0);
        f(x, y)
    }

    /// Runs `f` with a scratch copy of `t` and `t` itself.
    pub(crate) fn with_scratch_tensor<R>(
        &self,
        t: &mut Tensor,
        f: impl FnOnce(&Tensor, &mut Tensor) -> R,
    ) -> R {
        let mut slot = self.inner.scratch_tensor.borrow_mut();
        match slot.as_mut() {
            Some(s) if s.dtype() == t.dtype() && s.shape() == t.shape() => {
                s.bytes_mut().copy_from_slice(t.bytes())
            }
            _ => *slot = Some(t.clone()),
        }
        f(slot.as_ref().expect("set above"), t)
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

    pub(crate) fn mpi(&self) -> MpiExec<'_> {
        MpiExec::new(
            &self.inner.comm,
            self.inner.rt.options().max_message_bytes,
            self.inner.rt.watchdog().pulse(),
        )
    }

    /// Puts a blocking step of `op` outside the dispatch path (e.g. NCCL
    /// communicator creation) under the hang watchdog.
    pub(crate) fn watched(&self, op: Op) -> Call<'_> {
        self.watch_now(Descriptor::new(op, &[]))
    }

    /// Watches `desc` as a step at the group's current call number (calls
    /// that do not advance it: point-to-point, communicator creation).
    fn watch_now(&self, mut desc: Descriptor) -> Call<'_> {
        desc.seq = self.inner.seq.get();
        self.inner.watch.call(&desc)
    }

    /// The group's NCCL communicator, created by `connect` on first use.
    /// Collective on first use: call only where every member calls too.
    pub(crate) fn nccl_comm(
        &self,
        connect: impl FnOnce() -> Result<NcclComm<'rt>>,
    ) -> Result<Ref<'_, NcclComm<'rt>>> {
        if self.inner.nccl.borrow().is_none() {
            let comm = connect()?;
            *self.inner.nccl.borrow_mut() = Some(comm);
        }
        Ok(Ref::map(self.inner.nccl.borrow(), |c| {
            c.as_ref().expect("set above")
        }))
    }

    /// The NCCL communicator if one was created.
    pub(crate) fn existing_nccl_comm(&self) -> Option<Ref<'_, NcclComm<'rt>>> {
        Ref::filter_map(self.inner.nccl.borrow(), |c| c.as_ref()).ok()
    }

    /// The two-member communicator with group rank `peer`, made with
    /// `connect` (by both of them) on first use.
    pub(crate) fn nccl_pair(
        &self,
        peer: usize,
        connect: impl FnOnce() -> Result<NcclComm<'rt>>,
    ) -> Result<Ref<'_, NcclComm<'rt>>> {
        if !self.inner.nccl_pairs.borrow().contains_key(&peer) {
            let comm = connect()?;
            self.inner.nccl_pairs.borrow_mut().insert(peer, comm);
        }
        Ok(Ref::map(self.inner.nccl_pairs.borrow(), |m| &m[&peer]))
    }

    /// Validates a position argument (`src`, `dst`) for `op`.
    pub(crate) fn check_rank(&self, op: Op, what: &str, rank: usize) -> Result<usize> {
        rank_in_range(what, rank as i64, self.size())
            .map_err(|m| Error::invalid(op, self.name(), m))
    }

    /// The dispatch path of every collective: numbers the call, opens its
    /// tracing span, agrees on descriptors, applies `check`, and only then runs
    /// `body`. `body` gets every rank's descriptor (by group rank) when the op
    /// [needs them all](Descriptor::needs_all), otherwise this rank's only.
    /// `check` depends on the descriptor and the group alone: a repeat of
    /// the last call it passed skips it (see [`Admitted`]).
    pub(crate) fn collective<R>(
        &self,
        desc: Descriptor,
        check: impl Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let mut desc = desc;
        self.collective_on(false, &mut desc, check, body)
    }

    /// [`collective`](Self::collective); `fused`: the body's first move is
    /// a host executor call, which on shared memory carries the agreement.
    fn collective_on<R>(
        &self,
        fused: bool,
        desc: &mut Descriptor,
        check: impl Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        desc.seq = self.inner.seq.get();
        self.inner.seq.set(desc.seq + 1);
        let span = tracing::debug_span!(
            "collective",
            rank = self.global_rank(),
            op = op.name(),
            group = self.name(),
            seq = desc.seq,
            dtype = desc.dtype().map_or("-", |d| d.name()),
            shape = ?desc.shape(),
        );
        let _entered = span.enter();
        // The whole call, agreement and data, is watched: a peer that never
        // enters it or stops inside it is named instead of waited for.
        let call = self.inner.watch.call(desc);
        call.finish(self.agree_then(fused, desc, check, body))
    }

    /// The agreement step of [`collective`](Self::collective), then `body`.
    fn agree_then<R>(
        &self,
        fused: bool,
        desc: &Descriptor,
        check: impl Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        if let Some(d) = self.inner.deferred.get() {
            d.check_usable(op)?;
        }
        if self.size() == 1 {
            return self.checked_alone(op, desc, &check, body);
        }
        if desc.is_device() {
            match self.inner.check.get() {
                CheckMode::Strict => {}
                CheckMode::Deferred => return self.agree_deferred(desc, check, body),
                CheckMode::Off => return self.checked_alone(op, desc, &check, body),
            }
        }
        if let Some(shm) = self.shm() {
            return self.agree_on_shm(shm, fused, desc, check, body);
        }
        // Every call, whatever its kind, starts with the same all-reduce (max)
        // of [digest, !digest, flags, announcement]: it proves that every
        // rank passed the same call with a usable output, and hands every
        // rank the length an object's source announces. Only when the call
        // differs, or the op needs every rank's descriptor (objects of
        // several lengths), are the full descriptors gathered, and every
        // rank takes that branch together.
        let me = self.rank_in_group();
        let (key, verdict) = self.inner.admitted.admit(desc, &check);
        let [len, not_len] = desc.announcement(me);
        let mine = [key, !key, u64::from(desc.local_problem()), len, not_len];
        let mut max = [0u64; 5];
        self.inner
            .comm
            .all_reduce_into(&mine[..], &mut max[..], SystemOperation::max());
        if max[..3] == [key, !key, 0] {
            if !desc.needs_all() {
                // Identical everywhere: the op's own check gives every rank the same verdict.
                return self.on_verdict(op, verdict, desc, body);
            }
            let announced = Descriptor::announced([max[3], max[4]]);
            if let (Some(src), Some(len)) = (desc.length_source(), announced) {
                // Only the source's length matters, and every rank has it.
                let mut descs = vec![*desc; self.size()];
                for (r, d) in descs.iter_mut().enumerate() {
                    d.len = if r == src { len } else { 0 };
                }
                return self.checked(op, &descs, me, &check, body);
            }
        }
        let mut descs = vec![Descriptor::new(op, &[]); self.size()];
        self.inner.comm.all_gather_into(
            bytemuck::bytes_of(desc),
            bytemuck::cast_slice_mut::<_, u8>(&mut descs[..]),
        );
        self.checked(op, &descs, me, &check, body)
    }

    /// The agreement of a device call in `deferred` mode (see `check`):
    /// posted, and the work enqueued at once. A rank whose own checks refuse
    /// the call enqueues nothing and completes the agreement now, so its
    /// error is the one every member gets.
    fn agree_deferred<R>(
        &self,
        desc: &Descriptor,
        check: impl Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        let gpu = self.inner.rt.gpu()?;
        let deferred = self.inner.deferred.get_or_init(|| {
            // Collective at a group's first deferred call: the shm window.
            let posts = match self.shm() {
                Some(shm) => Posts::ring(shm.window().ring_area(), self.rank_in_group()),
                None => Posts::mpi(self.inner.comm.as_raw()),
            };
            let d = Rc::new(Deferred::new(
                self.name(),
                self.rank_in_group(),
                self.inner.rt.options().timeout,
                posts,
            ));
            gpu.register_deferred(&d);
            d
        });
        gpu.settle_at_call()?;
        if deferred.full() {
            gpu.settle()?;
        }
        let (digest, verdict) = self.inner.admitted.admit(desc, &check);
        deferred.post(desc, digest, self.size(), verdict.is_err())?;
        if let Err(rejection) = verdict {
            gpu.settle()?;
            return Err(Error::rejected(op, self.name(), rejection));
        }
        body(std::slice::from_ref(desc))
    }

    /// When this group's device calls agree (see [`CheckMode`]).
    pub fn check_mode(&self) -> CheckMode {
        self.inner.check.get()
    }

    /// Sets when this group's device calls agree. Collective: every member
    /// calls it with the same mode at the same point (agreed like any call,
    /// so a member passing another mode is an error on all of them).
    /// Deferred agreements already posted are completed first.
    pub fn set_check_mode(&self, mode: CheckMode) -> Result<()> {
        let desc = Descriptor::new(Op::SetCheckMode, &[mode.code() as i64]);
        self.collective(
            desc,
            |_| Ok(()),
            |_| {
                if let Ok(gpu) = self.inner.rt.gpu() {
                    gpu.settle()?;
                }
                self.inner.check.set(mode);
                Ok(())
            },
        )
    }

    /// [`checked`](Self::checked) on this rank's descriptor alone (every
    /// rank's is the same), through the group's [`Admitted`].
    fn checked_alone<R>(
        &self,
        op: Op,
        desc: &Descriptor,
        check: &dyn Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let verdict = self.inner.admitted.verdict(desc, check);
        self.on_verdict(op, verdict, desc, body)
    }

    /// Refuses the call with this rank's `verdict` on `desc`, or runs `body`
    /// on `desc`: for calls every rank made alike, where this rank's
    /// verdict is every rank's.
    #[inline]
    fn on_verdict<R>(
        &self,
        op: Op,
        verdict: std::result::Result<(), Rejection>,
        desc: &Descriptor,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        verdict.map_err(|r| Error::rejected(op, self.name(), r))?;
        tracing::trace!("agreed");
        body(std::slice::from_ref(desc))
    }

    /// Applies the agreement rules and the op's `check` to `descs` (this
    /// rank's alone when every rank's is the same, `me` being 0 then) and
    /// runs `body` on them when they allow the call.
    fn checked<R>(
        &self,
        op: Op,
        descs: &[Descriptor],
        me: usize,
        check: &dyn Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        agree(descs, me, check).map_err(|r| Error::rejected(op, self.name(), r))?;
        tracing::trace!("agreed");
        body(descs)
    }

    /// The agreement on shared memory. A fused call whose op's checks pass
    /// here publishes its descriptor with the body's first data phase and
    /// runs on; the executor stops at that synchronisation when any rank's
    /// differs, and every rank makes the same error from all of them. Other
    /// calls publish descriptors in a phase of their own, then proceed as
    /// the MPI agreement does.
    fn agree_on_shm<R>(
        &self,
        shm: &ShmExec,
        fused: bool,
        desc: &Descriptor,
        check: impl Fn(&Descriptor) -> std::result::Result<(), String>,
        body: impl FnOnce(&[Descriptor]) -> Result<R>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        let me = self.rank_in_group();
        let one = std::slice::from_ref(desc);
        let (digest, verdict) = self.inner.admitted.admit(desc, &check);
        if fused && !desc.needs_all() && verdict.is_ok() {
            shm.stage(desc, digest);
            let moved = body(one);
            if let Some(descs) = shm.take_disagreement() {
                return Err(match agree(&descs, me, &check) {
                    Err(r) => Error::rejected(op, self.name(), r),
                    Ok(()) => Fault::Disagreed.into_error(op, self.name()),
                });
            }
            if shm.unstage() {
                return Err(Error::invalid(
                    op,
                    self.name(),
                    "internal: the shared-memory body moved nothing (please report)",
                ));
            }
            return moved;
        }
        let pulse = self.inner.rt.watchdog().pulse();
        match shm.exchange_descriptors(desc, digest, desc.needs_all(), &pulse) {
            Some(descs) => self.checked(op, &descs, me, &check, body),
            // The same everywhere: this rank's verdict is every rank's.
            None => self.on_verdict(op, verdict, desc, body),
        }
    }

    /// The dispatch path with the op's rules applied: `desc` names the op,
    /// the input and the parameters; `fit` says whether the caller's output
    /// (see [`output_fit`](Self::output_fit)) fits the op's
    /// [output shape](Op::output_shape), flagged in the agreement so every
    /// rank fails together; the op's own parameter checks run on every
    /// rank's descriptor; `body` moves the bytes, and its faults come back
    /// naming the op and the group.
    pub(crate) fn run_op<R>(
        &self,
        desc: &mut Descriptor,
        fit: OutputFit,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        self.run_op_on(false, desc, fit, body)
    }

    /// [`run_op`](Self::run_op) of a host op with no output tensor, whose
    /// body's first move is a call to the [host executor](Self::host) (the
    /// agreement rides on it).
    pub(crate) fn run_host_op<R>(
        &self,
        mut desc: Descriptor,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        self.run_op_on(true, &mut desc, OutputFit::Unchecked, body)
    }

    /// [`run_host_op`](Self::run_host_op) writing into the caller's `out`,
    /// checked first and then handed to `body`.
    pub(crate) fn run_host_op_into<T: PlaneTensor, R>(
        &self,
        mut desc: Descriptor,
        out: &mut T,
        body: impl FnOnce(&mut T) -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let fit = self.output_fit(&desc, &*out);
        self.run_op_on(true, &mut desc, fit, || body(out))
    }

    /// Whether `out` fits the output of `desc`'s call on this rank. Only a
    /// verdict travels down the dispatch path: the caller's shape is
    /// copied only when it is wrong, for the message.
    pub(crate) fn output_fit<T: PlaneTensor>(&self, desc: &Descriptor, out: &T) -> OutputFit {
        let op = desc.op().expect("descriptors are built from an Op");
        if !op.output_used_on(self.rank_in_group(), &desc.params) {
            return OutputFit::Unchecked;
        }
        let fits = op.output_fits(desc.dims(), &desc.params, self.size(), out.shape());
        match fits.map(|f| f && Some(out.dtype()) == desc.dtype()) {
            None => OutputFit::Unchecked,
            Some(true) => OutputFit::Fits,
            Some(false) => OutputFit::Unfit(Box::new((out.dtype(), out.shape().to_vec()))),
        }
    }

    fn run_op_on<R>(
        &self,
        fused: bool,
        desc: &mut Descriptor,
        fit: OutputFit,
        body: impl FnOnce() -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        let size = self.size();
        // The descriptor is changed in place and passed on by reference: at
        // 200 bytes, each copy on this path is a `memcpy` per call.
        desc.mark_bad_output(matches!(fit, OutputFit::Unfit(_)));
        self.collective_on(
            fused,
            desc,
            |d| d.validate(op, size),
            |_| body().map_err(|f| f.into_error(op, self.name())),
        )
        .map_err(|e| match (fit, desc.dtype()) {
            (OutputFit::Unfit(out), Some(dt)) => {
                let want = op
                    .output_shape(&desc.shape(), &desc.params, size)
                    .unwrap_or_default();
                explain_output(e, (out.0, &out.1), dt, &want)
            }
            _ => e,
        })
    }

    /// The dispatch path of a point-to-point call: the sender's header meets the
    /// receiver's expectation, both sides check the pair and get the same verdict,
    /// and only then does `body` move the payload. Returns the sender's descriptor.
    pub(crate) fn point_to_point<R>(
        &self,
        desc: Descriptor,
        peer: Peer,
        body: impl FnOnce(&Descriptor) -> std::result::Result<R, Fault>,
    ) -> Result<R> {
        let op = desc.op().expect("descriptors are built from an Op");
        let (peer_rank, sending) = match peer {
            Peer::To(r) => (r, true),
            Peer::From(r) => (r, false),
        };
        let what = if sending { "dst" } else { "src" };
        let peer_rank = self.check_rank(op, what, peer_rank)?;
        if peer_rank == self.rank_in_group() {
            return Err(Error::invalid(
                op,
                self.name(),
                format!(
                    "{what} {peer_rank} is this rank itself (group of size {})",
                    self.size()
                ),
            ));
        }
        let span = tracing::debug_span!(
            "p2p",
            rank = self.global_rank(),
            op = op.name(),
            group = self.name(),
            peer = peer_rank,
            sending,
            dtype = desc.dtype().map_or("-", |d| d.name()),
            shape = ?desc.shape(),
        );
        let _entered = span.enter();
        let plane = self.mpi();
        let call = self.watch_now(desc);
        let mut other = Descriptor::new(op, &[]);
        let other_bytes = bytemuck::bytes_of_mut(&mut other);
        let (sent, expected, sender, receiver) = if sending {
            plane.send_header(bytemuck::bytes_of(&desc), peer_rank, TAG_HEADER);
            plane.recv_header(other_bytes, peer_rank, TAG_ANSWER);
            (desc, other, self.rank_in_group(), peer_rank)
        } else {
            plane.recv_header(other_bytes, peer_rank, TAG_HEADER);
            plane.send_header(bytemuck::bytes_of(&desc), peer_rank, TAG_ANSWER);
            (other, desc, peer_rank, self.rank_in_group())
        };
        call.finish(
            agree_peers(&sent, &expected, sender, receiver)
                .map_err(|m| Error::mismatch(op, self.name(), m))
                .and_then(|()| body(&sent).map_err(|f| f.into_error(op, self.name()))),
        )
    }
}

impl GroupCoordinator<'_> {
    /// The dispatch path of a combined send/receive (each rank sends to `dst`
    /// and receives from `src`, as in a ring shift): headers and answers are
    /// exchanged with `MPI_Sendrecv`, each link is checked by its two ends,
    /// links that agree move their payload, and a failed link is an error on
    /// both of its ends.
    pub(crate) fn exchange(
        &self,
        sent: Descriptor,
        dst: usize,
        expected: Descriptor,
        src: usize,
        body: impl FnOnce(bool, bool) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        let op = Op::SendRecv;
        let me = self.rank_in_group();
        let dst = self.check_rank(op, "dst", dst)?;
        let src = self.check_rank(op, "src", src)?;
        let span = tracing::debug_span!(
            "exchange",
            rank = self.global_rank(),
            group = self.name(),
            dst,
            src
        );
        let _entered = span.enter();
        let plane = self.mpi();
        let mut incoming = Descriptor::new(op, &[]);
        let mut answer = Descriptor::new(op, &[]);
        let call = self.watch_now(sent);
        plane.exchange_headers(
            bytemuck::bytes_of(&sent),
            dst,
            bytemuck::bytes_of_mut(&mut incoming),
            src,
            TAG_HEADER,
        );
        plane.exchange_headers(
            bytemuck::bytes_of(&expected),
            src,
            bytemuck::bytes_of_mut(&mut answer),
            dst,
            TAG_ANSWER,
        );
        let out_link = agree_peers(&sent, &answer, me, dst);
        let in_link = agree_peers(&incoming, &expected, src, me);
        let moved = body(out_link.is_ok(), in_link.is_ok());
        call.finish(
            out_link
                .and(in_link)
                .map_err(|m| Error::mismatch(Op::SendRecv, self.name(), m))
                .and_then(|()| moved.map_err(|f| f.into_error(Op::SendRecv, self.name()))),
        )
    }
}

/// The shared-memory executor over `comm` (ranks of one node; collective),
/// as member `me`: its window, kept by the runtime to be freed in creation
/// order; waiting ranks yield early when the node has more ranks than cores.
fn shm_plane(rt: &Runtime, comm: &SimpleCommunicator, me: usize) -> ShmExec {
    let window = Rc::new(ShmWindow::allocate(comm, rt.options().shm_chunk_bytes));
    rt.keep_window(window.clone());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    ShmExec::new(window, me, rt.world().me().local_size > cores)
}

/// Whether a group whose members gave `facts` (world rank, choice code,
/// check code; the choice alike on all) runs host collectives on shared
/// memory: `shm` is refused for a group spanning nodes.
fn choose_shm(rt: &Runtime, name: &str, choice: ExecChoice, facts: &[[u64; 3]]) -> Result<bool> {
    let node_of = |f: &[u64; 3]| rt.world().ranks[f[0] as usize].node;
    let one_node = facts.iter().all(|f| node_of(f) == node_of(&facts[0]));
    match choice {
        ExecChoice::Mpi => Ok(false),
        ExecChoice::Auto | ExecChoice::Hier => Ok(one_node && facts.len() > 1),
        ExecChoice::Shm if one_node => Ok(facts.len() > 1),
        ExecChoice::Shm => Err(Error::Launch(format!(
            "RANKMESH_HOST_PLANE=shm: {name} spans nodes, and the shared-memory executor runs within one node (use auto or mpi)"
        ))),
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

/// Adds this rank's output and the expected one to an output error, when
/// this rank's output is the one that does not fit.
fn explain_output(e: Error, out: (DType, &[usize]), dtype: DType, shape: &[usize]) -> Error {
    match e {
        Error::InvalidArgument { .. } if out != (dtype, shape) => e.noted(format_args!(
            "this rank: output is {:?} {}, expected {shape:?} {dtype}",
            out.1, out.0
        )),
        e => e,
    }
}

/// The descriptor of tensor op `op` on input `t` (host or device, by its type).
#[inline(always)]
pub(crate) fn tensor_desc<T: PlaneTensor>(op: Op, t: &T, params: &[i64]) -> Descriptor {
    let desc = Descriptor::for_tensor(op, t.dtype(), t.shape(), params);
    if T::ON_DEVICE {
        desc.on_device()
    } else {
        desc
    }
}

/// A caller's output as the dispatch path checked it (see
/// [`GroupCoordinator::output_fit`]).
pub(crate) enum OutputFit {
    /// No output, or one this op does not check here.
    Unchecked,
    Fits,
    /// Its dtype and shape, for the message every rank's error then carries.
    Unfit(Box<(DType, Vec<usize>)>),
}
