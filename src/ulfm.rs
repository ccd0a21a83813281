//! A lost rank as an answer: MPI's User-Level Failure Mitigation (ULFM,
//! Open MPI 5 started with `mpirun --with-ft ulfm`). It says whether this
//! job has it, keeps the world ranks lost so far, and holds the calls that
//! revoke and shrink a communicator.
//!
//! The `MPIX_` calls are looked up in the process, not linked: one build
//! runs under every MPI, and where ULFM is missing or off a lost rank ends
//! the job as before. With it on, MPI calls return instead of aborting: the
//! error handler installed on the runtime's world (and inherited by every
//! communicator made from it) revokes the communicator, so that its other
//! members stop waiting too, records the failed ranks, and gives up the
//! process's calls ([`crate::wait::give_up`]). A call whose MPI routine
//! returned early is then failed by its landing pad, never returned with a
//! half-moved result.

use crate::error::Abandon;
use crate::wait::give_up;
use mpi::ffi;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// Open MPI's error classes of ULFM (`MPIX_ERR_PROC_FAILED`,
/// `MPIX_ERR_PROC_FAILED_PENDING`, `MPIX_ERR_REVOKED` in mpi.h).
const PROC_FAILED: c_int = 75;
const PROC_FAILED_PENDING: c_int = 76;
const REVOKED: c_int = 77;

/// How long a rank told of a revoked communicator waits for its MPI to
/// name the failed ranks.
const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

type CommFn = unsafe extern "C" fn(ffi::MPI_Comm) -> c_int;
type ShrinkFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Comm) -> c_int;
type GroupFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Group) -> c_int;
type AgreeFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut c_int) -> c_int;

/// The ULFM calls of the MPI library this process runs.
struct Calls {
    revoke: CommFn,
    shrink: ShrinkFn,
    get_failed: GroupFn,
    agree: AgreeFn,
}

/// Whether this job runs with ULFM on (set once, at start-up).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Whether this job lost a rank (in any world, shrunk or not).
static LOST_ANY: AtomicBool = AtomicBool::new(false);
/// World ranks (of the current world) known lost, sorted.
static LOST: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The current world, whose ranks [`LOST`] counts in.
static WORLD: Mutex<Option<CommHandle>> = Mutex::new(None);

/// Every live communicator of the runtime's groups ([`Kept::revocable`]): a
/// survivor that gives up revokes them all, so that a member blocked on
/// one of them for a peer that moved on to recovery returns too.
static COMMS: Mutex<Vec<CommHandle>> = Mutex::new(Vec::new());

/// A communicator handle kept here (a pointer in Open MPI, owned by the
/// runtime or by a [`Kept`]).
#[derive(Clone, Copy, PartialEq)]
struct CommHandle(ffi::MPI_Comm);
// SAFETY: a handle is an address MPI owns; only the thread that calls MPI
// (the error handler runs inside its calls) uses it.
unsafe impl Send for CommHandle {}

/// The function `name` of the libraries already loaded, as `F` (a
/// function pointer type).
///
/// # Safety
/// `F` must be the C signature of `name`.
unsafe fn symbol<F: Copy>(name: &std::ffi::CStr) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut libc::c_void>()) };
    // SAFETY: a lookup in the symbols already loaded.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: a function's address, read as the pointer type the caller
    // promised (of the same size, asserted above).
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut libc::c_void, F>(&p) })
}

/// The calls, when the MPI library in this process has them.
fn calls() -> Option<&'static Calls> {
    static CALLS: OnceLock<Option<Calls>> = OnceLock::new();
    CALLS
        .get_or_init(|| {
            // SAFETY: each type spells the C signature of the MPIX_ function
            // of that name (Open MPI's mpiext_ftmpi_c.h).
            unsafe {
                Some(Calls {
                    revoke: symbol::<CommFn>(c"MPIX_Comm_revoke")?,
                    shrink: symbol::<ShrinkFn>(c"MPIX_Comm_shrink")?,
                    get_failed: symbol::<GroupFn>(c"MPIX_Comm_get_failed")?,
                    agree: symbol::<AgreeFn>(c"MPIX_Comm_agree")?,
                })
            }
        })
        .as_ref()
}

