//! The NCCL library, found and loaded at run time (no build-time CUDA or
//! NCCL), in three layers as cudarc does for the driver: `loader` finds the
//! file, `sys` resolves the C entry points, `comm` owns a communicator.
//!
//! cudarc's NCCL loader never looks for `libnccl.so.2` (the name runtime
//! packages and Python wheels ship) and panics when the library is absent;
//! this one searches the places NCCL really lives and reports every path it
//! tried.

pub mod comm;
pub mod loader;
pub mod sys;
