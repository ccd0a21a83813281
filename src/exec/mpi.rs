//! The host data plane: MPI on host memory.
//!
//! rsmpi counts are `i32`, so every transfer is cut into pieces of at most
//! `max_bytes` (and, for operations whose receive buffer holds a piece from
//! every rank, at most `max_bytes / P` per rank). Calls here assume the ranks
//! already agreed on sizes through the dispatch path.

use super::blocks::{BlockLayout, Blocks};
use super::copy::{copy_bytes, split_lens};
use super::mpi_calls::{given_up_after_loss, let_go_after_loss, received, status, wait_all, Calls};
use super::reduction::{reduce_into, Reducer};
use crate::error::Fault;
pub(crate) use crate::mpi_ext::null_request;
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::wait;
use crate::watch::Pulse;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::ops::Range;
use std::os::raw::c_int;

/// Tag of point-to-point call headers.
pub const TAG_HEADER: i32 = 0x5201;
/// Tag of the receiver's answer to a header.
pub const TAG_ANSWER: i32 = 0x5202;
/// Tag of point-to-point payload pieces.
pub const TAG_DATA: i32 = 0x5203;
/// Tag of the payload pieces of a batch (a tensor dictionary's tensors).
const TAG_BATCH: i32 = 0x5204;
/// Tag of `batch_send_recv` payloads.
const TAG_P2P_BATCH: i32 = 0x5205;

impl BlockLayout {
    /// The committed MPI datatype, `None` when a count does not fit `int`.
    fn datatype(self) -> Option<OwnedType> {
        let int = |v: usize| c_int::try_from(v).ok();
        let (count, run) = (int(self.count)?, int(self.run)?);
        let stride = ffi::MPI_Aint::try_from(self.stride).ok()?;
        let extent = ffi::MPI_Aint::try_from(self.extent).ok()?;
        // SAFETY: plain MPI type constructors on valid out-pointers; the
        // intermediate type is freed once the resized one holds it.
        unsafe {
            let mut vector = std::mem::zeroed();
            ffi::MPI_Type_create_hvector(count, run, stride, ffi::RSMPI_UINT8_T, &mut vector);
            let mut resized = std::mem::zeroed();
            ffi::MPI_Type_create_resized(vector, 0, extent, &mut resized);
            ffi::MPI_Type_free(&mut vector);
            ffi::MPI_Type_commit(&mut resized);
            Some(OwnedType(resized))
        }
    }
}

/// A committed MPI datatype, freed on drop.
struct OwnedType(ffi::MPI_Datatype);

impl Drop for OwnedType {
    fn drop(&mut self) {
        // SAFETY: a type this process committed and no call still uses.
        unsafe { ffi::MPI_Type_free(&mut self.0) };
    }
}

/// Posts `MPI_Isend` of `buf` (at most `i32::MAX` bytes) to `dst` with `tag`.
///
/// # Safety
/// `buf` must stay allocated and unchanged until the request completes.
pub(crate) unsafe fn isend_bytes(
    comm: ffi::MPI_Comm,
    buf: &[u8],
    dst: usize,
    tag: c_int,
) -> ffi::MPI_Request {
    let mut req = null_request();
    // SAFETY: the caller keeps `buf` alive until completion.
    unsafe {
        ffi::MPI_Isend(
            buf.as_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            dst as c_int,
            tag,
            comm,
            &mut req,
        )
    };
    req
}

/// Posts `MPI_Irecv` into `buf` (at most `i32::MAX` bytes) from `src` with `tag`.
///
/// # Safety
/// `buf` must stay allocated and untouched until the request completes.
unsafe fn irecv_bytes(
    comm: ffi::MPI_Comm,
    buf: &mut [u8],
    src: usize,
    tag: c_int,
) -> ffi::MPI_Request {
    let mut req = null_request();
    // SAFETY: the caller keeps `buf` alive and unaliased until completion.
    unsafe {
        ffi::MPI_Irecv(
            buf.as_mut_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            src as c_int,
            tag,
            comm,
            &mut req,
        )
    };
    req
}

/// Pieces of a buffer swapped with one peer while they are being made:
/// every receive is posted at the start, each send when its piece is
/// ready, and the receives are taken in order — so the transfer of one
/// piece overlaps the making of the next. Dropped with requests open (an
/// error path), it waits for them: they point into the caller's buffers.
pub(crate) struct Swap<'e> {
    exec: &'e MpiExec<'e>,
    peer: usize,
    recvs: Vec<ffi::MPI_Request>,
    lens: Vec<usize>,
    /// Piece k's messages are `recvs[firsts[k]..firsts[k + 1]]`.
    firsts: Vec<usize>,
    sends: Vec<ffi::MPI_Request>,
}

/// Largest message of a [`Swap`]: under Open MPI's TCP eager limit
/// (64 KiB), so no message waits for its receiver's go-ahead — which, on a
/// link whose queue is full of the other direction's data, arrives late
/// (docs/BENCHMARKS.md, "Tuned constants").
const SWAP_MESSAGE: usize = 32 << 10;

