//! The one error type of rankmesh.
//!
//! Every message names the operation, the group and the values involved, so a
//! line in a 512-rank log is enough to find the culprit.

use crate::op::Op;

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Result alias used by every fallible rankmesh function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in rankmesh. Its `Debug` is the readable
/// message too, so `fn main() -> rankmesh::Result<()>` prints that.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// MPI could not be initialised or the launcher environment is inconsistent.
    #[error("launch: {0}")]
    Launch(String),
    /// A start-up check that some rank failed (its `RANKMESH_*` variables,
    /// the launcher's view), agreed by every rank, each of which printed it
    /// to stderr while MPI was still up (a launcher that ends the job at the
    /// first failed rank would otherwise swallow the others' lines); or an
    /// MPI library of another ABI family than this build's headers, which
    /// every rank finds on its own before `MPI_Init`.
    #[error("launch: {0}")]
    Startup(String),
    /// Invalid parallel sizes or rank lists (checked before any communicator exists).
    #[error("invalid parallel layout: {0}")]
    Layout(String),
    /// A call whose arguments cannot work (a dim out of range, a rank
    /// outside the group, an output of the wrong shape). Raised identically
    /// on every rank of the group.
    #[error("{} on {group}: {msg}", op.name())]
    InvalidArgument {
        /// The operation.
        op: Op,
        /// Unique group name, e.g. `tp:1`.
        group: String,
        /// What is wrong, with the values involved.
        msg: String,
    },
    /// The ranks are in different calls or passed different arguments, or a
    /// peer sent a corrupt header. Raised on every rank involved.
    #[error("{} on {group}: {msg}", op.name())]
    Mismatch {
        /// The operation.
        op: Op,
        /// Unique group name.
        group: String,
        /// Who passed what.
        msg: String,
    },
    /// NCCL refused a call, failed asynchronously or was aborted.
    #[error("{} on {group}: {source}", op.name())]
    Nccl {
        /// The operation.
        op: Op,
        /// Unique group name.
        group: String,
        /// NCCL's code and text.
        source: NcclError,
    },
    /// Device work did not finish within `RANKMESH_TIMEOUT` (a lost or stuck
    /// peer); the group's NCCL communicators were aborted.
    #[error("{} on {group}: {msg}", op.name())]
    Timeout {
        /// The operation that was waiting.
        op: Op,
        /// Unique group name.
        group: String,
        /// What did not finish.
        msg: String,
    },
    /// A host call given up on, with `RANKMESH_ON_HANG=error` or by an
    /// interrupt ([`Runtime::set_interrupt_check`](crate::Runtime::set_interrupt_check)):
    /// no progress for `RANKMESH_TIMEOUT` (the message names the members
    /// missing and where they are), a member left, or this process was
    /// interrupted. The runtime is unusable after it: every later call is
    /// this error again, and dropping the runtime ends the job with
    /// [`Abandon::exit_code`] instead of finalising MPI under calls that
    /// never completed.
    #[error("{} on {group}: {msg}", op.name())]
    Abandoned {
        /// The operation given up on.
        op: Op,
        /// Unique group name.
        group: String,
        /// Why.
        why: Abandon,
        /// What happened, with the members concerned.
        msg: String,
    },
    /// A member of the call was lost, in a job that survives it (ULFM on:
    /// `mpirun --with-ft ulfm` under Open MPI 5). Every surviving member
    /// of the call gets it; the runtime's calls fail until the survivors
    /// call [`Runtime::shrink`](crate::Runtime::shrink), and dropping the
    /// runtime instead finalises MPI without ending the job.
    #[error("{} on {group}: world ranks {lost:?} lost: {msg}", op.name())]
    PeerLost {
        /// The operation that could not complete.
        op: Op,
        /// Unique group name.
        group: String,
        /// The world ranks known lost, sorted.
        lost: Vec<usize>,
        /// What happened.
        msg: String,
    },
    /// Bytes received from a peer that do not decode as the expected type.
    #[error("{} on {group}: cannot decode `{type_name}` sent by group rank {peer}: {msg}", op.name())]
    Decode {
        /// The operation.
        op: Op,
        /// Unique group name.
        group: String,
        /// Position of the sender in the group.
        peer: usize,
        /// Rust type the receiver asked for.
        type_name: &'static str,
        /// Decoder message.
        msg: String,
    },
    /// A value could not be serialised for the object plane.
    #[error("{} on {group}: cannot encode `{type_name}`: {msg}", op.name())]
    Encode {
        /// The operation.
        op: Op,
        /// Unique group name.
        group: String,
        /// Rust type being sent.
        type_name: &'static str,
        /// Encoder message.
        msg: String,
    },
    /// A tensor built or reshaped with inconsistent shape, data or dtype.
    #[error("tensor: {0}")]
    Tensor(String),
    /// Parallel state used before initialisation, after teardown, or overridden twice.
    #[error("parallel state: {0}")]
    State(String),
    /// A user function run by a helper (`main_first`, `main_only`, ...) failed
    /// on some rank; every rank of the group gets this error.
    #[error("{op} on {group}: the function failed on group rank {rank}: {msg}")]
    Failed {
        /// Helper name.
        op: &'static str,
        /// Unique group name.
        group: String,
        /// Group rank where the function failed.
        rank: usize,
        /// The function's error, as text.
        msg: String,
    },
    /// A shared-workspace file that is missing pieces, corrupt or from another run.
    #[error("workspace {path}: {msg}")]
    Workspace {
        /// File or directory concerned.
        path: std::path::PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The GPU stack (CUDA driver, device, NCCL library) is missing or unusable
    /// on this rank; the message says what was looked for and found.
    #[error("gpu: {0}")]
    Gpu(String),
    /// Something outside the op list (a CLI tool such as `bench` or `plot`,
    /// a local query such as `is_the_same_node_as`) cannot run as asked.
    #[error("{what} on {group}: {msg}")]
    Usage {
        /// The tool or function.
        what: &'static str,
        /// The group it ran on.
        group: String,
        /// What is wrong.
        msg: String,
    },
    /// A TCP link of a group formed across separately launched jobs
    /// ([`StatelessGroup::connect`](crate::StatelessGroup::connect)) failed:
    /// the rendezvous was unreachable, refused this process or timed out, or
    /// a peer closed its connection or broke the protocol.
    #[error("{group}: {msg}")]
    Connection {
        /// The group (`tcp://ADDR`).
        group: String,
        /// What failed, naming the peer and the address.
        msg: String,
    },
}