/// Whether the launcher turned ULFM on (`mpirun --with-ft ulfm` or
/// `--mca mpi_ft_enable 1` export `OMPI_MCA_mpi_ft_enable`).
fn requested() -> bool {
    std::env::var("OMPI_MCA_mpi_ft_enable").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Whether this job survives a lost rank (ULFM on, and its calls found).
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// At start-up, on every rank alike: turns fault tolerance on where the
/// launcher asked for it and the library has it, installing the error
/// handler on `world` (the runtime's duplicate of the world, which every
/// later communicator inherits it from) and on `MPI_COMM_WORLD`. `Err`:
/// asked for, but this MPI is not Open MPI with ULFM's calls.
pub(crate) fn start(world: ffi::MPI_Comm) -> Result<bool, String> {
    if !requested() {
        return Ok(false);
    }
    let open_mpi = crate::mpi_abi::library_family(crate::mpi_abi::library_version())
        == Some(crate::mpi_abi::Family::OpenMpi);
    // The error classes above are Open MPI's.
    if !open_mpi || calls().is_none() {
        return Err(
            "OMPI_MCA_mpi_ft_enable asks for fault tolerance, but this MPI library is not \
                    Open MPI with ULFM's calls (MPIX_Comm_revoke, MPIX_Comm_shrink, \
                    MPIX_Comm_get_failed, MPIX_Comm_agree): build rankmesh against Open MPI 5"
                .into(),
        );
    }
    watch_world(world);
    ACTIVE.store(true, Ordering::Release);
    Ok(true)
}

/// Makes `world` the communicator lost ranks are counted in, with the
/// error handler on it; forgets the ranks lost from the one before.
pub(crate) fn watch_world(world: ffi::MPI_Comm) {
    // SAFETY: the handler has the signature MPI calls it with; the
    // variadic tail (unused) is passed in registers that a fixed-argument
    // function ignores (x86-64 and AArch64 Linux).
    unsafe {
        let handler: unsafe extern "C" fn(*mut ffi::MPI_Comm, *mut c_int) = on_error;
        let handler = std::mem::transmute::<
            unsafe extern "C" fn(*mut ffi::MPI_Comm, *mut c_int),
            unsafe extern "C" fn(*mut ffi::MPI_Comm, *mut c_int, ...),
        >(handler);
        let mut eh: ffi::MPI_Errhandler = std::mem::zeroed();
        ffi::MPI_Comm_create_errhandler(Some(handler), &mut eh);
        ffi::MPI_Comm_set_errhandler(world, eh);
        ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, eh);
        ffi::MPI_Errhandler_free(&mut eh);
    }
    *WORLD.lock().unwrap_or_else(|e| e.into_inner()) = Some(CommHandle(world));
    LOST.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// A communicator freed at drop unless a rank was lost: then it is left
/// allocated, so that Open MPI never gives its context id to a
/// communicator of the shrunk world while a message, a request or a
/// nonblocking collective's schedule of the old one may still be in
/// flight. (Freed, the survivors' first split after a shrink hung, and
/// sums across nodes came out wrong on some survivors.) A revocable one
/// is in [`COMMS`] meanwhile, for [`revoke_all`].
pub(crate) struct Kept {
    comm: std::mem::ManuallyDrop<mpi::topology::SimpleCommunicator>,
    /// In [`COMMS`] (under ULFM, for a revocable one).
    registered: Option<CommHandle>,
}

impl Kept {
    /// A communicator that [`revoke_all`] leaves alone (the world's: its
    /// shrink revokes it).
    pub(crate) fn new(comm: mpi::topology::SimpleCommunicator) -> Kept {
        Kept {
            comm: std::mem::ManuallyDrop::new(comm),
            registered: None,
        }
    }

    /// A group's communicator: a survivor that gives up revokes it
    /// ([`revoke_all`]), so that members blocked on it return. Nothing is
    /// registered without ULFM.
    pub(crate) fn revocable(comm: mpi::topology::SimpleCommunicator) -> Kept {
        let registered = active().then(|| {
            let handle = CommHandle(mpi::raw::AsRaw::as_raw(&comm));
            COMMS.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
            handle
        });
        Kept {
            comm: std::mem::ManuallyDrop::new(comm),
            registered,
        }
    }
}

impl std::ops::Deref for Kept {
    type Target = mpi::topology::SimpleCommunicator;
    fn deref(&self) -> &mpi::topology::SimpleCommunicator {
        &self.comm
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // Out of COMMS before it can be freed.
        if let Some(handle) = self.registered {
            COMMS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|c| *c != handle);
        }
        if !lost_any() {
            // SAFETY: taken once, here, and never used again.
            drop(unsafe { std::mem::ManuallyDrop::take(&mut self.comm) });
        }
    }
}

/// Revokes the world and every registered communicator: every survivor
/// blocked in any of them returns, whatever peer it waits for. A
/// survivor's calls given up for a loss do this, from the call's landing
/// pad (outside MPI).
pub(crate) fn revoke_all() {
    let Some(calls) = calls() else { return };
    let world = *WORLD.lock().unwrap_or_else(|e| e.into_inner());
    let comms = COMMS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for c in world.into_iter().chain(comms) {
        // SAFETY: registered handles are live (unregistered before their
        // free); revoking twice is harmless.
        unsafe { (calls.revoke)(c.0) };
    }
}