/// The messages of a swap's piece `r`.
fn messages(r: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let n = r.len().div_ceil(SWAP_MESSAGE).max(1);
    (0..n).map(move |i| {
        let at = r.start + i * SWAP_MESSAGE;
        at..(at + SWAP_MESSAGE).min(r.end)
    })
}

impl<'e> Swap<'e> {
    /// Posts the receive of every piece `pieces[k]` of `theirs` from
    /// `peer` (each at most `i32::MAX` bytes).
    ///
    /// # Safety
    /// `theirs` must stay allocated and untouched until
    /// [`received`](Self::received) has returned for its piece, or the swap
    /// is dropped.
    pub(crate) unsafe fn post(
        exec: &'e MpiExec<'e>,
        peer: usize,
        theirs: &mut [u8],
        pieces: &[Range<usize>],
    ) -> Swap<'e> {
        let comm = exec.comm.as_raw();
        let mut recvs = Vec::new();
        let mut lens = Vec::new();
        let mut firsts = Vec::with_capacity(pieces.len() + 1);
        for r in pieces {
            firsts.push(recvs.len());
            for m in messages(r.clone()) {
                lens.push(m.len());
                // SAFETY: the caller keeps `theirs` for the requests' life.
                recvs.push(unsafe { irecv_bytes(comm, &mut theirs[m], peer, TAG_DATA) });
            }
        }
        firsts.push(recvs.len());
        Swap {
            exec,
            peer,
            recvs,
            lens,
            firsts,
            sends: Vec::new(),
        }
    }

    /// Posts the send of the next piece, `bytes`.
    ///
    /// # Safety
    /// `bytes` must stay allocated and unchanged until the swap is finished
    /// or dropped.
    pub(crate) unsafe fn send(&mut self, bytes: &[u8]) {
        let comm = self.exec.comm.as_raw();
        for m in messages(0..bytes.len()) {
            // SAFETY: the caller keeps `bytes` for the request's life.
            let req = unsafe { isend_bytes(comm, &bytes[m], self.peer, TAG_DATA) };
            self.sends.push(req);
        }
        self.progress();
    }

    /// Lets MPI move what is posted, without waiting.
    pub(crate) fn progress(&mut self) {
        let mut flag: c_int = 0;
        // SAFETY: live or null requests; statuses ignored.
        unsafe {
            ffi::MPI_Testall(
                self.sends.len() as c_int,
                self.sends.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
    }

    /// Waits for piece `k` from the peer (its bytes checked) by the host
    /// plane's wait policy: a piece takes milliseconds on a network, and a
    /// busy-polling rank would take the core its node's ranks are working on.
    /// Only a completed piece is progress: the watchdog names a peer that
    /// never sends.
    pub(crate) fn received(&mut self, k: usize) -> Result<(), Fault> {
        for i in self.firsts[k]..self.firsts[k + 1] {
            let mut status = [status()];
            wait_all(std::slice::from_mut(&mut self.recvs[i]), &mut status);
            self.exec.pulse.beat();
            check_count(received(&status[0]), self.lens[i], self.peer)?;
        }
        Ok(())
    }

    /// Waits for every send.
    pub(crate) fn finish(mut self) {
        let _ = self.exec.complete(&mut self.sends, &[], self.peer);
    }
}

impl MpiExec<'_> {
    /// `mine` to `peer` and the peer's into `theirs`, in eager-sized
    /// messages (see [`Swap`]).
    pub(crate) fn swap(&self, peer: usize, mine: &[u8], theirs: &mut [u8]) -> Result<(), Fault> {
        let whole = 0..theirs.len();
        // SAFETY: both buffers are borrowed until the swap is finished here
        // (or dropped on the error path, which waits for its requests).
        let mut swap = unsafe { Swap::post(self, peer, theirs, std::slice::from_ref(&whole)) };
        // SAFETY: as above.
        unsafe { swap.send(mine) };
        swap.received(0)?;
        swap.finish();
        Ok(())
    }
}

impl Drop for Swap<'_> {
    fn drop(&mut self) {
        // Dropped by a call given up (unwinding from its wait): its peer
        // may never answer, and waiting here would give up inside a
        // destructor. The requests are leaked; the runtime ends the job
        // without finalising MPI.
        if crate::wait::give_up::gave_up() {
            return;
        }
        let _ = self.exec.complete(&mut self.recvs, &[], self.peer);
        let _ = self.exec.complete(&mut self.sends, &[], self.peer);
    }
}

/// MPI over host memory for one communicator. Every piece that completes
/// is progress for the hang watchdog, so a long transfer that still moves is
/// never mistaken for a stuck one.
#[derive(Clone, Copy)]
pub struct MpiExec<'c> {
    comm: &'c SimpleCommunicator,
    max_bytes: usize,
    pulse: Pulse<'c>,
}

