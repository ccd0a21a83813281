//! The start-up watch: `Runtime::init` under a deadline
//! (`RANKMESH_INIT_TIMEOUT`), like every call after it.
//!
//! Start-up is collective from its first step: `MPI_Init` returns only once
//! every rank of the job has called it, and the world communicator's
//! duplicate, the node split and the exchanges that follow wait for every
//! rank too. A rank that never starts (stuck before init, stopped, or a plain
//! MPI program in the job) would leave the others waiting forever, silently.
//! A thread started before `MPI_Init` waits for start-up to finish; when the
//! deadline passes first, it names the step, asks the launcher's registry
//! ([`arrival`](super::arrival)) which ranks never arrived and where the
//! launcher placed them (under hydra, this node's marks:
//! [`node_marks`](super::node_marks)), prints that, and ends the job:
//! `MPI_Abort` once MPI is up, a plain exit before (the launcher then ends
//! the job).

use super::arrival::Registry;
use super::node_marks::{env_number, name_absent, NodeMarks};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the registry may wait for each rank's mark, and for all of
/// them, once the deadline has passed: the report must come out while the
/// launcher still lets this rank speak.
const ASK_EACH: Duration = Duration::from_secs(1);
const ASK_ALL: Duration = Duration::from_secs(5);
/// How long a rank that has reported waits before it ends the job: the
/// launcher kills every rank once one ends, and the others, which ran out
/// of time within the same second or so, are still asking the registry.
const LINGER: Duration = Duration::from_secs(2);

struct State {
    step: &'static str,
    mpi_up: bool,
    done: bool,
}

/// Watches `Runtime::init` from before `MPI_Init` until [`finish`](Self::finish).
pub(crate) struct StartupWatch {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// This rank's identity before MPI can tell it: the registry's, or the
/// launcher's environment.
fn launcher_rank(registry: Option<&Registry>, marks: Option<&NodeMarks>) -> Option<usize> {
    registry
        .map(Registry::rank)
        .or(marks.map(NodeMarks::rank))
        .or_else(|| {
            [
                "OMPI_COMM_WORLD_RANK",
                "PMIX_RANK",
                "PMI_RANK",
                "SLURM_PROCID",
            ]
            .into_iter()
            .find_map(env_number)
        })
}

/// The job's size as the launcher's environment says (the registry's own
/// answer wins where it has one).
fn launcher_size() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"]
        .into_iter()
        .find_map(env_number)
        .unwrap_or(1)
}

/// This host's name.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    if rc == 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "?".into()
    }
}

impl StartupWatch {
    /// Starts watching (before `MPI_Init`); `None` for `timeout` waits
    /// forever and starts nothing.
    pub fn start(timeout: Option<Duration>) -> StartupWatch {
        let shared = Arc::new((
            Mutex::new(State {
                step: "MPI_Init",
                mpi_up: false,
                done: false,
            }),
            Condvar::new(),
        ));
        let thread = timeout.map(|limit| {
            let shared = shared.clone();
            let host = host_name();
            // The mark goes in before MPI_Init, which waits for every rank.
            let registry = Registry::arrive(&host);
            let marks = registry.is_none().then(NodeMarks::arrive).flatten();
            std::thread::Builder::new()
                .name("rankmesh-startup".into())
                .spawn(move || watch(&shared, limit, &host, registry, marks))
                .expect("spawning the start-up watch")
        });
        StartupWatch { shared, thread }
    }

    /// Start-up now waits in `step` (`MPI_Init` is done once any later step
    /// is named).
    pub fn step(&self, step: &'static str) {
        let mut s = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        s.step = step;
        s.mpi_up = true;
    }

    /// Start-up is done: the watch ends.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).done = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StartupWatch {
    /// A start-up that failed with an error ends its watch too.
    fn drop(&mut self) {
        self.stop();
    }
}

/// The watch thread: waits for the end of start-up or the deadline.
fn watch(
    shared: &(Mutex<State>, Condvar),
    limit: Duration,
    host: &str,
    registry: Option<Registry>,
    mut marks: Option<NodeMarks>,
) {
    let deadline = Instant::now() + limit;
    let (lock, cv) = shared;
    let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !s.done {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let (step, mpi_up) = (s.step, s.mpi_up);
            drop(s);
            let line = report(limit, step, host, registry.as_ref(), marks.as_ref());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            std::thread::sleep(LINGER);
            // Neither exit below runs destructors.
            drop(marks.take());
            if mpi_up {
                // SAFETY: MPI is initialised; MPI_Abort only asks the
                // launcher to end the job (as the watchdog does).
                unsafe { mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, super::TIMEOUT_EXIT) };
            }
            // Before MPI is up there is nothing to abort: a rank that exits
            // non-zero makes the launcher end the job. _exit: the main
            // thread is inside MPI_Init, whose exit handlers must not run.
            let _ = std::io::Write::flush(&mut std::io::stdout());
            // SAFETY: ends the process; nothing after it runs.
            unsafe { libc::_exit(super::TIMEOUT_EXIT) };
        }
        s = cv
            .wait_timeout(s, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// The message of a rank whose start-up ran out of time in `step`.
fn report(
    limit: Duration,
    step: &str,
    host: &str,
    registry: Option<&Registry>,
    marks: Option<&NodeMarks>,
) -> String {
    let me = launcher_rank(registry, marks).map_or("?".to_string(), |r| r.to_string());
    let head = format!(
        "rankmesh: rank {me} on {host}: start-up did not finish within {:.1} s (RANKMESH_INIT_TIMEOUT): waiting in {step}",
        limit.as_secs_f64()
    );
    let tail = match (registry, marks) {
        (Some(reg), _) => {
            let absent = reg.absent(launcher_size(), ASK_EACH, ASK_ALL);
            name_absent(&absent.ranks, absent.unasked)
        }
        (None, Some(marks)) => marks.report(host),
        (None, None) => "; the ranks that have not started cannot be named here (rankmesh asks the launcher's PMIx registry under Open MPI 4's mpirun and srun --mpi=pmix, and marks arrivals on each node under hydra's mpiexec; a rank that has not started rankmesh holds up every other)".to_string(),
    };
    format!("{head}{tail}; ending the job\n")
}
