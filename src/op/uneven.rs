//! The rules of the uneven ops, `all_to_all_v` and the counted ones
//! (`all_gather_v`, `reduce_scatter_v`). They say what a rank checks in its
//! own counts before the agreement (a problem found here is flagged, so every
//! member refuses the call), and which shapes their descriptors carry.

use super::normalize_dim;
use crate::dtype::DType;
use std::ops::Range;

/// What is wrong with this rank's `all_to_all_v` arguments (input of
/// `input` shape, output of `output` shape and dtype, counts in rows of
/// dim 0), if anything.
pub(crate) fn all_to_all_v_problem(
    input: (DType, &[usize]),
    send_counts: &[usize],
    output: (DType, &[usize]),
    recv_counts: &[usize],
    size: usize,
) -> Option<String> {
    let ((dtype, shape), (out_dtype, out_shape)) = (input, output);
    if shape.is_empty() || out_shape.is_empty() {
        return Some("all_to_all_v expects tensors with at least one dimension".into());
    }
    for (what, counts) in [("send", send_counts), ("receive", recv_counts)] {
        if counts.len() != size {
            return Some(format!(
                "{} {what} counts for a group of size {size}",
                counts.len()
            ));
        }
    }
    if total(send_counts) != Some(shape[0]) {
        return Some(format!(
            "send counts {send_counts:?} do not add up to the input's {} rows (shape {shape:?})",
            shape[0]
        ));
    }
    if total(recv_counts) != Some(out_shape[0]) {
        return Some(format!(
            "receive counts {recv_counts:?} do not add up to the output's {} rows (shape {out_shape:?})",
            out_shape[0]
        ));
    }
    if out_dtype != dtype || out_shape[1..] != shape[1..] {
        return Some(format!(
            "the output's rows ({:?} {out_dtype}) are not the input's ({:?} {dtype})",
            &out_shape[1..],
            &shape[1..]
        ));
    }
    None
}

/// The two shapes of an op with per-member counts along one dim (the
/// counts travel as a digest, so each rank checks its own call against
/// them): which side holds this member's count, and which every member's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counted {
    /// The input holds this member's count, the output the sum
    /// (`all_gather_v`): the output's shape is the same on every member.
    Gathers,
    /// The input holds the sum, the output this member's count
    /// (`reduce_scatter_v`): the input's shape is the same on every member.
    Scatters,
}

/// The sum of `counts`, `None` when it overflows.
fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |a, n| a.checked_add(*n))
}

impl Counted {
    /// What is wrong with this rank's arguments (input and output as dtype
    /// and shape, `counts` along `dim` from each group rank, this one `me`),
    /// if anything. A `dim` out of range is the op's own check. The output
    /// is checked here only where the descriptor carries the input's shape
    /// (`Scatters`); the dispatch path checks it against the agreed shape
    /// otherwise.
    pub(crate) fn problem(
        self,
        input: (DType, &[usize]),
        output: (DType, &[usize]),
        counts: &[usize],
        dim: isize,
        (me, size): (usize, usize),
    ) -> Option<String> {
        let (dtype, shape) = input;
        if counts.len() != size {
            return Some(format!(
                "{} counts for a group of size {size}",
                counts.len()
            ));
        }
        let d = normalize_dim(dim, shape.len())?;
        let Some(sum) = total(counts) else {
            return Some(format!("counts {counts:?} overflow"));
        };
        match self {
            Counted::Gathers if shape[d] != counts[me] => Some(format!(
                "its input has {} slices along dim {d} (shape {shape:?}) but its count is {}",
                shape[d], counts[me]
            )),
            Counted::Scatters if shape[d] != sum => Some(format!(
                "its input has {} slices along dim {d} (shape {shape:?}) but its counts {counts:?} add up to {sum}",
                shape[d]
            )),
            Counted::Scatters => {
                let want = self.output_shape(shape, counts, dim, me);
                (output != (dtype, &want[..])).then(|| {
                    format!(
                        "its output is {:?} {} but its share is {want:?} {dtype}",
                        output.1, output.0
                    )
                })
            }
            Counted::Gathers => None,
        }
    }