impl<'c> MpiExec<'c> {
    /// A plane over `comm` cutting messages at `max_bytes`.
    pub(crate) fn new(comm: &'c SimpleCommunicator, max_bytes: usize, pulse: Pulse<'c>) -> Self {
        MpiExec {
            comm,
            max_bytes: max_bytes.max(1),
            pulse,
        }
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// This rank's place in the group.
    pub(crate) fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    /// The group's collectives, blocking or waited for by the wait policy.
    fn calls(&self) -> Calls {
        Calls(self.comm.as_raw())
    }

    /// Bytes one rank contributes per round when every rank's piece lands in one buffer.
    fn per_rank_piece(&self) -> usize {
        (self.max_bytes / self.size()).max(1)
    }

    /// Sends `send` to `dst` while receiving `recv` from `src`, each only when
    /// its flag is set (a link whose handshake failed carries nothing). Pieces
    /// pair up by index on each link, so no ring of such calls can deadlock.
    pub(crate) fn send_recv(
        &self,
        send: Option<&[u8]>,
        dst: usize,
        recv: Option<&mut [u8]>,
        src: usize,
    ) -> Result<(), Fault> {
        let c = self.max_bytes;
        let send_pieces: Vec<&[u8]> = send.map_or(Vec::new(), |b| b.chunks(c).collect());
        let mut recv_pieces: Vec<&mut [u8]> =
            recv.map_or(Vec::new(), |b| b.chunks_mut(c).collect());
        let rounds = send_pieces.len().max(recv_pieces.len());
        let mut recv_iter = recv_pieces.iter_mut();
        let calls = self.calls();
        for k in 0..rounds {
            let got = match (send_pieces.get(k), recv_iter.next()) {
                (Some(s), Some(r)) => Some((
                    calls.send_recv((s, dst, TAG_DATA), (r, src, TAG_DATA)),
                    r.len(),
                )),
                (Some(s), None) => {
                    calls.send(s, dst, TAG_DATA);
                    None
                }
                (None, Some(r)) => Some((calls.recv(r, src, TAG_DATA), r.len())),
                (None, None) => None,
            };
            if let Some((got, want)) = got {
                check_count(got, want, src)?;
            }
            self.pulse.beat();
        }
        Ok(())
    }

    /// Exchanges fixed-size headers with `tag`: ours to `dst`, `src`'s into `theirs`.
    pub fn exchange_headers(
        &self,
        ours: &[u8],
        dst: usize,
        theirs: &mut [u8],
        src: usize,
        tag: i32,
    ) {
        self.calls().send_recv((ours, dst, tag), (theirs, src, tag));
    }

    /// Block `r` of `send` (bytes `send_blocks[r]`) to rank `r`, whose
    /// `out` receives it at `recv_blocks[sender]`: one `MPI_Alltoallv` on
    /// the caller's buffers when every block fits a message, rounds
    /// through scratch otherwise. `longest`: the longest block any rank
    /// sends, the same on every rank (it decides the rounds).
    pub(crate) fn all_to_all_v(
        &self,
        send: &[u8],
        send_blocks: &[Range<usize>],
        out: &mut [u8],
        recv_blocks: &[Range<usize>],
        longest: usize,
    ) {
        let p = self.size();
        let ints = |blocks: &[Range<usize>], piece: Option<(usize, usize)>| {
            blocks
                .iter()
                .enumerate()
                .map(|(r, b)| match piece {
                    None => (b.len() as c_int, b.start as c_int),
                    Some((start, piece)) => (
                        b.len().saturating_sub(start).min(piece) as c_int,
                        (r * piece) as c_int,
                    ),
                })
                .unzip::<_, _, Vec<c_int>, Vec<c_int>>()
        };
        // The same decision on every rank: no buffer exceeds P blocks.
        if longest.saturating_mul(p) <= self.max_bytes {
            let (sc, sd) = ints(send_blocks, None);
            let (rc, rd) = ints(recv_blocks, None);
            // Every block lies inside its buffer (the caller's counts were
            // checked against the tensors), within `int`.
            self.calls().all_to_all_v((send, &sc, &sd), (out, &rc, &rd));
            self.pulse.beat();
            return;
        }
        let piece = self.per_rank_piece();
        let (mut s, mut r) = (vec![0u8; piece * p], vec![0u8; piece * p]);
        for start in (0..longest).step_by(piece) {
            let (sc, sd) = ints(send_blocks, Some((start, piece)));
            let (rc, rd) = ints(recv_blocks, Some((start, piece)));
            for (q, b) in send_blocks.iter().enumerate() {
                let n = sc[q] as usize;
                if n > 0 {
                    copy_bytes(&mut s[q * piece..][..n], &send[b.start + start..][..n]);
                }
            }
            // Piece `q` of each scratch buffer starts at `q·piece` and
            // holds at most `piece` bytes.
            self.calls()
                .all_to_all_v((&s, &sc, &sd), (&mut r, &rc, &rd));
            self.pulse.beat();
            for (q, b) in recv_blocks.iter().enumerate() {
                let n = rc[q] as usize;
                if n > 0 {
                    copy_bytes(&mut out[b.start + start..][..n], &r[q * piece..][..n]);
                }
            }
        }
    }

    /// Each rank's `mine` (lengths `lens`, known to all) delivered to `root`
    /// (`None` elsewhere).
    fn gather_varcount_to(&self, mine: &[u8], lens: &[usize], root: usize) -> Option<Vec<Vec<u8>>> {
        let is_root = self.comm.rank() as usize == root;
        let mut out: Vec<Vec<u8>> = lens
            .iter()
            .map(|n| Vec::with_capacity(if is_root { *n } else { 0 }))
            .collect();
        for (start, counts) in self.varcount_rounds(lens) {
            let own = own_piece(mine, start, counts[self.comm.rank() as usize]);
            if is_root {
                let displs = displacements(&counts);
                let mut tmp = vec![0u8; counts.iter().sum::<i32>() as usize];
                self.calls()
                    .gather_v(own, Some((&mut tmp, &counts, &displs)), root);
                scatter_round(&mut out, &tmp, &counts, &displs);
            } else {
                self.calls().gather_v(own, None, root);
            }
            self.pulse.beat();
        }
        is_root.then_some(out)
    }

    /// (offset, per-rank counts) of each round of a variable-count exchange.
    fn varcount_rounds(&self, lens: &[usize]) -> Vec<(usize, Vec<i32>)> {
        let piece = self.per_rank_piece();
        let longest = lens.iter().copied().max().unwrap_or(0);
        (0..longest)
            .step_by(piece)
            .map(|start| {
                let counts = lens
                    .iter()
                    .map(|n| n.saturating_sub(start).min(piece) as i32)
                    .collect();
                (start, counts)
            })
            .collect()
    }

    /// Sends `bytes` to `dst` in pieces with `TAG_DATA`.
    pub fn send(&self, bytes: &[u8], dst: usize) {
        for piece in bytes.chunks(self.max_bytes) {
            self.calls().send(piece, dst, TAG_DATA);
            self.pulse.beat();
        }
    }

    /// Receives exactly `buf.len()` bytes from `src` in pieces with
    /// `TAG_DATA`; a short piece is an error (a longer one is MPI's
    /// truncation error).
    pub(crate) fn recv(&self, buf: &mut [u8], src: usize) -> Result<(), Fault> {
        self.recv_tagged(buf, src, TAG_DATA)
    }

    /// [`recv`](Self::recv) with another tag.
    pub(crate) fn recv_tagged(&self, buf: &mut [u8], src: usize, tag: i32) -> Result<(), Fault> {
        for piece in buf.chunks_mut(self.max_bytes) {
            let want = piece.len();
            check_count(self.calls().recv(piece, src, tag), want, src)?;
            self.pulse.beat();
        }
        Ok(())
    }

    /// The largest piece a transfer is cut into.
    pub(crate) fn max_piece(&self) -> usize {
        self.max_bytes
    }

    /// Sends every buffer of `bufs` to `dst` at once: every piece is posted
    /// with `TAG_BATCH` before any is waited for, so the transfers overlap
    /// (one wait for the lot, as FastVideo's dict of async sends). Empty
    /// buffers send nothing; the receiver posts the same list.
    pub(crate) fn send_batch(&self, bufs: &[&[u8]], dst: usize) {
        let comm = self.comm.as_raw();
        let mut reqs: Vec<ffi::MPI_Request> = bufs
            .iter()
            .flat_map(|b| b.chunks(self.max_bytes))
            // SAFETY: every request is completed below, before `bufs` can be released.
            .map(|piece| unsafe { isend_bytes(comm, piece, dst, TAG_BATCH) })
            .collect();
        let _ = self.complete(&mut reqs, &[], dst);
    }

    /// Receives into every buffer of `bufs` from `src` at once (the
    /// counterpart of [`send_batch`](Self::send_batch)); a short piece is an
    /// error once every piece has arrived.
    pub(crate) fn recv_batch(&self, bufs: &mut [&mut [u8]], src: usize) -> Result<(), Fault> {
        let comm = self.comm.as_raw();
        let mut reqs = Vec::new();
        let mut want = Vec::new();
        for piece in bufs.iter_mut().flat_map(|b| b.chunks_mut(self.max_bytes)) {
            want.push(piece.len());
            // SAFETY: `piece` is exclusively borrowed until every request completes below.
            reqs.push(unsafe { irecv_bytes(comm, piece, src, TAG_BATCH) });
        }
        self.complete(&mut reqs, &want, src)
    }

    /// Broadcasts every buffer of `bufs` from `root` at once: one
    /// `MPI_Ibcast` per piece, all posted before any is waited for (every
    /// member posts the same list, which the dictionary's metadata fixed).
    pub(crate) fn broadcast_batch(&self, bufs: &mut [&mut [u8]], root: usize) {
        let comm = self.comm.as_raw();
        let mut reqs: Vec<ffi::MPI_Request> = bufs
            .iter_mut()
            .flat_map(|b| b.chunks_mut(self.max_bytes))
            .map(|piece| {
                let mut req = null_request();
                // SAFETY: `piece` is exclusively borrowed until every request
                // completes below; its length fits a c_int (max_bytes does).
                unsafe {
                    ffi::MPI_Ibcast(
                        piece.as_mut_ptr().cast(),
                        piece.len() as c_int,
                        ffi::RSMPI_UINT8_T,
                        root as c_int,
                        comm,
                        &mut req,
                    )
                };
                req
            })
            .collect();
        let _ = self.complete(&mut reqs, &[], root);
    }

    /// Waits for every request, beating the pulse as each completes; with
    /// `want` (receives), checks each piece's byte count.
    fn complete(
        &self,
        reqs: &mut [ffi::MPI_Request],
        want: &[usize],
        peer: usize,
    ) -> Result<(), Fault> {
        self.complete_from(reqs, want, &|_| peer)
    }

    /// [`complete`](Self::complete) with the peer of each receive request.
    fn complete_from(
        &self,
        reqs: &mut [ffi::MPI_Request],
        want: &[usize],
        peer_of: &dyn Fn(usize) -> usize,
    ) -> Result<(), Fault> {
        let n = reqs.len();
        let mut left = n;
        let mut index: Vec<c_int> = vec![0; n];
        let mut statuses = vec![status(); n];
        let mut fault = Ok(());
        while left > 0 {
            let mut done: c_int = 0;
            // MPI_Waitsome would poll inside MPI, holding the core that a
            // peer on a busy node may be waiting for: test by the host
            // plane's wait policy instead.
            wait::until(None, || {
                // SAFETY: live requests (MPI nulls completed ones and skips them).
                unsafe {
                    ffi::MPI_Testsome(
                        n as c_int,
                        reqs.as_mut_ptr(),
                        &mut done,
                        index.as_mut_ptr(),
                        statuses.as_mut_ptr(),
                    );
                }
                done != 0 || given_up_after_loss()
            });
            let_go_after_loss(reqs, &mut statuses);
            // SAFETY: reading an MPI constant.
            if done == unsafe { ffi::RSMPI_UNDEFINED } || done <= 0 {
                break;
            }
            for k in 0..done as usize {
                let i = index[k] as usize;
                if let Some(w) = want.get(i) {
                    let got = received(&statuses[k]);
                    if got != *w && fault.is_ok() {
                        fault = Err(Fault::Short {
                            peer: peer_of(i),
                            got,
                            want: *w,
                        });
                    }
                }
            }
            left -= done as usize;
            self.pulse.beat();
        }
        fault
    }

    /// A batch's headers: for each `(mine, peer, out_tag, in_tag)`, sends
    /// `mine` to `peer` with `out_tag` and receives `theirs[i]` from it with
    /// `in_tag`, every one posted before any is waited for.
    pub(crate) fn swap_headers(&self, mine: &[(&[u8], usize, i32, i32)], theirs: &mut [&mut [u8]]) {
        let comm = self.comm.as_raw();
        let mut reqs = Vec::with_capacity(2 * mine.len());
        for ((bytes, peer, out_tag, in_tag), into) in mine.iter().zip(theirs.iter_mut()) {
            // SAFETY: both buffers outlive the requests, completed below.
            unsafe {
                reqs.push(irecv_bytes(comm, into, *peer, *in_tag));
                reqs.push(isend_bytes(comm, bytes, *peer, *out_tag));
            }
        }
        let _ = self.complete(&mut reqs, &[], 0);
    }

    /// A batch's payloads: every receive (`recvs`: buffer and source) and
    /// every send (`sends`: buffer and destination) posted at once, in
    /// pieces, then waited for; a short piece is a fault naming its sender.
    pub(crate) fn send_recv_batch(
        &self,
        sends: &[(&[u8], usize)],
        recvs: &mut [(&mut [u8], usize)],
    ) -> Result<(), Fault> {
        let comm = self.comm.as_raw();
        let (mut reqs, mut want, mut from) = (Vec::new(), Vec::new(), Vec::new());
        for (buf, src) in recvs.iter_mut() {
            for piece in buf.chunks_mut(self.max_bytes) {
                want.push(piece.len());
                from.push(*src);
                // SAFETY: `piece` is exclusively borrowed until every request completes below.
                reqs.push(unsafe { irecv_bytes(comm, piece, *src, TAG_P2P_BATCH) });
            }
        }
        for (buf, dst) in sends {
            for piece in buf.chunks(self.max_bytes) {
                // SAFETY: every request is completed below, before `sends` can be released.
                reqs.push(unsafe { isend_bytes(comm, piece, *dst, TAG_P2P_BATCH) });
            }
        }
        self.complete_from(&mut reqs, &want, &|i| from[i])
    }

    /// Sends a fixed-size header with `tag`.
    pub fn send_header(&self, header: &[u8], dst: usize, tag: i32) {
        self.calls().send(header, dst, tag);
    }

    /// Receives a fixed-size header with `tag`.
    pub fn recv_header(&self, header: &mut [u8], src: usize, tag: i32) {
        self.calls().recv(header, src, tag);
    }
}

/// MPI's collectives on the group's communicator, cut into messages of at
/// most `max_bytes`: every op of `HostMoves`, which the fast paths fall back on.
impl MpiExec<'_> {
    pub(crate) fn barrier(&self) -> Result<(), Fault> {
        self.calls().barrier();
        Ok(())
    }

