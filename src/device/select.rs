//! Which CUDA device a rank drives: pure rules, unit-tested without a GPU.
//!
//! Ordinals are those the CUDA driver shows this process, so
//! `CUDA_VISIBLE_DEVICES` is already applied. Launchers either show every
//! rank all of a node's GPUs (rank `i` of the node takes ordinal `i`) or one
//! GPU per rank (`srun --gpus-per-task=1`: every rank takes ordinal 0 of its
//! own list). Whether two ranks of a communicator ended up on the same GPU is
//! decided by PCI bus id ([`duplicate_devices`]), before NCCL is touched.

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

/// Ranks that would share a GPU: `devices[r]` is (node, PCI bus id) of group
/// rank `r`. Returns the first clash as a message naming both ranks.
pub fn duplicate_devices(devices: &[(usize, String)]) -> Result<(), String> {
    for (b, dev) in devices.iter().enumerate() {
        if let Some(a) = devices[..b].iter().position(|d| d == dev) {
            return Err(format!(
                "group ranks {a} and {b} would share GPU {} on node {} (NCCL refuses two ranks \
                 on one GPU): start one rank per GPU, or set CUDA_VISIBLE_DEVICES / RANKMESH_DEVICE",
                dev.1, dev.0
            ));
        }
    }
    Ok(())
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

    #[test]
    fn shared_gpu_is_found_by_node_and_bus_id() {
        let d = |n: usize, b: &str| (n, b.to_string());
        assert!(duplicate_devices(&[d(0, "0000:01:00.0"), d(1, "0000:01:00.0")]).is_ok());
        let e = duplicate_devices(&[d(0, "a"), d(0, "b"), d(0, "a")]).unwrap_err();
        assert!(
            e.starts_with("group ranks 0 and 2 would share GPU a on node 0"),
            "{e}"
        );
    }
}