    /// The output's shape on group rank `me` for an input of `shape`: `dim`
    /// holds the sum of `counts` (`Gathers`) or this member's count
    /// (`Scatters`); `shape` itself when `dim` is out of range or `counts`
    /// has no entry for `me` (the checks then refuse the call).
    pub(crate) fn output_shape(
        self,
        shape: &[usize],
        counts: &[usize],
        dim: isize,
        me: usize,
    ) -> Vec<usize> {
        let mut out = shape.to_vec();
        if let Some(d) = normalize_dim(dim, shape.len()) {
            match self {
                Counted::Gathers => {
                    out[d] = counts.iter().fold(0usize, |a, n| a.saturating_add(*n))
                }
                Counted::Scatters => out[d] = counts.get(me).copied().unwrap_or(out[d]),
            }
        }
        out
    }

    /// The shape the descriptor carries, the same on every member whose
    /// counts agree: the output's (`Gathers`) or the input's (`Scatters`).
    pub(crate) fn agreed_shape(
        self,
        shape: &[usize],
        counts: &[usize],
        dim: isize,
        me: usize,
    ) -> Vec<usize> {
        match self {
            Counted::Gathers => self.output_shape(shape, counts, dim, me),
            Counted::Scatters => shape.to_vec(),
        }
    }
}

