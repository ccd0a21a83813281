//! MPI start-up and the facts about the world: ranks, nodes, hosts.

use super::connect::{connect, failures, shrink_root, split, status_record, SplitParent};
use super::launcher::{self, MpiView};
use super::GroupCoordinator;
use crate::agree::Descriptor;
use crate::agree::{agree_on_request, check_rank_list, fnv1a, validate_group_lists};
use crate::device::Gpu;
use crate::error::{Abandon, Error, Result};
use crate::exec::executor::ExecChoice;
use crate::exec::shm::ShmWindow;
use crate::op::CheckMode;
use crate::op::Op;
use crate::parse::parse_whole_size;
use crate::placement::{self, BindPolicy, Placement};
use crate::watch::{
    local_ipv4, Board, GroupWatch, OnHang, PeerFacts, Secret, Service, StartupWatch, Watchdog,
    ADDRS, SECRET_BYTES,
};
use mpi::environment::Universe;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;
use std::cell::{Cell, OnceCell, RefCell};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::rc::Rc;

/// Bytes of a host name carried in the start-up exchange.
const HOST_BYTES: usize = 256;

/// Per-rank facts gathered once at start-up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RankInfo {
    /// World rank.
    pub rank: usize,
    /// Host name (`MPI_Get_processor_name`).
    pub host: String,
    /// Index of the rank's node, numbered by the lowest world rank on each node.
    pub node: usize,
    /// Rank among the processes of its node.
    pub local_rank: usize,
    /// Number of processes on its node.
    pub local_size: usize,
}

/// Where every rank of the world runs. Node identity comes from
/// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`, never from host names or env vars.
#[derive(Clone, Debug)]
pub struct WorldInfo {
    /// This process's world rank.
    pub rank: usize,
    /// Number of ranks in the world.
    pub size: usize,
    /// Number of nodes.
    pub node_count: usize,
    /// Facts about every rank, indexed by world rank.
    pub ranks: Vec<RankInfo>,
}

impl WorldInfo {
    /// This rank's facts.
    pub fn me(&self) -> &RankInfo {
        &self.ranks[self.rank]
    }
}

/// Start-up options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Largest single MPI message in bytes; bigger transfers are chunked.
    /// Defaults to 1 GiB, overridable with `RANKMESH_MAX_MESSAGE_BYTES`.
    pub max_message_bytes: usize,
    /// CPU binding applied at start (`RANKMESH_BIND`); `None` leaves the
    /// launcher's binding, if any, in place.
    pub bind: Option<BindPolicy>,
    /// How long a rank waits for its peers to enter a call before the job is
    /// aborted with a message naming the call (`RANKMESH_TIMEOUT` seconds,
    /// default 600, 0 = wait forever).
    pub timeout: Option<std::time::Duration>,
    /// How long start-up (`Runtime::init`: `MPI_Init`, the world's
    /// communicators, the node split, the exchanges after them) may take
    /// before the job is ended with a message naming the ranks that never
    /// arrived (`RANKMESH_INIT_TIMEOUT` seconds, default 300, 0 = wait
    /// forever). Set it the same on every rank.
    pub init_timeout: Option<std::time::Duration>,
    /// Largest serialised object a rank accepts from a peer
    /// (`RANKMESH_MAX_OBJECT_BYTES`, default 4 GiB): a header announcing
    /// more is an error before anything is allocated. Set it the same on
    /// every rank.
    pub max_object_bytes: u64,
    /// Directory where a rank the watchdog stops writes its flight record
    /// (`RANKMESH_TRACE_DIR`); it goes to stderr either way.
    pub trace_dir: Option<PathBuf>,
    /// Which executor host collectives use (`RANKMESH_HOST_PLANE`:
    /// `auto`, the default, picks shared memory for groups on one node).
    /// Set it the same on every rank: a group's members check it.
    pub host_plane: ExecChoice,
    /// Bytes of each of the two data areas a rank owns in a group's
    /// shared-memory window (`RANKMESH_SHM_CHUNK_BYTES`, default 1 MiB,
    /// rounded up to whole pages).
    pub shm_chunk_bytes: usize,
    /// Whether large all-to-alls within a node read each peer's buffer with
    /// one copy (`RANKMESH_SINGLE_COPY`: `auto`, the default, `cma` or
    /// `none`; the last two as Open MPI's `btl_vader_single_copy_mechanism`
    /// spells them). Where the kernel refuses, a window falls back to two
    /// copies by itself.
    pub single_copy: SingleCopy,
    /// When device calls agree on their descriptors (`RANKMESH_CHECK`:
    /// `strict`, `deferred` — the default — or `off`). Set it the same on
    /// every rank: a group's members check it.
    pub check: CheckMode,
    /// Where each rank's status service listens
    /// (`RANKMESH_STATUS_ADDRS`, comma-separated IPv4 addresses, at most 4:
    /// a management network); empty, the default, means this host's
    /// outward addresses, with loopback only for a job on one node.
    pub status_addrs: Vec<Ipv4Addr>,
    /// Whether a group gathering objects moves those of ranks on the root's
    /// node through a shared-memory window (`RANKMESH_GATHER_SHM`, default
    /// on; `0` sends them all through MPI).
    pub gather_shm: bool,
    /// Whether a group of one runs its device ops through NCCL (a one-rank
    /// communicator, as PyTorch does) instead of as local copies
    /// (`RANKMESH_NCCL_FOR_ONE=1`; how one GPU checks NCCL's own kernels).
    pub nccl_for_one: bool,
    /// An NCCL communicator of more members than this bootstraps from
    /// several roots, one unique id per this many ranks
    /// (`RANKMESH_NCCL_RANKS_PER_ROOT`, default 256; needs NCCL 2.23's
    /// `ncclCommInitRankScalable`). Set it alike on every rank: a group's
    /// members check it.
    pub nccl_ranks_per_root: usize,
    /// The NCCL library file tried before the usual search
    /// (`RANKMESH_NCCL_LIB`).
    pub nccl_lib: Option<String>,
    /// Which device each local rank drives (`RANKMESH_DEVICE`: one ordinal,
    /// or a comma-separated list indexed by local rank); by default, the
    /// local rank's (checked against the visible devices on first use).
    pub device: Option<String>,
    /// Whether a world of one inside a Slurm allocation of more tasks is
    /// intended (`RANKMESH_ALLOW_SINGLETON=1`); by default it is refused
    /// at start-up as a launcher mistake.
    pub allow_singleton: bool,
    /// How the MPI executor calls MPI's collectives (`RANKMESH_MPI_CALLS`:
    /// `auto`, the default, `blocking` or `nonblocking`).
    pub mpi_calls: MpiCalls,
    /// What a call that cannot complete does (`RANKMESH_ON_HANG`: `abort`,
    /// the default, ends the job; `error` fails the call, see [`OnHang`]).
    pub on_hang: OnHang,
    /// Whether calls may come from any thread, one at a time
    /// (MPI_THREAD_SERIALIZED; the caller serialises them, as the Python
    /// package does for torch's autograd threads). Off by default: MPI is
    /// asked for FUNNELED, and calls stay on the thread that started it.
    pub serialized: bool,
    /// Whether ranks may share a GPU (`RANKMESH_SHARE_GPU=1`), a test mode:
    /// each rank without an `NCCL_HOSTID` is given its own before MPI and
    /// NCCL start, so NCCL sees it as a node of its own and moves its data
    /// through the network transport (slow). Off by default: ranks of one
    /// node on one GPU are refused, as NCCL refuses them.
    pub share_gpu: bool,
}

/// Whether all-to-alls within a node read each peer's blocks with one copy
/// (`process_vm_readv`) instead of two through the group's window. The
/// ranks of a node agree at start-up on the block size from which they
/// do ([`Runtime::single_copy_from`]): the largest any of them asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SingleCopy {
    /// From where this machine makes one read cheaper than two copies,
    /// timed at start-up (about 1 ms); never where it does not (a VM whose
    /// kernel pins pages slowly).
    #[default]
    Auto,
    /// From 16 KiB blocks, whatever the timing says.
    Cma,
    /// Never: every block moves through the window.
    Off,
}

