//! `use rankmesh::prelude::*;`: the runtime, groups, meshes, the traits that carry
//! the op list, objects, gathers and main-rank helpers, and the tensor types
//! a program needs.

pub use crate::{
    helpers::MainRank, object::TensorDict, object::TensorDicts, parallel::OnGroup, Collectives,
    DType, DeviceGroup, DeviceTensor, Error, Gathers, GroupCoordinator, Mesh, MeshLayout, Objects,
    P2p, ParallelState, ReduceOp, Result, Runtime, StatelessGroup, Tensor,
};
