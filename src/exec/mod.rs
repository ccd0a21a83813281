//! Executors: how a host group's bytes move. Three of them behind
//! `moves::HostMoves`: MPI on host memory ([`mpi`]), a node-local
//! shared-memory window (`shm`), or the two in a hierarchy for groups that
//! span nodes (`hier`). The device plane's executor is NCCL
//! (`crate::group`'s device group).

pub(crate) mod blocks;
mod cma;
mod combine;
mod copy;
pub(crate) mod executor;
pub(crate) mod hier;
pub(crate) mod moves;
pub mod mpi;
pub(crate) mod mpi_calls;
mod reduction;
pub(crate) mod shm;

pub(crate) use cma::pays_from as single_copy_pays_from;
pub(crate) use copy::misaligned_by_memcpy;