/// How the MPI executor (and the call agreement off shared memory) calls
/// MPI's collectives. Whatever each rank asks, the job agrees on one way
/// at start-up: nonblocking if any rank's choice says so.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MpiCalls {
    /// Blocking, unless the ranks of some node share CPUs (their bindings
    /// or quota leave fewer CPUs than ranks) and the MPI does not yield
    /// inside its own blocking calls there (MPICH, Intel MPI, Open MPI
    /// whose launcher did not see the oversubscription).
    #[default]
    Auto,
    /// MPI's blocking calls (they may poll a core while waiting).
    Blocking,
    /// Started nonblocking and waited for by rankmesh's wait policy
    /// (spin briefly, then yield and nap): for nodes where processes the
    /// CPU hint cannot see (data-loader workers) hold cores; on an idle
    /// node each call costs about 0.3 µs more.
    Nonblocking,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_message_bytes: 1 << 30,
            bind: None,
            timeout: Some(std::time::Duration::from_secs(600)),
            init_timeout: Some(std::time::Duration::from_secs(300)),
            max_object_bytes: 1 << 32,
            trace_dir: None,
            host_plane: ExecChoice::Auto,
            shm_chunk_bytes: crate::exec::shm::DEFAULT_CHUNK,
            single_copy: SingleCopy::Auto,
            check: CheckMode::Deferred,
            status_addrs: Vec::new(),
            gather_shm: true,
            nccl_for_one: false,
            nccl_ranks_per_root: 256,
            nccl_lib: None,
            device: None,
            allow_singleton: false,
            mpi_calls: MpiCalls::Auto,
            on_hang: OnHang::Abort,
            serialized: false,
            share_gpu: false,
        }
    }
}

impl Options {
    /// Defaults overridden by the `RANKMESH_*` environment variables.
    pub fn from_env() -> Result<Options> {
        let mut o = Options::default();
        o.read_limits()?;
        o.read_host_plane()?;
        o.read_device_plane()?;
        o.read_launch()?;
        Ok(o)
    }

    /// Sizes and time limits.
    fn read_limits(&mut self) -> Result<()> {
        if let Some(v) = var("RANKMESH_MAX_MESSAGE_BYTES") {
            self.max_message_bytes =
                byte_count("RANKMESH_MAX_MESSAGE_BYTES", &v, 1, i32::MAX as u64)? as usize;
        }
        if let Some(v) = var("RANKMESH_MAX_OBJECT_BYTES") {
            self.max_object_bytes =
                byte_count("RANKMESH_MAX_OBJECT_BYTES", &v, 1, MAX_OBJECT_BYTES_LIMIT)?;
        }
        if let Some(v) = var("RANKMESH_TIMEOUT") {
            self.timeout = parse_timeout("RANKMESH_TIMEOUT", &v)?;
        }
        if let Some(v) = var("RANKMESH_INIT_TIMEOUT") {
            self.init_timeout = parse_timeout("RANKMESH_INIT_TIMEOUT", &v)?;
        }
        if let Some(v) = var("RANKMESH_SHM_CHUNK_BYTES") {
            self.shm_chunk_bytes =
                byte_count("RANKMESH_SHM_CHUNK_BYTES", &v, 4096, MAX_SHM_CHUNK as u64)? as usize;
        }
        Ok(())
    }

    /// How host calls move, wait, and are checked.
    fn read_host_plane(&mut self) -> Result<()> {
        if let Some(v) = var("RANKMESH_HOST_PLANE") {
            self.host_plane = v.parse()?;
        }
        if let Some(v) = var("RANKMESH_SINGLE_COPY") {
            let ways = [
                ("auto", SingleCopy::Auto),
                ("cma", SingleCopy::Cma),
                ("none", SingleCopy::Off),
            ];
            self.single_copy = one_of("RANKMESH_SINGLE_COPY", &v, &ways)?;
        }
        if let Some(v) = var("RANKMESH_MPI_CALLS") {
            let ways = [
                ("auto", MpiCalls::Auto),
                ("blocking", MpiCalls::Blocking),
                ("nonblocking", MpiCalls::Nonblocking),
            ];
            self.mpi_calls = one_of("RANKMESH_MPI_CALLS", &v, &ways)?;
        }
        if let Some(v) = var("RANKMESH_ON_HANG") {
            let ways = [("abort", OnHang::Abort), ("error", OnHang::Error)];
            self.on_hang = one_of("RANKMESH_ON_HANG", &v, &ways)?;
        }
        if let Some(v) = var("RANKMESH_CHECK") {
            self.check = v
                .parse()
                .map_err(|e| Error::Launch(format!("RANKMESH_CHECK={:?}: {e}", v.trim())))?;
        }
        if let Some(v) = var("RANKMESH_GATHER_SHM") {
            self.gather_shm = on_off("RANKMESH_GATHER_SHM", &v)?;
        }
        Ok(())
    }