    pub(crate) fn all_gather_into(&self, block: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let (n, p) = (block.len(), self.size());
        // Empty Rust buffers share one dangling address, which MPI reads as aliasing.
        if n == 0 {
            return Ok(());
        }
        if n <= self.per_rank_piece() {
            self.calls().all_gather(block, out);
            return Ok(());
        }
        let piece = self.per_rank_piece();
        let mut tmp = vec![0u8; piece * p];
        for start in (0..n).step_by(piece) {
            let len = piece.min(n - start);
            self.calls()
                .all_gather(&block[start..start + len], &mut tmp[..len * p]);
            self.pulse.beat();
            for r in 0..p {
                copy_bytes(
                    &mut out[r * n + start..r * n + start + len],
                    &tmp[r * len..(r + 1) * len],
                );
            }
        }
        Ok(())
    }

    pub(crate) fn scatter(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        root: usize,
    ) -> Result<(), Fault> {
        let (n, p) = (recv.len(), self.size());
        if n == 0 {
            return Ok(());
        }
        let piece = self.per_rank_piece();
        if n <= piece {
            self.calls().scatter(send, recv, root);
            return Ok(());
        }
        let mut tmp = vec![0u8; if send.is_some() { piece * p } else { 0 }];
        for start in (0..n).step_by(piece) {
            let len = piece.min(n - start);
            let mine = &mut recv[start..start + len];
            match send {
                Some(send) => {
                    for r in 0..p {
                        copy_bytes(
                            &mut tmp[r * len..(r + 1) * len],
                            &send[r * n + start..r * n + start + len],
                        );
                    }
                    self.calls().scatter(Some(&tmp[..len * p]), mine, root);
                }
                None => self.calls().scatter(None, mine, root),
            }
            self.pulse.beat();
        }
        Ok(())
    }