impl Error {
    /// A bad argument of `op` on `group`.
    pub(crate) fn invalid(op: Op, group: &str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            group: group.to_string(),
            msg: msg.into(),
        }
    }

    /// The error with `note` added, in parentheses, to the message of a
    /// rejected call (an invalid argument or a mismatch): what this rank
    /// alone knows about it. Other errors are returned as they are.
    pub(crate) fn noted(self, note: impl std::fmt::Display) -> Self {
        match self {
            Error::InvalidArgument { op, group, msg } => Error::InvalidArgument {
                op,
                group,
                msg: format!("{msg} ({note})"),
            },
            Error::Mismatch { op, group, msg } => Error::Mismatch {
                op,
                group,
                msg: format!("{msg} ({note})"),
            },
            e => e,
        }
    }

    /// Ranks (or the two ends of a link) that passed different calls.
    pub(crate) fn mismatch(op: Op, group: &str, msg: impl Into<String>) -> Self {
        Error::Mismatch {
            op,
            group: group.to_string(),
            msg: msg.into(),
        }
    }

    /// An NCCL failure of `op` on `group`.
    pub(crate) fn nccl(op: Op, group: &str, source: NcclError) -> Self {
        Error::Nccl {
            op,
            group: group.to_string(),
            source,
        }
    }

    /// The agreement's verdict as an error of `op` on `group`.
    pub(crate) fn rejected(op: Op, group: &str, r: Rejection) -> Self {
        match r {
            Rejection::Mismatch(msg) => Error::mismatch(op, group, msg),
            Rejection::Invalid(msg) => Error::invalid(op, group, msg),
        }
    }

    /// The operation a collective-plane error names, if any.
    pub fn op(&self) -> Option<Op> {
        match self {
            Error::InvalidArgument { op, .. }
            | Error::Mismatch { op, .. }
            | Error::Nccl { op, .. }
            | Error::Timeout { op, .. }
            | Error::Abandoned { op, .. }
            | Error::PeerLost { op, .. }
            | Error::Decode { op, .. }
            | Error::Encode { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// Exit code of a job the watchdog ends (`MPI_Abort`): `EX_TEMPFAIL` of
/// sysexits.h, apart from `timeout(1)`'s 124 so the two can be told apart.
pub const TIMEOUT_EXIT: i32 = Abandon::Timeout.exit_code();

/// Exit code of a job ended because a member of a call left (its runtime
/// dropped after an error or a panic, or its process gone): `EX_PROTOCOL`.
pub const LEFT_EXIT: i32 = Abandon::PeerLeft.exit_code();

/// Why a call was given up on ([`Error::Abandoned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandon {
    /// No progress for `RANKMESH_TIMEOUT`: a member never entered the call
    /// or stopped inside it.
    Timeout,
    /// A member of the call left (an error, a panic, its process gone).
    PeerLeft,
    /// This process was interrupted (its interrupt check said so).
    Interrupted,
}

impl Abandon {
    /// The exit code of a job ended after it: 75 and 76 as when the
    /// watchdog ends the job itself, 130 (128 + SIGINT) for an interrupt.
    pub const fn exit_code(self) -> i32 {
        match self {
            Abandon::Timeout => 75,
            Abandon::PeerLeft => 76,
            Abandon::Interrupted => 130,
        }
    }
}

/// What an executor's body can fail with; the dispatch path adds the op and
/// the group.
pub(crate) enum Fault {
    /// An NCCL call failed.
    Nccl(NcclError),
    /// Anything else, already a complete error.
    Error(Error),
    /// A peer's payload was not the length both sides agreed on.
    Short {
        /// Group rank of the sender.
        peer: usize,
        /// Bytes that arrived in the piece.
        got: usize,
        /// Bytes the piece should have had.
        want: usize,
    },
    /// The shared-memory executor's first synchronisation found the ranks'
    /// descriptors different (or an output unusable); the dispatch path
    /// replaces this with the named error it makes from every descriptor.
    Disagreed,
}

impl From<Error> for Fault {
    fn from(e: Error) -> Self {
        Fault::Error(e)
    }
}

impl From<NcclError> for Fault {
    fn from(e: NcclError) -> Self {
        Fault::Nccl(e)
    }
}

impl Fault {
    /// The complete error of `op` on `group`.
    pub(crate) fn into_error(self, op: Op, group: &str) -> Error {
        match self {
            Fault::Nccl(source) => Error::nccl(op, group, source),
            Fault::Error(e) => e,
            Fault::Short { peer, got, want } => Error::Mismatch {
                op,
                group: group.to_string(),
                msg: format!(
                    "group rank {peer} sent {got} bytes in a piece that should hold {want}: \
                     its payload does not match the header it sent"
                ),
            },
            Fault::Disagreed => Error::Mismatch {
                op,
                group: group.to_string(),
                msg: "the members passed different calls".into(),
            },
        }
    }
}

/// Why the ranks' descriptors do not allow a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The ranks are in different calls or passed different arguments, or a
    /// descriptor is corrupt.
    Mismatch(String),
    /// Every rank passed the same call, but its arguments cannot work.
    Invalid(String),
}

impl Rejection {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Rejection::Mismatch(m) | Rejection::Invalid(m) => m,
        }
    }
}

/// A failed NCCL call: the code, and `"NCCL <call>: <ncclGetErrorString>
/// (code N): <ncclGetLastError>"` as the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct NcclError {
    /// `ncclResult_t` (0 for an error rankmesh raised, e.g. a communicator
    /// already aborted).
    pub code: i32,
    /// The whole message.
    pub msg: String,
}

impl NcclError {
    /// An error rankmesh raises itself (no NCCL code).
    pub(crate) fn other(msg: impl Into<String>) -> NcclError {
        NcclError {
            code: 0,
            msg: msg.into(),
        }
    }
}
