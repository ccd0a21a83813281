//! Who has arrived at start-up on this node, for launchers whose registry
//! rankmesh may not use. Hydra (MPICH, Intel MPI) hands each rank a PMI-1
//! socket that belongs to the MPI's own start-up, and a second client on it
//! would break that protocol.
//!
//! Each rank a hydra proxy started leaves a mark in `/dev/shm` before
//! `MPI_Init`, named after the proxy (its pid and start time: this node's
//! part of the job) and the rank, and removes it when start-up ends. A rank
//! whose start-up runs out of time lists its proxy's marks. With the whole
//! job on this node (hydra's `MPI_LOCALNRANKS` equals `PMI_SIZE`) the ranks
//! without a mark are named; otherwise it says how many of this node's ranks
//! are missing, since which ranks hydra placed here is known only through
//! the PMI socket.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DIR: &str = "/dev/shm";
const PREFIX: &str = "rankmesh-arrived-";
/// `comm` of hydra's proxy (MPICH 4 and 5, Intel MPI), 15 characters as the
/// kernel keeps it.
const PROXY: &str = "hydra_pmi_proxy";
/// How far up the process tree the proxy may be (wrappers: `bash -c`,
/// `timeout`, `env`).
const DEPTH: usize = 8;

/// This rank's mark, removed when dropped.
pub(crate) struct NodeMarks {
    job: String,
    mark: PathBuf,
    rank: usize,
    size: usize,
    local: usize,
}

/// `(ppid, comm, start time)` from the text of `/proc/PID/stat`.
fn parse_stat(stat: &str) -> Option<(u32, &str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    // After the comm: state, ppid, then 18 more fields to the start time
    // (field 22 of proc(5)).
    let rest: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    Some((
        rest.get(1)?.parse().ok()?,
        comm,
        rest.get(19)?.parse().ok()?,
    ))
}

fn stat_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The hydra proxy above this process: its pid and start time.
fn proxy() -> Option<(u32, u64)> {
    // SAFETY: getppid has no preconditions.
    let mut pid = unsafe { libc::getppid() } as u32;
    for _ in 0..DEPTH {
        let stat = stat_of(pid)?;
        let (ppid, comm, start) = parse_stat(&stat)?;
        if comm == PROXY {
            return Some((pid, start));
        }
        if ppid <= 1 {
            return None;
        }
        pid = ppid;
    }
    None
}

/// Removes marks whose proxy has ended (a rank killed during start-up
/// leaves its mark behind).
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
            continue;
        };
        let alive = pid.parse::<u32>().ok().and_then(stat_of).is_some_and(|s| {
            parse_stat(&s).is_some_and(|(_, comm, st)| comm == PROXY && st.to_string() == start)
        });
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A launcher's number in the environment (`PMI_RANK=3`).
pub(super) fn env_number(key: &str) -> Option<usize> {
    std::env::var(key).ok()?.trim().parse().ok()
}

impl NodeMarks {
    /// Marks this rank arrived; `None` where hydra did not start this
    /// process or `/dev/shm` refuses the mark.
    pub fn arrive() -> Option<NodeMarks> {
        let rank = env_number("PMI_RANK")?;
        let size = env_number("PMI_SIZE")?;
        let local = env_number("MPI_LOCALNRANKS")?;
        let (pid, start) = proxy()?;
        let dir = Path::new(DIR);
        prune(dir);
        let job = format!("{PREFIX}{pid}-{start}-");
        let mark = dir.join(format!("{job}{rank}"));
        std::fs::File::create(&mark).ok()?;
        Some(NodeMarks {
            job,
            mark,
            rank,
            size,
            local,
        })
    }

    /// This rank, as hydra numbered it.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The ranks of this node's part of the job that have marked arrival.
    fn arrived(&self) -> BTreeSet<usize> {
        let Ok(entries) = std::fs::read_dir(DIR) else {
            return BTreeSet::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                name.to_str()?.strip_prefix(&self.job)?.parse().ok()
            })
            .collect()
    }

    /// The tail of the start-up report: who has not arrived, on `host`.
    pub fn report(&self, host: &str) -> String {
        absent_line(&self.arrived(), self.size, self.local, host)
    }
}

impl Drop for NodeMarks {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.mark);
    }
}

