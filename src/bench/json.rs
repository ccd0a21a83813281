//! The `-J` report in nccl-tests' JSON (file version 3). It keeps nccl-tests'
//! keys, nesting (`devices` inside `config`) and meanings (an iteration's
//! per-iteration time is its slowest process's), and never overwrites a file
//! ([`create_report_file`]). rankmesh's additions sit under keys nccl-tests
//! does not use (`group`, `mpi_baseline`, `nccl_baseline` in a result;
//! `rankmesh` at the top). Unlike nccl-tests, `env` lists only the variables
//! that shape the run (NCCL_, RANKMESH_, OMPI_, SLURM_, PMIX_), never the
//! whole environment, which may hold secrets.

use super::extras::ratio;
use super::format::{Cell, PerIter as PerIterTimes};
use super::{BenchConfig, BenchReport, Row};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// JSON file version, as nccl-tests numbers it.
pub const VERSION: u32 = 3;

/// The whole document, keys in nccl-tests' order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Document {
    /// File version (3).
    pub version: u32,
    /// `YYYY-MM-DD HH:MM:SS` (UTC).
    pub start_time: String,
    /// Command line.
    pub args: Vec<String>,
    /// Relevant environment variables, `NAME=value`.
    pub env: Vec<String>,
    /// NCCL version (0: host plane).
    pub nccl_version: i32,
    /// Run parameters and devices.
    pub config: Config,
    /// One entry per row.
    pub results: Vec<Result>,
    /// Validation summary.
    pub out_of_bounds: OutOfBounds,
    /// Bandwidth summary.
    pub average_bus_bandwidth: AverageBusBandwidth,
    /// Error messages.
    pub errors: Vec<String>,
    /// End of the run.
    pub end_time: String,
    /// rankmesh specifics.
    pub rankmesh: Extension,
}

/// nccl-tests' `config` object; booleans are the strings `"true"`/`"false"`
/// as nccl-tests writes them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Config {
    pub nthreads: u32,
    pub ngpus: u32,
    pub minimum_bytes: usize,
    pub maximum_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub step_factor: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub step_bytes: Option<usize>,
    pub warmup_iters: usize,
    pub iterations: usize,
    pub aggregated_iterations: usize,
    pub validation: usize,
    pub graph: u32,
    pub blocking_collectives: String,
    pub per_iter_timing: String,
    pub per_iter_skip: u32,
    pub parallel_init: String,
    /// One entry per rank (where `analyze_perf_json.py` counts nodes).
    pub devices: Vec<Device>,
}

/// nccl-tests' device entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Device {
    pub rank: usize,
    pub group: usize,
    pub pid: u32,
    pub hostname: String,
    pub device: i32,
    pub device_hex: String,
    pub device_info: String,
}

/// One measurement as nccl-tests writes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Measurement {
    pub time: f64,
    pub alg_bw: f64,
    pub bus_bw: f64,
    pub nwrong: Option<f64>,
}

/// nccl-tests' `*_per_iter` object: statistics over each iteration's
/// slowest process, the per-iteration times, and (several processes) every
/// process's own times.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct PerIter {
    pub skipped_iterations: u32,
    pub min_us: f64,
    pub max_us: f64,
    pub avg_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub stdev_us: f64,
    pub cv_pct: f64,
    pub times_us: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub per_process_max_times_us: Option<Vec<Vec<f64>>>,
}

/// The raw-library comparison of one row.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Baseline {
    pub time: f64,
    pub bus_bw: f64,
    /// rankmesh bus bandwidth / raw bus bandwidth (time ratio without bus traffic).
    pub bw_ratio: f64,
    /// rankmesh time − raw time, µs.
    pub added_us: f64,
}

/// One result row, keys in nccl-tests' order, then rankmesh's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Result {
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    /// `%6i`-formatted, as nccl-tests stores it.
    pub root: String,
    pub out_of_place: Measurement,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub out_of_place_per_iter: Option<PerIter>,
    pub in_place: Measurement,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub in_place_per_iter: Option<PerIter>,
    /// Timed iterations (`-n`), as nccl-tests counts them.
    pub actual_iterations: usize,
    /// Empty, as nccl-tests' sweeps write it.
    pub experiment_name: String,
    /// rankmesh: the group that ran this row.
    pub group: String,
    /// rankmesh: the host plane's raw-MPI comparison.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mpi_baseline: Option<Baseline>,
    /// rankmesh: the device plane's raw-NCCL comparison.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub nccl_baseline: Option<Baseline>,
}

/// Validation summary.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct OutOfBounds {
    pub count: u64,
    pub okay: String,
}

/// Bandwidth summary (`okay` is `"unchecked"` without a minimum).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct AverageBusBandwidth {
    pub bandwidth: f64,
    pub okay: String,
}

/// rankmesh's own keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Extension {
    pub collective: String,
    pub backend: String,
    pub groups: Vec<(String, Vec<usize>)>,
}

