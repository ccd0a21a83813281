//! CPU/NUMA/GPU placement with hwloc (the `hwlocality` crate on the system
//! library): what each rank is bound to, and the binding policies the
//! runtime applies at start.
//!
//! Debian's hwloc has no CUDA/NVML plugin, so GPUs are found as PCI devices
//! (NVIDIA vendor id, or a display/3D controller class) and their local CPUs
//! are those of their first non-I/O ancestor.

use crate::device::DeviceInfo;
use crate::error::{Error, Result};
use crate::parse::{choice, Choice};
use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::topology::Topology;
use serde::{Deserialize, Serialize};

/// How the runtime binds ranks to CPUs at start (`--bind`, `RANKMESH_BIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindPolicy {
    /// Leave the binding as it is (the launcher's, if any).
    None,
    /// Spread the node's ranks over disjoint sets of cores.
    Cores,
    /// Bind each rank to one NUMA node, ranks spread over the nodes.
    Numa,
    /// Bind each rank to the cores near its GPU (local rank i → GPU i).
    Gpu,
}

choice!(
    BindPolicy,
    &[
        BindPolicy::None,
        BindPolicy::Cores,
        BindPolicy::Numa,
        BindPolicy::Gpu
    ]
);

impl std::str::FromStr for BindPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        BindPolicy::named(s.trim()).ok_or_else(|| {
            Error::Launch(format!(
                "unknown binding policy {:?}: use none, cores, numa or gpu",
                s.trim()
            ))
        })
    }
}

impl BindPolicy {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BindPolicy::None => "none",
            BindPolicy::Cores => "cores",
            BindPolicy::Numa => "numa",
            BindPolicy::Gpu => "gpu",
        }
    }
}

/// A GPU as hwloc sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// PCI bus id, `dddd:bb:dd.f`.
    pub bus_id: String,
    /// CPUs close to the GPU (list format).
    pub local_cpus: String,
}

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// CPUs the process may run on (list format, as `Cpus_allowed_list`).
    pub cpus: String,
    /// NUMA nodes those CPUs belong to.
    pub numa: Vec<usize>,
    /// The GPU of this local rank, when the node has GPUs.
    pub gpu: Option<GpuInfo>,
    /// Who set the binding: `launcher`, `rankmesh:<policy>`, or `none`.
    pub bound_by: String,
}

fn hw(e: impl std::fmt::Display) -> Error {
    Error::Launch(format!("hwloc: {e}"))
}

/// `0-3,8` form of a CPU set.
fn list(set: &CpuSet) -> String {
    let s = set.to_string();
    s.strip_prefix("CpuSet(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(&s)
        .to_string()
}

fn topology() -> Result<Topology> {
    Topology::builder()
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(hw)?
        .build()
        .map_err(hw)
}

/// GPUs by PCI bus id.
fn gpus(t: &Topology) -> Vec<&TopologyObject> {
    let mut out: Vec<&TopologyObject> = t
        .objects_with_type(ObjectType::PCIDevice)
        .filter(|o| match o.attributes() {
            Some(ObjectAttributes::PCIDevice(p)) => {
                p.vendor_id() == 0x10de || matches!(p.class_id(), 0x0300 | 0x0302)
            }
            _ => false,
        })
        .collect();
    out.sort_by_key(|o| bus_id(o));
    out
}

fn bus_id(o: &TopologyObject) -> String {
    match o.attributes() {
        Some(ObjectAttributes::PCIDevice(p)) => format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p.domain(),
            p.bus_id(),
            p.bus_device(),
            p.function()
        ),
        _ => String::new(),
    }
}

/// (domain, bus, device, function) of a PCI bus id in any of the spellings
/// in use (`0000:1b:00.0` from hwloc, `0000:1B:00.0` from CUDA,
/// `00000000:1B:00.0` from NVML).
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, function) = s.trim().rsplit_once('.')?;
    let mut parts = rest.split(':');
    let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// This rank's GPU among `g`: the device CUDA gives it (`cuda`, from
/// [`crate::device::probe`]; matched by PCI bus id, so `CUDA_VISIBLE_DEVICES`
/// and `RANKMESH_DEVICE` count) when a driver answered, else the
/// `local_rank`-th GPU of the node.
fn my_gpu<'t>(
    g: &[&'t TopologyObject],
    local_rank: usize,
    cuda: Option<&DeviceInfo>,
) -> Option<&'t TopologyObject> {
    if g.is_empty() {
        return None;
    }
    let cuda = cuda.and_then(|d| parse_bus_id(&d.bus_id));
    cuda.and_then(|want| g.iter().find(|o| parse_bus_id(&bus_id(o)) == Some(want)))
        .or_else(|| g.get(local_rank % g.len()))
        .copied()
}

fn gpu_cpus(o: &TopologyObject) -> Option<CpuSet> {
    o.first_non_io_ancestor()
        .and_then(|a| a.cpuset())
        .map(|s| s.clone_target())
}

