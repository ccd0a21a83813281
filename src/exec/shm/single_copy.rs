//! All-to-alls within a node with one copy. Each rank reads its block of
//! every peer's input straight from the peer's buffer (`process_vm_readv`,
//! [`cma`]) instead of through the window (a copy in, a copy out).
//!
//! Two phases:
//! 1. **Offer.** Each rank publishes its pid (0 where it takes no part: its
//!    setting, or an earlier refusal) and the addresses of what it offers.
//!    Where any rank published 0, every rank sees it in the same phase and
//!    the call moves through the window.
//! 2. **Settle.** After its reads, each rank publishes whether the kernel
//!    refused one. No offered buffer changes until every reader is done,
//!    and a refusal anywhere sends every rank to the window at the same
//!    call (which rewrites the output whole).
//!
//! The choice is made on what every rank knows alike (the group's size and
//! the longest block), so every rank takes the same phases.

use super::{Place, ShmExec};
use crate::error::Fault;
use crate::exec::blocks::Blocks;
use crate::exec::cma::{self, pair_runs, Segment};
use crate::watch::Pulse;
use std::io;

/// Every rank's offer, readable until [`Offers::settle`].
struct Offers<'a> {
    plane: &'a ShmExec,
    place: Place,
}

impl Offers<'_> {
    /// Word `i` of rank `r`'s offer (word 0 is its pid).
    fn word(&self, r: usize, i: usize) -> usize {
        let bytes = self.plane.peer(r, self.place, 8 * i, 8);
        u64::from_ne_bytes(bytes.try_into().expect("8 bytes")) as usize
    }

    /// Reads `segments` from rank `s`.
    ///
    /// # Safety
    /// Every segment's local range is memory of this call's output that
    /// nothing else touches during the read.
    unsafe fn read(&self, s: usize, segments: &[Segment]) -> io::Result<()> {
        // SAFETY: the caller's promise.
        unsafe { cma::read_from(self.word(s, 0) as u32, segments) }
    }

    /// The second phase: publishes `refusal` (a peer whose buffer could not
    /// be read, and why) and learns every rank's. `Ok(true)` when every
    /// read succeeded; otherwise single copies are off for this window
    /// (and, by [`cma::mark_refused`], for the process), every rank says
    /// why once, and the caller moves the call through the window.
    fn settle(self, pulse: &Pulse, refusal: Option<(usize, io::Error)>) -> Result<bool, Fault> {
        let plane = self.plane;
        let place = plane.begin_phase(4);
        // The errno, or -1 for a short read; 0: every read succeeded.
        let code = refusal
            .as_ref()
            .map_or(0, |(_, e)| e.raw_os_error().unwrap_or(-1));
        plane.own(place, 0, 4).copy_from_slice(&code.to_ne_bytes());
        plane.sync(pulse)?;
        let refused: Vec<(usize, i32)> = (0..plane.size)
            .map(|r| {
                let bytes = plane.peer(r, place, 0, 4);
                (r, i32::from_ne_bytes(bytes.try_into().expect("4 bytes")))
            })
            .filter(|(_, code)| *code != 0)
            .collect();
        let Some(&(first, code)) = refused.first() else {
            return Ok(true);
        };
        plane.single_copy.set(false);
        if cma::mark_refused() {
            let (whose, why) = match refusal {
                Some((s, e)) => (format!("reading local rank {s}'s buffer with"), e),
                None => (
                    format!("local rank {first} reading a peer's buffer with"),
                    match code {
                        -1 => io::Error::other("a short read"),
                        errno => io::Error::from_raw_os_error(errno),
                    },
                ),
            };
            tracing::debug!(
                "shared-memory executor: {whose} process_vm_readv was refused ({why}); copying through shared memory from now on"
            );
        }
        Ok(false)
    }
}

impl ShmExec {
    /// Whether a call whose longest block is `longest` bytes (the same on
    /// every rank) offers its buffers for single copies.
    pub(super) fn moves_by_single_copy(&self, longest: usize) -> bool {
        self.size > 1 && longest >= self.single_copy_from
    }

    /// The first phase: publishes this rank's pid and `addresses`; `None`
    /// (on every rank alike) when some rank takes no single copies.
    fn offer(
        &self,
        pulse: &Pulse,
        addresses: impl ExactSizeIterator<Item = usize>,
    ) -> Result<Option<Offers<'_>>, Fault> {
        let words = 1 + addresses.len();
        let place = self.begin_phase(8 * words);
        let pid = match self.single_copy.get() && !cma::refused() {
            true => std::process::id() as usize,
            false => 0,
        };
        let own = self.own(place, 0, 8 * words);
        for (slot, word) in own
            .chunks_exact_mut(8)
            .zip(std::iter::once(pid).chain(addresses))
        {
            slot.copy_from_slice(&(word as u64).to_ne_bytes());
        }
        self.sync(pulse)?;
        let offers = Offers { plane: self, place };
        Ok((0..self.size)
            .all(|r| offers.word(r, 0) != 0)
            .then_some(offers))
    }

    /// An all-to-all with one copy: every rank offers where each block of
    /// its `send` starts and reads its block of every peer's straight into
    /// `out`. `Ok(false)`: move it through the window instead.
    pub(super) fn all_to_all_single_copy<S: Blocks, O: Blocks>(
        &self,
        pulse: &Pulse,
        (send, from): (&[u8], S),
        (out, to): (&mut [u8], O),
    ) -> Result<bool, Fault> {
        let (p, me) = (self.size, self.me);
        let at = send.as_ptr() as usize;
        let Some(offers) = self.offer(pulse, (0..p).map(|r| at + from.start(r)))? else {
            return Ok(false);
        };
        let mut refusal = None;
        let mut segments = Vec::new();
        let base = out.as_mut_ptr();
        // Each rank starts with the next one, so no one rank is read by all.
        for s in (1..p).map(|k| (me + k) % p) {
            let n = to.len(s);
            let theirs = offers.word(s, 1 + me);
            let mine = from.start(me);
            segments.clear();
            pair_runs(
                to.runs(s, 0, n)
                    .map(|(at, pos, len)| (base.wrapping_add(at), pos, len)),
                from.runs(me, 0, n)
                    .map(|(at, pos, len)| (theirs + (at - mine), pos, len)),
                &mut segments,
            );
            // SAFETY: the segments lie inside `out` (its layout's runs),
            // which only this call writes.
            if let Err(e) = unsafe { offers.read(s, &segments) } {
                refusal = Some((s, e));
                break;
            }
            pulse.beat();
        }
        if refusal.is_none() {
            from.copy_to(send, me, to, out, me, 0, to.len(me));
        }
        offers.settle(pulse, refusal)
    }
}
