//! Which host executor a call runs on: the enum over the three that
//! implement [`HostMoves`](super::moves::HostMoves) — MPI ([`MpiExec`]),
//! node-local shared memory ([`ShmCall`]) and the node-aware stages across
//! nodes ([`HierCall`]) — and `RANKMESH_HOST_PLANE`'s choice among them.

use super::hier::HierCall;
use super::moves::HostMoves;
use super::mpi::MpiExec;
use super::shm::ShmCall;
use crate::error::{Error, Result};
use crate::parse::{choice, Choice};

/// The executor a host call runs on.
pub(crate) enum HostExec<'a> {
    /// MPI collectives on the group's communicator.
    Mpi(MpiExec<'a>),
    /// The group's shared-memory window.
    Shm(ShmCall<'a>),
    /// Shared memory within nodes, MPI among their leaders.
    Hier(HierCall<'a>),
}

impl<'a> std::ops::Deref for HostExec<'a> {
    type Target = dyn HostMoves + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            HostExec::Mpi(p) => p,
            HostExec::Shm(s) => s,
            HostExec::Hier(h) => h,
        }
    }
}

/// `RANKMESH_HOST_PLANE`: which executor host collectives use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecChoice {
    /// Shared memory for groups whose members share one node; for groups
    /// spanning nodes with two or more members on some node, the node-aware
    /// stages for the ops and sizes where they pay (per-op crossovers,
    /// `GroupCoordinator::host_executor_for`), flat MPI for the rest; MPI
    /// otherwise.
    #[default]
    Auto,
    /// MPI for every group.
    Mpi,
    /// Shared memory; a group spanning nodes is an error at its creation.
    Shm,
    /// As `Auto`, but a group spanning nodes runs every op that has
    /// node-aware stages in them, at every size (broadcast and barrier
    /// included, which `Auto` leaves flat).
    Hier,
}

impl ExecChoice {
    /// The value's name, as `RANKMESH_HOST_PLANE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ExecChoice::Auto => "auto",
            ExecChoice::Mpi => "mpi",
            ExecChoice::Shm => "shm",
            ExecChoice::Hier => "hier",
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64
    }
}

choice!(
    ExecChoice,
    &[
        ExecChoice::Mpi,
        ExecChoice::Shm,
        ExecChoice::Hier,
        ExecChoice::Auto
    ]
);

impl std::str::FromStr for ExecChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ExecChoice::named(s.trim()).ok_or_else(|| {
            Error::Launch(format!(
                "RANKMESH_HOST_PLANE={s:?} is not one of mpi, shm, hier, auto"
            ))
        })
    }
}