    /// NCCL and the GPU.
    fn read_device_plane(&mut self) -> Result<()> {
        if let Some(v) = var("RANKMESH_NCCL_FOR_ONE") {
            self.nccl_for_one = on_off("RANKMESH_NCCL_FOR_ONE", &v)?;
        }
        if let Some(v) = var("RANKMESH_NCCL_RANKS_PER_ROOT") {
            self.nccl_ranks_per_root = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    Error::Launch(format!(
                        "RANKMESH_NCCL_RANKS_PER_ROOT={v:?} is not a positive whole number"
                    ))
                })?;
        }
        if let Some(v) = var("RANKMESH_NCCL_LIB") {
            self.nccl_lib = Some(v);
        }
        if let Some(v) = var("RANKMESH_DEVICE") {
            self.device = Some(v);
        }
        if let Some(v) = var("RANKMESH_SHARE_GPU") {
            self.share_gpu = on_off("RANKMESH_SHARE_GPU", &v)?;
        }
        Ok(())
    }

    /// Where the job starts, binds, traces and serves its status.
    fn read_launch(&mut self) -> Result<()> {
        if let Some(v) = var("RANKMESH_TRACE_DIR") {
            if v.is_empty() {
                return Err(Error::Launch("RANKMESH_TRACE_DIR is set but empty".into()));
            }
            std::fs::create_dir_all(&v).map_err(|e| {
                Error::Launch(format!("RANKMESH_TRACE_DIR={v:?} cannot be created: {e}"))
            })?;
            self.trace_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = var("RANKMESH_BIND") {
            self.bind = Some(v.parse()?);
        }
        if let Some(v) = var("RANKMESH_ALLOW_SINGLETON") {
            self.allow_singleton = on_off("RANKMESH_ALLOW_SINGLETON", &v)?;
        }
        if let Some(v) = var("RANKMESH_STATUS_ADDRS") {
            self.status_addrs = v
                .split(',')
                .map(|a| a.trim().parse::<Ipv4Addr>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()
                .filter(|a| (1..=ADDRS).contains(&a.len()))
                .ok_or_else(|| {
                    Error::Launch(format!(
                        "RANKMESH_STATUS_ADDRS={v:?} is not 1 to {ADDRS} comma-separated IPv4 addresses"
                    ))
                })?;
        }
        Ok(())
    }
}

/// What runs before `MPI_Init`: the panic note, the library's ABI check
/// (before any call that a wrong library would crash in: each rank finds
/// the same mismatch on its own, so none waits for another), and
/// `NCCL_HOSTID`, which NCCL reads once at its first call and MPI's own
/// threads may read once MPI starts.
fn before_mpi(options: &Options) -> Result<()> {
    note_panics();
    if let Err(why) = crate::mpi_abi::check_library() {
        return Err(refuse_start(None, why));
    }
    if options.share_gpu {
        give_own_nccl_host();
    }
    Ok(())
}

/// The launcher's checks on every rank, and this rank's own start-up error
/// found before MPI (`refused`: its options), agreed before the next
/// collective step so that no rank returns while the others wait; the
/// checks' warnings when every rank passed.
fn agree_on_checks(
    world_comm: &SimpleCommunicator,
    info: &WorldInfo,
    options: &Options,
    refused: Option<Error>,
    startup: &StartupWatch,
) -> Result<Vec<String>> {
    let me = info.me();
    let view = MpiView {
        rank: info.rank,
        size: info.size,
        local_rank: me.local_rank,
        local_size: me.local_size,
    };
    let env = |k: &str| std::env::var(k).ok();
    let checked = launcher::check(&env, &view, options.allow_singleton);
    startup.step("the start-up checks' agreement (MPI_Allgather)");
    let mine = match (&refused, &checked) {
        (Some(Error::Launch(m)), _) | (None, Err(Error::Launch(m))) => Some(m.clone()),
        (Some(e), _) | (None, Err(e)) => Some(e.to_string()),
        _ => None,
    };
    if let Err(why) = agree_on_start(world_comm, mine.as_deref()) {
        // Before MPI is finalised (which waits for every rank), so no rank
        // exits before all have said it.
        return Err(refuse_start(Some(info.rank), why));
    }
    checked
}

/// What rank `rank` warns of at start-up besides the launcher's checks:
/// GPUs shared for tests (rank 0 says it once), and a thread level below
/// the one asked for (`(granted, wanted)`).
fn start_warnings(
    options: &Options,
    rank: usize,
    (granted, wanted): (Threading, Threading),
) -> Vec<String> {
    let mut warnings = Vec::new();
    if options.share_gpu && rank == 0 {
        warnings.push(
            "RANKMESH_SHARE_GPU=1: ranks may share a GPU; each is a node of its own to NCCL \
             (NCCL_HOSTID), which moves their data through its network transport: slow, \
             for tests"
                .into(),
        );
    }
    if granted < wanted {
        warnings.push(format!(
            "MPI granted thread level {granted:?} where rankmesh asked for {wanted:?}; \
             rankmesh keeps all MPI calls on one thread"
        ));
    }
    warnings
}

/// How MPI's collectives wait, agreed by the job: a node whose ranks share
/// CPUs makes its host-plane waits yield first and, unless the MPI yields
/// inside its own blocking calls there, any such node makes the whole job's
/// MPI executor wait by that policy too (every member of a communicator
/// must call a collective the same way).
fn choose_mpi_waits(
    world_comm: &SimpleCommunicator,
    node_comm: &SimpleCommunicator,
    options: &Options,
    startup: &StartupWatch,
) {
    startup.step("the node's CPU sets (MPI_Allgather)");
    let shared = super::executors::note_shared_cpus_among(node_comm);
    let crowded = match options.mpi_calls {
        // A call waiting inside a blocking MPI routine cannot be given up:
        // where calls that hang are to fail, rankmesh waits.
        MpiCalls::Auto if options.on_hang == OnHang::Error => true,
        MpiCalls::Auto => shared && !crate::mpi_ext::yields_when_idle(),
        MpiCalls::Blocking => false,
        MpiCalls::Nonblocking => true,
    };
    startup.step("whether any node is crowded (MPI_Allreduce)");
    let mut anywhere = 0u8;
    world_comm.all_reduce_into(
        &u8::from(crowded),
        &mut anywhere,
        mpi::collective::SystemOperation::max(),
    );
    crate::exec::mpi_calls::wait_by_policy(anywhere != 0);
}

/// The variable `name`, when set (and valid Unicode).
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value of `name` among `ways` (by its word, spaces trimmed).
fn one_of<T: Copy>(name: &str, v: &str, ways: &[(&str, T)]) -> Result<T> {
    match ways.iter().find(|(word, _)| *word == v.trim()) {
        Some((_, way)) => Ok(*way),
        None => {
            let words: Vec<&str> = ways.iter().map(|(w, _)| *w).collect();
            Err(Error::Launch(format!(
                "{name}={v:?} is not one of {}",
                words.join(", ")
            )))
        }
    }
}

fn on_off(name: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(Error::Launch(format!("{name}={v:?} is not 0 or 1"))),
    }
}

/// Environment variable `name`'s value `v` as a byte count in `lo..=hi`.
fn byte_count(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64> {
    parse_whole_size(v)
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| Error::Launch(format!("{name}={v:?} is not a byte count in {lo}..={hi}")))
}

/// The block size from which the ranks of `node` (collective over it) read
/// peers' all-to-all blocks with one copy: the largest any of them asks
/// (`Off`, or a machine where a read never pays, asks never), so a
/// group's members always take the same phases. Timed only where the
/// node has peers to read from.
fn agree_single_copy(node: &SimpleCommunicator, setting: SingleCopy) -> Option<usize> {
    use crate::exec::shm::SINGLE_COPY_FROM;
    use mpi::collective::SystemOperation;
    const NEVER: u64 = u64::MAX;
    // The timing is collective over the node: every rank takes part where
    // any rank asks for it (the settings may differ among ranks).
    let asks = u8::from(setting == SingleCopy::Auto && node.size() > 1);
    let mut any_asks = 0u8;
    node.all_reduce_into(&asks, &mut any_asks, SystemOperation::max());
    let timed = (any_asks != 0)
        .then(|| crate::exec::single_copy_pays_from(node, SINGLE_COPY_FROM))
        .flatten();
    let mine = match setting {
        SingleCopy::Off => NEVER,
        SingleCopy::Cma => SINGLE_COPY_FROM as u64,
        SingleCopy::Auto if node.size() == 1 => SINGLE_COPY_FROM as u64,
        SingleCopy::Auto => timed.map_or(NEVER, |n| n as u64),
    };
    let mut agreed = NEVER;
    node.all_reduce_into(&mine, &mut agreed, SystemOperation::max());
    (agreed != NEVER).then_some(agreed as usize)
}

/// Largest `RANKMESH_SHM_CHUNK_BYTES` (1 GiB): two of them per rank and group.
const MAX_SHM_CHUNK: usize = 1 << 30;

/// Highest `RANKMESH_MAX_OBJECT_BYTES` (1 TiB): the bound exists to stop
/// a forged header, so it cannot be lifted altogether.
const MAX_OBJECT_BYTES_LIMIT: u64 = 1 << 40;

/// Longest non-zero timeout (one year): longer is a typo, not a wish.
const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;
/// Shortest non-zero timeout: below it, healthy calls would be killed.
const MIN_TIMEOUT_SECS: f64 = 0.1;

