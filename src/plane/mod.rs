//! Data planes: where tensor bytes move. Host collectives run on one of two
//! executors behind [`executor::HostMoves`]: MPI on host memory, or a
//! node-local shared-memory window; the GPU plane is NCCL (loaded here)
//! driven by [`crate::device`].

mod combine;
pub mod executor;
pub mod host;
pub mod nccl;
mod reduction;
pub(crate) mod shm;
pub mod shm_window;
