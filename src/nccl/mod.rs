//! The NCCL library, found and loaded at run time (no build-time CUDA or
//! NCCL), in layers as cudarc does for the driver. `loader` finds the file,
//! `sys` resolves the C entry points, `result` turns codes into typed errors
//! and maps dtypes and operators, `comm` owns a communicator. No raw entry
//! point is called outside this module.
//!
//! cudarc's NCCL loader never looks for `libnccl.so.2` (the name runtime
//! packages and Python wheels ship) and panics when the library is absent;
//! this one searches the places NCCL really lives and reports every path it
//! tried.

pub(crate) mod comm;
pub(crate) mod loader;
pub(crate) mod result;
pub(crate) mod sys;