/// The links of one `all_to_all_v` as both ends of each judged them.
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
    /// What this rank tells each member `r` in the count exchange: the
    /// rows it sends `r`, the rows it expects from `r`, its longest block.
    pub(crate) fn table(send: &[usize], recv: &[usize]) -> Vec<[u64; 3]> {
        let longest = send.iter().copied().max().unwrap_or(0) as u64;
        send.iter()
            .zip(recv)
            .map(|(s, r)| [*s as u64, *r as u64, longest])
            .collect()
    }

    /// Group rank `me`'s links after the count exchange: its
    /// [`table`](Self::table) goes to every member through `swap` (an
    /// all-to-all of the tables' bytes, entry `r` to member `r`), and each
    /// link is [judged](Self::judge) from the entries that came back.
    pub(crate) fn swapped<E>(
        me: usize,
        send: &[usize],
        recv: &[usize],
        swap: impl FnOnce(&[u8], &mut [u8]) -> Result<(), E>,
    ) -> Result<Links, E> {
        let mine = Links::table(send, recv);
        let mut theirs = vec![[0u64; 3]; mine.len()];
        swap(
            bytemuck::cast_slice(&mine),
            bytemuck::cast_slice_mut(&mut theirs),
        )?;
        Ok(Links::judge(me, send, recv, &theirs))
    }

    /// Group rank `me`'s verdict on its links from what every member `s`
    /// told it (`theirs[s]`: its [`table`](Self::table) entry for `me`).
    /// Each link is judged by its two ends from the same two numbers, so
    /// both refuse it or neither does; a refused link moves nothing, and
    /// both ends report it naming both.
    pub(crate) fn judge(me: usize, send: &[usize], recv: &[usize], theirs: &[[u64; 3]]) -> Links {
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
        for (s, [sends_me, expects_from_me, their_longest]) in theirs.iter().copied().enumerate() {
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
        links
    }

    /// Byte ranges of each member's rows in this rank's input and output
    /// (laid out by its send and receive `counts`, rows of `row` bytes),
    /// empty on the links refused.
    pub(crate) fn placed(
        &self,
        (send, recv): (&[usize], &[usize]),
        row: usize,
    ) -> (Vec<Range<usize>>, Vec<Range<usize>>) {
        (
            Links::spans(send, &self.send, row),
            Links::spans(recv, &self.recv, row),
        )
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    const F: DType = DType::F32;

    #[test]
    fn all_to_all_v_counts_must_fit_the_tensors() {
        let ok = all_to_all_v_problem((F, &[5, 2]), &[2, 3], (F, &[4, 2]), &[4, 0], 2);
        assert_eq!(ok, None);
        let short = all_to_all_v_problem((F, &[5, 2]), &[5], (F, &[4, 2]), &[4, 0], 2);
        assert_eq!(short.unwrap(), "1 send counts for a group of size 2");
        let sum = all_to_all_v_problem((F, &[5, 2]), &[2, 2], (F, &[4, 2]), &[4, 0], 2);
        assert!(sum.unwrap().contains("do not add up to the input's 5 rows"));
        let out = all_to_all_v_problem((F, &[5, 2]), &[2, 3], (F, &[4, 2]), &[1, 1], 2);
        assert!(out.unwrap().contains("the output's 4 rows"));
        let rows = all_to_all_v_problem((F, &[5, 2]), &[2, 3], (F, &[4, 3]), &[4, 0], 2);
        assert!(rows.unwrap().contains("rows"));
        let scalar = all_to_all_v_problem((F, &[]), &[0, 0], (F, &[0]), &[0, 0], 2);
        assert!(scalar.unwrap().contains("at least one dimension"));
        let huge = all_to_all_v_problem((F, &[5]), &[usize::MAX, 6], (F, &[0]), &[0, 0], 2);
        assert!(huge.is_some());
    }

    #[test]
    fn both_ends_of_a_link_refuse_it_and_the_others_move() {
        // 2 members: member 0 sends 3 rows to member 1, which expects 2.
        let (s0, r0) = (vec![1, 3], vec![1, 4]);
        let (s1, r1) = (vec![4, 0], vec![2, 0]);
        let t0 = Links::table(&s0, &r0);
        let t1 = Links::table(&s1, &r1);
        let at0 = Links::judge(0, &s0, &r0, &[t0[0], t1[0]]);
        let at1 = Links::judge(1, &s1, &r1, &[t0[1], t1[1]]);
        let named = "group rank 0 sends 3 rows to group rank 1, which expects 2";
        assert_eq!(at0.refused.as_deref(), Some(named));
        assert_eq!(at1.refused.as_deref(), Some(named));
        assert_eq!((at0.send, at0.recv), (vec![1, 0], vec![1, 4]));
        assert_eq!((at1.send, at1.recv), (vec![4, 0], vec![0, 0]));
        assert_eq!((at0.longest, at1.longest), (4, 4));
        // A refused link keeps its place in the buffer.
        assert_eq!(Links::spans(&[2, 3], &[0, 3], 4), [0..0, 8..20]);
    }

    #[test]
    fn gathered_counts_name_this_rank() {
        let g = Counted::Gathers;
        let f = DType::F32;
        let any = (f, &[][..]);
        let problem = |shape: &[usize], counts: &[usize], dim| {
            g.problem((f, shape), any, counts, dim, (0, 3))
        };
        assert_eq!(problem(&[3, 2], &[3, 0, 1], 0), None);
        let wrong = problem(&[3, 2], &[2, 0, 1], 0).unwrap();
        assert!(wrong.contains("3 slices along dim 0"), "{wrong}");
        assert!(problem(&[3, 2], &[3, 0], 0).is_some());
        // A bad dim is the op's check, not a count problem.
        assert_eq!(problem(&[3, 2], &[3, 0, 1], 5), None);
        assert_eq!(g.output_shape(&[3, 2], &[3, 0, 1], -2, 0), [4, 2]);
        assert_eq!(g.output_shape(&[3, 2], &[3, 0, 1], 2, 0), [3, 2]);
        assert_eq!(g.agreed_shape(&[3, 2], &[3, 0, 1], 0, 0), [4, 2]);
    }

    #[test]
    fn scattered_counts_check_the_sum_and_this_ranks_output() {
        let s = Counted::Scatters;
        let f = DType::F32;
        // Member 1 of 3 keeps its 0 slices of 4 along dim 1.
        let ok = s.problem((f, &[2, 4]), (f, &[2, 0]), &[3, 0, 1], 1, (1, 3));
        assert_eq!(ok, None);
        let short = s.problem((f, &[2, 3]), (f, &[2, 0]), &[3, 0, 1], 1, (1, 3));
        assert!(short.unwrap().contains("add up to 4"));
        let out = s.problem((f, &[2, 4]), (f, &[2, 1]), &[3, 0, 1], 1, (1, 3));
        assert!(out.unwrap().contains("its share is [2, 0] f32"));
        let dtype = s.problem((f, &[2, 4]), (DType::F64, &[2, 0]), &[3, 0, 1], 1, (1, 3));
        assert!(dtype.is_some());
        let overflow = s.problem((f, &[2, 4]), (f, &[2, 0]), &[usize::MAX, 1, 0], 1, (1, 3));
        assert!(overflow.unwrap().contains("overflow"));
        assert_eq!(s.output_shape(&[2, 4], &[3, 0, 1], -1, 0), [2, 3]);
        assert_eq!(s.agreed_shape(&[2, 4], &[3, 0, 1], -1, 0), [2, 4]);
    }
}
