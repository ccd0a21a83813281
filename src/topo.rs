//! The `rankmesh topo` report: who runs where and which groups each rank is in.

use crate::error::Result;
use crate::object::Objects;
use crate::parallel::GroupKind;
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
    /// CPUs the rank may run on (list format).
    pub cpus: String,
    /// NUMA nodes of those CPUs.
    pub numa: Vec<usize>,
    /// Its GPU, when the node has GPUs (hwloc's view of the PCI device).
    pub gpu: Option<crate::placement::GpuInfo>,
    /// The CUDA device the GPU plane would drive (`None`: no usable driver
    /// or device on this rank).
    pub device: Option<crate::device::DeviceInfo>,
    /// Who set the binding: `launcher`, `rankmesh:<policy>` or `none`.
    pub bound_by: String,
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
    /// The host executor of each group, as
    /// [`GroupCoordinator::host_executor`](crate::GroupCoordinator::host_executor)
    /// names it.
    pub host: HostExecutors,
}

/// Which executor runs a rank's host collectives, per group.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct HostExecutors {
    /// Tensor-parallel group: `shm`, `mpi` or `local`.
    pub tp: String,
    /// Sequence-parallel group.
    pub sp: String,
    /// Data-parallel group.
    pub dp: String,
}

/// The whole report; its JSON form is the CLI's `--json` output (placement
/// keys follow the group lists).
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
    /// The NCCL library world rank 0 finds (`None`: not found).
    pub nccl: Option<NcclInfo>,
}

/// Which NCCL the runtime would load.
#[derive(Clone, Debug, Serialize)]
pub struct NcclInfo {
    /// `major.minor.patch`.
    pub version: String,
    /// Library path or name it was loaded as.
    pub path: String,
    /// Collectives the device plane runs as NCCL's own calls instead of
    /// grouped sends and receives (`alltoall`, `gather`, `scatter`; NCCL 2.28).
    pub native_collectives: Vec<String>,
    /// The optional entry points the library exports (non-blocking and
    /// scalable creation, split, registration, ...), by C name.
    pub optional_entry_points: Vec<String>,
}

