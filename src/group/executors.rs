//! Which executor a group's calls run on. The host executor is chosen when
//! the group is made (shared memory within a node, MPI, or the hierarchy);
//! beside it are the MPI executor every host path can fall back on, and the
//! group's NCCL communicators (made at first use).

use super::{GroupCoordinator, Runtime};
use crate::error::{Error, Result};
use crate::exec::executor::{ExecChoice, HostExec};
use crate::exec::hier::{Hier, HierCall, NodeMap};
use crate::exec::mpi::MpiExec;
use crate::exec::route::{route, Planes, Route};
use crate::exec::shm::{ShmCall, ShmExec, ShmWindow};
use crate::nccl::comm::Communicator as NcclComm;
use crate::op::Op;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::Ref;
use std::rc::Rc;

impl<'rt> GroupCoordinator<'rt> {
    /// Which executor the group's host collectives use: `"shm"` (a
    /// shared-memory window on the members' node), `"hier"` (a window per
    /// node and MPI among the nodes' leaders), `"mpi"`, or `"local"` (a
    /// group of one: every op is a copy).
    pub fn host_executor(&self) -> &'static str {
        if self.size() == 1 {
            "local"
        } else if self.planes().shm {
            "shm"
        } else if self.inner.host.hier_nodes.is_some() {
            "hier"
        } else {
            "mpi"
        }
    }

    /// Which executor a host `op` moving `bytes` runs on (sizes as the
    /// bench counts them: the buffer, an all-gather's output, a
    /// reduce-scatter's input): `"local"` in a group of one, else the
    /// choice of `exec::route`, the one place it is
    /// made: MPI for every op, the group's window or node-aware stages for
    /// the ops and sizes where they pay.
    pub fn host_executor_for(&self, op: Op, bytes: usize) -> &'static str {
        if self.size() == 1 {
            return "local";
        }
        match route(op, bytes, self.planes()) {
            Route::Shm => "shm",
            Route::Hier => "hier",
            Route::Mpi => "mpi",
        }
    }

    /// The fast paths this group has (fixed at its creation).
    #[inline(always)]
    pub(crate) fn planes(&self) -> Planes {
        self.inner.host.planes
    }

    /// The shared-memory executor, its window made on first use. Collective
    /// the first time: only the dispatch path calls it, where every member does.
    pub(super) fn shm(&self) -> Option<&ShmExec> {
        if !self.planes().shm {
            return None;
        }
        let (rt, comm) = (self.inner.rt, &self.inner.comm);
        Some(
            self.inner
                .host
                .shm
                .get_or_init(|| shm_exec(rt, comm, self.rank_in_group())),
        )
    }

    /// The hierarchical executor, its windows and communicators made on
    /// first use. Collective the first time, like [`shm`](Self::shm).
    pub(super) fn hier(&self) -> Option<&Hier> {
        let nodes = self.inner.host.hier_nodes.as_ref()?;
        Some(self.inner.host.hier.get_or_init(|| {
            let rt = self.inner.rt;
            Hier::new(
                &self.inner.comm,
                NodeMap::new(nodes),
                self.rank_in_group(),
                rt.options().max_message_bytes,
                |node_comm, local| shm_exec(rt, node_comm, local),
            )
        }))
    }

    /// The executor of a host call of `op` moving `bytes` (inside the
    /// dispatch path, where every member calls: a fast path's window or
    /// communicators are made at its first use), as [`route`] decides.
    #[inline(always)]
    pub(crate) fn host_for(&self, op: Op, bytes: usize) -> HostExec<'_> {
        let pulse = self.inner.rt.watchdog().pulse();
        match route(op, bytes, self.planes()) {
            Route::Shm => match self.shm() {
                Some(plane) => HostExec::Shm(ShmCall {
                    plane,
                    flat: self.mpi(),
                    pulse,
                }),
                None => HostExec::Mpi(self.mpi()),
            },
            Route::Hier => match self.hier() {
                Some(hier) => HostExec::Hier(HierCall {
                    hier,
                    flat: self.mpi(),
                    pulse,
                }),
                None => HostExec::Mpi(self.mpi()),
            },
            Route::Mpi => HostExec::Mpi(self.mpi()),
        }
    }

    pub(crate) fn mpi(&self) -> MpiExec<'_> {
        MpiExec::new(
            &self.inner.comm,
            self.inner.rt.options().max_message_bytes,
            self.inner.rt.watchdog().pulse(),
        )
    }

    /// The group's NCCL communicator, created by `connect` on first use.
    /// Collective on first use: call only where every member calls too.
    pub(crate) fn nccl_comm(
        &self,
        connect: impl FnOnce() -> Result<NcclComm<'rt>>,
    ) -> Result<Ref<'_, NcclComm<'rt>>> {
        if self.inner.device.nccl.borrow().is_none() {
            let comm = connect()?;
            *self.inner.device.nccl.borrow_mut() = Some(comm);
        }
        Ok(Ref::map(self.inner.device.nccl.borrow(), |c| {
            c.as_ref().expect("set above")
        }))
    }

    /// Takes `comm` (split from the world's at creation) as the group's
    /// NCCL communicator.
    pub(crate) fn adopt_nccl(&self, comm: NcclComm<'rt>) {
        *self.inner.device.nccl.borrow_mut() = Some(comm);
    }

    /// The NCCL communicator if one was created.
    pub(crate) fn existing_nccl_comm(&self) -> Option<Ref<'_, NcclComm<'rt>>> {
        Ref::filter_map(self.inner.device.nccl.borrow(), |c| c.as_ref()).ok()
    }

    /// The two-member communicator with group rank `peer`, made with
    /// `connect` (by both of them) on first use.
    pub(crate) fn nccl_pair(
        &self,
        peer: usize,
        connect: impl FnOnce() -> Result<NcclComm<'rt>>,
    ) -> Result<Ref<'_, NcclComm<'rt>>> {
        if !self.inner.device.nccl_pairs.borrow().contains_key(&peer) {
            let comm = connect()?;
            self.inner.device.nccl_pairs.borrow_mut().insert(peer, comm);
        }
        Ok(Ref::map(self.inner.device.nccl_pairs.borrow(), |m| {
            &m[&peer]
        }))
    }
}