/// A timeout variable `name`: 0 (wait forever) or seconds in 0.1 ..= one year.
fn parse_timeout(name: &str, v: &str) -> Result<Option<std::time::Duration>> {
    let secs: f64 = v
        .trim()
        .parse()
        .map_err(|_| Error::Launch(format!("{name}={v:?} is not a number of seconds")))?;
    if secs == 0.0 {
        return Ok(None);
    }
    if !(MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(&secs) {
        return Err(Error::Launch(format!(
            "{name}={v:?} is out of range: 0 (never time out) or {MIN_TIMEOUT_SECS} ..= {MAX_TIMEOUT_SECS} seconds"
        )));
    }
    Ok(Some(std::time::Duration::from_secs_f64(secs)))
}

/// Owner of MPI for the process. Every communicator borrows it, so none can
/// outlive MPI finalisation, which happens when the `Runtime` is dropped.
pub struct Runtime {
    // Field order is drop order: communicators before the universe.
    /// The world's NCCL communicator once [`connect_devices`](Runtime::connect_devices)
    /// made it: the parent every later group's communicator is split from.
    /// Before the GPU, whose context it uses.
    device_root: RefCell<Option<SplitParent>>,
    /// Opened at the first device call; the error is kept so every later
    /// call reports the same thing.
    gpu: OnceCell<std::result::Result<Gpu, String>>,
    /// Every group's shared-memory window, in creation order: freed here,
    /// before MPI finalisation (see `exec::shm`).
    shm_windows: RefCell<Vec<Rc<ShmWindow>>>,
    world_comm: crate::ulfm::Kept,
    info: WorldInfo,
    options: Options,
    threading: Threading,
    warnings: Vec<String>,
    placement: Option<Placement>,
    /// Watches group creation over the world (members: every rank).
    creation: GroupWatch,
    creations: Cell<u64>,
    /// The node's agreed [`Runtime::single_copy_from`].
    single_copy_from: Option<usize>,
    watchdog: Watchdog,
    /// Handed its MPI to the runtime of its survivors ([`Runtime::shrink`]):
    /// its drop only lets go of what it held.
    shrunk: Cell<bool>,
    /// MPI itself, finalised when dropped (`None` once shrunk).
    universe: Option<Universe>,
}

impl Runtime {
    /// Initialises MPI (a world of 1 when not started by a launcher) with
    /// options from the environment.
    ///
    /// A `RANKMESH_*` variable that one rank cannot use is still an error on
    /// every rank, at once: the rank starts MPI anyway, so that its peers'
    /// start-up completes, and all of them return the same error naming it.
    pub fn init() -> Result<Runtime> {
        Runtime::init_adjusted(|_| {})
    }

    /// As [`init`](Self::init), with the options from the environment
    /// adjusted by `adjust` first (a command line's overrides).
    pub fn init_adjusted(adjust: impl FnOnce(&mut Options)) -> Result<Runtime> {
        match Options::from_env() {
            Ok(mut options) => {
                adjust(&mut options);
                Runtime::start(options, None)
            }
            Err(e) => Runtime::start(Options::default(), Some(e)),
        }
    }

    /// Initialises MPI with explicit options.
    pub fn init_with(options: Options) -> Result<Runtime> {
        Runtime::start(options, None)
    }

    /// Starts MPI and the runtime; `refused`: this rank's own start-up error
    /// found before MPI (its options), reported on every rank.
    fn start(options: Options, refused: Option<Error>) -> Result<Runtime> {
        before_mpi(&options)?;
        let startup = StartupWatch::start(options.init_timeout);
        // FUNNELED is the lowest level that is true of this process: it has
        // helper threads (the watchdog, the status service, a stateless
        // group's TCP writers), which SINGLE promises it does not, but only
        // the main thread calls MPI — except the watchdog's MPI_Abort, which
        // ends the job. MULTIPLE would slow every call for nothing.
        // SERIALIZED costs nothing over FUNNELED in Open MPI and MPICH: both
        // lock their internals only for MULTIPLE.
        let wanted = if options.serialized {
            Threading::Serialized
        } else {
            Threading::Funneled
        };
        let (universe, threading) = mpi::initialize_with_threading(wanted).ok_or_else(|| {
            Error::Launch("MPI is already initialised: create one Runtime per process".into())
        })?;
        startup.step("the world communicator's duplicate (MPI_Comm_dup)");
        let world_comm = universe.world().duplicate();
        // Same on every rank (the launcher's environment, the library).
        let refused = refused.or(crate::ulfm::start(world_comm.as_raw())
            .err()
            .map(Error::Launch));
        Runtime::build(
            universe,
            threading,
            world_comm,
            options,
            Some(refused),
            startup,
        )
    }

    /// The runtime over `world_comm` (MPI started, `universe`): the world's
    /// facts, the start-up checks (`Some(refused)`: this rank's own error,
    /// reported on every rank; `None`: none, the world was shrunk and the
    /// launcher's counts no longer hold), placement, the timed choices and
    /// the watchdog.
    fn build(
        universe: Universe,
        threading: Threading,
        world_comm: SimpleCommunicator,
        options: Options,
        refused: Option<Option<Error>>,
        startup: StartupWatch,
    ) -> Result<Runtime> {
        let wanted = if options.serialized {
            Threading::Serialized
        } else {
            Threading::Funneled
        };
        let (info, node_comm) = gather_world_info(&world_comm, &startup)?;
        let mut warnings = match refused {
            Some(refused) => agree_on_checks(&world_comm, &info, &options, refused, &startup)?,
            None => Vec::new(),
        };
        startup.step("the binding's agreement (MPI_Allgather)");
        let me = info.me();
        let placement = match options.bind {
            Some(policy) => Some(bind_everywhere(
                &world_comm,
                policy,
                me.local_rank,
                me.local_size,
                options.device.as_deref(),
            )?),
            None => None,
        };
        warnings.extend(start_warnings(&options, info.rank, (threading, wanted)));
        for w in &warnings {
            tracing::warn!(rank = info.rank, "{w}");
        }
        tracing::debug!(
            rank = info.rank,
            size = info.size,
            nodes = info.node_count,
            "MPI initialised"
        );
        // After the binding, which decides whether a node's ranks share CPUs.
        choose_mpi_waits(&world_comm, &node_comm, &options, &startup);
        startup.step("how copies across cache-line offsets run here (timed)");
        let by_memcpy = crate::exec::misaligned_by_memcpy();
        tracing::debug!(
            "copies whose ends disagree within a cache line: {}",
            if by_memcpy {
                "memcpy"
            } else {
                "vector loop (memcpy slower here)"
            }
        );
        startup.step("where single copies pay on this node (timed, MPI_Allreduce)");
        let single_copy_from = agree_single_copy(&node_comm, options.single_copy);
        startup.step("the watchdog's start (status board, service addresses)");
        let watchdog = start_watchdog(&world_comm, &info, node_comm, &options);
        startup.finish();
        let everyone: Vec<usize> = (0..info.size).collect();
        let creation = watchdog.register("world".into(), &everyone);
        Ok(Runtime {
            device_root: RefCell::new(None),
            gpu: OnceCell::new(),
            shm_windows: RefCell::new(Vec::new()),
            world_comm: crate::ulfm::Kept::new(world_comm),
            info,
            options,
            threading,
            warnings,
            placement,
            creation,
            creations: Cell::new(0),
            single_copy_from,
            watchdog,
            shrunk: Cell::new(false),
            universe: Some(universe),
        })
    }

    /// The world communicator, for tools that measure MPI itself (doctor).
    pub(crate) fn world_comm(&self) -> &SimpleCommunicator {
        &self.world_comm
    }

    /// Facts about the world.
    pub fn world(&self) -> &WorldInfo {
        &self.info
    }

    /// This rank's GPU plane: CUDA driver, device, stream and NCCL, opened
    /// on first use (local, not collective). The error says what is missing
    /// (driver, device, NCCL library and every path tried).
    pub fn gpu(&self) -> Result<&Gpu> {
        let me = self.info.me();
        self.gpu
            .get_or_init(|| {
                let o = &self.options;
                let (device, nccl) = (o.device.as_deref(), o.nccl_lib.as_deref());
                Gpu::open(me.local_rank, me.local_size, device, nccl, o.timeout).map_err(
                    |e| match e {
                        Error::Gpu(m) => m,
                        e => e.to_string(),
                    },
                )
            })
            .as_ref()
            .map_err(|m| Error::Gpu(m.clone()))
    }

    /// This process's world rank.
    pub fn rank(&self) -> usize {
        self.info.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.info.size
    }

    /// The application has printed its error itself. When this runtime is
    /// dropped after a failed call, it still tells its peers why it left
    /// (they are named the error at once), but prints nothing more.
    pub fn error_reported(&self) {
        self.watchdog.error_reported();
    }

    /// Ends this rank's part in the job with the application's verdict, for
    /// programs that handle rankmesh's errors themselves (a Python script
    /// that catches an exception and goes on). `None`: a clean exit, even
    /// if the latest call failed. `Some(why)`: peers still in a call with
    /// this rank are told `why` at once, as after an unhandled error.
    /// Dropping the runtime without this names the latest failed call.
    pub fn finish(self, failure: Option<String>) {
        self.watchdog.verdict(failure);
    }

    /// Sets the interrupt check: a function that a call blocked waiting
    /// for its peers runs on its own thread every 50 ms (never while the
    /// call makes progress or spins). When it returns `true` the call is
    /// given up: it fails with [`Error::Abandoned`] of
    /// [`Abandon::Interrupted`](crate::error::Abandon::Interrupted), its peers are
    /// told that this rank left, and the runtime is done (see
    /// [`Error::Abandoned`]). The Python package checks for Ctrl-C here.
    /// `None` removes it. A call waiting inside a blocking MPI routine is
    /// not interrupted.
    pub fn set_interrupt_check(&self, check: Option<fn() -> bool>) {
        crate::wait::give_up::set_interrupt_check(check);
    }

    /// Why this process gave a call up ([`Error::Abandoned`]), if it did:
    /// every later call fails with that, and dropping the runtime ends the
    /// job.
    pub fn given_up(&self) -> Option<(crate::error::Abandon, String)> {
        crate::wait::give_up::given_up()
    }

    /// The block size from which all-to-alls within this node read each
    /// peer's blocks with one copy, as its ranks agreed at start-up (see
    /// [`SingleCopy`]); `None`: every block moves through the window.
    pub fn single_copy_from(&self) -> Option<usize> {
        self.single_copy_from
    }

    /// Start-up options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Thread level MPI granted.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// Whether MPI lets calls come from any thread, one at a time (it
    /// granted SERIALIZED or more).
    pub fn calls_from_any_thread(&self) -> bool {
        self.threading >= Threading::Serialized
    }

    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// Keeps a group's shared window until the runtime frees every window.
    pub(crate) fn keep_window(&self, window: Rc<ShmWindow>) {
        self.shm_windows.borrow_mut().push(window);
    }

    /// This rank's flight record: its last calls (group, call number, op,
    /// shape, when each started, how long it took and whether it failed),
    /// oldest first. The watchdog prints it when it ends a hung job; call it
    /// yourself for a post-mortem of an `Err`.
    pub fn flight_record(&self) -> String {
        self.watchdog
            .flight_record(&format!("rankmesh: rank {}", self.info.rank))
    }

    /// Runs `f`, a step of group creation collective over the world, under
    /// the watchdog (a rank missing from it is named, not waited for).
    pub(crate) fn creating<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let mut desc = Descriptor::new(Op::CreateGroup, &[]);
        desc.seq = self.creations.get();
        self.creations.set(desc.seq + 1);
        let call = self.creation.call(&desc);
        call.run(Op::CreateGroup, self.creation.name(), f)
    }

    /// The placement rankmesh applied at start, when a binding policy was set.
    pub fn applied_placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// How this job calls MPI's collectives, as agreed at start-up
    /// ([`MpiCalls::Blocking`] or [`MpiCalls::Nonblocking`]; see
    /// [`Options::mpi_calls`]).
    pub fn mpi_calls(&self) -> MpiCalls {
        match crate::exec::mpi_calls::waits_by_policy() {
            true => MpiCalls::Nonblocking,
            false => MpiCalls::Blocking,
        }
    }

    /// Where this rank's status service listens (the job's addresses, one
    /// port; empty when it did not start): what a firewall rule or an audit
    /// of the node's open ports needs. It answers only the job's members.
    pub fn status_service(&self) -> Vec<std::net::SocketAddrV4> {
        self.watchdog().service_addrs()
    }

    /// Launcher disagreements found at start-up (also logged).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A group over the whole world, named `world`.
    pub fn world_group(&self) -> Result<GroupCoordinator<'_>> {
        self.creating(|| {
            let group = GroupCoordinator::new(self, self.world_comm.duplicate(), "world".into())?;
            let everyone = [(0..self.size()).collect::<Vec<_>>()];
            if let Some(comm) = self.split_devices(&everyone, "world")? {
                group.adopt_nccl(comm);
            }
            Ok(group)
        })
    }

    /// Creates the world's NCCL communicator on this rank's GPU: the job's
    /// one NCCL bootstrap (unique ids over MPI, non-blocking creation under
    /// `RANKMESH_TIMEOUT`). Every group made afterwards by
    /// [`world_group`](Self::world_group), [`split_groups`](Self::split_groups)
    /// or a [`Mesh`](crate::Mesh) gets its communicator from this one with
    /// `ncclCommSplit`, at creation, with no bootstrap of its own. Groups made
    /// before, [`subgroup`](Self::subgroup)s and stateless groups bootstrap
    /// their own on first device use. Collective over the world; a second
    /// call does nothing. Needs NCCL 2.18 or newer to split (older ones:
    /// groups keep their own bootstrap).
    pub fn connect_devices(&self) -> Result<()> {
        if self.device_root.borrow().is_some() {
            return Ok(());
        }
        self.creating(|| {
            let gpu = self.gpu();
            let verdict =
                self.agree_on_world("a GPU for the world's NCCL communicator", 0, gpu.is_ok());
            let gpu = gpu?;
            verdict?;
            let world = GroupCoordinator::new(self, self.world_comm.duplicate(), "world".into())?;
            let comm = connect(&world, gpu)?;
            gpu.register_root(comm.state());
            let cc = gpu.info().compute_capability;
            let mut all = vec![0u32; 2 * self.size()];
            self.world_comm
                .all_gather_into(&[cc.0, cc.1][..], &mut all[..]);
            let sm = all.chunks(2).map(|c| (c[0], c[1])).collect();
            *self.device_root.borrow_mut() = Some(SplitParent { comm, sm });
            Ok(())
        })
    }

    /// After [`connect_devices`](Self::connect_devices): this rank's
    /// communicator of `lists` split from the world's (collective over the
    /// world); `None` before it, or for a rank in no list.
    fn split_devices(
        &self,
        lists: &[Vec<usize>],
        name: &str,
    ) -> Result<Option<crate::nccl::comm::Communicator<'static>>> {
        let root = self.device_root.borrow();
        let Some(parent) = root.as_ref() else {
            return Ok(None);
        };
        if parent.comm.api().comm_split.is_none() {
            return Ok(None);
        }
        split(self, parent, self.gpu()?, lists, name)
    }

    /// Builds one group per list with a single `MPI_Comm_split` over the world
    /// (collective: every rank passes the same lists). Returns the group that
    /// holds this rank, `None` if it is in no list. Groups are named
    /// `{name}:{index of the list}`.
    pub fn split_groups(
        &self,
        name: &str,
        lists: &[Vec<usize>],
    ) -> Result<Option<GroupCoordinator<'_>>> {
        self.creating(|| self.split_groups_watched(name, lists))
    }

    fn split_groups_watched(
        &self,
        name: &str,
        lists: &[Vec<usize>],
    ) -> Result<Option<GroupCoordinator<'_>>> {
        // Agree on validity and on the lists themselves before splitting, so a
        // rank with different lists errors instead of joining the wrong group.
        let local = validate_group_lists(self.size(), lists);
        let digest = fnv1a(format!("{name}{lists:?}").as_bytes());
        let verdict = self.agree_on_world(
            &format!("the group lists for {name}"),
            digest,
            local.is_ok(),
        );
        local?;
        verdict?;
        let index = lists.iter().position(|l| l.contains(&self.rank()));
        let color = index.map_or(Color::undefined(), |i| Color::with_value(i as i32));
        let key = index.map_or(0, |i| {
            lists[i].iter().position(|r| *r == self.rank()).unwrap_or(0)
        });
        let comm = self.world_comm.split_by_color_with_key(color, key as i32);
        let group = match (index, comm) {
            (Some(i), Some(comm)) => {
                let group = GroupCoordinator::new(self, comm, format!("{name}:{i}"))?;
                debug_assert_eq!(group.ranks(), lists[i].as_slice());
                Some(group)
            }
            _ => None,
        };
        // Every world rank takes part in the split, members of no list too.
        let label = index.map_or_else(|| format!("{name} (no group)"), |i| format!("{name}:{i}"));
        if let Some(device) = self.split_devices(lists, &label)? {
            if let Some(g) = &group {
                g.adopt_nccl(device);
            }
        }
        Ok(group)
    }

    /// Builds a group over `ranks` (world ranks, in group-rank order) with
    /// `MPI_Comm_create_group`: only the listed ranks call it, the others are
    /// not involved. The list must be non-empty, without duplicates, inside
    /// the world and contain the caller; every member must pass the same list
    /// (checked once the group exists).
    pub fn subgroup(&self, name: &str, ranks: &[usize]) -> Result<GroupCoordinator<'_>> {
        check_rank_list(ranks, self.size(), self.rank(), "world")?;
        // Members only: watched as a group of the listed ranks.
        let watch = self
            .watchdog
            .register(format!("{name}{ranks:?} (being created)").into(), ranks);
        watch
            .call(&Descriptor::new(Op::CreateGroup, &[]))
            .run(Op::CreateGroup, name, || self.subgroup_watched(name, ranks))
    }

    fn subgroup_watched(&self, name: &str, ranks: &[usize]) -> Result<GroupCoordinator<'_>> {
        crate::agree::agree_on_list(&self.world_comm, ranks, self.rank())?;
        let as_i32: Vec<i32> = ranks.iter().map(|r| *r as i32).collect();
        let group = self.world_comm.group().include(&as_i32);
        let comm = self
            .world_comm
            .split_by_subgroup_with_tag(&group, SUBGROUP_TAG)
            .ok_or_else(|| {
                Error::Layout(format!(
                    "MPI_Comm_create_group for {name} {ranks:?} returned no communicator"
                ))
            })?;
        GroupCoordinator::new(self, comm, format!("{name}{ranks:?}"))
    }

    /// Every rank's verdict on a world-collective request (`local_ok`) and a
    /// digest of what it asked for: an `Err` on every rank when any rank
    /// rejects the request or asked for something else (a rank that rejects
    /// it reports its own reason; this returns `Ok` there). Collective.
    pub(crate) fn agree_on_world(&self, what: &str, digest: u64, local_ok: bool) -> Result<()> {
        let mine = [u64::from(!local_ok), digest];
        let mut all = vec![0u64; 2 * self.size()];
        self.world_comm.all_gather_into(&mine[..], &mut all[..]);
        if !local_ok {
            return Ok(());
        }
        agree_on_request(&all, what, digest, self.rank())
    }
}

