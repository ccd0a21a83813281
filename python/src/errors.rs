//! rankmesh's errors as Python exceptions: one `rankmesh.Error` subclass per
//! kind, carrying the library's message (the same on every rank that fails).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(rankmesh, Error, PyException, "Every error rankmesh raises.");
create_exception!(
    rankmesh,
    MismatchError,
    Error,
    "The members are in different calls, or passed different arguments."
);
create_exception!(rankmesh, InvalidArgumentError, Error, "Every member passed the same call, but its arguments cannot work (a bad dim, a shape that does not divide).");
create_exception!(
    rankmesh,
    TensorError,
    Error,
    "A tensor that cannot be used as given (its size, layout or memory)."
);
create_exception!(
    rankmesh,
    StateError,
    Error,
    "A call out of order: groups not initialised, or initialised twice."
);
create_exception!(
    rankmesh,
    TimeoutError,
    Error,
    "A call that did not complete in time."
);
create_exception!(
    rankmesh,
    PeerError,
    Error,
    "A member failed or left, or a link to it broke."
);
create_exception!(
    rankmesh,
    ObjectError,
    Error,
    "An object that cannot cross ranks (its type, or bytes a peer sent)."
);
create_exception!(
    rankmesh,
    StartupError,
    Error,
    "The job could not start (launcher, MPI, layout)."
);
create_exception!(
    rankmesh,
    PeerLostError,
    PeerError,
    "A member of the call was lost in a job that survives it (ULFM: mpirun --with-ft ulfm under Open MPI 5); .lost names the world ranks."
);
create_exception!(rankmesh, GpuError, Error, "The device plane: CUDA or NCCL.");

/// The exception a signal handler raised while a call waited (Ctrl-C's
/// `KeyboardInterrupt`), for the call it interrupted to raise.
static PENDING: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);

/// The thread that started the runtime: the one whose waits check for
/// Python's signals.
static PYTHON_THREAD: std::sync::OnceLock<std::thread::ThreadId> = std::sync::OnceLock::new();

/// Makes this thread the one whose waits run Python's signal handlers.
pub fn note_python_thread() {
    let _ = PYTHON_THREAD.set(std::thread::current().id());
}

/// The runtime's interrupt check: runs Python's signal handlers (they run
/// only when the main thread holds the GIL, which a waiting call released).
/// `true` when one raised: the call is given up and raises that. Other
/// threads' waits (torch's autograd threads in the torch backend) skip it:
/// Python runs handlers on its main thread only, and taking the GIL there
/// could wait on a thread that waits for their MPI lock.
pub fn interrupted() -> bool {
    if PYTHON_THREAD.get() != Some(&std::thread::current().id()) {
        return false;
    }
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            *PENDING.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            true
        }
    })
}

/// The exception a signal handler raised, if one is waiting to be raised
/// (the torch backend's calls raise it themselves).
pub fn take_pending() -> Option<PyErr> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// The exception of a library error.
pub fn to_py(e: rankmesh::Error) -> PyErr {
    use rankmesh::{error::Abandon, Error as E};
    let msg = e.to_string();
    match e {
        E::Abandoned { why, .. } => match why {
            Abandon::Interrupted => take_pending().unwrap_or_else(|| Error::new_err(msg)),
            Abandon::Timeout => TimeoutError::new_err(msg),
            Abandon::PeerLeft => PeerError::new_err(msg),
        },
        E::PeerLost { lost, .. } => {
            let err = PeerLostError::new_err(msg);
            Python::attach(|py| {
                let _ = err.value(py).setattr("lost", lost);
            });
            err
        }
        E::Mismatch { .. } => MismatchError::new_err(msg),
        E::InvalidArgument { .. } | E::Usage { .. } => InvalidArgumentError::new_err(msg),
        E::Tensor(_) => TensorError::new_err(msg),
        E::State(_) | E::Workspace { .. } => StateError::new_err(msg),
        E::Timeout { .. } => TimeoutError::new_err(msg),
        E::Failed { .. } | E::Connection { .. } => PeerError::new_err(msg),
        E::Decode { .. } | E::Encode { .. } => ObjectError::new_err(msg),
        E::Launch(_) | E::Startup(_) | E::Layout(_) => StartupError::new_err(msg),
        E::Nccl { .. } | E::Gpu(_) => GpuError::new_err(msg),
        // The library's error enum is non-exhaustive: a kind added later is
        // still an Error.
        _ => Error::new_err(msg),
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("TensorError", py.get_type::<TensorError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("PeerError", py.get_type::<PeerError>())?;
    m.add("PeerLostError", py.get_type::<PeerLostError>())?;
    m.add("ObjectError", py.get_type::<ObjectError>())?;
    m.add("StartupError", py.get_type::<StartupError>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    Ok(())
}