/// The shared-memory executor over `comm` (ranks of one node; collective),
/// as member `me`: its window, kept by the runtime to be freed in creation
/// order. Its ranks wait by [`crate::wait`]'s policy; members sharing
/// fewer CPUs than they are is only a hint to it (yield before block).
pub(super) fn shm_exec(rt: &Runtime, comm: &SimpleCommunicator, me: usize) -> ShmExec {
    // Every member is here before the window (MPI's allocation blocks
    // inside MPI, where a member that never comes could not be given up;
    // the barrier waits by the host plane's policy where calls may fail).
    // On every rank whatever it set: a member that skipped it would meet
    // the others' barrier with its window allocation.
    crate::exec::mpi_calls::Calls(comm.as_raw()).barrier();
    let window = Rc::new(ShmWindow::allocate(comm, rt.options().shm_chunk_bytes));
    rt.keep_window(window.clone());
    note_shared_cpus_among(comm);
    ShmExec::new(window, me, rt.single_copy_from())
}

/// Gives [`crate::wait`] the CPUs of `comm`'s members, ranks of one node
/// (collective): whether they share CPUs (returned) is its hint.
pub(super) fn note_shared_cpus_among(comm: &SimpleCommunicator) -> bool {
    let mine = crate::wait::own_cpus();
    let mut all = vec![0u64; mine.len() * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let cpus: Vec<[u64; crate::wait::CPU_WORDS + 1]> = all
        .chunks_exact(mine.len())
        .map(|c| c.try_into().expect("one CPU record"))
        .collect();
    crate::wait::note_shared_cpus(&cpus)
}

/// Whether a group whose members gave `facts` (world rank, choice code,
/// check code, ranks per NCCL root; the choice alike on all) runs host
/// collectives on shared memory: `shm` is refused for a group spanning
/// nodes.
pub(super) fn choose_shm(
    rt: &Runtime,
    name: &str,
    choice: ExecChoice,
    facts: &[[u64; 4]],
) -> Result<bool> {
    let node_of = |f: &[u64; 4]| rt.world().ranks[f[0] as usize].node;
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
