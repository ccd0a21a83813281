//! Stateless groups (FastVideo's `StatelessProcessGroup`), the MPI way: a
//! metadata group over any list of world ranks, formed by its members only.
//!
//! FastVideo builds these on a TCP key-value store with counters and expiring
//! keys; here MPI matches messages by communicator, source and order, so a
//! message from one sender can never be taken for another's, and nothing expires.

use crate::collectives::Collectives;
use crate::error::Result;
use crate::group::GroupCoordinator;
use crate::world::Runtime;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A metadata-only group over a list of world ranks.
///
/// ```
/// # let rt = rankmesh::Runtime::init()?;
/// use rankmesh::StatelessGroup;
/// let me = rt.rank();
/// let solo = StatelessGroup::create(&rt, &[me])?; // only the listed ranks call this
/// assert_eq!(solo.all_gather_obj(&"hello".to_string())?, vec!["hello".to_string()]);
/// # Ok::<(), rankmesh::Error>(())
/// ```
pub struct StatelessGroup<'rt> {
    group: GroupCoordinator<'rt>,
}

impl<'rt> StatelessGroup<'rt> {
    /// Forms the group; only the listed world ranks call this (see [`Runtime::subgroup`]).
    pub fn create(rt: &'rt Runtime, ranks: &[usize]) -> Result<Self> {
        Ok(StatelessGroup {
            group: rt.subgroup("stateless", ranks)?,
        })
    }

    /// Position of this process in the group.
    pub fn rank(&self) -> usize {
        self.group.rank_in_group()
    }

    /// Number of members.
    pub fn world_size(&self) -> usize {
        self.group.size()
    }

    /// Sends `obj` to group rank `dst`.
    pub fn send_obj<T: Serialize>(&self, obj: &T, dst: usize) -> Result<()> {
        self.group.send_object(obj, dst)
    }

    /// Receives the next object sent by group rank `src`.
    pub fn recv_obj<T: DeserializeOwned>(&self, src: usize) -> Result<T> {
        self.group.recv_object(src)
    }

    /// Group rank `src`'s object on every member.
    pub fn broadcast_obj<T: Serialize + DeserializeOwned>(
        &self,
        obj: Option<&T>,
        src: usize,
    ) -> Result<T> {
        self.group.broadcast_object(obj, src)
    }

    /// Every member's object, in group-rank order.
    pub fn all_gather_obj<T: Serialize + DeserializeOwned>(&self, obj: &T) -> Result<Vec<T>> {
        self.group.all_gather_object(obj)
    }

    /// Waits for every member.
    pub fn barrier(&self) -> Result<()> {
        self.group.barrier()
    }

    /// The underlying group (for tensor collectives as well).
    pub fn group(&self) -> &GroupCoordinator<'rt> {
        &self.group
    }
}
