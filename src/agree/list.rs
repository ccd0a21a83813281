//! Agreement on a rank list among the listed ranks only (sub-groups and
//! stateless groups are made by their members, not by the whole world).
//! Each member posts a small record of its list to every other member it
//! lists and checks each record as it arrives: members whose lists differ,
//! in membership or only in order, get a named error in milliseconds; a
//! listed rank that never calls is left to the watchdog, which names it.

use crate::error::{Error, Result};
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::os::raw::c_int;

/// Tag of rank-list records on the world communicator.
const TAG: c_int = 0x5211;

/// What a member says about its list: digest of the ordered list, digest of
/// the set of members, length.
type Record = [u64; 3];

fn record(ranks: &[usize]) -> Record {
    let ordered = fnv1a(format!("{ranks:?}").as_bytes());
    let set = ranks
        .iter()
        .map(|r| fnv1a(&r.to_le_bytes()))
        .fold(0u64, u64::wrapping_add);
    [ordered, set, ranks.len() as u64]
}

/// Checks that every other member of `ranks` passed the same list as `me`.
pub(crate) fn agree_on_list(world: &SimpleCommunicator, ranks: &[usize], me: usize) -> Result<()> {
    let peers: Vec<usize> = ranks.iter().copied().filter(|r| *r != me).collect();
    if peers.is_empty() {
        return Ok(());
    }
    let mine = Box::new(record(ranks));
    let mut theirs: Vec<Record> = vec![[0; 3]; peers.len()];
    let (mut sends, mut recvs) = post(world, &mine, &mut theirs, &peers);
    let null = crate::mpi_ext::null_request;
    let mut verdict = Ok(());
    let mut pending = peers.len();
    // No deadline: a member that never calls is the watchdog's to name.
    crate::wait::until(None, || {
        for i in 0..peers.len() {
            if recvs[i] == null() {
                continue;
            }
            let mut done: c_int = 0;
            // SAFETY: a live request; MPI sets it to null once complete.
            unsafe { ffi::MPI_Test(&mut recvs[i], &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if done != 0 {
                pending -= 1;
                verdict = compare(&mine, &theirs[i], ranks, peers[i]);
                if verdict.is_err() {
                    break;
                }
            }
        }
        pending == 0 || verdict.is_err()
    });
    if let_go(&mut recvs, &mut sends) {
        std::mem::forget(mine);
    }
    verdict
}

/// This rank's record sent to every peer and theirs received into
/// `theirs`, all posted at once: (sends, receives).
fn post(
    world: &SimpleCommunicator,
    mine: &Record,
    theirs: &mut [Record],
    peers: &[usize],
) -> (Vec<ffi::MPI_Request>, Vec<ffi::MPI_Request>) {
    let null = crate::mpi_ext::null_request;
    let mut sends = vec![null(); peers.len()];
    let mut recvs = vec![null(); peers.len()];
    let comm = world.as_raw();
    for (i, p) in peers.iter().enumerate() {
        // SAFETY: buffers live until their requests complete or are freed
        // (the send buffer is leaked if a send is abandoned, see `let_go`).
        unsafe {
            ffi::MPI_Isend(
                mine.as_ptr().cast(),
                3,
                ffi::RSMPI_UINT64_T,
                *p as c_int,
                TAG,
                comm,
                &mut sends[i],
            );
            ffi::MPI_Irecv(
                theirs[i].as_mut_ptr().cast(),
                3,
                ffi::RSMPI_UINT64_T,
                *p as c_int,
                TAG,
                comm,
                &mut recvs[i],
            );
        }
    }
    (sends, recvs)
}

/// Receives still posted are cancelled; sends that have not completed (a
/// peer that never calls) are let go. Whether any send was: its buffer
/// must then outlive this call.
fn let_go(recvs: &mut [ffi::MPI_Request], sends: &mut [ffi::MPI_Request]) -> bool {
    let null = crate::mpi_ext::null_request;
    for r in recvs.iter_mut().filter(|r| **r != null()) {
        // SAFETY: live receive requests; cancel then wait is the MPI idiom.
        unsafe {
            ffi::MPI_Cancel(r);
            ffi::MPI_Wait(r, ffi::RSMPI_STATUS_IGNORE);
        }
    }
    let mut abandoned = false;
    for s in sends.iter_mut() {
        let mut done: c_int = 0;
        for _ in 0..1000 {
            // SAFETY: a live or null send request.
            unsafe { ffi::MPI_Test(s, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if done != 0 {
                break;
            }
            std::hint::spin_loop();
        }
        if done == 0 {
            // SAFETY: freeing an active send request is allowed; MPI
            // completes it in the background.
            unsafe { ffi::MPI_Request_free(s) };
            abandoned = true;
        }
    }
    abandoned
}

fn compare(mine: &Record, theirs: &Record, ranks: &[usize], peer: usize) -> Result<()> {
    if mine == theirs {
        return Ok(());
    }
    let how = if mine[1] == theirs[1] && mine[2] == theirs[2] {
        "the same members in a different order"
    } else {
        "different members"
    };
    Err(Error::Layout(format!(
        "world rank {peer} passed a rank list with {how} than this rank's {ranks:?}: every member must pass the same list"
    )))
}

/// The verdict on a request every rank made (a parallel layout, a list of
/// groups): `all` holds each rank's `[rejected, digest]`, in rank order, as
/// an all-gather left them; `me` asked for `digest` and accepted it. The
/// same error on every rank that accepted: the first rank that rejected the
/// request, or else the first that asked for something else.
pub(crate) fn agree_on_request(all: &[u64], what: &str, digest: u64, me: usize) -> Result<()> {
    if let Some(r) = all.chunks(2).position(|c| c[0] != 0) {
        return Err(Error::Layout(format!("rank {r} rejected {what}")));
    }
    if let Some(r) = all.chunks(2).position(|c| c[1] != digest) {
        return Err(Error::Layout(format!(
            "rank {r} passed different {what} than rank {me}"
        )));
    }
    Ok(())
}

/// FNV-1a, for cheap cross-rank agreement digests (not for security).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Checks a rank list for a collective among its members only: not empty,
/// no duplicates, inside a group of `size`, and holding the caller `me`.
pub(crate) fn check_rank_list(ranks: &[usize], size: usize, me: usize, what: &str) -> Result<()> {
    if ranks.is_empty() {
        return Err(Error::Layout("the rank list is empty".into()));
    }
    if let Some(r) = ranks.iter().find(|r| **r >= size) {
        return Err(Error::Layout(format!(
            "rank {r} in {ranks:?} is not in {what} (size {size})"
        )));
    }
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Layout(format!(
            "rank {} appears twice in {ranks:?}",
            w[0]
        )));
    }
    if !ranks.contains(&me) {
        return Err(Error::Layout(format!(
            "rank {me} called a collective over {ranks:?} but is not in the list"
        )));
    }
    Ok(())
}

/// Checks explicit group lists: ranks in range and each rank in at most one list.
pub(crate) fn validate_group_lists(world_size: usize, lists: &[Vec<usize>]) -> Result<()> {
    let mut owner = vec![None; world_size];
    for (g, list) in lists.iter().enumerate() {
        if list.is_empty() {
            return Err(Error::Layout(format!("group list {g} is empty")));
        }
        for &r in list {
            if r >= world_size {
                return Err(Error::Layout(format!(
                    "group list {g} names rank {r} but the world has {world_size} ranks"
                )));
            }
            if let Some(prev) = owner[r].replace(g) {
                return Err(Error::Layout(format!(
                    "rank {r} appears in group lists {prev} and {g}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_rejected_or_different_anywhere_is_named() {
        assert!(agree_on_request(&[0, 7, 0, 7, 0, 7], "a layout", 7, 0).is_ok());
        let rejected = agree_on_request(&[0, 7, 1, 7, 0, 9], "a layout", 7, 0).unwrap_err();
        assert_eq!(
            rejected.to_string(),
            "invalid parallel layout: rank 1 rejected a layout"
        );
        let differs = agree_on_request(&[0, 7, 0, 7, 0, 9], "a layout", 7, 1).unwrap_err();
        assert_eq!(
            differs.to_string(),
            "invalid parallel layout: rank 2 passed different a layout than rank 1"
        );
    }
}