/// What the marks say: the absent ranks by name when the whole job of
/// `size` ranks is on this node (`local` ranks here), else a count.
fn absent_line(arrived: &BTreeSet<usize>, size: usize, local: usize, host: &str) -> String {
    if local == size {
        let absent: Vec<(usize, Option<String>)> = (0..size)
            .filter(|r| !arrived.contains(r))
            .map(|r| (r, Some(host.to_string())))
            .collect();
        return name_absent(&absent, 0);
    }
    let here: Vec<String> = arrived.iter().map(usize::to_string).collect();
    match local.saturating_sub(arrived.len()) {
        0 => format!(
            "; the {local} ranks placed on {host} have all started rankmesh: the absent ranks are on other nodes, which cannot be named from here (hydra tells only the MPI which ranks it placed where)"
        ),
        n => format!(
            "; {n} of the {local} ranks placed on {host} {} not started rankmesh (started here: {}); ranks on other nodes cannot be named from here",
            if n == 1 { "has" } else { "have" },
            if here.is_empty() { "none".to_string() } else { here.join(", ") }
        ),
    }
}

/// Most ranks named one by one; the rest are counted.
const NAMED: usize = 16;

/// `; rank 3 (on n1) has not started rankmesh` and the like.
pub(super) fn name_absent(ranks: &[(usize, Option<String>)], unasked: usize) -> String {
    let named: Vec<String> = ranks
        .iter()
        .take(NAMED)
        .map(|(r, host)| match host {
            Some(h) => format!("{r} (on {h})"),
            None => r.to_string(),
        })
        .collect();
    let more = match ranks.len().saturating_sub(NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let unasked = match unasked {
        0 => String::new(),
        n => format!(" ({n} ranks not asked in time)"),
    };
    match ranks.len() {
        0 => format!(
            "; every rank the launcher was asked about has started rankmesh{unasked}: one is stuck in the same step"
        ),
        1 => format!("; rank {}{more} has not started rankmesh{unasked}", named[0]),
        _ => format!(
            "; ranks {}{more} have not started rankmesh{unasked}",
            named.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_is_found_in_proc_stat_text() {
        let line = "4242 (hydra_pmi_proxy) S 4240 4242 4100 0 -1 4194560 300 0 0 0 1 2 0 0 20 0 1 0 987654 9000000 400 18446744073709551615";
        assert_eq!(parse_stat(line), Some((4240, "hydra_pmi_proxy", 987654)));
        // A comm with spaces and parentheses ends at the last ')'.
        let odd = "7 (a (b) c) R 5 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0 0";
        assert_eq!(parse_stat(odd), Some((5, "a (b) c", 12)));
        assert_eq!(parse_stat("7 (short) R 5"), None);
    }

    #[test]
    fn absent_ranks_are_named_when_the_job_is_on_this_node_and_counted_otherwise() {
        let arrived: BTreeSet<usize> = [0, 1].into();
        assert_eq!(
            absent_line(&arrived, 3, 3, "vm"),
            "; rank 2 (on vm) has not started rankmesh"
        );
        assert_eq!(
            absent_line(&arrived, 5, 3, "n0"),
            "; 1 of the 3 ranks placed on n0 has not started rankmesh (started here: 0, 1); ranks on other nodes cannot be named from here"
        );
        assert!(absent_line(&arrived, 5, 2, "n0").contains("have all started rankmesh"));
        assert!(absent_line(&BTreeSet::new(), 4, 2, "n1")
            .contains("2 of the 2 ranks placed on n1 have not"));
    }

    /// A mark of a proxy that no longer runs is removed; others stay.
    #[test]
    fn marks_of_ended_jobs_are_pruned() {
        let dir = std::env::temp_dir().join(format!("rankmesh-marks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gone = dir.join(format!("{PREFIX}999999999-1-0"));
        let other = dir.join("unrelated");
        std::fs::File::create(&gone).unwrap();
        std::fs::File::create(&other).unwrap();
        prune(&dir);
        assert!(!gone.exists());
        assert!(other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn absent_ranks_are_named_with_their_hosts() {
        assert_eq!(
            name_absent(&[(0, Some("n0".into()))], 0),
            "; rank 0 (on n0) has not started rankmesh"
        );
        assert_eq!(
            name_absent(&[(2, None), (5, Some("n1".into()))], 3),
            "; ranks 2, 5 (on n1) have not started rankmesh (3 ranks not asked in time)"
        );
        let many: Vec<_> = (0..20).map(|r| (r, None)).collect();
        assert!(name_absent(&many, 0).contains("15 and 4 more have not"));
        assert!(name_absent(&[], 0).contains("one is stuck in the same step"));
    }
}
