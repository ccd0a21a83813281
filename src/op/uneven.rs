//! The rules of the uneven ops, `all_to_all_v` and `all_gather_v`: what a
//! rank checks in its own counts before the agreement (a problem found
//! here is flagged, so every member refuses the call), and the shapes
//! their descriptors carry.

use super::normalize_dim;
use crate::dtype::DType;

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
    let sum = |c: &[usize]| c.iter().try_fold(0usize, |a, n| a.checked_add(*n));
    if sum(send_counts) != Some(shape[0]) {
        return Some(format!(
            "send counts {send_counts:?} do not add up to the input's {} rows (shape {shape:?})",
            shape[0]
        ));
    }
    if sum(recv_counts) != Some(out_shape[0]) {
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

/// What is wrong with this rank's `all_gather_v` arguments (input of
/// `shape`, `counts` along `dim` from each group rank, this one `me`), if
/// anything. A `dim` out of range is the op's own check.
pub(crate) fn all_gather_v_problem(
    shape: &[usize],
    counts: &[usize],
    dim: isize,
    me: usize,
    size: usize,
) -> Option<String> {
    if counts.len() != size {
        return Some(format!(
            "{} counts for a group of size {size}",
            counts.len()
        ));
    }
    let d = normalize_dim(dim, shape.len())?;
    if shape[d] != counts[me] {
        return Some(format!(
            "its input has {} slices along dim {d} (shape {shape:?}) but its count is {}",
            shape[d], counts[me]
        ));
    }
    if counts
        .iter()
        .try_fold(0usize, |a, n| a.checked_add(*n))
        .is_none()
    {
        return Some(format!("counts {counts:?} overflow"));
    }
    None
}

/// The output shape of `all_gather_v` of an input of `shape`: `dim` holds
/// the sum of `counts`; `shape` itself when `dim` is out of range (the
/// op's check then refuses the call).
pub(crate) fn all_gather_v_shape(shape: &[usize], counts: &[usize], dim: isize) -> Vec<usize> {
    let mut out = shape.to_vec();
    if let Some(d) = normalize_dim(dim, shape.len()) {
        out[d] = counts.iter().fold(0usize, |a, n| a.saturating_add(*n));
    }
    out
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
    fn all_gather_v_counts_name_this_rank() {
        assert_eq!(all_gather_v_problem(&[3, 2], &[3, 0, 1], 0, 0, 3), None);
        let wrong = all_gather_v_problem(&[3, 2], &[2, 0, 1], 0, 0, 3).unwrap();
        assert!(wrong.contains("3 slices along dim 0"), "{wrong}");
        assert!(all_gather_v_problem(&[3, 2], &[3, 0], 0, 0, 3).is_some());
        // A bad dim is the op's check, not a count problem.
        assert_eq!(all_gather_v_problem(&[3, 2], &[3, 0, 1], 5, 0, 3), None);
        assert_eq!(all_gather_v_shape(&[3, 2], &[3, 0, 1], -2), [4, 2]);
        assert_eq!(all_gather_v_shape(&[3, 2], &[3, 0, 1], 2), [3, 2]);
    }
}