/// Applies `policy` for local rank `local_rank` of `local_size` and returns
/// where the rank then runs. An impossible request is an error.
pub fn apply(
    policy: Option<BindPolicy>,
    local_rank: usize,
    local_size: usize,
    device: Option<&str>,
) -> Result<Placement> {
    let t = topology()?;
    let current = t.cpu_binding(CpuBindingFlags::PROCESS).map_err(hw)?;
    let launcher_bound = current != *t.allowed_cpuset();
    // Asked once: it picks the GPU for `--bind gpu` and for the report.
    let cuda = crate::device::probe(local_rank, local_size, device).ok();
    let target: Option<CpuSet> = match policy {
        None | Some(BindPolicy::None) => None,
        Some(BindPolicy::Cores) => {
            let cores: Vec<&TopologyObject> = t.objects_with_type(ObjectType::Core).collect();
            let c = cores.len();
            if local_size > c {
                return Err(Error::Launch(format!(
                    "--bind cores needs a core per rank: {local_size} ranks on this node but {c} cores; use --bind none or fewer ranks per node"
                )));
            }
            let mut set = CpuSet::new();
            for core in &cores[local_rank * c / local_size..(local_rank + 1) * c / local_size] {
                if let Some(cs) = core.cpuset() {
                    set |= &*cs;
                }
            }
            Some(set)
        }
        Some(BindPolicy::Numa) => {
            let nodes: Vec<&TopologyObject> = t.objects_with_type(ObjectType::NUMANode).collect();
            let node = nodes
                .get(local_rank * nodes.len() / local_size)
                .ok_or_else(|| Error::Launch("--bind numa: hwloc reports no NUMA node".into()))?;
            node.cpuset().map(|s| s.clone_target())
        }
        Some(BindPolicy::Gpu) => {
            let g = gpus(&t);
            if g.is_empty() {
                return Err(Error::Launch(
                    "--bind gpu: no GPU (NVIDIA or display-class PCI device) found on this node"
                        .into(),
                ));
            }
            if local_size > g.len() {
                return Err(Error::Launch(format!(
                    "--bind gpu: {local_size} ranks on this node but {} GPUs; run one rank per GPU",
                    g.len()
                )));
            }
            my_gpu(&g, local_rank, cuda.as_ref()).and_then(gpu_cpus)
        }
    };
    let bound_by = match (&target, policy) {
        (Some(set), Some(p)) => {
            if launcher_bound {
                tracing::warn!(
                    "overriding the launcher's binding {} with --bind {}",
                    list(&current),
                    p.name()
                );
            }
            t.bind_cpu(set, CpuBindingFlags::PROCESS).map_err(hw)?;
            format!("rankmesh:{}", p.name())
        }
        _ if launcher_bound => "launcher".to_string(),
        _ => "none".to_string(),
    };
    describe_with(&t, local_rank, cuda.as_ref(), bound_by)
}

/// Where this process runs now (no change), for local rank `local_rank` whose
/// CUDA device, if known, is `cuda`; a binding narrower than the machine is
/// reported as the launcher's.
pub fn describe(local_rank: usize, cuda: Option<&DeviceInfo>) -> Result<Placement> {
    let t = topology()?;
    let current = t.cpu_binding(CpuBindingFlags::PROCESS).map_err(hw)?;
    let bound_by = if current == *t.allowed_cpuset() {
        "none"
    } else {
        "launcher"
    };
    describe_with(&t, local_rank, cuda, bound_by.to_string())
}

fn describe_with(
    t: &Topology,
    local_rank: usize,
    cuda: Option<&DeviceInfo>,
    bound_by: String,
) -> Result<Placement> {
    let cpus = t.cpu_binding(CpuBindingFlags::PROCESS).map_err(hw)?;
    let numa = t
        .objects_with_type(ObjectType::NUMANode)
        .enumerate()
        .filter(|(_, n)| n.cpuset().is_some_and(|s| s.intersects(&cpus)))
        .map(|(i, _)| i)
        .collect();
    let g = gpus(t);
    let gpu = my_gpu(&g, local_rank, cuda).map(|o| GpuInfo {
        bus_id: bus_id(o),
        local_cpus: gpu_cpus(o).map_or_else(String::new, |s| list(&s)),
    });
    Ok(Placement {
        cpus: list(&cpus),
        numa,
        gpu,
        bound_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_match_across_spellings() {
        let hwloc = parse_bus_id("0000:1b:00.0");
        assert!(hwloc.is_some());
        assert_eq!(parse_bus_id("0000:1B:00.0"), hwloc);
        assert_eq!(parse_bus_id("00000000:1B:00.0"), hwloc);
        assert_ne!(parse_bus_id("0000:1C:00.0"), hwloc);
        assert_eq!(parse_bus_id("not a bus id"), None);
    }

    #[test]
    fn policies_parse() {
        for p in [
            BindPolicy::None,
            BindPolicy::Cores,
            BindPolicy::Numa,
            BindPolicy::Gpu,
        ] {
            assert_eq!(p.name().parse::<BindPolicy>().unwrap(), p);
        }
        assert!("sockets"
            .parse::<BindPolicy>()
            .unwrap_err()
            .to_string()
            .contains("use none, cores, numa or gpu"));
    }

    #[test]
    fn describe_matches_proc_status() {
        let p = describe(0, None).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        assert_eq!(p.cpus, line.split_whitespace().nth(1).unwrap());
        assert!(!p.numa.is_empty());
    }
}