    pub(crate) fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Fault> {
        for piece in buf.chunks_mut(self.max_bytes) {
            self.calls().broadcast(piece, root);
            self.pulse.beat();
        }
        Ok(())
    }

    pub(crate) fn all_to_all_into(&self, send: &[u8], out: &mut [u8]) -> Result<(), Fault> {
        let p = self.size();
        if send.is_empty() {
            return Ok(());
        }
        let block = send.len() / p;
        if block <= self.per_rank_piece() {
            self.calls().all_to_all(send, out, block);
            return Ok(());
        }
        let piece = self.per_rank_piece();
        let mut s = vec![0u8; piece * p];
        let mut r = vec![0u8; piece * p];
        for start in (0..block).step_by(piece) {
            let len = piece.min(block - start);
            for q in 0..p {
                copy_bytes(
                    &mut s[q * len..(q + 1) * len],
                    &send[q * block + start..q * block + start + len],
                );
            }
            self.calls()
                .all_to_all(&s[..len * p], &mut r[..len * p], len);
            self.pulse.beat();
            for q in 0..p {
                copy_bytes(
                    &mut out[q * block + start..q * block + start + len],
                    &r[q * len..(q + 1) * len],
                );
            }
        }
        Ok(())
    }

    /// One `MPI_Allgatherv` on the caller's buffers when `out` fits a
    /// message, rounds through scratch otherwise.
    pub(crate) fn all_gather_v_into(
        &self,
        mine: &[u8],
        lens: &[usize],
        out: &mut [u8],
    ) -> Result<(), Fault> {
        let total: usize = lens.iter().sum();
        if total <= self.max_bytes {
            let counts: Vec<c_int> = lens.iter().map(|n| *n as c_int).collect();
            let displs = displacements(&counts);
            // `out` holds every count at its displacement (all within
            // `int`: `total` is).
            self.calls().all_gather_v(mine, out, &counts, &displs);
            self.pulse.beat();
            return Ok(());
        }
        let starts: Vec<usize> = lens
            .iter()
            .scan(0, |at, n| {
                *at += n;
                Some(*at - n)
            })
            .collect();
        for (start, counts) in self.varcount_rounds(lens) {
            let displs = displacements(&counts);
            let mut tmp = vec![0u8; counts.iter().sum::<i32>() as usize];
            let own = own_piece(mine, start, counts[self.comm.rank() as usize]);
            self.calls().all_gather_v(own, &mut tmp, &counts, &displs);
            self.pulse.beat();
            for (r, at) in starts.iter().enumerate() {
                let (d, n) = (displs[r] as usize, counts[r] as usize);
                if n > 0 {
                    copy_bytes(&mut out[at + start..at + start + n], &tmp[d..d + n]);
                }
            }
        }
        Ok(())
    }