impl TopoReport {
    /// Builds the report from initialised parallel state (collective over the
    /// world: each rank contributes its placement).
    pub fn new(ps: &ParallelState<'_>) -> Result<TopoReport> {
        let layout = ps.layout()?;
        let rt = ps.world().runtime();
        let world = rt.world();
        // Placement is per process: every rank describes itself, all gather.
        let me = world.me();
        let device =
            crate::device::probe(me.local_rank, me.local_size, rt.options().device.as_deref())
                .map_err(|e| tracing::debug!("{e}"))
                .ok();
        let mine = match rt.applied_placement() {
            Some(p) => p.clone(),
            None => crate::placement::describe(me.local_rank, device.as_ref())?,
        };
        let host = HostExecutors {
            tp: ps.tp()?.host_executor().to_string(),
            sp: ps.sp()?.host_executor().to_string(),
            dp: ps.dp()?.host_executor().to_string(),
        };
        let placements = ps.world().all_gather_object(&(mine, device, host))?;
        let ranks = world
            .ranks
            .iter()
            .zip(placements)
            .map(|(r, (p, device, host))| RankEntry {
                rank: r.rank,
                host: r.host.clone(),
                node: r.node,
                local_rank: r.local_rank,
                local_size: r.local_size,
                groups: RankGroups {
                    tp: layout.group_of(GroupKind::Tp, r.rank),
                    sp: layout.group_of(GroupKind::Sp, r.rank),
                    dp: layout.group_of(GroupKind::Dp, r.rank),
                    host,
                },
                cpus: p.cpus,
                numa: p.numa,
                gpu: p.gpu,
                device,
                bound_by: p.bound_by,
            })
            .collect();
        Ok(TopoReport {
            world_size: layout.world_size,
            nodes: world.node_count,
            tp: layout.tp,
            sp: layout.sp,
            dp: layout.dp,
            ranks,
            nccl: crate::nccl::loader::load(rt.options().nccl_lib.as_deref(), &|k| {
                std::env::var(k).ok()
            })
            .map(|n| {
                let api = n.api().ok();
                let names = |f: fn(&crate::nccl::sys::Api) -> Vec<&'static str>| {
                    api.map(f)
                        .unwrap_or_default()
                        .into_iter()
                        .map(String::from)
                        .collect()
                };
                NcclInfo {
                    version: n.version(),
                    path: n.path().to_string(),
                    native_collectives: names(crate::nccl::sys::Api::native_collectives),
                    optional_entry_points: names(crate::nccl::sys::Api::optional_entry_points),
                }
            })
            .map_err(|e| tracing::debug!("{e}"))
            .ok(),
        })
    }

    /// A fixed-width table for terminals and logs.
    pub fn table(&self) -> String {
        let fmt_group = |g: &[usize]| format!("{g:?}");
        // A column as wide as its widest cell, and at least `min`.
        let width = |cell: &dyn Fn(&RankEntry) -> usize, min: usize| {
            self.ranks.iter().map(cell).max().unwrap_or(0).max(min)
        };
        let host_w = width(&|r| r.host.len(), 4);
        let group_w = |k: fn(&RankGroups) -> &Vec<usize>| {
            width(&|r: &RankEntry| fmt_group(k(&r.groups)).len(), 2)
        };
        let (tw, sw, dw) = (group_w(|g| &g.tp), group_w(|g| &g.sp), group_w(|g| &g.dp));
        let numa = |r: &RankEntry| {
            r.numa
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        // CUDA's choice when a driver answers (`ordinal@bus id`), else hwloc's PCI view.
        let gpu = |r: &RankEntry| match (&r.device, &r.gpu) {
            (Some(d), _) => format!("{}@{}", d.ordinal, d.bus_id),
            (None, Some(g)) => g.bus_id.clone(),
            (None, None) => "-".to_string(),
        };
        let exec = |r: &RankEntry| {
            let h = &r.groups.host;
            format!("{}/{}/{}", h.tp, h.sp, h.dp)
        };
        let cw = width(&|r| r.cpus.len(), 4);
        let nw = width(&|r| numa(r).len(), 4);
        let gw = width(&|r| gpu(r).len(), 3);
        let ew = width(&|r| exec(r).len(), "host tp/sp/dp".len());
        let mut out = format!(
            "{} ranks on {} node(s): tp={} sp={} dp={}; {}\n{:>4}  {:<host_w$}  {:>4}  {:>5}  {:<tw$}  {:<sw$}  {:<dw$}  {:<ew$}  {:<cw$}  {:<nw$}  {:<gw$}  {}\n",
            self.world_size,
            self.nodes,
            self.tp,
            self.sp,
            self.dp,
            self.nccl.as_ref().map_or("NCCL not found".to_string(), |n| format!("NCCL {} ({})", n.version, n.path)),
            "rank", "host", "node", "local", "tp", "sp", "dp", "host tp/sp/dp", "cpus", "numa", "gpu", "bound"
        );
        for r in &self.ranks {
            out += &format!(
                "{:>4}  {:<host_w$}  {:>4}  {:>5}  {:<tw$}  {:<sw$}  {:<dw$}  {:<ew$}  {:<cw$}  {:<nw$}  {:<gw$}  {}\n",
                r.rank,
                r.host,
                r.node,
                format!("{}/{}", r.local_rank, r.local_size),
                fmt_group(&r.groups.tp),
                fmt_group(&r.groups.sp),
                fmt_group(&r.groups.dp),
                exec(r),
                r.cpus,
                numa(r),
                gpu(r),
                r.bound_by,
            );
        }
        out
    }
}

/// One rank of a mesh report.
#[derive(Clone, Debug, Serialize)]
pub struct MeshRank {
    /// World rank.
    pub rank: usize,
    /// Host name.
    pub host: String,
    /// Its coordinate along each dimension.
    pub coords: indexmap::IndexMap<String, usize>,
    /// Each dimension's group: world ranks in group order.
    pub groups: indexmap::IndexMap<String, Vec<usize>>,
}

/// `rankmesh topo --mesh`: every rank's host, coordinates and groups, and
/// which dimensions' groups cross nodes.
#[derive(Clone, Debug, Serialize)]
pub struct MeshReport {
    /// Ranks in the world.
    pub world_size: usize,
    /// Nodes in the job.
    pub nodes: usize,
    /// The dimensions and their sizes, in the order given.
    pub dims: indexmap::IndexMap<String, usize>,
    /// Dimensions with a group that spans nodes (allowed unless declared
    /// intra-node, which the mesh refuses).
    pub crossing_nodes: Vec<String>,
    /// One entry per rank.
    pub ranks: Vec<MeshRank>,
}

