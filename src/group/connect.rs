//! Creating a group's NCCL communicator over its MPI communicator.
//!
//! Every step that can fail on one rank is followed by an MPI exchange of
//! the outcome, so all members return the same error instead of some of them
//! blocking in NCCL: (1) all-gather of (node, PCI bus id) and the duplicate
//! check, (2) the unique id from the first rank, with its status, (3)
//! `ncclCommInitRank`, whose outcome is all-gathered, (4) a one-element
//! warm-up all-reduce waited on with the polling loop.

use crate::device::select::duplicate_devices;
use crate::device::Gpu;
use crate::error::NcclError;
use crate::error::{Error, Result};
use crate::group::GroupCoordinator;
use crate::nccl::comm::Communicator as NcclComm;
use crate::nccl::result::unique_id;
use crate::nccl::sys::{Api, UniqueId, UNIQUE_ID_BYTES};
use crate::op::Op;
use crate::op::ReduceOp;
use mpi::topology::Process;
use mpi::traits::*;

/// Bytes of one rank's status record (flag + text).
const STATUS_BYTES: usize = 256;
/// Bytes of one rank's device record (node + bus id).
const DEVICE_BYTES: usize = 64;

fn status_record(outcome: &std::result::Result<(), String>) -> [u8; STATUS_BYTES] {
    let mut rec = [0u8; STATUS_BYTES];
    if let Err(m) = outcome {
        rec[0] = 1;
        let n = m.len().min(STATUS_BYTES - 1);
        rec[1..1 + n].copy_from_slice(&m.as_bytes()[..n]);
    }
    rec
}

/// The first failing rank's message from all-gathered status records.
fn first_failure(records: &[u8]) -> Option<(usize, String)> {
    records
        .chunks(STATUS_BYTES)
        .enumerate()
        .find(|(_, r)| r[0] != 0)
        .map(|(rank, r)| {
            let text = &r[1..];
            let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
            (rank, String::from_utf8_lossy(&text[..end]).into_owned())
        })
}

/// A member's node, device bus id and compute capability, for the others.
fn device_record(node: usize, bus_id: &str, sm: (u32, u32)) -> [u8; DEVICE_BYTES] {
    let mut rec = [0u8; DEVICE_BYTES];
    rec[..8].copy_from_slice(&(node as u64).to_le_bytes());
    let n = bus_id.len().min(DEVICE_BYTES - 16);
    rec[8..8 + n].copy_from_slice(&bus_id.as_bytes()[..n]);
    rec[DEVICE_BYTES - 8..DEVICE_BYTES - 4].copy_from_slice(&sm.0.to_le_bytes());
    rec[DEVICE_BYTES - 4..].copy_from_slice(&sm.1.to_le_bytes());
    rec
}