    /// f16/bf16 are reduced in f32 and rounded once at the end.
    pub(crate) fn all_reduce_into(
        &self,
        input: &Tensor,
        output: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        reduce_into(
            &AllReduce(self),
            input.data(),
            output.data_mut(),
            op,
            self.size(),
        );
        Ok(())
    }

    pub(crate) fn reduce_scatter_block_into(
        &self,
        packed: &Tensor,
        output: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        reduce_into(
            &ReduceScatter(self),
            packed.data(),
            output.data_mut(),
            op,
            self.size(),
        );
        Ok(())
    }

    pub(crate) fn reduce_into_root(
        &self,
        input: &Tensor,
        output: &mut Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Fault> {
        reduce_into(
            &Reduce(self, root),
            input.data(),
            output.data_mut(),
            op,
            self.size(),
        );
        Ok(())
    }

    pub(crate) fn gather_into(
        &self,
        block: &[u8],
        out: Option<&mut [u8]>,
        root: usize,
    ) -> Result<(), Fault> {
        let (n, p) = (block.len(), self.size());
        if n == 0 {
            return Ok(());
        }
        let mut out = out.filter(|_| self.comm.rank() as usize == root);
        let piece = self.per_rank_piece();
        if n <= piece {
            self.calls().gather(block, out, root);
            self.pulse.beat();
            return Ok(());
        }
        // Each piece lands as `P` runs of the root's blocks.
        let mut tmp = vec![0u8; if out.is_some() { piece * p } else { 0 }];
        for start in (0..n).step_by(piece) {
            let len = piece.min(n - start);
            let send = &block[start..start + len];
            match out.as_deref_mut() {
                Some(out) => {
                    self.calls().gather(send, Some(&mut tmp[..len * p]), root);
                    for r in 0..p {
                        copy_bytes(
                            &mut out[r * n + start..r * n + start + len],
                            &tmp[r * len..(r + 1) * len],
                        );
                    }
                }
                None => self.calls().gather(send, None, root),
            }
            self.pulse.beat();
        }
        Ok(())
    }

    /// Through MPI derived datatypes (`layout`s), so no pack or unpack copy
    /// is made: Open MPI gathers the strided block while it copies it into
    /// shared memory anyway. `false`, having done nothing, when a count
    /// would not fit MPI's `int` or the transfer is larger than one message.
    pub(crate) fn all_to_all_strided(
        &self,
        send: &[u8],
        send_layout: BlockLayout,
        recv: &mut [u8],
        recv_layout: BlockLayout,
    ) -> Result<bool, Fault> {
        if send.len() > self.max_bytes || recv.len() > self.max_bytes {
            return Ok(false);
        }
        if let (1, 1, Ok(run)) = (
            send_layout.count,
            recv_layout.count,
            c_int::try_from(send_layout.run),
        ) {
            if send_layout.run == recv_layout.run {
                // Contiguous blocks both sides (a 4-d all-to-all whose outer
                // dims are 1): the plain call on the caller's buffers, as a
                // raw all-to-all, with no datatype to build.
                // Each buffer holds `size` blocks of `run` bytes (the layouts
                // were derived from their shapes).
                self.calls().all_to_all(send, recv, run as usize);
                self.pulse.beat();
                return Ok(true);
            }
        }
        let (Some(stype), Some(rtype)) = (send_layout.datatype(), recv_layout.datatype()) else {
            return Ok(false);
        };
        let (p, me) = (self.comm.size() as usize, self.comm.rank() as usize);
        // Byte displacements of the blocks (`int` in MPI_Alltoallw).
        let displs = |l: BlockLayout| -> Option<Vec<c_int>> {
            (0..p).map(|r| c_int::try_from(r * l.extent).ok()).collect()
        };
        match (displs(send_layout), displs(recv_layout)) {
            (Some(sdispls), Some(rdispls)) => {
                // Every peer's block through MPI; this rank's own block
                // copied here, run by run: Open MPI's datatype engine packs
                // and unpacks a strided self-block (about 20% of a 2-rank
                // exchange at 1-4 MiB).
                let counts: Vec<c_int> = (0..p).map(|r| c_int::from(r != me)).collect();
                let (stypes, rtypes) = (vec![stype.0; p], vec![rtype.0; p]);
                // SAFETY: both datatypes cover one block, block r of each
                // buffer starts at its displacement (the layouts were derived
                // from their shapes); the arrays have `p` entries.
                unsafe {
                    self.calls().all_to_all_w(
                        (send.as_ptr().cast(), &sdispls, &stypes),
                        (recv.as_mut_ptr().cast(), &rdispls, &rtypes),
                        &counts,
                    );
                }
                let block = send_layout.count * send_layout.run;
                send_layout.copy_to(send, me, recv_layout, recv, me, 0, block);
            }
            // Beyond `int` displacements: Open MPI's alltoall moves every block.
            // SAFETY: both datatypes cover exactly `size` blocks of the
            // buffers (the layouts were derived from their shapes).
            _ => unsafe {
                self.calls().all_to_all_typed(
                    (send.as_ptr().cast(), stype.0),
                    (recv.as_mut_ptr().cast(), rtype.0),
                    1,
                );
            },
        }
        self.pulse.beat();
        Ok(true)
    }

    pub(crate) fn gather_varcount(
        &self,
        mine: &[u8],
        lens: &[usize],
        root: Option<usize>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fault> {
        Ok(match root {
            Some(root) => self.gather_varcount_to(mine, lens, root),
            None => {
                let mut flat = vec![0u8; lens.iter().sum()];
                self.all_gather_v_into(mine, lens, &mut flat)?;
                Some(split_lens(&flat, lens))
            }
        })
    }
}

struct AllReduce<'p, 'c>(&'p MpiExec<'c>);

impl Reducer for AllReduce<'_, '_> {
    fn run<T: Equivalence + Copy + Default, O: Operation + Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: O,
    ) {
        let piece = (self.0.max_bytes / std::mem::size_of::<T>()).max(1);
        for (s, r) in send.chunks(piece).zip(recv.chunks_mut(piece)) {
            self.0.calls().all_reduce(s, r, op.as_raw());
            self.0.pulse.beat();
        }
    }
}

struct Reduce<'p, 'c>(&'p MpiExec<'c>, usize);

impl Reducer for Reduce<'_, '_> {
    fn run<T: Equivalence + Copy + Default, O: Operation + Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: O,
    ) {
        let (calls, root) = (self.0.calls(), self.1);
        let piece = (self.0.max_bytes / std::mem::size_of::<T>()).max(1);
        if self.0.comm.rank() as usize == root {
            for (s, r) in send.chunks(piece).zip(recv.chunks_mut(piece)) {
                calls.reduce(s, Some(r), root, op.as_raw());
                self.0.pulse.beat();
            }
        } else {
            for s in send.chunks(piece) {
                calls.reduce(s, None, root, op.as_raw());
                self.0.pulse.beat();
            }
        }
    }
}

