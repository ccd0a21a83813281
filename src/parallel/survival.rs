//! What a parallel layout keeps after losing ranks. The policy drops each
//! whole replica (a slice along the data-parallel dimension) that held a
//! lost rank, so that tensor, sequence and pipeline groups stay whole and
//! only data parallelism shrinks; the dropped replicas' other ranks retire.
//! Pure: the plan every survivor computes alike after `Runtime::shrink`,
//! before `Runtime::retire` (docs/USAGE.md, "When a rank is lost").

use super::layout::Layout;
use super::mesh::MeshLayout;
use crate::error::{Error, Result};

/// A layout's plan after a loss ([`MeshLayout::after_loss`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survival {
    /// The layout of the ranks that go on: the replica dimension shrunk to
    /// the replicas kept, every other dimension as before. Its ranks are
    /// the kept ranks renumbered in their old order, which keeps each one's
    /// other coordinates.
    pub layout: MeshLayout,
    /// The replica indices (along the replica dimension) kept, ascending.
    pub kept: Vec<usize>,
    /// The replica indices dropped, ascending.
    pub dropped: Vec<usize>,
    /// Ranks alive in a dropped replica: they leave the job.
    pub retired: Vec<usize>,
    /// Each rank's rank among the kept ones (`None`: lost or retired).
    pub new_rank: Vec<Option<usize>>,
}

impl MeshLayout {
    /// The plan after losing the ranks `lost` of this layout's world:
    /// every slice along `replica` (`"dp"`) that held a lost rank is
    /// dropped whole. An error where a lost rank is not in the world,
    /// `replica` is not a dimension, or every replica lost a rank (nothing
    /// whole survives).
    pub fn after_loss(&self, lost: &[usize], replica: &str) -> Result<Survival> {
        let world = self.world();
        if let Some(r) = lost.iter().find(|&&r| r >= world) {
            return Err(Error::Layout(format!(
                "after a loss: rank {r} is not in a world of {world}"
            )));
        }
        let size = self
            .dims()
            .find(|(n, _)| *n == replica)
            .map(|(_, s)| s)
            .ok_or_else(|| {
                let known: Vec<&str> = self.dims().map(|(n, _)| n).collect();
                Error::Layout(format!(
                    "after a loss: no dimension {replica:?} to drop replicas along (the mesh has {})",
                    known.join(", ")
                ))
            })?;
        let mut hit = vec![false; size];
        for &r in lost {
            hit[self.coord(r, replica)?] = true;
        }
        let (dropped, kept): (Vec<usize>, Vec<usize>) = (0..size).partition(|&i| hit[i]);
        if kept.is_empty() {
            return Err(Error::Layout(format!(
                "after a loss: the lost ranks {lost:?} are in every one of the {size} {replica} \
                 replicas; no whole replica survives"
            )));
        }
        let mut retired = Vec::new();
        let mut new_rank = vec![None; world];
        let mut next = 0;
        for (r, slot) in new_rank.iter_mut().enumerate() {
            if !hit[self.coord(r, replica)?] {
                *slot = Some(next);
                next += 1;
            } else if !lost.contains(&r) {
                retired.push(r);
            }
        }
        Ok(Survival {
            layout: self.resized(replica, kept.len()),
            kept,
            dropped,
            retired,
            new_rank,
        })
    }
}

