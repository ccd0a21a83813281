//! `use rankmesh::prelude::*;`: the runtime, groups, the op list's traits
//! and the tensor types a program needs.

pub use crate::{
    Collectives, DType, DeviceGroup, DeviceTensor, Error, GroupCoordinator, ParallelState,
    ReduceOp, Result, Runtime, StatelessGroup, Tensor, TensorDict, TensorDicts,
};
