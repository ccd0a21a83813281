//! Agreement: every rank of a group checks every rank's call before data
//! moves, so a bad or mismatched call is the same named error on every rank
//! instead of a hang. Written once here for every group kind (host, device,
//! stateless host, stateless device):
//!
//! - [`descriptor`]: the fixed-size call descriptor, its digest, and the
//!   verdicts every rank reaches on the same descriptors (collectives,
//!   point-to-point pairs, a stateless group's one-way frames), with the
//!   admitted-call memo;
//! - `deferred`, `ring`, `posted`, `next`: the `deferred` check mode's
//!   posted agreements (rings in a node's shared window, or MPI
//!   all-gathers, each answering with a `next::Next`);
//! - `list`: agreement on rank lists among the listed ranks only, and the
//!   validation of group lists.

mod deferred;
pub mod descriptor;
mod list;
mod next;
mod posted;
mod ring;

pub(crate) use deferred::{Deferred, Posts, Verdict};
#[cfg(feature = "internals")]
pub use descriptor::MAX_DIMS;
pub use descriptor::{agree, agree_peers};
pub(crate) use descriptor::{agree_frame, Admitted, Check, CheckFn, Frame};
pub use descriptor::{Descriptor, ViewProblem};
pub(crate) use list::{
    agree_on_list, agree_on_request, check_rank_list, fnv1a, validate_group_lists,
};
pub(crate) use ring::RingArea;
pub(crate) use ring::{reset as reset_ring, RING_BYTES, SCAN_EVERY};