/// `Err` naming `what` where the job does not survive a lost rank.
fn needs_ulfm(what: &str) -> Result<()> {
    match crate::ulfm::active() {
        true => Ok(()),
        false => Err(Error::State(format!(
            "{what} needs a job that survives a lost rank: rankmesh built against Open MPI 5 \
             and started with `mpirun --with-ft ulfm`"
        ))),
    }
}

/// The survivors' runtime after a lost rank ([`Runtime::shrink`]).
pub struct Shrunk {
    /// The new world: the survivors, renumbered densely in their old order.
    pub runtime: Runtime,
    /// The old world ranks that were lost, sorted.
    pub lost: Vec<usize>,
    /// Each old world rank's rank in the new world (`None`: lost).
    pub new_rank: Vec<Option<usize>>,
}

impl Runtime {
    /// After [`Error::PeerLost`]: the survivors agree on the ranks lost,
    /// shrink the world to themselves and rebuild the runtime on it: the
    /// node communicators, the shared-memory windows, the status board and
    /// service, and the watch. Collective over the survivors, each of which
    /// calls it once it saw the loss (a call that failed with it); a rank
    /// lost meanwhile is shrunk out too.
    ///
    /// Consuming the runtime ends every group made on the old world before
    /// the new one exists: the borrow checker refuses an old group's call.
    /// What the old world's calls left mid-way (windows, pending requests)
    /// is let go of, not freed with the lost ranks. The GPU goes on, and
    /// after [`connect_devices`](Self::connect_devices) so does the world's
    /// NCCL communicator, shrunk with `ncclCommShrink` (NCCL 2.27 or newer)
    /// rather than bootstrapped again; groups of the new world split from
    /// it. Where NCCL cannot shrink it, the reason is in
    /// [`warnings`](Self::warnings) and groups bootstrap their own at their
    /// first device call.
    ///
    /// Needs ULFM: Open MPI 5 started with `mpirun --with-ft ulfm`;
    /// otherwise [`Error::State`] and the runtime is gone (a lost rank ends
    /// such a job anyway).
    pub fn shrink(mut self) -> Result<Shrunk> {
        self.can_shrink()?;
        let devices = self.take_devices();
        let old = self.world_comm.as_raw();
        crate::ulfm::revoke(old);
        let new = crate::ulfm::shrink(old).map_err(Error::State)?;
        let new_rank = crate::ulfm::rank_map(old, new);
        let lost: Vec<usize> = (0..new_rank.len())
            .filter(|&r| new_rank[r].is_none())
            .collect();
        tracing::warn!(
            rank = self.info.rank,
            "world ranks {lost:?} lost; {} survivors go on",
            new_rank.len() - lost.len()
        );
        let mut runtime = self.rebuild(new)?;
        runtime.adopt_devices(devices, &lost);
        Ok(Shrunk {
            runtime,
            lost,
            new_rank,
        })
    }

