//! `use rankmesh::prelude::*;`: the runtime, groups, meshes, the traits that carry
//! the op list, objects, gathers and main-rank helpers, and the tensor types
//! a program needs.

pub use crate::{
    Collectives, DType, DeviceGroup, DeviceTensor, Error, Gathers, GroupCoordinator, MainRank,
    Mesh, MeshLayout, Objects, OnGroup, P2p, ParallelState, ReduceOp, Result, Runtime,
    StatelessGroup, Tensor, TensorDict, TensorDicts,
};
