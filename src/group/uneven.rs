//! What both planes share for the uneven ops, `all_to_all_v` and
//! `all_gather_v`: their descriptors, and the count exchange through which
//! each link of an `all_to_all_v` is checked by its two ends before any
//! row moves (a sender's count against its receiver's expectation).

use super::call::shaped_desc;
use super::{GroupCoordinator, PlaneTensor};
use crate::agree::Descriptor;
use crate::error::{Error, Fault};
use crate::op::uneven::{all_gather_v_problem, all_gather_v_shape, all_to_all_v_problem};
use crate::op::{counts_digest, Op};
use std::ops::Range;

/// The descriptor of an `all_to_all_v` (rows of the input's shape: the
/// ranks' dim 0 differ), flagged when this rank's counts do not fit its
/// tensors, and what is wrong then.
pub(crate) fn all_to_all_v_desc<T: PlaneTensor>(
    t: &T,
    send_counts: &[usize],
    out: &T,
    recv_counts: &[usize],
    size: usize,
) -> (Descriptor, Option<String>) {
    let problem = all_to_all_v_problem(
        (t.dtype(), t.shape()),
        send_counts,
        (out.dtype(), out.shape()),
        recv_counts,
        size,
    );
    let row = t.shape().get(1..).unwrap_or_default();
    let mut desc = shaped_desc::<T>(Op::AllToAllV, t.dtype(), row, &[]);
    desc.mark_bad_counts(problem.is_some());
    (desc, problem)
}

/// The descriptor of an `all_gather_v` (the output's shape, the counts'
/// digest), flagged when this rank's counts do not fit its input, and what
/// is wrong then.
pub(crate) fn all_gather_v_desc<T: PlaneTensor>(
    t: &T,
    counts: &[usize],
    dim: isize,
    me: usize,
    size: usize,
) -> (Descriptor, Option<String>) {
    let problem = all_gather_v_problem(t.shape(), counts, dim, me, size);
    let shape = all_gather_v_shape(t.shape(), counts, dim);
    let params = [dim as i64, counts_digest(counts)];
    let mut desc = shaped_desc::<T>(Op::AllGatherV, t.dtype(), &shape, &params);
    desc.mark_bad_counts(problem.is_some());
    (desc, problem)
}

/// `e` with this rank's own counts problem, when it found one.
pub(crate) fn counts_found_here(e: Error, problem: &Option<String>) -> Error {
    match problem {
        Some(p) => e.noted(format_args!("this rank: {p}")),
        None => e,
    }
}

/// The links of one `all_to_all_v` as both ends of each agreed them.
pub(crate) struct Links {
    /// Rows this rank sends to each member (0 on a refused link).
    pub send: Vec<usize>,
    /// Rows this rank receives from each member (0 on a refused link).
    pub recv: Vec<usize>,
    /// The most rows any member sends to any other, the same everywhere.
    pub longest: usize,
    /// The refused links this rank is an end of, described.
    pub refused: Option<String>,
}

impl Links {
    /// Byte ranges of each member's rows in a buffer laid out by `counts`
    /// (rows of `row` bytes), emptied where `agreed` moves nothing: a
    /// refused link keeps its place, so the others land where they belong.
    pub(crate) fn spans(counts: &[usize], agreed: &[usize], row: usize) -> Vec<Range<usize>> {
        let mut at = 0;
        counts
            .iter()
            .zip(agreed)
            .map(|(n, a)| {
                at += n * row;
                at - n * row..at - n * row + a * row
            })
            .collect()
    }
}

impl GroupCoordinator<'_> {
    /// Exchanges the counts of an `all_to_all_v` with every member (what
    /// this rank sends each, what it expects from each, and its longest
    /// block), so that each link is judged by its two ends from the same
    /// two numbers. A link whose ends differ moves nothing, and both ends
    /// report it, naming both; the others move.
    pub(crate) fn swap_counts(&self, send: &[usize], recv: &[usize]) -> Result<Links, Fault> {
        let (p, me) = (self.size(), self.rank_in_group());
        let longest = send.iter().copied().max().unwrap_or(0) as u64;
        let mine: Vec<[u64; 3]> = (0..p)
            .map(|r| [send[r] as u64, recv[r] as u64, longest])
            .collect();
        let mut theirs = vec![[0u64; 3]; p];
        if p == 1 {
            theirs.copy_from_slice(&mine);
        } else {
            self.host().all_to_all_into(
                bytemuck::cast_slice(&mine),
                bytemuck::cast_slice_mut(&mut theirs),
            )?;
        }
        let mut links = Links {
            send: send.to_vec(),
            recv: recv.to_vec(),
            longest: 0,
            refused: None,
        };
        let mut refused = Vec::new();
        let link = |from: usize, to: usize, sends: u64, expects: u64| {
            format!(
                "group rank {from} sends {sends} rows to group rank {to}, which expects {expects}"
            )
        };
        for (s, [sends_me, expects_from_me, their_longest]) in theirs.into_iter().enumerate() {
            links.longest = links.longest.max(their_longest as usize);
            if sends_me != recv[s] as u64 {
                refused.push(link(s, me, sends_me, recv[s] as u64));
                links.recv[s] = 0;
            }
            if s != me && expects_from_me != send[s] as u64 {
                refused.push(link(me, s, send[s] as u64, expects_from_me));
                links.send[s] = 0;
            }
        }
        if links.recv[me] == 0 {
            links.send[me] = 0;
        }
        links.refused = (!refused.is_empty()).then(|| refused.join("; "));
        Ok(links)
    }
}
