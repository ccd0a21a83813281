//! bench's memory sanity check: before any buffer is allocated, the sweep's
//! peak per-rank memory is compared with what the rank can have, so a size
//! that cannot fit is a message naming both numbers, not an allocation
//! abort or the OOM killer.

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

/// Limit minus usage of this process's cgroup (v2, then v1).
fn cgroup_room() -> Option<u128> {
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<u128>().ok();
    let v2 = read("/sys/fs/cgroup/memory.max")
        .map(|max| (max, read("/sys/fs/cgroup/memory.current").unwrap_or(0)));
    let v1 = || {
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes").map(|max| {
            let used = read("/sys/fs/cgroup/memory/memory.usage_in_bytes").unwrap_or(0);
            (max, used)
        })
    };
    let (max, used) = v2.or_else(v1)?;
    // v1 reports "no limit" as a huge number; anything above 2^60 is that.
    (max < 1 << 60).then(|| max.saturating_sub(used))
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