fn measurement(c: &Cell) -> Measurement {
    Measurement {
        time: c.time_us,
        alg_bw: c.algbw,
        bus_bw: c.busbw,
        nwrong: c.wrong.map(|w| w as f64),
    }
}

fn per_iter(p: &PerIterTimes) -> PerIter {
    let s = &p.stats;
    PerIter {
        skipped_iterations: 0,
        min_us: s.min,
        max_us: s.max,
        avg_us: s.avg,
        p50_us: s.p50,
        p95_us: s.p95,
        p99_us: s.p99,
        stdev_us: s.stdev,
        cv_pct: p.cv_pct(),
        times_us: p.times_us.clone(),
        per_process_max_times_us: (p.per_process_us.len() > 1).then(|| p.per_process_us.clone()),
    }
}

fn result_row(r: &Row, cfg: &BenchConfig) -> Result {
    let baseline = r.baseline.as_ref().map(|b| Baseline {
        time: b.time_us,
        bus_bw: b.busbw,
        bw_ratio: ratio(&r.out_of_place, b),
        added_us: r.out_of_place.time_us - b.time_us,
    });
    Result {
        size: r.size,
        count: r.count,
        dtype: r.dtype.clone(),
        redop: r.redop.clone(),
        root: format!("{:6}", r.root),
        out_of_place: measurement(&r.out_of_place),
        out_of_place_per_iter: r.per_iter.as_ref().map(|p| per_iter(&p[0])),
        in_place: measurement(&r.in_place),
        in_place_per_iter: r.per_iter.as_ref().map(|p| per_iter(&p[1])),
        actual_iterations: cfg.iters,
        experiment_name: String::new(),
        group: r.group.clone(),
        mpi_baseline: baseline.clone().filter(|_| !cfg.device),
        nccl_baseline: baseline.filter(|_| cfg.device),
    }
}

/// Creates the report file without ever replacing one, as nccl-tests does:
/// `path` if it does not exist, else the first free `path.0`, `path.1`, ….
pub fn create_report_file(path: &Path) -> std::io::Result<(PathBuf, File)> {
    let mut candidate = path.to_path_buf();
    for n in 0u64.. {
        match File::options()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(f) => return Ok((candidate, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut name = path.as_os_str().to_owned();
                name.push(format!(".{n}"));
                candidate = PathBuf::from(name);
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("u64 names run out")
}

/// UTC `YYYY-MM-DD HH:MM:SS` for a Unix time (civil-from-days).
pub fn utc_string(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Builds the document for a finished run.
pub fn document(
    cfg: &BenchConfig,
    report: &BenchReport,
    start: u64,
    args: Vec<String>,
) -> Document {
    let relevant = ["NCCL_", "RANKMESH_", "OMPI_", "SLURM_", "PMIX_"];
    let mut env: Vec<String> = std::env::vars()
        .filter(|(k, _)| relevant.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let yes_no = |b: bool| if b { "true" } else { "false" }.to_string();
    Document {
        version: VERSION,
        start_time: utc_string(start),
        args,
        env,
        nccl_version: report.nccl_version,
        config: Config {
            nthreads: 1,
            ngpus: 1,
            minimum_bytes: cfg.min_bytes,
            maximum_bytes: cfg.max_bytes,
            step_factor: (cfg.step_factor > 1).then_some(cfg.step_factor),
            step_bytes: (cfg.step_factor <= 1).then_some(cfg.step_bytes),
            warmup_iters: cfg.warmup,
            iterations: cfg.iters,
            aggregated_iterations: cfg.agg,
            validation: cfg.check,
            graph: 0,
            blocking_collectives: yes_no(cfg.blocking > 0),
            per_iter_timing: yes_no(cfg.stats),
            per_iter_skip: 0,
            parallel_init: yes_no(false),
            devices: report.devices.clone(),
        },
        results: report.rows.iter().map(|r| result_row(r, cfg)).collect(),
        out_of_bounds: OutOfBounds {
            count: report.wrong_rows,
            okay: yes_no(report.wrong_rows == 0),
        },
        average_bus_bandwidth: AverageBusBandwidth {
            bandwidth: report.avg_busbw,
            okay: cfg.min_bw.map_or("unchecked".to_string(), |m| {
                yes_no(report.avg_busbw >= 0.9 * m)
            }),
        },
        errors: Vec::new(),
        end_time: utc_string(now_secs()),
        rankmesh: Extension {
            collective: cfg.op.name().to_string(),
            backend: if cfg.device { "nccl" } else { "host" }.to_string(),
            groups: report.groups.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_files_are_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("rankmesh-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        let names: Vec<PathBuf> = (0..3)
            .map(|_| create_report_file(&path).unwrap().0)
            .collect();
        assert_eq!(
            names,
            [path.clone(), dir.join("out.json.0"), dir.join("out.json.1")]
        );
        assert!(create_report_file(&dir.join("missing/x.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_string(0), "1970-01-01 00:00:00");
        assert_eq!(utc_string(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc_string(1_795_000_000), "2026-11-18 11:06:40");
    }
}
