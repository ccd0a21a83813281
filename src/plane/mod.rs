//! Data planes: where tensor bytes move. Today the host plane (MPI on host
//! memory); the GPU plane (NCCL) plugs in beside it.

pub mod host;
pub mod nccl;
mod reduction;
pub mod shm_window;
