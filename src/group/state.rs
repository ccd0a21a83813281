//! A group's state, by plane. [`Inner`](super::Inner) holds the device
//! state first and the host state second, ahead of its MPI communicator, so
//! Rust's field order is the drop order MPI and NCCL need: deferred device
//! agreements complete while the NCCL communicators they may abort still
//! exist; the NCCL communicators go before the MPI communicator their ids
//! came over; the host executors' windows and sub-communicators go before
//! the group's communicator; and every group goes before the `Runtime`
//! that finalises MPI (the `'rt` borrow). An emulator trial of tests/gpu.rs
//! (`drop_in_every_order`) drops groups, device results and the runtime in
//! every order a program can write.

use crate::agree::Deferred;
use crate::exec::hier::Hier;
use crate::exec::route::Planes;
use crate::exec::shm::ShmExec;
use crate::nccl::comm::Communicator as NcclComm;
use crate::op::CheckMode;
use crate::tensor::Tensor;
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// The device plane's state: NCCL communicators and the agreements of
/// device calls.
pub(super) struct DeviceState<'rt> {
    /// Posted device agreements (check mode `deferred`), made at the first
    /// such call. First field: completed (and any disagreement acted on)
    /// before the communicators below are destroyed.
    pub(super) deferred: OnceCell<Rc<Deferred>>,
    /// The group's NCCL communicator, created at its first device operation.
    pub(super) nccl: RefCell<Option<NcclComm<'rt>>>,
    /// Two-member NCCL communicators for point-to-point calls made before
    /// the group's own communicator exists, by peer group rank.
    pub(super) nccl_pairs: RefCell<HashMap<usize, NcclComm<'rt>>>,
    /// When device calls agree (alike on every member).
    pub(super) check: Cell<CheckMode>,
}

impl DeviceState<'_> {
    pub(super) fn new(check: CheckMode) -> Self {
        DeviceState {
            deferred: OnceCell::new(),
            nccl: RefCell::new(None),
            nccl_pairs: RefCell::new(HashMap::new()),
            check: Cell::new(check),
        }
    }
}

/// The host plane's state: the executor chosen when the group was made
/// (made at its first collective) and the scratch its packing reuses.
pub(super) struct HostState {
    /// The shared-memory executor, made at the group's first collective.
    pub(super) shm: OnceCell<ShmExec>,
    /// For a hierarchical group (decided, alike on every member, when the
    /// group is made): each member's node, by group rank.
    pub(super) hier_nodes: Option<Vec<usize>>,
    /// The fast paths, decided alike on every member when the group is
    /// made (a window when the members share a node; node-aware stages),
    /// as `exec::route` reads them.
    pub(super) planes: Planes,
    /// The hierarchical executor, made at the group's first collective.
    pub(super) hier: OnceCell<Hier>,
    /// Scratch buffers for packing (kept, so a hot loop allocates nothing).
    pub(super) scratch: RefCell<[Vec<u8>; 2]>,
    /// Scratch tensor for in-place reductions.
    pub(super) scratch_tensor: RefCell<Option<Tensor>>,
    /// Typed scratch for the reduce-scatters that pack or pad their input
    /// (the reduction needs typed tensors): the packed input and one block.
    pub(super) typed_scratch: RefCell<Option<(Tensor, Tensor)>>,
}

impl HostState {
    pub(super) fn new(shm_wanted: bool, hier_nodes: Option<Vec<usize>>, forced_hier: bool) -> Self {
        HostState {
            planes: Planes {
                shm: shm_wanted,
                hier: hier_nodes.is_some(),
                forced_hier,
            },
            shm: OnceCell::new(),
            hier_nodes,
            hier: OnceCell::new(),
            scratch: RefCell::new([Vec::new(), Vec::new()]),
            scratch_tensor: RefCell::new(None),
            typed_scratch: RefCell::new(None),
        }
    }
}
