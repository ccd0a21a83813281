//! Data planes: where tensor bytes move. Host collectives run on one of three
//! executors behind [`executor::HostMoves`]: MPI on host memory, a
//! node-local shared-memory window, or the two in a hierarchy for groups
//! spanning nodes; the GPU plane is NCCL (loaded here)
//! driven by [`crate::device`].

mod combine;
mod copy;
pub mod executor;
pub(crate) mod hier;
pub mod host;
pub mod nccl;
mod reduction;
pub(crate) mod shm;
pub mod shm_window;
