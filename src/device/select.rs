//! Which CUDA device a rank drives: pure rules, unit-tested without a GPU.
//!
//! Ordinals are those the CUDA driver shows this process, so
//! `CUDA_VISIBLE_DEVICES` is already applied. Launchers either show every
//! rank all of a node's GPUs (rank `i` of the node takes ordinal `i`) or one
//! GPU per rank (`srun --gpus-per-task=1`: every rank takes ordinal 0 of its
//! own list). Whether two ranks of a communicator ended up on the same GPU is
//! decided as NCCL decides it, by NCCL host and PCI bus id
//! ([`duplicate_devices`]), before NCCL is touched.

/// Chooses this rank's device ordinal.
///
/// `explicit` is `RANKMESH_DEVICE`: one ordinal for this rank, or a
/// comma-separated list indexed by local rank.
pub fn choose_device(
    local_rank: usize,
    local_size: usize,
    visible: usize,
    explicit: Option<&str>,
    visible_env: Option<&str>,
) -> Result<usize, String> {
    let shown = match visible_env {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v:?}"),
        None => "CUDA_VISIBLE_DEVICES unset".to_string(),
    };
    if visible == 0 {
        return Err(format!("no CUDA device is visible to this rank ({shown})"));
    }
    if let Some(spec) = explicit {
        let list: Vec<&str> = spec.split(',').map(str::trim).collect();
        let pick = if list.len() == 1 {
            list[0]
        } else {
            *list.get(local_rank).ok_or_else(|| {
                format!(
                    "RANKMESH_DEVICE={spec:?} lists {} devices but this is local rank {local_rank}",
                    list.len()
                )
            })?
        };
        let ordinal: usize = pick
            .parse()
            .map_err(|_| format!("RANKMESH_DEVICE={spec:?}: {pick:?} is not a device ordinal"))?;
        if ordinal >= visible {
            return Err(format!(
                "RANKMESH_DEVICE={spec:?} picks device {ordinal} but {visible} are visible ({shown})"
            ));
        }
        return Ok(ordinal);
    }
    if visible >= local_size {
        return Ok(local_rank);
    }
    if visible == 1 {
        // One GPU shown per rank is how Slurm's --gpus-per-task works; a real
        // overlap is caught by bus id when a communicator forms.
        return Ok(0);
    }
    Err(format!(
        "{local_size} ranks on this node but {visible} CUDA devices are visible ({shown}); \
         NCCL needs one GPU per rank: start at most {visible} ranks per node, or set RANKMESH_DEVICE"
    ))
}

/// Where a rank's GPU is, as NCCL tells GPUs apart: its NCCL host and its
/// PCI bus id. NCCL's host is its host hash, which `NCCL_HOSTID` sets
/// (`getHostHashOnce`); without it, the MPI node stands for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuPlace {
    /// The rank's MPI node (for the message).
    pub node: usize,
    /// [`host_id_key`] of its `NCCL_HOSTID`; 0 when unset.
    pub host_id: u64,
    /// PCI bus id.
    pub bus_id: String,
}

impl GpuPlace {
    /// Whether NCCL sees both on one GPU: one NCCL host and one bus id.
    fn same_gpu(&self, other: &GpuPlace) -> bool {
        let same_host = match (self.host_id, other.host_id) {
            (0, 0) => self.node == other.node,
            (a, b) => a == b,
        };
        same_host && self.bus_id == other.bus_id
    }
}

/// This process's `NCCL_HOSTID` as a non-zero key (FNV-1a), or 0 when it is
/// unset or empty.
pub fn host_id_key(host_id: Option<&str>) -> u64 {
    match host_id {
        Some(id) if !id.is_empty() => {
            let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            h | 1
        }
        _ => 0,
    }
}

/// The NCCL host of a rank on `host`, by name, for groups whose members
/// have no common node numbering (stateless groups across jobs):
/// `NCCL_HOSTID` when set, else the host name.
pub fn nccl_host_name(host: &str, host_id: Option<&str>) -> String {
    match host_id {
        Some(id) if !id.is_empty() => format!("the NCCL host of NCCL_HOSTID {id}"),
        _ => host.to_string(),
    }
}

/// The `NCCL_HOSTID` that `RANKMESH_SHARE_GPU=1` gives a rank which has
/// none: distinct per process on every host, so that each rank is a node of
/// its own to NCCL and may share a GPU with the others.
pub fn share_gpu_host_id(host: &str, pid: u32) -> String {
    format!("rankmesh-{host}-{pid}")
}