fn parse_device_record(rec: &[u8]) -> (usize, String, (u32, u32)) {
    let word = |at: usize| u32::from_le_bytes(rec[at..at + 4].try_into().expect("4 bytes"));
    let node = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes")) as usize;
    let text = &rec[8..DEVICE_BYTES - 8];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    let bus = String::from_utf8_lossy(&text[..end]).into_owned();
    (node, bus, (word(DEVICE_BYTES - 8), word(DEVICE_BYTES - 4)))
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
pub(crate) fn connect<'rt>(group: &GroupCoordinator<'rt>, gpu: &'rt Gpu) -> Result<NcclComm<'rt>> {
    let fail = |msg: String| Error::invalid(Op::Connect, group.name(), msg);
    let nccl_fail = |source: NcclError| Error::nccl(Op::Connect, group.name(), source);
    let comm = group.raw_comm();
    let size = group.size();
    let me = group.rank_in_group();
    let _watch = group.watched(Op::Connect);

    // (0) Every member has NCCL (a GPU may open without it).
    let mut statuses = vec![0u8; STATUS_BYTES * size];
    let usable = gpu.api().map(|_| ()).map_err(|e| e.to_string());
    comm.all_gather_into(&status_record(&usable)[..], &mut statuses[..]);
    if let Some((rank, msg)) = first_failure(&statuses) {
        return Err(no_nccl(group.name(), rank, &msg));
    }

    // (1) No two members on one GPU; the group reduces as its oldest GPU can.
    let node = group.runtime().world().me().node;
    let info = gpu.info();
    let mine = device_record(node, &info.bus_id, info.compute_capability);
    let mut all = vec![0u8; DEVICE_BYTES * size];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let records: Vec<_> = all.chunks(DEVICE_BYTES).map(parse_device_record).collect();
    let devices: Vec<(usize, String)> = records.iter().map(|(n, b, _)| (*n, b.clone())).collect();
    duplicate_devices(&devices).map_err(fail)?;
    let sm = records
        .iter()
        .map(|r| r.2)
        .min()
        .unwrap_or(info.compute_capability);

    // (2) The unique id, made by the first member.
    let api = gpu.api()?;
    let mut packet = [0u8; 1 + UNIQUE_ID_BYTES];
    if me == 0 {
        packet = id_packet(api);
    }
    comm.process_at_rank(0).broadcast_into(&mut packet[..]);
    let id = id_of(&packet, 0).map_err(nccl_fail)?;

    // (3) Every member initialises; all learn every outcome.
    gpu.context()
        .bind_to_thread()
        .map_err(|e| fail(format!("binding the CUDA context: {e}")))?;
    let created = NcclComm::init(api, id, (size, me), group.name(), sm);
    let outcome = created.as_ref().map(|_| ()).map_err(|e| e.msg.clone());
    let mut statuses = vec![0u8; STATUS_BYTES * size];
    comm.all_gather_into(&status_record(&outcome)[..], &mut statuses[..]);
    if let Some((rank, msg)) = first_failure(&statuses) {
        // Abort, not destroy: destroying can wait for the members that failed.
        if let Ok(c) = created {
            c.state().abort(api, "a peer failed to initialise");
        }
        return Err(nccl_fail(NcclError::other(format!(
            "group rank {rank}: {msg}"
        ))));
    }
    let nccl = created.map_err(nccl_fail)?;
    gpu.register(nccl.state());

    // (4) Warm-up: NCCL connects lazily; pay that cost here, not in the first op.
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
    .map_err(nccl_fail)?;
    gpu.synchronize()?;
    tracing::debug!(
        rank = group.global_rank(),
        group = group.name(),
        device = %gpu.info().bus_id,
        "NCCL communicator ready"
    );
    Ok(nccl)
}

/// Tag of a pair communicator's unique id and status messages.
const TAG_PAIR: i32 = 0x5231;

/// Creates the two-member communicator of this rank and group rank `peer`
/// (both of them call it, inside an agreed point-to-point call): the lower
/// rank makes the unique id and sends it over MPI; each tells the other
/// whether its `ncclCommInitRank` worked, so both fail alike.
pub(crate) fn connect_pair<'rt>(
    group: &GroupCoordinator<'rt>,
    gpu: &'rt Gpu,
    peer: usize,
) -> Result<NcclComm<'rt>> {
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
    gpu.context().bind_to_thread().map_err(|e| {
        Error::invalid(
            Op::Connect,
            group.name(),
            format!("binding the CUDA context: {e}"),
        )
    })?;
    // A pair only sends and receives: nothing it does depends on the peer's GPU.
    let sm = gpu.info().compute_capability;
    let created = NcclComm::init(api, id, (2, usize::from(!low)), &name, sm);
    let mine = status_record(&created.as_ref().map(|_| ()).map_err(|e| e.msg.clone()));
    let theirs = swap_status(&other, &mine);
    if let Some((_, msg)) = first_failure(&theirs) {
        if let Ok(c) = created {
            c.state().abort(api, "the peer failed to initialise");
        }
        return Err(nccl_fail(NcclError::other(format!(
            "group rank {peer}: {msg}"
        ))));
    }
    let nccl = created.map_err(nccl_fail)?;
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
        all.extend(status_record(&Ok(())));
        all.extend(status_record(
            &Err("NCCL ncclCommInitRank failed: x".into()),
        ));
        all.extend(status_record(&Err("other".into())));
        assert_eq!(
            first_failure(&all),
            Some((1, "NCCL ncclCommInitRank failed: x".to_string()))
        );
        let long = "e".repeat(1000);
        let rec = status_record(&Err(long));
        assert_eq!(first_failure(&rec).unwrap().1.len(), STATUS_BYTES - 1);
        assert_eq!(first_failure(&status_record(&Ok(()))), None);
    }

    #[test]
    fn device_records_round_trip() {
        let r = device_record(7, "0000:1B:00.0", (9, 0));
        assert_eq!(
            parse_device_record(&r),
            (7, "0000:1B:00.0".to_string(), (9, 0))
        );
    }
}
