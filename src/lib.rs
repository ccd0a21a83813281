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
// No function over 80 lines of code (clippy.toml's threshold; CI denies
// warnings): a longer one is split by what its parts do. Tests may be long
// lists of cases.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

// The layers, bottom first: a module imports only modules above it in this
// list (tests/layers.rs enforces it; docs/ARCHITECTURE.md draws it).
// 1. values: element types, the op list's rules, the error, host tensors
mod parse;
mod dtype;
pub mod op;
pub mod error;
pub mod tensor;
// 2. agreement and the watch, over the MPI pieces rsmpi lacks
mod wait;
mod mpi_ext;
mod mpi_abi;
mod ulfm;
// The agreement, the executors and the tools' modules are internal. The
// `internals` feature, which Cargo.toml's self dev-dependency turns on for
// the integration tests only, makes them public for those tests (the
// agreement's property tests, fault injection that speaks the wire tags);
// a user's build has no such paths, and nothing of its API is hidden.
#[cfg(feature = "internals")]
#[allow(missing_docs)]
pub mod agree;
#[cfg(not(feature = "internals"))]
mod agree;
mod watch;
// 3. executors and the device plane
mod nccl;
pub mod device;
#[cfg(feature = "internals")]
#[allow(missing_docs)]
pub mod exec;
#[cfg(not(feature = "internals"))]
mod exec;
pub mod placement;
// 4. groups and the runtime
pub mod group;
// 5. what is built on groups
pub mod object;
pub mod helpers;
pub mod stateless;
pub mod parallel;
// 6. tools, reached through `tools` (and, for the tests, as above)
#[cfg(feature = "internals")]
pub mod bench;
#[cfg(not(feature = "internals"))]
mod bench;
#[cfg(feature = "internals")]
pub mod doctor;
#[cfg(not(feature = "internals"))]
mod doctor;
#[cfg(feature = "internals")]
pub mod topo;
#[cfg(not(feature = "internals"))]
mod topo;
pub mod tools;
// (7. the CLI is bin/rankmesh.rs)
pub mod prelude;

// The root holds what a program names first; the rest is in the public
// modules above, each a user's namespace (tests/layers.rs caps the root).
pub use device::DeviceTensor;
pub use dtype::DType;
pub use error::{Error, Result};
pub use group::{Collectives, DeviceGroup, GroupCoordinator, Options, P2p, Runtime};
pub use object::{Gathers, Objects};
pub use op::ReduceOp;
pub use parallel::{Mesh, MeshLayout, ParallelState};
pub use stateless::StatelessGroup;
pub use tensor::{Element, Tensor};
pub use watch::OnHang;

/// The README's examples are compiled as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// docs/USAGE.md's examples are compiled as doc tests too.
#[doc = include_str!("../docs/USAGE.md")]
#[cfg(doctest)]
pub struct UsageDoctests;

/// docs/GPU.md's example is compiled as a doc test too.
#[doc = include_str!("../docs/GPU.md")]
#[cfg(doctest)]
pub struct GpuDocDoctests;