    /// Whether this job survives a lost rank, so that
    /// [`shrink`](Self::shrink) and [`retire`](Self::retire) can work:
    /// the [`Error::State`] they return otherwise, before they take the
    /// runtime.
    pub fn can_shrink(&self) -> Result<()> {
        needs_ulfm("shrink")
    }

    /// After [`shrink`](Self::shrink), where the survivors' plan retires
    /// some of them ([`MeshLayout::after_loss`](crate::parallel::MeshLayout::after_loss)
    /// drops whole replicas): collective over the world. The ranks with
    /// `stay` go on in a runtime of their own, renumbered in their old
    /// order; the others get `None` and leave (their process ends, with
    /// MPI left unfinalised as after any loss). Needs ULFM, as `shrink`.
    pub fn retire(mut self, stay: bool) -> Result<Option<Runtime>> {
        needs_ulfm("retire")?;
        let devices = self.take_devices();
        // SAFETY: out-pointer valid; every member of the world calls this.
        let new = unsafe {
            let mut new: mpi::ffi::MPI_Comm = std::mem::zeroed();
            let color = if stay { 0 } else { mpi::ffi::RSMPI_UNDEFINED };
            mpi::ffi::MPI_Comm_split(
                self.world_comm.as_raw(),
                color,
                self.info.rank as i32,
                &mut new,
            );
            new
        };
        crate::ulfm::note_world_changed();
        if !stay {
            // A retired rank's device plane ends here: its peers go on
            // without it, so nothing of it waits on them.
            if let Some((gpu, Some(root))) = devices {
                if let Ok(api) = gpu.api() {
                    root.comm.state().abort(api, "this rank retired");
                }
            }
            // MPI stays initialised: it is not finalised after a loss.
            std::mem::forget(self.let_go().0);
            return Ok(None);
        }
        let retired: Vec<usize> = crate::ulfm::rank_map(self.world_comm.as_raw(), new)
            .iter()
            .enumerate()
            .filter_map(|(r, to)| to.is_none().then_some(r))
            .collect();
        let mut runtime = self.rebuild(new)?;
        runtime.adopt_devices(devices, &retired);
        Ok(Some(runtime))
    }

    /// This world's GPU and its world NCCL communicator, taken before the
    /// world is let go of, for the next world to carry on with.
    fn take_devices(&mut self) -> Option<(Gpu, Option<SplitParent>)> {
        let root = self.device_root.take();
        match self.gpu.take() {
            Some(Ok(gpu)) => Some((gpu, root)),
            _ => {
                std::mem::forget(root);
                None
            }
        }
    }

