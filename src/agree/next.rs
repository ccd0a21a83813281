//! What a backend of the posted agreements (`ring`, `posted`) hands
//! `deferred` when asked for its oldest agreement: a leaf both backends
//! and their user import.

use crate::agree::Descriptor;

/// The oldest posted agreement, as a backend sees it.
pub(super) enum Next {
    /// Nothing (more) to complete now.
    Done,
    /// Agreed, and consumed.
    Same,
    /// Every member's descriptor, for the verdict.
    Check {
        mine: Descriptor,
        all: Vec<Descriptor>,
    },
    /// A member did not post it before the deadline: this rank's descriptor.
    Missing(Descriptor),
    /// Group rank `rank` closed its posts before this one (its NCCL
    /// communicator failed): this rank's descriptor.
    Closed { rank: usize, mine: Descriptor },
    /// A member that has not posted it was lost (ULFM noted its process
    /// gone): this rank's descriptor.
    Lost(Descriptor),
}