/// Records world ranks found lost (by MPI or by the watchdog); nothing
/// without ULFM, whose job ends with its first loss as it always did.
pub(crate) fn note_lost(ranks: impl IntoIterator<Item = usize>) {
    if !active() {
        return;
    }
    let mut lost = LOST.lock().unwrap_or_else(|e| e.into_inner());
    lost.extend(ranks);
    if !lost.is_empty() {
        LOST_ANY.store(true, Ordering::Relaxed);
    }
    lost.sort_unstable();
    lost.dedup();
}

/// The world lost ranks on purpose (`Runtime::retire`): finalising would
/// fence them as it does lost ones.
pub(crate) fn note_world_changed() {
    LOST_ANY.store(true, Ordering::Relaxed);
}

/// Whether this job lost a rank, in this world or one it shrank from.
pub(crate) fn lost_any() -> bool {
    LOST_ANY.load(Ordering::Relaxed)
}

/// The world ranks known lost so far, sorted.
pub(crate) fn lost() -> Vec<usize> {
    LOST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// How often [`loss_known`] asks MPI, where no loss is known yet.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

thread_local! {
    /// When [`loss_known`] may ask MPI next.
    static NEXT_ASK: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// Whether a rank of this world is known lost (never without ULFM). Where
/// none is known yet, MPI is asked at most every [`ASK_EVERY`]: its
/// progress takes in the launcher's notice of a failure on another node.
/// For waits outside any call (a device plane's deferred agreements): once
/// a rank is lost every survivor must shrink, so nothing waited for in
/// this world will come. The thread that calls MPI only.
pub(crate) fn loss_known() -> bool {
    if !active() {
        return false;
    }
    if !lost().is_empty() {
        return true;
    }
    let now = std::time::Instant::now();
    if NEXT_ASK.get().is_some_and(|at| now < at) {
        return false;
    }
    NEXT_ASK.set(Some(now + ASK_EVERY));
    // Copied out first: `failed_in_world` takes the lock again.
    let world = *WORLD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(world) = world {
        ask_mpi(world);
    }
    !lost().is_empty()
}

/// Notes the ranks of `world` that MPI knows failed, after driving its
/// progress once (which takes in the launcher's notice of a failure).
fn ask_mpi(world: CommHandle) {
    drive_progress();
    note_lost(failed_in_world(world.0));
}

/// One probe of this process's own communicator: it only drives MPI's
/// progress.
fn drive_progress() {
    let mut flag: c_int = 0;
    // SAFETY: a probe of MPI_COMM_SELF with valid out-pointers.
    unsafe {
        let mut status: ffi::MPI_Status = std::mem::zeroed();
        ffi::MPI_Iprobe(
            ffi::RSMPI_ANY_SOURCE,
            0,
            ffi::RSMPI_COMM_SELF,
            &mut flag,
            &mut status,
        );
    }
}

/// The world ranks known lost, after waiting [`NOTICE_WAIT`] at most for
/// MPI to name one where none is known yet: a rank told of a revoked
/// communicator learns who failed from the launcher's notice, which MPI
/// takes in while it progresses. Outside MPI calls only (the main thread,
/// in a call's landing pad).
pub(crate) fn lost_after_notice() -> Vec<usize> {
    let world = *WORLD.lock().unwrap_or_else(|e| e.into_inner());
    let Some(world) = world else {
        return lost();
    };
    let until = std::time::Instant::now() + NOTICE_WAIT;
    loop {
        let known = lost();
        if !known.is_empty() || std::time::Instant::now() >= until {
            return known;
        }
        ask_mpi(world);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The world ranks of `comm`'s members that MPI knows failed.
fn failed_in_world(comm: ffi::MPI_Comm) -> Vec<usize> {
    let (Some(calls), Some(world)) = (calls(), *WORLD.lock().unwrap_or_else(|e| e.into_inner()))
    else {
        return Vec::new();
    };
    // SAFETY: valid communicators; the groups are freed here.
    unsafe {
        let mut failed: ffi::MPI_Group = std::mem::zeroed();
        if (calls.get_failed)(comm, &mut failed) != 0 {
            return Vec::new();
        }
        let mut world_group: ffi::MPI_Group = std::mem::zeroed();
        ffi::MPI_Comm_group(world.0, &mut world_group);
        let in_world = translate(failed, world_group);
        ffi::MPI_Group_free(&mut failed);
        ffi::MPI_Group_free(&mut world_group);
        in_world.into_iter().flatten().collect()
    }
}

/// Where each rank of group `from` is in group `to` (`None`: not there).
///
/// # Safety
/// Both are valid groups.
unsafe fn translate(from: ffi::MPI_Group, to: ffi::MPI_Group) -> Vec<Option<usize>> {
    let mut n: c_int = 0;
    // SAFETY: the caller's group.
    unsafe { ffi::MPI_Group_size(from, &mut n) };
    let ranks: Vec<c_int> = (0..n).collect();
    let mut there = vec![0 as c_int; ranks.len()];
    // SAFETY: the caller's groups; both arrays hold `n` ranks.
    unsafe { ffi::MPI_Group_translate_ranks(from, n, ranks.as_ptr(), to, there.as_mut_ptr()) };
    // MPI_UNDEFINED is negative.
    there
        .into_iter()
        .map(|r| (r >= 0).then_some(r as usize))
        .collect()
}

/// The error handler of the world and every communicator made from it.
/// A failed or revoked peer: revoke the communicator (its other members'
/// calls return too), note who failed, give up this process's calls. Any
/// other error: MPI's default, the job ends with it.
unsafe extern "C" fn on_error(comm: *mut ffi::MPI_Comm, code: *mut c_int) {
    // SAFETY: MPI passes valid pointers to the communicator and the code.
    let (comm, code) = unsafe { (*comm, *code) };
    let mut class: c_int = 0;
    // SAFETY: an error code MPI just raised.
    unsafe { ffi::MPI_Error_class(code, &mut class) };
    if !matches!(class, PROC_FAILED | PROC_FAILED_PENDING | REVOKED) {
        let text = error_string(code);
        eprintln!("rankmesh: MPI error: {text}; ending the job");
        // SAFETY: as MPI_ERRORS_ARE_FATAL would.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
        return;
    }
    revoke(comm);
    let failed = failed_in_world(comm);
    note_lost(failed.iter().copied());
    let lost = lost();
    let what = match class {
        REVOKED if lost.is_empty() => {
            "a member revoked the communicator after a failure".to_string()
        }
        _ => format!("MPI reports world ranks {lost:?} failed"),
    };
    give_up::give_up(
        Abandon::PeerLeft,
        format!("cannot complete: {what} ({})", error_string(code)),
    );
}

/// MPI's text for `code`.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Revokes `comm`: every pending and later call on it, on every member,
/// returns `MPIX_ERR_REVOKED` (revoking twice is harmless).
pub(crate) fn revoke(comm: ffi::MPI_Comm) {
    if let Some(calls) = calls() {
        // SAFETY: a valid communicator.
        unsafe { (calls.revoke)(comm) };
    }
}

/// The survivors of `comm`, renumbered densely in their old order
/// (`MPIX_Comm_shrink`: collective over the survivors, which agree on the
/// set). The new communicator is confirmed whole with `MPIX_Comm_agree`; a
/// rank lost meanwhile is shrunk out again.
pub(crate) fn shrink(comm: ffi::MPI_Comm) -> Result<ffi::MPI_Comm, String> {
    let calls = calls().ok_or("this MPI library has no ULFM calls")?;
    let mut from = comm;
    // Each round loses a rank at least; a world of n cannot lose more.
    for _ in 0..=mpi_size(comm) {
        // SAFETY: valid handles; the new communicator is the caller's.
        unsafe {
            let mut new: ffi::MPI_Comm = std::mem::zeroed();
            let rc = (calls.shrink)(from, &mut new);
            if from != comm {
                ffi::MPI_Comm_free(&mut from);
            }
            if rc != 0 {
                return Err(format!("MPIX_Comm_shrink failed: {}", error_string(rc)));
            }
            let mut flag: c_int = 1;
            if (calls.agree)(new, &mut flag) == 0 {
                return Ok(new);
            }
            from = new;
        }
    }
    Err("MPIX_Comm_shrink: ranks kept failing while the survivors shrank the world".into())
}

/// The number of ranks of `comm`.
fn mpi_size(comm: ffi::MPI_Comm) -> usize {
    let mut n: c_int = 0;
    // SAFETY: a valid communicator.
    unsafe { ffi::MPI_Comm_size(comm, &mut n) };
    n.max(0) as usize
}

/// Where each rank of `old` is in `new` (`None`: not a member).
pub(crate) fn rank_map(old: ffi::MPI_Comm, new: ffi::MPI_Comm) -> Vec<Option<usize>> {
    // SAFETY: valid communicators; the groups are freed here.
    unsafe {
        let mut og: ffi::MPI_Group = std::mem::zeroed();
        let mut ng: ffi::MPI_Group = std::mem::zeroed();
        ffi::MPI_Comm_group(old, &mut og);
        ffi::MPI_Comm_group(new, &mut ng);
        let map = translate(og, ng);
        ffi::MPI_Group_free(&mut og);
        ffi::MPI_Group_free(&mut ng);
        map
    }
}