struct ReduceScatter<'p, 'c>(&'p MpiExec<'c>);

impl Reducer for ReduceScatter<'_, '_> {
    fn blocks(&self) -> usize {
        self.0.size()
    }

    fn run<T: Equivalence + Copy + Default, O: Operation + Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: O,
    ) {
        let p = self.0.size();
        let block = recv.len();
        let piece = (self.0.per_rank_piece() / std::mem::size_of::<T>()).max(1);
        if block <= piece {
            self.0.calls().reduce_scatter_block(send, recv, op.as_raw());
            return;
        }
        let mut s = vec![T::default(); piece * p];
        for start in (0..block).step_by(piece) {
            let len = piece.min(block - start);
            for q in 0..p {
                s[q * len..(q + 1) * len]
                    .copy_from_slice(&send[q * block + start..q * block + start + len]);
            }
            self.0.calls().reduce_scatter_block(
                &s[..len * p],
                &mut recv[start..start + len],
                op.as_raw(),
            );
            self.0.pulse.beat();
        }
    }
}

/// A received piece must hold the bytes the header promised.
fn check_count(got: usize, want: usize, peer: usize) -> Result<(), Fault> {
    if got == want {
        Ok(())
    } else {
        Err(Fault::Short { peer, got, want })
    }
}

/// This rank's piece of a variable-count round (empty once its data is sent).
fn own_piece(mine: &[u8], start: usize, count: i32) -> &[u8] {
    let start = start.min(mine.len());
    &mine[start..start + count as usize]
}

/// Where each of `counts` starts when laid end to end (MPI's `displs`).
pub(crate) fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// Appends each rank's part of one variable-count round to its output.
fn scatter_round(out: &mut [Vec<u8>], tmp: &[u8], counts: &[i32], displs: &[i32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let d = displs[r] as usize;
        o.extend_from_slice(&tmp[d..d + counts[r] as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::BlockLayout;

    #[test]
    fn counts_past_mpis_int_are_refused_not_truncated() {
        let huge = BlockLayout {
            count: 1 << 31,
            run: 1,
            stride: 1,
            extent: 1,
        };
        assert!(huge.datatype().is_none());
    }
}
