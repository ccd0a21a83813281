//! Data planes: where tensor bytes move. The host plane is MPI on host
//! memory; the GPU plane is NCCL (loaded here) driven by [`crate::device`].

pub mod host;
pub mod nccl;
mod reduction;
pub mod shm_window;
