//! # rankmesh
//!
//! Collective communication for MPI-launched jobs: tensor/sequence/data
//! parallel groups, a typed object plane and tensor collectives.
//!
//! MPI is the control plane (ranks, node locality, group communicators,
//! metadata) and the host data plane. Every call first agrees on a small
//! descriptor across the group, so bad input is the same clear [`Error`] on
//! every rank instead of a hang or an abort.
//!
//! ```
//! use rankmesh::{Collectives, ParallelState, ReduceOp, Runtime, Tensor};
//!
//! fn main() -> rankmesh::Result<()> {
//!     let rt = Runtime::init()?; // a world of 1 without a launcher
//!     let mut ps = ParallelState::new(&rt)?;
//!     ps.initialize_model_parallel(1, rt.size(), None)?;
//!     let x = Tensor::from_vec([2, 3], vec![rt.rank() as f32; 6])?;
//!     let sum = ps.sp()?.all_reduce(&x, ReduceOp::Sum)?;
//!     let seq = ps.sp()?.all_gather(&x, -1)?; // [2, 3·P]
//!     println!("{:?} {:?}", sum.as_slice::<f32>()?, seq.shape());
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

pub mod autograd;
pub mod bench;
mod check;
pub mod collectives;
mod depth;
pub mod device;
pub mod dispatch;
pub mod doctor;
pub mod error;
pub mod gather;
pub mod group;
pub mod helpers;
mod host_ops;
pub mod launcher;
pub mod layout;
pub mod layout_ops;
mod list_check;
mod object;
pub mod op;
pub mod parallel;
pub mod placement;
pub mod plane;
pub mod reduce;
pub mod stateless;
pub mod tensor;
pub mod tensor_dict;
pub mod topo;
mod watch;
pub mod workload;
pub mod workspace;
pub mod world;

pub use autograd::Differentiable;
pub use check::CheckMode;
pub use collectives::{Collectives, PlaneTensor};
pub use device::{DeviceEvent, DeviceGroup, DeviceTensor, DeviceView, DeviceViewMut, Gpu};
pub use error::{Error, NcclError, Result};
pub use group::GroupCoordinator;
pub use layout::{GroupKind, Layout};
pub use op::Op;
pub use parallel::{OnGroup, ParallelState};
pub use reduce::ReduceOp;
pub use stateless::{StatelessDevice, StatelessGroup};
pub use tensor::{
    divide, ensure_divisibility, split_tensor_along_last_dim, split_views_along_last_dim, Bool,
    DType, Element, LastDimView, Tensor, F8E4M3, F8E5M2,
};
pub use tensor_dict::{DictValue, Object, TensorDict, TensorDicts};
pub use watch::TIMEOUT_EXIT;
pub use workspace::Workspace;
pub use world::{Options, RankInfo, Runtime, WorldInfo};

/// The README's examples are compiled as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// docs/GPU.md's example is compiled as a doc test too.
#[doc = include_str!("../docs/GPU.md")]
#[cfg(doctest)]
pub struct GpuDocDoctests;
