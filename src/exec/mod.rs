//! Executors: how a host group's bytes move. MPI on host memory ([`mpi`])
//! does every op of `moves::HostMoves`; a node-local shared-memory window
//! (`shm`) and the two in a hierarchy for groups that span nodes (`hier`)
//! are fast paths for the ops `route` sends them. The device plane's
//! executor is NCCL (`crate::group`'s device group).

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
pub(crate) mod route;
pub(crate) mod shm;

pub(crate) use cma::pays_from as single_copy_pays_from;
pub(crate) use copy::misaligned_by_memcpy;
