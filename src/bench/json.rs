//! The `-J` report: nccl-tests' JSON keys (file version 3), plus rankmesh's
//! additions under keys nccl-tests does not use (`group`, `mpi_baseline`,
//! `rankmesh`). Unlike nccl-tests, `env` lists only the variables that shape
//! the run (NCCL_, RANKMESH_, OMPI_, SLURM_, PMIX_), never the whole
//! environment, which may hold secrets.

use super::format::{Cell, RankStats};
use super::{BenchConfig, BenchReport, Row};
use serde::{Deserialize, Serialize};

/// JSON file version, as nccl-tests numbers it.
pub const VERSION: u32 = 3;

/// The whole document.
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
    /// Run parameters.
    pub config: Config,
    /// One entry per rank.
    pub devices: Vec<Device>,
    /// One entry per row.
    pub results: Vec<Result>,
    /// Validation summary.
    pub out_of_bounds: OutOfBounds,
    /// Bandwidth summary.
    pub average_bus_bandwidth: AverageBusBandwidth,
    /// End of the run.
    pub end_time: String,
    /// Error messages.
    pub errors: Vec<String>,
    /// rankmesh specifics.
    pub rankmesh: Extension,
}

/// nccl-tests' `config` object.
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

/// Per-iteration statistics, nccl-tests' `*_per_iter` keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct PerIter {
    pub min_us: f64,
    pub max_us: f64,
    pub avg_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub stdev_us: f64,
    pub cv_pct: f64,
    /// rankmesh: smallest, largest and mean of the ranks' mean latencies.
    pub rank_min_avg_us: f64,
    pub rank_max_avg_us: f64,
    pub rank_avg_us: f64,
}

/// The raw-MPI comparison of one row.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct Baseline {
    pub time: f64,
    pub bus_bw: f64,
    /// rankmesh bus bandwidth / MPI bus bandwidth.
    pub bw_ratio: f64,
    /// rankmesh time − MPI time, µs.
    pub added_us: f64,
}

/// One result row.
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
    pub in_place: Measurement,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub out_of_place_per_iter: Option<PerIter>,
    pub actual_iterations: usize,
    pub experiment_name: String,
    pub group: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mpi_baseline: Option<Baseline>,
    /// The device plane's baseline (raw NCCL on the same communicator).
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

fn per_iter(r: &RankStats) -> PerIter {
    let s = &r.all;
    PerIter {
        rank_min_avg_us: r.rank_min,
        rank_max_avg_us: r.rank_max,
        rank_avg_us: r.rank_avg,
        min_us: s.min,
        max_us: s.max,
        avg_us: s.avg,
        p50_us: s.p50,
        p95_us: s.p95,
        p99_us: s.p99,
        stdev_us: s.stdev,
        cv_pct: if s.avg > 0.0 {
            s.stdev / s.avg * 100.0
        } else {
            0.0
        },
    }
}

fn result_row(r: &Row, cfg: &BenchConfig) -> Result {
    let baseline = r.baseline.as_ref().map(|b| Baseline {
        time: b.time_us,
        bus_bw: b.busbw,
        bw_ratio: if b.busbw > 0.0 {
            r.out_of_place.busbw / b.busbw
        } else {
            b.time_us / r.out_of_place.time_us
        },
        added_us: r.out_of_place.time_us - b.time_us,
    });
    Result {
        size: r.size,
        count: r.count,
        dtype: r.dtype.clone(),
        redop: r.redop.clone(),
        root: format!("{:6}", r.root),
        out_of_place: measurement(&r.out_of_place),
        in_place: measurement(&r.in_place),
        out_of_place_per_iter: r.stats.as_ref().map(per_iter),
        actual_iterations: cfg.iters * cfg.agg,
        experiment_name: cfg.op.program(),
        group: r.group.clone(),
        mpi_baseline: baseline.clone().filter(|_| !cfg.device),
        nccl_baseline: baseline.filter(|_| cfg.device),
    }
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
    devices: Vec<Device>,
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
        nccl_version: 0,
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
        },
        devices,
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
        end_time: utc_string(now_secs()),
        errors: Vec::new(),
        rankmesh: Extension {
            collective: cfg.op.name().to_string(),
            backend: "host".to_string(),
            groups: report.groups.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc_string(0), "1970-01-01 00:00:00");
        assert_eq!(utc_string(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc_string(1_795_000_000), "2026-11-18 11:06:40");
    }
}