impl MeshReport {
    /// Makes the mesh (checking `intra_node` dimensions, every rank alike)
    /// and describes it. Collective over the world.
    pub fn new(
        rt: &crate::group::Runtime,
        layout: crate::parallel::MeshLayout,
        intra_node: &[&str],
    ) -> Result<MeshReport> {
        let mesh = crate::parallel::Mesh::new(rt, layout, intra_node)?;
        let layout = mesh.layout();
        let world = rt.world();
        let names: Vec<&str> = layout.dims().map(|(n, _)| n).collect();
        let mut ranks = Vec::with_capacity(world.size);
        for info in &world.ranks {
            let mut groups = indexmap::IndexMap::new();
            for n in &names {
                groups.insert(n.to_string(), layout.group_of(&[n], info.rank)?);
            }
            ranks.push(MeshRank {
                rank: info.rank,
                host: info.host.clone(),
                coords: layout
                    .coords(info.rank)
                    .into_iter()
                    .map(|(n, c)| (n.to_string(), c))
                    .collect(),
                groups,
            });
        }
        // This rank's groups are real communicators: they must match.
        if cfg!(debug_assertions) {
            for n in &names {
                let g = mesh.group(&[n])?;
                assert_eq!(g.ranks(), ranks[rt.rank()].groups[*n].as_slice());
            }
        }
        let crossing_nodes = names
            .iter()
            .filter(|n| {
                ranks.iter().any(|r| {
                    let g = &r.groups[**n];
                    g.iter()
                        .any(|m| world.ranks[*m].node != world.ranks[g[0]].node)
                })
            })
            .map(|n| n.to_string())
            .collect();
        Ok(MeshReport {
            world_size: world.size,
            nodes: world.node_count,
            dims: layout.dims().map(|(n, s)| (n.to_string(), s)).collect(),
            crossing_nodes,
            ranks,
        })
    }

    /// A table (rank, host, coordinates, groups), then each node's ranks.
    pub fn table(&self) -> String {
        let dims: Vec<(&String, &usize)> = self.dims.iter().collect();
        let sizes: Vec<String> = dims.iter().map(|(n, s)| format!("{n}={s}")).collect();
        let mut out = format!(
            "{} ranks on {} node(s): mesh {}{}\n",
            self.world_size,
            self.nodes,
            sizes.join(" "),
            if self.crossing_nodes.is_empty() {
                String::new()
            } else {
                format!(
                    "; groups crossing nodes: {}",
                    self.crossing_nodes.join(", ")
                )
            }
        );
        let host_w = self
            .ranks
            .iter()
            .map(|r| r.host.len())
            .max()
            .unwrap_or(0)
            .max(4);
        let group_w = |n: &str| {
            self.ranks
                .iter()
                .map(|r| format!("{:?}", r.groups[n]).len())
                .max()
                .unwrap_or(0)
                .max(n.len())
        };
        let coord_w = |n: &str| n.len().max(3);
        out += &format!("{:>4}  {:<host_w$}", "rank", "host");
        for (n, _) in &dims {
            out += &format!("  {:>w$}", format!("@{n}"), w = coord_w(n) + 1);
        }
        for (n, _) in &dims {
            out += &format!("  {:<w$}", n, w = group_w(n));
        }
        out += "\n";
        for r in &self.ranks {
            out += &format!("{:>4}  {:<host_w$}", r.rank, r.host);
            for (n, _) in &dims {
                out += &format!("  {:>w$}", r.coords[*n], w = coord_w(n) + 1);
            }
            for (n, _) in &dims {
                out += &format!("  {:<w$}", format!("{:?}", r.groups[*n]), w = group_w(n));
            }
            out += "\n";
        }
        let mut hosts: Vec<&str> = Vec::new();
        for r in &self.ranks {
            if !hosts.contains(&r.host.as_str()) {
                hosts.push(&r.host);
            }
        }
        for h in hosts {
            let on: Vec<String> = self
                .ranks
                .iter()
                .filter(|r| r.host == h)
                .map(|r| r.rank.to_string())
                .collect();
            out += &format!("node {h}: ranks {}\n", on.join(" "));
        }
        out
    }
}
