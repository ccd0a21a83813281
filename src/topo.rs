//! The `rankmesh topo` report: who runs where and which groups each rank is in.

use crate::error::Result;
use crate::layout::GroupKind;
use crate::parallel::ParallelState;
use serde::Serialize;

/// One rank's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct RankEntry {
    /// World rank.
    pub rank: usize,
    /// Host name.
    pub host: String,
    /// Node index.
    pub node: usize,
    /// Rank on its node.
    pub local_rank: usize,
    /// Ranks on its node.
    pub local_size: usize,
    /// World ranks of its groups.
    pub groups: RankGroups,
}

/// World ranks of the groups one rank belongs to.
#[derive(Clone, Debug, Serialize)]
pub struct RankGroups {
    /// Tensor-parallel group.
    pub tp: Vec<usize>,
    /// Sequence-parallel group.
    pub sp: Vec<usize>,
    /// Data-parallel group.
    pub dp: Vec<usize>,
}

/// The whole report; its JSON form is the CLI's `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct TopoReport {
    /// Number of ranks.
    pub world_size: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Tensor-parallel size.
    pub tp: usize,
    /// Sequence-parallel size.
    pub sp: usize,
    /// Data-parallel size.
    pub dp: usize,
    /// Every rank, sorted by rank.
    pub ranks: Vec<RankEntry>,
}

impl TopoReport {
    /// Builds the report from initialised parallel state (no communication:
    /// node identity was gathered at start-up, groups follow from the layout).
    pub fn new(ps: &ParallelState<'_>) -> Result<TopoReport> {
        let layout = ps.layout()?;
        let world = ps.world().runtime().world();
        let ranks = world
            .ranks
            .iter()
            .map(|r| RankEntry {
                rank: r.rank,
                host: r.host.clone(),
                node: r.node,
                local_rank: r.local_rank,
                local_size: r.local_size,
                groups: RankGroups {
                    tp: layout.group_of(GroupKind::Tp, r.rank),
                    sp: layout.group_of(GroupKind::Sp, r.rank),
                    dp: layout.group_of(GroupKind::Dp, r.rank),
                },
            })
            .collect();
        Ok(TopoReport {
            world_size: layout.world_size,
            nodes: world.node_count,
            tp: layout.tp,
            sp: layout.sp,
            dp: layout.dp,
            ranks,
        })
    }

    /// A fixed-width table for terminals and logs.
    pub fn table(&self) -> String {
        let fmt_group = |g: &[usize]| format!("{g:?}");
        let host_w = self
            .ranks
            .iter()
            .map(|r| r.host.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let group_w = |k: fn(&RankGroups) -> &Vec<usize>| {
            self.ranks
                .iter()
                .map(|r| fmt_group(k(&r.groups)).len())
                .max()
                .unwrap_or(2)
                .max(2)
        };
        let (tw, sw, dw) = (group_w(|g| &g.tp), group_w(|g| &g.sp), group_w(|g| &g.dp));
        let mut out = format!(
            "{} ranks on {} node(s): tp={} sp={} dp={}\n{:>4}  {:<host_w$}  {:>4}  {:>5}  {:<tw$}  {:<sw$}  {:<dw$}\n",
            self.world_size, self.nodes, self.tp, self.sp, self.dp, "rank", "host", "node", "local", "tp", "sp", "dp"
        );
        for r in &self.ranks {
            out += &format!(
                "{:>4}  {:<host_w$}  {:>4}  {:>5}  {:<tw$}  {:<sw$}  {:<dw$}\n",
                r.rank,
                r.host,
                r.node,
                format!("{}/{}", r.local_rank, r.local_size),
                fmt_group(&r.groups.tp),
                fmt_group(&r.groups.sp),
                fmt_group(&r.groups.dp),
            );
        }
        out
    }
}
