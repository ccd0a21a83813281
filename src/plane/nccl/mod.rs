//! The NCCL library, found and loaded at run time (no build-time CUDA or
//! NCCL): the project-owned loader that the GPU data plane will sit on.
//!
//! cudarc's NCCL loader never looks for `libnccl.so.2` (the name runtime
//! packages and Python wheels ship) and panics when the library is absent;
//! this one searches the places NCCL really lives and reports every path it
//! tried.

pub mod loader;