impl Layout {
    /// FastVideo's layout after losing the ranks `lost`: its replicas are
    /// the model-parallel blocks of lcm(tp, sp) consecutive ranks (whole
    /// TP and SP groups), and every block that held a lost rank is dropped
    /// whole. Returns the survivors' layout (the same tp and sp, dp
    /// smaller), to make with
    /// [`ParallelState::initialize_model_parallel`](crate::ParallelState::initialize_model_parallel)
    /// on the runtime that [`Runtime::retire`](crate::Runtime::retire)
    /// gives the kept ranks, and the plan over a (`dp`, `mp`) mesh of the
    /// blocks: blocks kept and dropped, the ranks retired, each rank's new
    /// rank. Each kept rank keeps its TP and SP ranks and its DP group's
    /// index. An error where a lost rank is not in the world or every
    /// block lost a rank.
    pub fn after_loss(&self, lost: &[usize]) -> Result<(Layout, Survival)> {
        let block = lcm(self.tp, self.sp);
        let blocks = self.world_size / block;
        let mesh = MeshLayout::row_major(self.world_size, &[("dp", blocks), ("mp", block)])?;
        let plan = mesh.after_loss(lost, "dp")?;
        let layout = Layout::new(plan.kept.len() * block, self.tp, self.sp, None)?;
        Ok((layout, plan))
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::GroupKind;

    /// Against a brute-force reading of FastVideo's groups: after the
    /// plan, every kept rank's TP, SP and DP groups are its old groups'
    /// kept members, renumbered, in order; no kept TP or SP group lost a
    /// member; the retired are the living ranks of the dropped blocks.
    #[test]
    fn fastvideo_layouts_keep_whole_tp_and_sp_groups() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for w in 1..=24 {
            for tp in (1..=w).filter(|t| w % t == 0) {
                for sp in (1..=w).filter(|s| w % s == 0) {
                    let old = Layout::new(w, tp, sp, None).unwrap();
                    for _ in 0..6 {
                        let mut lost: Vec<usize> = (0..1 + next() as usize % 3)
                            .map(|_| next() as usize % w)
                            .collect();
                        lost.sort_unstable();
                        lost.dedup();
                        check_plan(&old, &lost);
                    }
                }
            }
        }
    }

    fn check_plan(old: &Layout, lost: &[usize]) {
        let block = lcm(old.tp, old.sp);
        let hit: Vec<usize> = lost.iter().map(|r| r / block).collect();
        let every = (0..old.world_size / block).all(|b| hit.contains(&b));
        let (new, plan) = match old.after_loss(lost) {
            Ok(v) => v,
            Err(e) => {
                assert!(every, "{old:?} lost {lost:?}: {e}");
                return;
            }
        };
        assert!(
            !every,
            "{old:?} lost {lost:?}: no block survives, yet a plan"
        );
        let kept: Vec<usize> = (0..old.world_size)
            .filter(|r| plan.new_rank[*r].is_some())
            .collect();
        assert_eq!(new.world_size, kept.len());
        let retired: Vec<usize> = (0..old.world_size)
            .filter(|r| hit.contains(&(r / block)) && !lost.contains(r))
            .collect();
        assert_eq!(plan.retired, retired, "{old:?} lost {lost:?}");
        for &r in &kept {
            let n = plan.new_rank[r].unwrap();
            for kind in [GroupKind::Tp, GroupKind::Sp, GroupKind::Dp] {
                let was: Vec<usize> = old
                    .group_of(kind, r)
                    .into_iter()
                    .filter_map(|m| plan.new_rank[m])
                    .collect();
                assert_eq!(
                    new.group_of(kind, n),
                    was,
                    "{old:?} lost {lost:?}: rank {r} {kind:?}"
                );
                if kind != GroupKind::Dp {
                    assert_eq!(
                        was.len(),
                        old.size(kind),
                        "{old:?}: rank {r}'s {kind:?} group lost a member"
                    );
                }
            }
        }
    }

    #[test]
    fn a_fastvideo_loss_in_every_block_is_an_error() {
        // tp 2, sp 4: blocks of 4; ranks 1 and 6 hit both.
        let e = Layout::new(8, 2, 4, None)
            .unwrap()
            .after_loss(&[1, 6])
            .unwrap_err();
        assert!(
            e.to_string().contains("in every one of the 2 dp replicas"),
            "{e}"
        );
        // tp 2, sp 3: blocks of 6 in a world of 12; one block goes.
        let (l, plan) = Layout::new(12, 2, 3, None)
            .unwrap()
            .after_loss(&[7])
            .unwrap();
        assert_eq!((l.world_size, l.tp, l.sp, l.dp), (6, 2, 3, 2));
        assert_eq!(plan.retired, [6, 8, 9, 10, 11]);
    }

