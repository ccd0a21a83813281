//! The one error type of rankmesh.
//!
//! Every message names the operation, the group and the values involved, so a
//! line in a 512-rank log is enough to find the culprit.

/// Result alias used by every fallible rankmesh function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in rankmesh.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MPI could not be initialised or the launcher environment is inconsistent.
    #[error("launch: {0}")]
    Launch(String),
    /// Invalid parallel sizes or rank lists (checked before any communicator exists).
    #[error("invalid parallel layout: {0}")]
    Layout(String),
    /// A collective or point-to-point call with arguments that cannot work.
    /// Raised identically on every rank of the group.
    #[error("{op} on {group}: {msg}")]
    Collective {
        /// Operation name, e.g. `all_gather`.
        op: &'static str,
        /// Unique group name, e.g. `tp:1`.
        group: String,
        /// What is wrong, with the values involved.
        msg: String,
    },
    /// Bytes received from a peer that do not decode as the expected type.
    #[error("{op} on {group}: cannot decode `{type_name}` sent by group rank {peer}: {msg}")]
    Decode {
        /// Operation name.
        op: &'static str,
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
    #[error("{op} on {group}: cannot encode `{type_name}`: {msg}")]
    Encode {
        /// Operation name.
        op: &'static str,
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
}

impl Error {
    pub(crate) fn collective(op: &'static str, group: &str, msg: impl Into<String>) -> Self {
        Error::Collective {
            op,
            group: group.to_string(),
            msg: msg.into(),
        }
    }
}