    /// The device plane `take_devices` carried from the old world, on this
    /// new one whose members are the old one's but `excluded` (old world
    /// ranks): the same GPU, and the world's communicator shrunk
    /// (collective over the new world). A shrink NCCL refuses leaves the
    /// new world without one, with a warning: its groups bootstrap their
    /// own at their first device call.
    fn adopt_devices(&mut self, devices: Option<(Gpu, Option<SplitParent>)>, excluded: &[usize]) {
        let Some((gpu, root)) = devices else { return };
        let gpu = match self.gpu.set(Ok(gpu)) {
            Ok(()) => self
                .gpu
                .get()
                .and_then(|g| g.as_ref().ok())
                .expect("just set"),
            Err(_) => return,
        };
        let Some(root) = root else { return };
        match shrink_root(self, root, gpu, excluded) {
            Ok(parent) => *self.device_root.borrow_mut() = Some(parent),
            Err(e) => {
                let why = format!(
                    "the world's NCCL communicator was not shrunk ({e}); groups connect \
                     their own at their first device call"
                );
                tracing::warn!(rank = self.info.rank, "{why}");
                self.warnings.push(why);
            }
        }
    }

    /// Lets go of this world (for `shrink` and `retire`): what it holds that
    /// would wait on a lost or departed rank (windows, the board, pending
    /// requests, NCCL communicators) is left behind, as after a call given
    /// up, and the rest is dropped. Returns MPI itself and what the next
    /// world starts from.
    fn let_go(mut self) -> (Option<Universe>, Options, Threading) {
        let kept = (self.universe.take(), self.options.clone(), self.threading);
        crate::wait::give_up::give_up(Abandon::PeerLeft, "the world was let go of".into());
        // What `take_devices` left: a world communicator without its GPU.
        std::mem::forget(self.device_root.take());
        self.shrunk.set(true);
        drop(self);
        crate::wait::give_up::reset();
        kept
    }

    /// The runtime again on `new`, a communicator of some of this world's
    /// ranks: this world let go of, then everything built on `new` as at
    /// start-up, but the launcher's checks.
    fn rebuild(self, new: mpi::ffi::MPI_Comm) -> Result<Runtime> {
        let (universe, options, threading) = self.let_go();
        crate::ulfm::watch_world(new);
        // SAFETY: `new` is a valid communicator, owned from here.
        let world = unsafe { SimpleCommunicator::from_raw(new) };
        let startup = StartupWatch::start(options.init_timeout);
        let universe =
            universe.ok_or_else(|| Error::State("the runtime was shrunk already".into()))?;
        Runtime::build(universe, threading, world, options, None, startup)
    }
}

impl Drop for Runtime {
    /// A rank that panics would otherwise finalise MPI while its peers wait in
    /// a collective, and the job would hang; abort the whole job instead.
    fn drop(&mut self) {
        if self.shrunk.get() {
            return;
        }
        // Before anything that can block (MPI finalisation waits for every
        // rank): after a failed call or in a panic, say why and publish it,
        // so peers blocked in a call with this rank are named the reason
        // and end the job within about a second.
        let panic = std::thread::panicking().then(panic_message);
        self.watchdog.leaving(panic);
        // Calls given up left MPI mid-call: finalising could wait forever.
        // Not under ULFM after a lost rank: MPI finalises without it.
        if let Some((why, _)) = crate::wait::give_up::given_up() {
            if !(why == Abandon::PeerLeft && crate::ulfm::active()) {
                self.watchdog.end_after_giving_up(why);
            }
        }
        // Open MPI's finalisation fences every rank the job started with,
        // the lost ones too, and can wait for them forever (one exit in
        // about ten here; open-mpi/ompi#11404): after a loss, survivors
        // leave MPI unfinalised, as ULFM's launcher allows.
        if crate::ulfm::active() {
            self.leave_together();
        }
        if crate::ulfm::lost_any() {
            std::mem::forget(self.universe.take());
        }
    }
}

/// How long a survivor waits at its exit for the others (see
/// [`Runtime::leave_together`]).
const LEAVE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Runtime {
    /// Under ULFM, at drop: waits (at most [`LEAVE_WAIT`]) until every rank
    /// of this world is leaving too. After a loss MPI_Finalize is skipped,
    /// and its fence did this: a survivor that exits first is one more
    /// failure to the others, whose last call may still need its messages
    /// (over TCP, data in flight is lost with the process). Without a loss
    /// yet, a rank that died after its last call fails this barrier (ULFM's
    /// error handler notes it lost), so that the survivors skip the
    /// finalisation that would wait for it forever.
    fn leave_together(&self) {
        let mut request = [crate::mpi_ext::null_request()];
        // SAFETY: a valid communicator and out-pointer; the request is
        // completed or left below, and owns no buffer.
        unsafe { mpi::ffi::MPI_Ibarrier(self.world_comm.as_raw(), &mut request[0]) };
        crate::exec::mpi_calls::settled(
            &mut request,
            &mut [crate::exec::mpi_calls::status()],
            LEAVE_WAIT,
        );
    }
}

/// The latest panic's message and place, kept by the hook [`note_panics`]
/// installs for [`Runtime`]'s drop to publish.
static PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Chains a panic hook that keeps each panic's message (then runs the hook
/// that was there, which prints it as usual).
fn note_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(a panic without a message)".into());
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{what}{at}"));
            previous(info);
        }));
    });
}

/// The message [`note_panics`] kept for the panic under way.
fn panic_message() -> String {
    PANIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| "(a panic without a message)".into())
}

