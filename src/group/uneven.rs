//! What both planes share for the uneven ops, `all_to_all_v` and the
//! counted ones (`all_gather_v`, `reduce_scatter_v`): their descriptors, and the count exchange through which
//! each link of an `all_to_all_v` is checked by its two ends before any
//! row moves (a sender's count against its receiver's expectation).

use super::call::shaped_desc;
use super::{Collectives, GroupCoordinator, PlaneTensor};
use crate::agree::Descriptor;
use crate::error::{Error, Fault, Result};
use crate::op::uneven::{all_to_all_v_problem, Links};
use crate::op::{Args, Op};
use crate::tensor::Tensor;

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
    let mut desc = shaped_desc::<T>(Args::bare(Op::AllToAllV), t.dtype(), row);
    desc.mark_bad_counts(problem.is_some());
    (desc, problem)
}

/// The descriptor of a call with per-member counts (`args`: its op,
/// [`counted`](crate::op::Op::counted), with `dim` and `counts`), carrying
/// the shape every member agrees on, and flagged when this rank's counts do
/// not fit its tensors, with what is wrong then.
pub(crate) fn counted_desc<T: PlaneTensor>(
    args: Args,
    (t, out): (&T, &T),
    (counts, dim): (&[usize], isize),
    (me, size): (usize, usize),
) -> (Descriptor, Option<String>) {
    let counted = args.op().counted().expect("a counted op");
    let input = (t.dtype(), t.shape());
    let problem = counted.problem(input, (out.dtype(), out.shape()), counts, dim, (me, size));
    let shape = counted.agreed_shape(t.shape(), counts, dim, me);
    let mut desc = shaped_desc::<T>(args, t.dtype(), &shape);
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

impl GroupCoordinator<'_> {
    /// torch's `all_to_all_single(output_splits, input_splits)` before an
    /// uneven exchange: every member's `send_counts[r]` reaches member `r`,
    /// and the result holds what each member will send here, in group-rank
    /// order: the `recv_counts` of
    /// [`all_to_all_v`](crate::Collectives::all_to_all_v). Collective;
    /// `send_counts` has one entry per member (on every member, or the
    /// call is an error on every member).
    pub fn exchange_counts(&self, send_counts: &[usize]) -> Result<Vec<usize>> {
        let counts: Vec<u64> = send_counts.iter().map(|n| *n as u64).collect();
        let sent = Tensor::from_vec([counts.len()], counts)?;
        let got = self.all_to_all(&sent)?;
        if send_counts.len() != self.size() {
            return Err(Error::Usage {
                what: "exchange_counts",
                group: self.name().to_string(),
                msg: format!(
                    "send_counts has {} entries but the group has {} members",
                    send_counts.len(),
                    self.size()
                ),
            });
        }
        Ok(got.as_slice::<u64>()?.iter().map(|n| *n as usize).collect())
    }

    /// Exchanges the counts of an `all_to_all_v` with every member through
    /// the group's host executor and judges each link by its two ends (see
    /// [`Links::swapped`]): the device plane's first step, and the host's
    /// on a group of one (larger host groups exchange them in their
    /// executor's `all_to_all_v`).
    pub(crate) fn swap_counts(&self, send: &[usize], recv: &[usize]) -> Result<Links, Fault> {
        Links::swapped(
            self.rank_in_group(),
            send,
            recv,
            |mine, theirs| match self.size() {
                1 => {
                    theirs.copy_from_slice(mine);
                    Ok(())
                }
                _ => self
                    .host_for(Op::AllToAllV, mine.len())
                    .all_to_all_into(mine, theirs),
            },
        )
    }
}
