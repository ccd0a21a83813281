//! bench's memory sanity check, before any buffer is allocated. The sweep's
//! peak per-rank memory is compared with what the rank can have, so a size
//! that cannot fit is a message naming both numbers, not an allocation abort
//! or the OOM killer.

use super::config::{sizes, BenchConfig};

/// Bytes one rank needs at the sweep's largest size on a group of `n`:
/// host input and output, their plane copies, the in-place and packing
/// scratch, and (with `-c`) the downloaded output with two f64 copies for
/// the comparison.
pub fn peak_bytes(cfg: &BenchConfig, n: usize) -> Option<u128> {
    let elem = cfg.dtype.size() as u128;
    let largest = *sizes(cfg).last()?;
    let count = largest / cfg.dtype.size();
    let (send, recv, _) = cfg.op.counts(count, n, cfg.dtype.size());
    let (send, recv) = (send as u128 * elem, recv as u128 * elem);
    let buffers = 2 * (send + recv);
    let scratch = 2 * send.max(recv);
    let check = if cfg.check > 0 {
        recv + 2 * (recv / elem) * 8
    } else {
        0
    };
    Some(buffers + scratch + check)
}

/// What this rank may use: the lower of `MemAvailable` and the cgroup's
/// remaining limit, shared by the node's `local_ranks`. `None` when neither
/// can be read (then nothing is refused).
pub fn available_bytes(local_ranks: usize) -> Option<(u128, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo.as_deref().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u128>().ok())
            .map(|kb| (kb * 1024, "MemAvailable".to_string()))
    });
    let cgroup = cgroup_room().map(|b| (b, "the cgroup memory limit".to_string()));
    let (bytes, what) = match (avail, cgroup) {
        (Some(a), Some(c)) => {
            if c.0 < a.0 {
                c
            } else {
                a
            }
        }
        (a, c) => a.or(c)?,
    };
    let ranks = local_ranks.max(1) as u128;
    Some((
        bytes / ranks,
        format!("{what} shared by {ranks} rank(s) on this node"),
    ))
}

/// Limit minus usage of this process's own cgroup, the tightest along its
/// path up to the hierarchy's root (v2, else v1's memory controller): under
/// Slurm or systemd the job's limit sits on the job's cgroup, not on
/// `/sys/fs/cgroup` itself.
fn cgroup_room() -> Option<u128> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    room_along(&cgroup_path(&cgroup, &mounts)?)
}

/// Which memory-limit files a cgroup directory holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Version {
    /// `memory.max` and `memory.current`.
    V2,
    /// `memory.limit_in_bytes` and `memory.usage_in_bytes`.
    V1,
}

/// This process's cgroup directories, its own first, then each parent up
/// to the mount point, from `/proc/self/cgroup` and `/proc/self/mountinfo`.
fn cgroup_path(cgroup: &str, mountinfo: &str) -> Option<(Version, Vec<std::path::PathBuf>)> {
    // (version, path in the hierarchy)
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| (Version::V2, p));
    let v1 = || {
        cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some((Version::V1, path))
        })
    };
    // A v1 memory line wins: on a hybrid host the v2 tree holds no memory controller.
    let (version, path) = v1().or(v2)?;
    let (root, mount) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let fits = match version {
            Version::V2 => right.first() == Some(&"cgroup2"),
            Version::V1 => {
                right.first() == Some(&"cgroup")
                    && right
                        .get(2)
                        .is_some_and(|o| o.split(',').any(|c| c == "memory"))
            }
        };
        (fits && left.len() > 4).then(|| (left[3], left[4]))
    })?;
    // A mount of a sub-tree (a container's) shows paths below its root.
    let inner = path
        .strip_prefix(root)
        .unwrap_or(path)
        .trim_start_matches('/');
    let mut dir = std::path::Path::new(mount).join(inner);
    let mut dirs = vec![dir.clone()];
    while dir != std::path::Path::new(mount) && dir.pop() {
        dirs.push(dir.clone());
    }
    Some((version, dirs))
}

/// The least room (limit minus usage) among `dirs`' limits; `None` when
/// none of them sets one.
fn room_along((version, dirs): &(Version, Vec<std::path::PathBuf>)) -> Option<u128> {
    let read = |d: &std::path::Path, f: &str| -> Option<u128> {
        std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok()
    };
    let (max, used) = match version {
        Version::V2 => ("memory.max", "memory.current"),
        Version::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    };
    dirs.iter()
        .filter_map(|d| {
            // "max" does not parse; v1 reports "no limit" as a huge number.
            let limit = read(d, max).filter(|m| *m < 1 << 60)?;
            Some(limit.saturating_sub(read(d, used).unwrap_or(0)))
        })
        .min()
}

/// `None` when the sweep fits, else the message naming both numbers.
pub fn refuse(cfg: &BenchConfig, n: usize, local_ranks: usize) -> Option<String> {
    let need = peak_bytes(cfg, n)?;
    let (have, what) = available_bytes(local_ranks)?;
    (need > have).then(|| {
        format!(
            "the sweep needs about {} per rank at its largest size ({} bytes) but this rank can have {} ({what}); lower -e",
            human(need),
            sizes(cfg).last().copied().unwrap_or(0),
            human(have)
        )
    })
}

fn human(b: u128) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const MOUNTS_V2: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n\
        22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";

    #[test]
    fn the_jobs_own_cgroup_v2_and_its_parents() {
        let (v, dirs) =
            cgroup_path("0::/system.slice/slurmstepd.scope/job_7\n", MOUNTS_V2).unwrap();
        assert_eq!(v, Version::V2);
        assert_eq!(
            dirs,
            [
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7",
                "/sys/fs/cgroup/system.slice/slurmstepd.scope",
                "/sys/fs/cgroup/system.slice",
                "/sys/fs/cgroup",
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn v1_memory_controller_and_a_containers_sub_tree() {
        let cgroup = "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc/job\n0::/\n";
        let mounts = "40 30 0:35 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
            41 30 0:36 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n";
        let (v, dirs) = cgroup_path(cgroup, mounts).unwrap();
        assert_eq!(v, Version::V1);
        assert_eq!(
            dirs,
            ["/sys/fs/cgroup/memory/job", "/sys/fs/cgroup/memory"].map(PathBuf::from)
        );
    }

    /// The job's limit counts even when the root has none, and the tightest
    /// level wins.
    #[test]
    fn the_tightest_limit_along_the_path() {
        let root = std::env::temp_dir().join(format!("rankmesh-cgroup-{}", std::process::id()));
        let job = root.join("slice/job");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("slice/memory.max"), "8589934592\n").unwrap();
        std::fs::write(root.join("slice/memory.current"), "1073741824\n").unwrap();
        std::fs::write(job.join("memory.max"), "2147483648\n").unwrap();
        std::fs::write(job.join("memory.current"), "536870912\n").unwrap();
        let dirs = vec![job.clone(), root.join("slice"), root.clone()];
        assert_eq!(room_along(&(Version::V2, dirs)), Some(1536 << 20));
        let unlimited = vec![root.clone()];
        assert_eq!(room_along(&(Version::V2, unlimited)), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