/// Prints a start-up refusal on this rank (world `rank` once MPI knows it)
/// and returns it as [`Error::Startup`]: printed here because MPI may not
/// be up to carry it, or be finalised before the caller could print it.
fn refuse_start(rank: Option<usize>, why: String) -> Error {
    let who = rank.map_or(String::new(), |r| format!(" (rank {r})"));
    let line = format!("rankmesh: error{who}: launch: {why}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Error::Startup(why)
}

/// Bytes of one rank's start-up verdict (a flag, then the message).
const VERDICT_BYTES: usize = 512;

/// All-gathers each rank's start-up error (`None`: none); every rank
/// returns the same message, naming each rank that had one.
fn agree_on_start(
    world: &SimpleCommunicator,
    mine: Option<&str>,
) -> std::result::Result<(), String> {
    let rec: [u8; VERDICT_BYTES] = status_record(&mine.map_or(Ok(()), |m| Err(m.to_string())));
    let mut all = vec![0u8; VERDICT_BYTES * world.size() as usize];
    world.all_gather_into(&rec[..], &mut all[..]);
    let failed = failures(&all, VERDICT_BYTES);
    match failed.first() {
        None => Ok(()),
        // The same on every rank (a variable set for the whole job): said once.
        Some((_, first))
            if failed.len() == world.size() as usize && failed.iter().all(|(_, m)| m == first) =>
        {
            Err(first.clone())
        }
        Some(_) => Err(format!(
            "start-up refused on {}: {}",
            if failed.len() == 1 {
                "one rank"
            } else {
                "several ranks"
            },
            failed
                .iter()
                .map(|(r, m)| format!("rank {r}: {m}"))
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

/// `MPI_Comm_create_group` tag of rankmesh's sub-groups.
const SUBGROUP_TAG: i32 = 0x5210;

/// Applies a binding policy on every rank; a rank that cannot bind makes
/// every rank fail (a half-bound job would run with skewed performance).
fn bind_everywhere(
    world: &SimpleCommunicator,
    policy: BindPolicy,
    local_rank: usize,
    local_size: usize,
    device: Option<&str>,
) -> Result<Placement> {
    let mine = placement::apply(Some(policy), local_rank, local_size, device);
    let mut all = vec![0u8; world.size() as usize];
    world.all_gather_into(&u8::from(mine.is_err()), &mut all[..]);
    match (mine, all.iter().position(|f| *f != 0)) {
        (Err(Error::Launch(m)), _) => Err(Error::Launch(format!("rank {}: {m}", world.rank()))),
        (Err(e), _) => Err(e),
        (Ok(_), Some(r)) => Err(Error::Launch(format!(
            "--bind {} failed on rank {r} (see its error)",
            policy.name()
        ))),
        (Ok(p), None) => Ok(p),
    }
}

/// Starts the status board (collective over the node), the status service
/// and the watchdog; every rank learns where every other rank's service
/// listens (collective over the world).
/// `RANKMESH_SHARE_GPU`: gives this process an `NCCL_HOSTID` of its own
/// unless it has one (then the caller's ids decide).
fn give_own_nccl_host() {
    if std::env::var_os("NCCL_HOSTID").is_none_or(|v| v.is_empty()) {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let id = crate::device::select::share_gpu_host_id(&host, std::process::id());
        // Before MPI_Init and before NCCL is loaded, while no thread of
        // theirs can be reading the environment.
        std::env::set_var("NCCL_HOSTID", id);
    }
}

fn start_watchdog(
    world: &SimpleCommunicator,
    info: &WorldInfo,
    node_comm: SimpleCommunicator,
    options: &Options,
) -> Watchdog {
    let board = Board::create(node_comm, info.rank);
    // The job's secret: drawn by world rank 0, sent to every rank over MPI
    // (never logged); the status services answer only requests carrying it.
    let mut secret = [0u8; SECRET_BYTES];
    if info.rank == 0 && getrandom::fill(&mut secret).is_err() {
        // No randomness from the OS: the services stay closed (all-zero
        // secret refused below), and only peers' departures on this node
        // are seen.
        secret = [0u8; SECRET_BYTES];
    }
    world.process_at_rank(0).broadcast_into(&mut secret[..]);
    let secret = Secret::new(secret);
    // Always listening (a rank that leaves tells the other nodes here), on
    // the addresses the job publishes only.
    let service = secret_usable(&secret)
        .then(|| {
            let addrs = status_addresses(&options.status_addrs, info.node_count);
            Service::start(board.view().clone(), secret, &addrs)
                .map_err(|e| tracing::warn!("the status service did not start: {e}"))
                .ok()
        })
        .flatten();
    const REC: usize = 4 * ADDRS + 2;
    let mut mine = [0u8; REC];
    if let Some(svc) = &service {
        for (i, ip) in svc.addrs().iter().take(ADDRS).enumerate() {
            mine[4 * i..4 * i + 4].copy_from_slice(&ip.octets());
        }
        mine[4 * ADDRS..].copy_from_slice(&svc.port().to_le_bytes());
    }
    let mut all = vec![0u8; REC * info.size];
    world.all_gather_into(&mine[..], &mut all[..]);
    let peers = all
        .chunks(REC)
        .zip(&info.ranks)
        .map(|(rec, r)| {
            let port = u16::from_le_bytes([rec[4 * ADDRS], rec[4 * ADDRS + 1]]);
            let service = rec[..4 * ADDRS]
                .chunks(4)
                .map(|o| Ipv4Addr::new(o[0], o[1], o[2], o[3]))
                .filter(|ip| !ip.is_unspecified() && port != 0)
                .map(|ip| SocketAddrV4::new(ip, port))
                .collect();
            PeerFacts {
                node: r.node,
                host: r.host.clone(),
                service,
            }
        })
        .collect();
    Watchdog::start(
        info.rank,
        options.timeout,
        options.on_hang,
        board,
        service,
        peers,
        options.trace_dir.clone(),
        secret,
    )
}

/// Where the status service listens: `RANKMESH_STATUS_ADDRS` when set (a
/// management network), else this host's outward IPv4 addresses, with
/// loopback only when the job is on one node (or the host has no other).
fn status_addresses(chosen: &[Ipv4Addr], nodes: usize) -> Vec<Ipv4Addr> {
    if !chosen.is_empty() {
        return chosen.iter().take(ADDRS).copied().collect();
    }
    let ips = local_ipv4();
    let mut out: Vec<Ipv4Addr> = ips
        .iter()
        .filter(|a| !a.is_loopback())
        .take(ADDRS - 1)
        .copied()
        .collect();
    if nodes == 1 || out.is_empty() {
        out.push(Ipv4Addr::LOCALHOST);
    }
    out
}

/// A secret the OS drew (all zeros: it could not).
fn secret_usable(secret: &Secret) -> bool {
    !secret.is_zero()
}

fn gather_world_info(
    world: &SimpleCommunicator,
    startup: &StartupWatch,
) -> Result<(WorldInfo, SimpleCommunicator)> {
    let rank = world.rank() as usize;
    let size = world.size() as usize;
    startup.step("the node split (MPI_Comm_split_type shared)");
    let node_comm = world.split_shared(rank as i32);
    let local_rank = node_comm.rank() as usize;
    let local_size = node_comm.size() as usize;
    // The node's identity is the lowest world rank on it (local rank 0, key = rank).
    let mut leader = rank as u64;
    node_comm.process_at_rank(0).broadcast_into(&mut leader);
    let host = mpi::environment::processor_name()
        .map_err(|e| Error::Launch(format!("processor name is not UTF-8: {e}")))?;
    let mut mine = [0u8; 24 + HOST_BYTES];
    mine[..8].copy_from_slice(&leader.to_le_bytes());
    mine[8..16].copy_from_slice(&(local_rank as u64).to_le_bytes());
    mine[16..24].copy_from_slice(&(local_size as u64).to_le_bytes());
    let name = host.as_bytes();
    let n = name.len().min(HOST_BYTES);
    mine[24..24 + n].copy_from_slice(&name[..n]);
    let mut all = vec![0u8; mine.len() * size];
    startup.step("the exchange of hosts and nodes (MPI_Allgather)");
    world.all_gather_into(&mine[..], &mut all[..]);
    let word = |rec: &[u8], i: usize| {
        u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().unwrap_or_default())
    };
    let mut leaders: Vec<u64> = all.chunks(mine.len()).map(|r| word(r, 0)).collect();
    let per_rank_leader = leaders.clone();
    leaders.sort_unstable();
    leaders.dedup();
    let ranks = all
        .chunks(mine.len())
        .enumerate()
        .map(|(r, rec)| {
            let host_bytes = &rec[24..];
            let end = host_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(host_bytes.len());
            RankInfo {
                rank: r,
                host: String::from_utf8_lossy(&host_bytes[..end]).into_owned(),
                node: leaders.binary_search(&per_rank_leader[r]).unwrap_or(0),
                local_rank: word(rec, 1) as usize,
                local_size: word(rec, 2) as usize,
            }
        })
        .collect();
    let info = WorldInfo {
        rank,
        size,
        node_count: leaders.len(),
        ranks,
    };
    Ok((info, node_comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RANKMESH_*_BYTES` take sizes as the CLI does (`16M`), within bounds.
    #[test]
    fn byte_variables_take_the_clis_sizes() {
        assert_eq!(byte_count("B", "4096", 1, 1 << 30).unwrap(), 4096);
        assert_eq!(byte_count("B", "16M", 1, 1 << 30).unwrap(), 16 << 20);
        assert_eq!(byte_count("B", " 1G ", 1, 1 << 30).unwrap(), 1 << 30);
        assert_eq!(
            byte_count("B", "2G", 1, 1 << 30).unwrap_err().to_string(),
            "launch: B=\"2G\" is not a byte count in 1..=1073741824"
        );
        assert!(byte_count("B", "lots", 1, 1 << 30).is_err());
        // A count of bytes is whole, as before sizes took suffixes.
        assert!(byte_count("B", "7.5", 1, 1 << 30).is_err());
    }
}
