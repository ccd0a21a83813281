//! Creating a group's NCCL communicator over its MPI communicator.
//!
//! Every step that can fail on one rank is followed by an MPI exchange of
//! the outcome, so all members return the same error instead of some of them
//! blocking in NCCL: (1) all-gather of (node, PCI bus id, compute
//! capability) and the duplicate check, (2) the unique id from the first
//! rank (or, past `RANKMESH_NCCL_RANKS_PER_ROOT` members, one id per root
//! for `ncclCommInitRankScalable`), with its status, (3) non-blocking
//! creation, polled to completion under `RANKMESH_TIMEOUT` and aborted past
//! it, whose outcome is all-gathered (the error names every member that
//! failed or did not finish), (4) a one-element warm-up all-reduce waited on
//! with the polling loop.
//!
//! A group made after [`Runtime::connect_devices`](crate::Runtime::connect_devices)
//! skips all of it: [`split`] derives its communicator from the world's with
//! `ncclCommSplit`, one bootstrap for the whole job.

use crate::device::select::{duplicate_devices, host_id_key, GpuPlace};
use crate::device::Gpu;
use crate::error::NcclError;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::nccl::comm::{Communicator as NcclComm, Membership, Origin};
use crate::nccl::result::unique_id;
use crate::nccl::sys::{Api, UniqueId, UNIQUE_ID_BYTES};
use crate::op::Op;
use crate::op::ReduceOp;
use mpi::topology::Process;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::time::{Duration, Instant};

/// Bytes of one rank's status record (flag + text).
pub(crate) const STATUS_BYTES: usize = 256;
/// Bytes of one rank's device record (node + bus id).
const DEVICE_BYTES: usize = 64;

/// One rank's status record of `N` bytes: a failure flag, then the
/// message, cut at a character boundary to fit.
pub(crate) fn status_record<const N: usize>(outcome: &std::result::Result<(), String>) -> [u8; N] {
    let mut rec = [0u8; N];
    if let Err(m) = outcome {
        rec[0] = 1;
        let mut n = m.len().min(N - 1);
        while !m.is_char_boundary(n) {
            n -= 1;
        }
        rec[1..1 + n].copy_from_slice(&m.as_bytes()[..n]);
    }
    rec
}

/// Every failing rank's message from all-gathered status records of
/// `record_bytes` each.
pub(crate) fn failures(records: &[u8], record_bytes: usize) -> Vec<(usize, String)> {
    records
        .chunks(record_bytes)
        .enumerate()
        .filter(|(_, r)| r[0] != 0)
        .map(|(rank, r)| {
            let text = &r[1..];
            let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
            (rank, String::from_utf8_lossy(&text[..end]).into_owned())
        })
        .collect()
}

/// The first failing rank's message from all-gathered status records.
fn first_failure(records: &[u8]) -> Option<(usize, String)> {
    failures(records, STATUS_BYTES).into_iter().next()
}

/// How a failing member is named: the `label` of its ranks ("group",
/// "world") and its rank there from its position in the records.
pub(crate) struct Naming<'n> {
    pub label: &'n str,
    pub rank_of: &'n dyn Fn(usize) -> usize,
}