/// The first pair `(a, b)`, `a < b`, of places that `same` calls one GPU:
/// the one scan behind both clash checks (MPI groups by [`GpuPlace`],
/// stateless groups by host name and bus id).
pub fn first_shared<T>(places: &[T], same: impl Fn(&T, &T) -> bool) -> Option<(usize, usize)> {
    places
        .iter()
        .enumerate()
        .find_map(|(b, p)| places[..b].iter().position(|q| same(q, p)).map(|a| (a, b)))
}

/// Ranks that would share a GPU as NCCL sees it: `devices[r]` is group rank
/// `r`'s place. Returns the first clash as a message naming both ranks.
pub fn duplicate_devices(devices: &[GpuPlace]) -> Result<(), String> {
    let Some((a, b)) = first_shared(devices, GpuPlace::same_gpu) else {
        return Ok(());
    };
    let dev = &devices[b];
    let host = if dev.host_id == 0 {
        format!("node {}", dev.node)
    } else {
        format!("node {} (one NCCL_HOSTID)", dev.node)
    };
    Err(format!(
        "group ranks {a} and {b} would share GPU {} on {host} (NCCL refuses two ranks \
         on one GPU): start one rank per GPU, or set CUDA_VISIBLE_DEVICES / \
         RANKMESH_DEVICE; to test several ranks on one GPU, set RANKMESH_SHARE_GPU=1",
        dev.bus_id
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_rank_maps_to_its_ordinal_when_all_gpus_are_shown() {
        assert_eq!(choose_device(3, 4, 4, None, None), Ok(3));
        assert_eq!(choose_device(1, 2, 8, None, Some("0,1,2,3,4,5,6,7")), Ok(1));
    }

    #[test]
    fn one_gpu_per_rank_takes_ordinal_zero() {
        assert_eq!(choose_device(2, 4, 1, None, Some("2")), Ok(0));
    }

    #[test]
    fn more_ranks_than_gpus_is_an_error_naming_the_counts() {
        let e = choose_device(0, 4, 2, None, Some("0,1")).unwrap_err();
        assert!(e.contains("4 ranks on this node but 2 CUDA devices"), "{e}");
        assert!(e.contains("CUDA_VISIBLE_DEVICES=\"0,1\""), "{e}");
        let e = choose_device(0, 1, 0, None, None).unwrap_err();
        assert!(e.contains("no CUDA device is visible"), "{e}");
    }

    #[test]
    fn explicit_device_single_or_per_local_rank() {
        assert_eq!(choose_device(0, 4, 2, Some("1"), None), Ok(1));
        assert_eq!(choose_device(2, 4, 4, Some("3,2,1,0"), None), Ok(1));
        assert!(choose_device(0, 1, 2, Some("2"), None)
            .unwrap_err()
            .contains("picks device 2 but 2 are visible"));
        assert!(choose_device(0, 1, 2, Some("x"), None)
            .unwrap_err()
            .contains("\"x\" is not a device ordinal"));
        assert!(choose_device(3, 4, 4, Some("0,1"), None)
            .unwrap_err()
            .contains("this is local rank 3"));
    }

    fn place(node: usize, host_id: Option<&str>, bus: &str) -> GpuPlace {
        GpuPlace {
            node,
            host_id: host_id_key(host_id),
            bus_id: bus.to_string(),
        }
    }

    #[test]
    fn shared_gpu_is_found_by_node_and_bus_id() {
        let d = |n: usize, b: &str| place(n, None, b);
        assert!(duplicate_devices(&[d(0, "0000:01:00.0"), d(1, "0000:01:00.0")]).is_ok());
        let e = duplicate_devices(&[d(0, "a"), d(0, "b"), d(0, "a")]).unwrap_err();
        assert!(
            e.starts_with("group ranks 0 and 2 would share GPU a on node 0"),
            "{e}"
        );
        assert!(e.contains("RANKMESH_SHARE_GPU=1"), "{e}");
    }

    #[test]
    fn nccl_hostid_decides_the_host_as_nccl_does() {
        let bus = "0000:01:00.0";
        // Distinct ids on one node: two NCCL nodes, one GPU allowed.
        let ok = [place(0, Some("a"), bus), place(0, Some("b"), bus)];
        assert!(duplicate_devices(&ok).is_ok());
        // One id on two nodes: one NCCL host, so the same bus id clashes.
        let e =
            duplicate_devices(&[place(0, Some("x"), bus), place(1, Some("x"), bus)]).unwrap_err();
        assert!(e.contains("on node 1 (one NCCL_HOSTID)"), "{e}");
        // Set on one rank only: different hashes, as in NCCL.
        assert!(duplicate_devices(&[place(0, Some("x"), bus), place(0, None, bus)]).is_ok());
        assert_eq!(host_id_key(Some("")), 0);
        assert_ne!(host_id_key(Some("a")), host_id_key(Some("b")));
        assert_ne!(share_gpu_host_id("vm", 10), share_gpu_host_id("vm", 11));
    }
}