    /// Every kept rank keeps its coordinates but the replica's, which is
    /// its replica's place among the kept ones.
    fn keeps_coordinates(old: &MeshLayout, plan: &Survival, replica: &str) {
        for (r, new) in plan.new_rank.iter().enumerate() {
            let Some(new) = *new else { continue };
            for ((name, was), (name2, now)) in
                old.coords(r).into_iter().zip(plan.layout.coords(new))
            {
                assert_eq!(name, name2);
                if name == replica {
                    assert_eq!(plan.kept[now], was, "rank {r}'s replica");
                } else {
                    assert_eq!(now, was, "rank {r} ({name}) became rank {new}");
                }
            }
        }
    }

    #[test]
    fn a_lost_tp_rank_takes_its_replica_out() {
        // torch's row-major (dp, tp): replicas of 2 consecutive ranks.
        let l = MeshLayout::row_major(8, &[("dp", 4), ("tp", 2)]).unwrap();
        let plan = l.after_loss(&[3], "dp").unwrap();
        assert_eq!(plan.kept, [0, 2, 3]);
        assert_eq!(plan.dropped, [1]);
        assert_eq!(plan.retired, [2]);
        let want = [
            Some(0),
            Some(1),
            None,
            None,
            Some(2),
            Some(3),
            Some(4),
            Some(5),
        ];
        assert_eq!(plan.new_rank, want);
        assert_eq!(
            plan.layout,
            MeshLayout::row_major(6, &[("dp", 3), ("tp", 2)]).unwrap()
        );
        keeps_coordinates(&l, &plan, "dp");
    }

    #[test]
    fn replicas_interleaved_with_other_dimensions_stay_in_order() {
        // Megatron's "tp-dp-pp": dp in the middle of the rank order.
        let sizes = [("tp", 2), ("dp", 3), ("pp", 2)];
        let l = MeshLayout::ordered(12, "tp-dp-pp", &sizes).unwrap();
        let plan = l.after_loss(&[2, 9], "dp").unwrap();
        // Rank 2 is (tp 0, dp 1, pp 0) and rank 9 (tp 1, dp 1, pp 1).
        assert_eq!(plan.dropped, [1]);
        assert_eq!(plan.retired, [3, 8]);
        let want = MeshLayout::ordered(8, "tp-dp-pp", &[("tp", 2), ("dp", 2), ("pp", 2)]).unwrap();
        assert_eq!(plan.layout, want);
        keeps_coordinates(&l, &plan, "dp");
        // Two replicas hit at once.
        let plan = l.after_loss(&[0, 11], "dp").unwrap();
        assert_eq!(
            (plan.kept.as_slice(), plan.retired.len()),
            (&[1][..], 2 * 2 * 2 - 2)
        );
        keeps_coordinates(&l, &plan, "dp");
    }

    #[test]
    fn a_loss_in_every_replica_or_outside_the_world_is_an_error() {
        let l = MeshLayout::row_major(4, &[("dp", 2), ("tp", 2)]).unwrap();
        let e = l.after_loss(&[1, 2], "dp").unwrap_err().to_string();
        assert!(
            e.contains("the lost ranks [1, 2] are in every one of the 2 dp replicas; no whole replica survives"),
            "{e}"
        );
        let e = l.after_loss(&[4], "dp").unwrap_err().to_string();
        assert!(e.contains("rank 4 is not in a world of 4"), "{e}");
        let e = l.after_loss(&[0], "data").unwrap_err().to_string();
        assert!(
            e.contains("no dimension \"data\" to drop replicas along (the mesh has dp, tp)"),
            "{e}"
        );
        // No loss: the same layout, nobody retired.
        let plan = l.after_loss(&[], "dp").unwrap();
        assert_eq!((plan.layout, plan.retired.len()), (l, 0));
    }
}
