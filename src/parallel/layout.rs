//! Pure parallel-layout math: parallel sizes to group rank lists.
//!
//! No MPI here, so the formulas are tested exhaustively without a launcher.
//! The groups are exactly FastVideo's `initialize_model_parallel`:
//! TP groups `[i·t, (i+1)·t)`, SP groups `[i·s, (i+1)·s)`, DP groups
//! `range(i, W, s)`. Unlike FastVideo, sizes that leave a rank outside every
//! group, and a DP size that contradicts `W / s`, are rejected up front.

use crate::error::{Error, Result};
use serde::Serialize;

/// The kinds of parallel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum GroupKind {
    /// Tensor parallel.
    Tp,
    /// Sequence parallel.
    Sp,
    /// Data parallel.
    Dp,
}

impl GroupKind {
    /// Short name used in group names (`tp`, `sp`, `dp`).
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Sp => "sp",
            GroupKind::Dp => "dp",
        }
    }

    /// All kinds, in report order.
    pub const ALL: [GroupKind; 3] = [GroupKind::Tp, GroupKind::Sp, GroupKind::Dp];
}

/// A validated TP/SP/DP layout of a world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// World size W.
    pub world_size: usize,
    /// Tensor-parallel size t.
    pub tp: usize,
    /// Sequence-parallel size s.
    pub sp: usize,
    /// Data-parallel size, always `W / s`.
    pub dp: usize,
}

impl Layout {
    /// Validates sizes: `t, s ≥ 1`, `t | W`, `s | W`, and `dp` (if given) `= W / s`.
    pub fn new(world_size: usize, tp: usize, sp: usize, dp: Option<usize>) -> Result<Layout> {
        if world_size == 0 {
            return Err(Error::Layout("world size is 0".into()));
        }
        consecutive_group_count(world_size, tp, "tensor-parallel")?;
        consecutive_group_count(world_size, sp, "sequence-parallel")?;
        let derived_dp = world_size / sp;
        if let Some(d) = dp {
            if d != derived_dp {
                return Err(Error::Layout(format!(
                    "data-parallel size {d} contradicts world size {world_size} / sequence-parallel size {sp} = {derived_dp}"
                )));
            }
        }
        Ok(Layout {
            world_size,
            tp,
            sp,
            dp: derived_dp,
        })
    }

    /// Size of one group of `kind`.
    pub fn size(&self, kind: GroupKind) -> usize {
        match kind {
            GroupKind::Tp => self.tp,
            GroupKind::Sp => self.sp,
            GroupKind::Dp => self.dp,
        }
    }

    /// Index of the group of `kind` that holds world rank `rank` (the MPI split colour).
    pub fn group_index(&self, kind: GroupKind, rank: usize) -> usize {
        match kind {
            GroupKind::Tp => rank / self.tp,
            GroupKind::Sp => rank / self.sp,
            GroupKind::Dp => rank % self.sp,
        }
    }

    /// Every group of `kind`, as lists of world ranks in group-rank order.
    pub fn groups(&self, kind: GroupKind) -> Vec<Vec<usize>> {
        let w = self.world_size;
        match kind {
            GroupKind::Tp => consecutive_groups(w, self.tp),
            GroupKind::Sp => consecutive_groups(w, self.sp),
            GroupKind::Dp => (0..self.sp)
                .map(|i| (i..w).step_by(self.sp).collect())
                .collect(),
        }
    }

    /// The world ranks of the group of `kind` that holds `rank`.
    pub fn group_of(&self, kind: GroupKind, rank: usize) -> Vec<usize> {
        self.groups(kind).swap_remove(self.group_index(kind, rank))
    }
}

/// Number of groups of `size` consecutive ranks, or an error naming `what`.
pub fn consecutive_group_count(world_size: usize, size: usize, what: &str) -> Result<usize> {
    if size == 0 {
        return Err(Error::Layout(format!(
            "{what} size must be at least 1, got 0"
        )));
    }
    if !world_size.is_multiple_of(size) {
        return Err(Error::Layout(format!(
            "world size {world_size} is not divisible by {what} size {size}"
        )));
    }
    Ok(world_size / size)
}

/// Groups `[i·size, (i+1)·size)` covering `0..world_size` (size must divide it).
pub fn consecutive_groups(world_size: usize, size: usize) -> Vec<Vec<usize>> {
    (0..world_size / size)
        .map(|i| (i * size..(i + 1) * size).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agree::validate_group_lists;

    /// Every valid layout up to 64 ranks against the FastVideo formulas, plus
    /// the partition properties those formulas imply.
    #[test]
    fn every_valid_layout_up_to_64_matches_fastvideo() {
        for w in 1..=64usize {
            for t in (1..=w).filter(|t| w % t == 0) {
                for s in (1..=w).filter(|s| w % s == 0) {
                    let l = Layout::new(w, t, s, None).unwrap();
                    assert_eq!(l.dp, w / s);
                    let tp = l.groups(GroupKind::Tp);
                    let sp = l.groups(GroupKind::Sp);
                    let dp = l.groups(GroupKind::Dp);
                    for (i, g) in tp.iter().enumerate() {
                        assert_eq!(*g, (i * t..(i + 1) * t).collect::<Vec<_>>());
                    }
                    for (i, g) in sp.iter().enumerate() {
                        assert_eq!(*g, (i * s..(i + 1) * s).collect::<Vec<_>>());
                    }
                    assert_eq!(dp.len(), s);
                    for (i, g) in dp.iter().enumerate() {
                        assert_eq!(*g, (i..w).step_by(s).collect::<Vec<_>>());
                    }
                    for kind in GroupKind::ALL {
                        let groups = l.groups(kind);
                        validate_group_lists(w, &groups).unwrap();
                        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), w);
                        for r in 0..w {
                            let g = &groups[l.group_index(kind, r)];
                            assert!(g.contains(&r));
                            assert_eq!(g.len(), l.size(kind));
                            assert_eq!(l.group_of(kind, r), *g);
                        }
                    }
                    assert!(Layout::new(w, t, s, Some(w / s)).is_ok());
                    if w / s != 1 {
                        assert!(Layout::new(w, t, s, Some(1)).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn every_invalid_size_up_to_64_is_rejected() {
        for w in 1..=64usize {
            for bad in (0..=w + 1).filter(|x| *x == 0 || w % x != 0) {
                let e = Layout::new(w, bad, 1, None).unwrap_err().to_string();
                assert!(e.contains("tensor-parallel"), "{e}");
                let e = Layout::new(w, 1, bad, None).unwrap_err().to_string();
                assert!(e.contains("sequence-parallel"), "{e}");
            }
        }
        let e = Layout::new(8, 2, 2, Some(2)).unwrap_err().to_string();
        assert!(
            e.contains(
                "data-parallel size 2 contradicts world size 8 / sequence-parallel size 2 = 4"
            ),
            "{e}"
        );
    }

    #[test]
    fn group_lists_are_validated() {
        assert!(validate_group_lists(4, &[vec![0, 1], vec![2]]).is_ok());
        assert!(validate_group_lists(4, &[vec![0, 1], vec![1]])
            .unwrap_err()
            .to_string()
            .contains("rank 1 appears"));
        assert!(validate_group_lists(4, &[vec![4]])
            .unwrap_err()
            .to_string()
            .contains("names rank 4"));
        assert!(validate_group_lists(4, &[vec![]])
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