/// One line naming every member that failed: members with the same
/// message share it ("group ranks 1, 3: ...").
fn name_failures(failed: &[(usize, String)], naming: &Naming<'_>) -> String {
    let mut parts: Vec<(Vec<usize>, &str)> = Vec::new();
    for (at, msg) in failed {
        let rank = (naming.rank_of)(*at);
        match parts.iter_mut().find(|(_, m)| *m == msg.as_str()) {
            Some((ranks, _)) => ranks.push(rank),
            None => parts.push((vec![rank], msg)),
        }
    }
    parts
        .iter()
        .map(|(ranks, msg)| {
            let list = ranks
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{} {noun} {list}: {msg}", naming.label)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How many roots a communicator of `size` members bootstraps from: one per
/// `per_root` ranks when the library can (one otherwise).
fn roots_for(size: usize, per_root: usize, scalable: bool) -> usize {
    if scalable && size > per_root {
        size.div_ceil(per_root.max(1))
    } else {
        1
    }
}

/// The member that makes root `i`'s unique id: spread evenly over the members.
fn root_rank(i: usize, roots: usize, size: usize) -> usize {
    i * size / roots
}

/// All-gathers one status record per member over `comm` while marking
/// progress: members that finished creating wait here for one that may
/// still be polling its own creation for up to `limit`, and the watchdog
/// must not end the job for that wait. Past `limit` (a member that never
/// comes) the marks stop and the watchdog takes over.
fn gather_statuses(
    comm: &SimpleCommunicator,
    mine: &[u8; STATUS_BYTES],
    limit: Option<Duration>,
    beat: &dyn Fn(),
) -> Vec<u8> {
    let mut all = vec![0u8; STATUS_BYTES * comm.size() as usize];
    let start = Instant::now();
    mpi::request::scope(|scope| {
        let mut req = comm.immediate_all_gather_into(scope, &mine[..], &mut all[..]);
        loop {
            match req.test() {
                Ok(_) => break,
                Err(r) => req = r,
            }
            if limit.is_none_or(|l| start.elapsed() < l) {
                beat();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    all
}

/// Waits for a creation this rank started (see [`NcclComm::ready`]).
pub(crate) fn finish_creation(
    started: std::result::Result<Option<NcclComm<'static>>, NcclError>,
    beat: &dyn Fn(),
) -> std::result::Result<Option<NcclComm<'static>>, NcclError> {
    started.and_then(|c| match c {
        Some(c) => c.ready(beat).map(|()| Some(c)),
        None => Ok(None),
    })
}

/// This rank's status record of a finished creation, for the others.
pub(crate) fn creation_record(
    done: &std::result::Result<Option<NcclComm<'static>>, NcclError>,
) -> [u8; STATUS_BYTES] {
    status_record(&done.as_ref().map(|_| ()).map_err(|e| e.msg.clone()))
}

/// The verdict on a creation from every member's status record (`all`, in
/// member order): `Ok` only where every member succeeded; otherwise this
/// rank's communicator is aborted and the error names each member that
/// failed or did not finish.
pub(crate) fn judge_creation(
    api: &Api,
    done: std::result::Result<Option<NcclComm<'static>>, NcclError>,
    all: &[u8],
    naming: &Naming<'_>,
) -> std::result::Result<Option<NcclComm<'static>>, NcclError> {
    let failed = failures(all, STATUS_BYTES);
    if failed.is_empty() {
        return done;
    }
    // Abort, not destroy: destroying can wait for the members that failed.
    if let Ok(Some(c)) = &done {
        c.state()
            .abort(api, "a peer failed to create the communicator");
    }
    let code = done.err().map_or(0, |e| e.code);
    Err(NcclError {
        code,
        msg: name_failures(&failed, naming),
    })
}

/// Finishes a creation this rank started, then agrees on the outcome with
/// every member (`exchange` all-gathers status records over MPI).
fn agree_on_creation(
    api: &Api,
    started: std::result::Result<Option<NcclComm<'static>>, NcclError>,
    beat: &dyn Fn(),
    naming: &Naming<'_>,
    exchange: impl FnOnce(&[u8; STATUS_BYTES]) -> Vec<u8>,
) -> std::result::Result<Option<NcclComm<'static>>, NcclError> {
    let done = finish_creation(started, beat);
    let all = exchange(&creation_record(&done));
    judge_creation(api, done, &all, naming)
}

/// A member's GPU place (node, `NCCL_HOSTID` key, bus id) and compute
/// capability, for the others: node at 0..8, bus id at 8..48, the host id
/// key at 48..56, the capability at 56..64.
fn device_record(place: &GpuPlace, sm: (u32, u32)) -> [u8; DEVICE_BYTES] {
    let mut rec = [0u8; DEVICE_BYTES];
    rec[..8].copy_from_slice(&(place.node as u64).to_le_bytes());
    let n = place.bus_id.len().min(DEVICE_BYTES - 24);
    rec[8..8 + n].copy_from_slice(&place.bus_id.as_bytes()[..n]);
    rec[DEVICE_BYTES - 16..DEVICE_BYTES - 8].copy_from_slice(&place.host_id.to_le_bytes());
    rec[DEVICE_BYTES - 8..DEVICE_BYTES - 4].copy_from_slice(&sm.0.to_le_bytes());
    rec[DEVICE_BYTES - 4..].copy_from_slice(&sm.1.to_le_bytes());
    rec
}

fn parse_device_record(rec: &[u8]) -> (GpuPlace, (u32, u32)) {
    let word = |at: usize| u32::from_le_bytes(rec[at..at + 4].try_into().expect("4 bytes"));
    let long = |at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().expect("8 bytes"));
    let text = &rec[8..DEVICE_BYTES - 16];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    let place = GpuPlace {
        node: long(0) as usize,
        host_id: long(DEVICE_BYTES - 16),
        bus_id: String::from_utf8_lossy(&text[..end]).into_owned(),
    };
    (place, (word(DEVICE_BYTES - 8), word(DEVICE_BYTES - 4)))
}

/// The unique-id message: a failure flag, then the id or NCCL's error text.
fn id_packet(api: &Api) -> [u8; 1 + UNIQUE_ID_BYTES] {
    let mut packet = [0u8; 1 + UNIQUE_ID_BYTES];
    match unique_id(api) {
        Ok(id) => packet[1..].copy_from_slice(&id.to_bytes()),
        Err(e) => {
            packet[0] = 1;
            let n = e.msg.len().min(UNIQUE_ID_BYTES);
            packet[1..1 + n].copy_from_slice(&e.msg.as_bytes()[..n]);
        }
    }
    packet
}

/// The id in a message from [`id_packet`], or its maker's error naming `maker`.
fn id_of(packet: &[u8; 1 + UNIQUE_ID_BYTES], maker: usize) -> Result<UniqueId, NcclError> {
    if packet[0] != 0 {
        let text = String::from_utf8_lossy(&packet[1..]);
        return Err(NcclError::other(format!(
            "ncclGetUniqueId failed on group rank {maker}: {}",
            text.trim_end_matches('\0')
        )));
    }
    Ok(UniqueId::from_bytes(
        packet[1..].try_into().expect("128 bytes"),
    ))
}

/// The error of a communicator that group rank `rank` cannot join for lack of NCCL.
fn no_nccl(what: &str, rank: usize, msg: &str) -> Error {
    Error::Gpu(format!(
        "{what} needs NCCL, which group rank {rank} cannot use: {msg}"
    ))
}

/// Creates `group`'s communicator (collective over the group).
pub(crate) fn connect(group: &GroupCoordinator<'_>, gpu: &Gpu) -> Result<NcclComm<'static>> {
    let _watch = group.watched(Op::Connect);
    agree_nccl_usable(group, gpu)?;
    let sm = agree_devices(group, gpu)?;
    let (ids, roots) = unique_ids(group, gpu)?;
    let nccl = create(group, gpu, &ids, sm)?;
    if roots > 1 {
        tracing::debug!(
            group = group.name(),
            roots,
            "NCCL bootstrap from several roots (ncclCommInitRankScalable)"
        );
    }
    gpu.register(nccl.state());
    warm_up(group, gpu, &nccl)?;
    tracing::debug!(
        rank = group.global_rank(),
        group = group.name(),
        device = %gpu.info().bus_id,
        "NCCL communicator ready"
    );
    Ok(nccl)
}

/// Step 0 of [`connect`]: every member has NCCL (a GPU may open without
/// it), or every member gets the same error naming the first that lacks
/// it. (The number of ranks per root is alike: the group's creation
/// checked it.)
fn agree_nccl_usable(group: &GroupCoordinator<'_>, gpu: &Gpu) -> Result<()> {
    let mut statuses = vec![0u8; STATUS_BYTES * group.size()];
    let usable = gpu.api().map(|_| ()).map_err(|e| e.to_string());
    group.raw_comm().all_gather_into(
        &status_record::<STATUS_BYTES>(&usable)[..],
        &mut statuses[..],
    );
    match first_failure(&statuses) {
        Some((rank, msg)) => Err(no_nccl(group.name(), rank, &msg)),
        None => Ok(()),
    }
}

/// Step 1: no two members on one GPU; the group reduces as its oldest GPU
/// can (the lowest compute capability, returned).
fn agree_devices(group: &GroupCoordinator<'_>, gpu: &Gpu) -> Result<(u32, u32)> {
    let info = gpu.info();
    let mine = GpuPlace {
        node: group.runtime().world().me().node,
        host_id: host_id_key(std::env::var("NCCL_HOSTID").ok().as_deref()),
        bus_id: info.bus_id.clone(),
    };
    let mine = device_record(&mine, info.compute_capability);
    let mut all = vec![0u8; DEVICE_BYTES * group.size()];
    group.raw_comm().all_gather_into(&mine[..], &mut all[..]);
    let (places, sms): (Vec<GpuPlace>, Vec<(u32, u32)>) =
        all.chunks(DEVICE_BYTES).map(parse_device_record).unzip();
    duplicate_devices(&places).map_err(|msg| Error::invalid(Op::Connect, group.name(), msg))?;
    Ok(sms.into_iter().min().unwrap_or(info.compute_capability))
}

/// Step 2: the unique ids, made by the roots (the first member, or one
/// member per `RANKMESH_NCCL_RANKS_PER_ROOT`) and all-gathered with their
/// status; with how many roots made them.
fn unique_ids(group: &GroupCoordinator<'_>, gpu: &Gpu) -> Result<(Vec<UniqueId>, usize)> {
    let (size, me) = (group.size(), group.rank_in_group());
    let per_root = group.runtime().options().nccl_ranks_per_root;
    let api = gpu.api()?;
    let roots = roots_for(size, per_root, api.comm_init_rank_scalable.is_some());
    let is_root = (0..roots).any(|i| root_rank(i, roots, size) == me);
    let packet = if is_root {
        id_packet(api)
    } else {
        [0u8; 1 + UNIQUE_ID_BYTES]
    };
    let mut packets = vec![0u8; (1 + UNIQUE_ID_BYTES) * size];
    group
        .raw_comm()
        .all_gather_into(&packet[..], &mut packets[..]);
    let ids = (0..roots)
        .map(|i| {
            let maker = root_rank(i, roots, size);
            let at = maker * (1 + UNIQUE_ID_BYTES);
            let p: &[u8; 1 + UNIQUE_ID_BYTES] = packets[at..at + 1 + UNIQUE_ID_BYTES]
                .try_into()
                .expect("one packet");
            id_of(p, maker)
        })
        .collect::<std::result::Result<Vec<UniqueId>, NcclError>>()
        .map_err(|e| Error::nccl(Op::Connect, group.name(), e))?;
    Ok((ids, roots))
}

/// Step 3: every member creates its communicator from `ids` (non-blocking)
/// and polls; all learn every outcome, so a failure is every member's.
fn create(
    group: &GroupCoordinator<'_>,
    gpu: &Gpu,
    ids: &[UniqueId],
    sm: (u32, u32),
) -> Result<NcclComm<'static>> {
    let api = gpu.api()?;
    bind_context(group, gpu)?;
    let membership = Membership {
        size: group.size(),
        rank: group.rank_in_group(),
        group: group.name(),
        sm,
        limit: gpu.timeout(),
    };
    let started = NcclComm::start(api, Origin::Ids(ids), &membership);
    let naming = Naming {
        label: "group",
        rank_of: &|r| r,
    };
    let pulse = group.runtime().watchdog().pulse();
    let beat = || pulse.beat();
    let comm = group.raw_comm();
    Ok(agree_on_creation(api, started, &beat, &naming, |mine| {
        gather_statuses(comm, mine, gpu.timeout(), &beat)
    })
    .map_err(|e| Error::nccl(Op::Connect, group.name(), e))?
    .expect("created from ids"))
}

/// Makes `gpu`'s CUDA context current on this thread, as NCCL's creation
/// needs.
fn bind_context(group: &GroupCoordinator<'_>, gpu: &Gpu) -> Result<()> {
    gpu.context().bind_to_thread().map_err(|e| {
        Error::invalid(
            Op::Connect,
            group.name(),
            format!("binding the CUDA context: {e}"),
        )
    })
}

/// Step 4: NCCL connects lazily; one all-reduce of one element pays that
/// cost here, not in the caller's first op.
fn warm_up(group: &GroupCoordinator<'_>, gpu: &Gpu, nccl: &NcclComm<'static>) -> Result<()> {
    let one = gpu.zeros([1], crate::DType::F32)?;
    let p = one.ptr_on(gpu.enqueue_own()?)?;
    // SAFETY: one f32 on this device, alive until the synchronize below.
    unsafe {
        nccl.all_reduce(
            p,
            p,
            1,
            crate::DType::F32,
            ReduceOp::Sum,
            gpu.stream().cu_stream() as _,
        )
    }
    .map_err(|e| Error::nccl(Op::Connect, group.name(), e))?;
    gpu.synchronize()
}

/// What a split needs of the world's communicator: it, and every world
/// rank's compute capability (a child reduces as its oldest GPU can).
pub(crate) struct SplitParent {
    pub comm: NcclComm<'static>,
    pub sm: Vec<(u32, u32)>,
}

/// Derives a communicator for each list from the world's with
/// `ncclCommSplit` (collective over the world: every rank calls it, one in
/// no list with no color). Returns this rank's, named `name`, or `None`.
pub(crate) fn split(
    rt: &crate::Runtime,
    parent: &SplitParent,
    gpu: &Gpu,
    lists: &[Vec<usize>],
    name: &str,
) -> Result<Option<NcclComm<'static>>> {
    let nccl_fail = |source: NcclError| Error::nccl(Op::Connect, name, source);
    let api = gpu.api()?;
    let me = rt.rank();
    let index = lists.iter().position(|l| l.contains(&me));
    let (size, key, sm) = match index {
        Some(i) => (
            lists[i].len(),
            lists[i].iter().position(|r| *r == me).unwrap_or(0),
            lists[i]
                .iter()
                .map(|r| parent.sm[*r])
                .min()
                .unwrap_or((0, 0)),
        ),
        None => (0, 0, (0, 0)),
    };
    let membership = Membership {
        size,
        rank: key,
        group: name,
        sm,
        limit: gpu.timeout(),
    };
    let origin = Origin::Split {
        parent: &parent.comm,
        color: index,
        key,
    };
    let made = from_world_parent(rt, (api, gpu), origin, &membership).map_err(|e| {
        nccl_fail(NcclError {
            code: e.code,
            msg: format!("ncclCommSplit of the world's communicator: {}", e.msg),
        })
    })?;
    if let Some(c) = &made {
        gpu.register(c.state());
    }
    Ok(made)
}

/// A communicator from the world's (`origin`: a split or a shrink of it),
/// its outcome agreed over `rt`'s world (collective over it), the
/// watchdog told of progress meanwhile.
fn from_world_parent(
    rt: &crate::Runtime,
    (api, gpu): (&'static Api, &Gpu),
    origin: Origin<'_, 'static>,
    membership: &Membership<'_>,
) -> std::result::Result<Option<NcclComm<'static>>, NcclError> {
    let pulse = rt.watchdog().pulse();
    let beat = || pulse.beat();
    let started = NcclComm::start(api, origin, membership);
    let naming = Naming {
        label: "world",
        rank_of: &|r| r,
    };
    agree_on_creation(api, started, &beat, &naming, |mine| {
        gather_statuses(rt.world_comm(), mine, gpu.timeout(), &beat)
    })
}

/// After the world shrank to `rt`'s (collective over the survivors): the
/// world's communicator without the `lost` ranks of the old one
/// (`ncclCommShrink`, ending the old one's work in flight first), its
/// members renumbered as MPI's shrink renumbered them (densely, in old
/// order). The old communicator is aborted either way: NCCL leaves its
/// resources to the caller.
pub(crate) fn shrink_root(
    rt: &crate::Runtime,
    old: SplitParent,
    gpu: &Gpu,
    lost: &[usize],
) -> Result<SplitParent> {
    let sm: Vec<(u32, u32)> = (0..old.sm.len())
        .filter(|r| !lost.contains(r))
        .map(|r| old.sm[r])
        .collect();
    let membership = Membership {
        size: rt.size(),
        rank: rt.rank(),
        group: "world",
        sm: sm.iter().copied().min().unwrap_or((0, 0)),
        limit: gpu.timeout(),
    };
    let origin = Origin::Shrink {
        parent: &old.comm,
        exclude: lost,
    };
    let made = gpu
        .api()
        .map_err(|e| NcclError::other(e.to_string()))
        .and_then(|api| from_world_parent(rt, (api, gpu), origin, &membership));
    if let Ok(api) = gpu.api() {
        old.comm
            .state()
            .abort(api, "the world shrank (ncclCommShrink)");
    }
    drop(old);
    match made {
        Ok(Some(comm)) => {
            gpu.register_root(comm.state());
            Ok(SplitParent { comm, sm })
        }
        Ok(None) => Err(Error::State(
            "ncclCommShrink gave this survivor no communicator".into(),
        )),
        Err(e) => Err(Error::nccl(
            Op::Connect,
            "world",
            NcclError {
                code: e.code,
                msg: format!("ncclCommShrink of the world's communicator: {}", e.msg),
            },
        )),
    }
}

/// Tag of a pair communicator's unique id and status messages.
const TAG_PAIR: i32 = 0x5231;

/// Creates the two-member communicator of this rank and group rank `peer`
/// (both of them call it, inside an agreed point-to-point call): the lower
/// rank makes the unique id and sends it over MPI; each tells the other
/// whether its creation worked, so both fail alike.
pub(crate) fn connect_pair(
    group: &GroupCoordinator<'_>,
    gpu: &Gpu,
    peer: usize,
) -> Result<NcclComm<'static>> {
    let name = format!("{} (pair {peer})", group.name());
    let nccl_fail = |source: NcclError| Error::nccl(Op::Connect, group.name(), source);
    let comm = group.raw_comm();
    let other = comm.process_at_rank(peer as i32);
    let low = group.rank_in_group() < peer;
    // Both learn whether the other has NCCL before either waits on it.
    let usable = status_record(&gpu.api().map(|_| ()).map_err(|e| e.to_string()));
    let theirs = swap_status(&other, &usable);
    for (rank, rec) in [(group.rank_in_group(), &usable), (peer, &theirs)] {
        if let Some((_, msg)) = first_failure(rec) {
            return Err(no_nccl(&name, rank, &msg));
        }
    }
    let api = gpu.api()?;
    let mut packet = [0u8; 1 + UNIQUE_ID_BYTES];
    if low {
        packet = id_packet(api);
        other.send_with_tag(&packet[..], TAG_PAIR);
    } else {
        other.receive_into_with_tag(&mut packet[..], TAG_PAIR);
    }
    let maker = if low { group.rank_in_group() } else { peer };
    let id = id_of(&packet, maker).map_err(nccl_fail)?;
    bind_context(group, gpu)?;
    // A pair only sends and receives: nothing it does depends on the peer's GPU.
    let membership = Membership {
        size: 2,
        rank: usize::from(!low),
        group: &name,
        sm: gpu.info().compute_capability,
        limit: gpu.timeout(),
    };
    let pulse = group.runtime().watchdog().pulse();
    let beat = || pulse.beat();
    let started = NcclComm::start(api, Origin::Ids(&[id]), &membership);
    let pair = [
        group.rank_in_group().min(peer),
        group.rank_in_group().max(peer),
    ];
    let naming = Naming {
        label: "group",
        rank_of: &|r| pair[r],
    };
    let nccl = agree_on_creation(api, started, &beat, &naming, |mine| {
        // Status records in pair-rank order.
        let theirs = swap_status(&other, mine);
        let (first, second) = if low {
            (mine, &theirs)
        } else {
            (&theirs, mine)
        };
        [&first[..], &second[..]].concat()
    })
    .map_err(nccl_fail)?
    .expect("created from an id");
    gpu.register(nccl.state());
    Ok(nccl)
}

/// Sends this rank's status record to the pair's other member and returns theirs.
fn swap_status(other: &Process<'_>, mine: &[u8; STATUS_BYTES]) -> [u8; STATUS_BYTES] {
    let mut theirs = [0u8; STATUS_BYTES];
    mpi::request::scope(|scope| {
        let sent = other.immediate_send_with_tag(scope, &mine[..], TAG_PAIR);
        other.receive_into_with_tag(&mut theirs[..], TAG_PAIR);
        sent.wait();
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_records_carry_the_first_failure() {
        let mut all = Vec::new();
        all.extend(status_record::<STATUS_BYTES>(&Ok(())));
        all.extend(status_record::<STATUS_BYTES>(&Err(
            "NCCL ncclCommInitRank failed: x".into(),
        )));
        all.extend(status_record::<STATUS_BYTES>(&Err("other".into())));
        assert_eq!(
            first_failure(&all),
            Some((1, "NCCL ncclCommInitRank failed: x".to_string()))
        );
        let long = "e".repeat(1000);
        let rec = status_record::<STATUS_BYTES>(&Err(long));
        assert_eq!(first_failure(&rec).unwrap().1.len(), STATUS_BYTES - 1);
        assert_eq!(first_failure(&status_record::<STATUS_BYTES>(&Ok(()))), None);
    }

    #[test]
    fn device_records_round_trip() {
        let place = GpuPlace {
            node: 7,
            host_id: host_id_key(Some("node-a")),
            bus_id: "00000000:1B:00.0".to_string(),
        };
        let r = device_record(&place, (9, 0));
        assert_eq!(parse_device_record(&r), (place, (9, 0)));
    }
}
