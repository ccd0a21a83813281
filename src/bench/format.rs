//! nccl-tests' text output, byte for byte: the same printf formats, widths and
//! number formatting (`getFloatStr`), so scripts that parse nccl-tests by
//! column position parse rankmesh too.

/// nccl-tests' `getFloatStr`: the widest of `%.2f`, `%.1f`, `%.0f` that fits
/// `width`, else `%.1e` (`%.0e` below width 7).
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = if width >= 7 {
        c_exp(value, 1)
    } else {
        c_exp(value, 0)
    };
    format!("{s:>width$}")
}

/// C's `%.<prec>e`: mantissa, `e`, sign, at least two exponent digits.
fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", exp.abs())
}

/// C's `%g` for the `#wrong` column (integers print as integers; large values
/// switch to exponent form with 6 significant digits).
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    let exp = value.abs().log10().floor() as i32;
    if (-4..6).contains(&exp) {
        let prec = (5 - exp).max(0) as usize;
        let s = format!("{value:.prec$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        };
        return s;
    }
    let s = c_exp(value, 5);
    let (mant, e) = s.split_once('e').unwrap_or((&s, ""));
    let mant = if mant.contains('.') {
        mant.trim_end_matches('0').trim_end_matches('.')
    } else {
        mant
    };
    format!("{mant}e{e}")
}

/// The preamble lines before the device list.
pub struct Preamble<'a> {
    /// Program name (`all_reduce_perf`).
    pub program: &'a str,
    /// Minimum bytes.
    pub min_bytes: usize,
    /// Maximum bytes.
    pub max_bytes: usize,
    /// Step factor (when > 1) or step bytes.
    pub step: (usize, bool),
    /// Warm-up iterations.
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Aggregated iterations.
    pub agg: usize,
    /// Validation (`-c`).
    pub check: usize,
    /// Blocking mode (`-z`).
    pub blocking: usize,
    /// NCCL library version, 0 when not loaded.
    pub nccl_version: i32,
}

/// `# nccl-tests version ...` through `# Using devices`.
pub fn preamble(p: &Preamble<'_>) -> String {
    let (step, factor) = p.step;
    let mut out = format!(
        "# nccl-tests version rankmesh-{} nccl-headers=0 nccl-library={}\n# Collective test starting: {}\n\
         # nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: 0\n",
        env!("CARGO_PKG_VERSION"),
        p.nccl_version,
        p.program,
        p.min_bytes,
        p.max_bytes,
        step,
        if factor { "factor" } else { "bytes" },
        p.warmup,
        p.iters,
        p.agg,
        p.check,
    );
    match p.blocking {
        0 => {}
        1 => out += "# Blocking Enabled: wait and barrier after each inner iteration (-m) \n",
        _ => out += "# Blocking Enabled: wait after each inner iteration (-m), no barrier \n",
    }
    out += "#\n# Using devices\n";
    out
}

/// One `#  Rank ...` device line.
pub fn device_line(
    rank: usize,
    group: usize,
    pid: u32,
    host: &str,
    device: i32,
    bus: &str,
    name: &str,
) -> String {
    format!("#  Rank {rank:2} Group {group:2} Pid {pid:6} on {host:>10} device {device:2} [{bus}] {name}\n")
}

/// Extra columns appended after nccl-tests' 13 (rankmesh extensions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// `--baseline mpi`: MPI time, MPI busbw, busbw ratio, added latency.
    pub baseline: bool,
    /// `--stats`: per-iteration min/max/avg/p50/p99 across ranks.
    pub stats: bool,
    /// Device plane: the baseline is raw NCCL, not raw MPI.
    pub device: bool,
}

/// The two header lines (plus the leading `#`), with extension columns.
pub fn header(extras: Extras) -> String {
    let mut top = format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ", "", "", "", "", "");
    let mut names = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    );
    let mut units = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    if extras.baseline {
        top += if extras.device {
            "   raw NCCL (out-of-place)        "
        } else {
            "   raw MPI (out-of-place)         "
        };
        names += &format!(
            " {:>7}  {:>6}  {:>6}  {:>7}",
            "time", "busbw", "ratio", "+time"
        );
        units += &format!(" {:>7}  {:>6}  {:>6}  {:>7}", "(us)", "(GB/s)", "", "(us)");
    }
    if extras.stats {
        top += "   rank means, then all iterations (out-of-place)";
        names += &format!(
            " {:>7}  {:>7}  {:>7}  {:>7}  {:>7}",
            "min", "max", "avg", "p50", "p99"
        );
        units += &format!(
            " {:>7}  {:>7}  {:>7}  {:>7}  {:>7}",
            "(us)", "(us)", "(us)", "(us)", "(us)"
        );
    }
    format!("#\n{top}\n{names}\n{units}\n")
}

/// One measurement: time per iteration, bandwidths and wrong elements (`None`
/// when validation is off: printed `N/A`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cell {
    /// Microseconds per iteration.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
    /// Wrong elements over all ranks.
    pub wrong: Option<u64>,
}

/// `%12li  %12li  %8s  %6s  %6s` — size, count, type, redop, root.
pub fn row_start(size: usize, count: usize, dtype: &str, redop: &str, root: i64) -> String {
    format!("{size:12}  {count:12}  {dtype:>8}  {redop:>6}  {root:6}")
}

/// `  %7s  %6s  %6s  %6g` (or `   N/A`) for one of out-of-place / in-place.
pub fn cell(c: &Cell) -> String {
    let wrong = match c.wrong {
        Some(w) => format!("  {:>6}", c_g(w as f64)),
        None => "    N/A".to_string(),
    };
    format!(
        "  {}  {}  {}{wrong}",
        float_str(c.time_us, 7),
        float_str(c.algbw, 6),
        float_str(c.busbw, 6)
    )
}

/// Baseline extension columns: MPI time, MPI busbw, rankmesh/MPI busbw, added µs.
pub fn baseline_cells(mine: &Cell, mpi: Option<&Cell>) -> String {
    match mpi {
        Some(m) => {
            let ratio = if m.busbw > 0.0 {
                mine.busbw / m.busbw
            } else {
                mine.time_us.recip() * m.time_us
            };
            format!(
                "  {}  {}  {}  {}",
                float_str(m.time_us, 7),
                float_str(m.busbw, 6),
                float_str(ratio, 6),
                float_str(mine.time_us - m.time_us, 7)
            )
        }
        None => format!("  {:>7}  {:>6}  {:>6}  {:>7}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// `--stats` extension columns, OSU/IMB style: the fastest, slowest and mean
/// of the ranks' mean latencies, then p50 and p99 over every iteration of
/// every rank.
pub fn stats_cells(s: &RankStats) -> String {
    [s.rank_min, s.rank_max, s.rank_avg, s.all.p50, s.all.p99]
        .iter()
        .map(|v| format!("  {}", float_str(*v, 7)))
        .collect()
}

/// Latency statistics of one measurement across ranks (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankStats {
    /// Smallest per-rank mean.
    pub rank_min: f64,
    /// Largest per-rank mean.
    pub rank_max: f64,
    /// Mean of the per-rank means.
    pub rank_avg: f64,
    /// Statistics over every iteration of every rank.
    pub all: IterStats,
}

impl RankStats {
    /// From each rank's per-iteration samples.
    pub fn of(per_rank: &[Vec<f64>]) -> RankStats {
        let means: Vec<f64> = per_rank
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.iter().sum::<f64>() / s.len() as f64)
            .collect();
        if means.is_empty() {
            return RankStats::default();
        }
        RankStats {
            rank_min: means.iter().copied().fold(f64::INFINITY, f64::min),
            rank_max: means.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            rank_avg: means.iter().sum::<f64>() / means.len() as f64,
            all: IterStats::of(&per_rank.concat()),
        }
    }
}

/// Per-iteration statistics in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IterStats {
    /// Fastest iteration.
    pub min: f64,
    /// Slowest iteration.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Median (nccl-tests: element n/2 of the sorted samples).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation.
    pub stdev: f64,
}

impl IterStats {
    /// nccl-tests' `computeIterStats` over samples (µs).
    pub fn of(samples: &[f64]) -> IterStats {
        if samples.is_empty() {
            return IterStats::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let pct = |p: usize| s[(n * p).div_ceil(100).saturating_sub(1).min(n - 1)];
        let avg = s.iter().sum::<f64>() / n as f64;
        let stdev = (s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64).sqrt();
        IterStats {
            min: s[0],
            max: s[n - 1],
            avg,
            p50: s[n / 2],
            p95: pct(95),
            p99: pct(99),
            stdev,
        }
    }
}

/// The footer: out-of-bounds count, average bus bandwidth (checked against
/// `min_bw` like nccl-tests: FAILED below 90% of it), and the closing lines.
pub fn footer(wrong_rows: u64, avg_busbw: f64, min_bw: Option<f64>, program: &str) -> String {
    let verdict = |ok: bool| if ok { "OK" } else { "FAILED" };
    let bw_verdict = min_bw.map_or("", |m| verdict(avg_busbw >= m * 0.9));
    format!(
        "# {:<20} : {} {}\n# {:<20} : {} {}\n#\n# Collective test concluded: {program}\n#\n\n",
        "Out of bounds values",
        wrong_rows,
        verdict(wrong_rows == 0),
        "Avg bus bandwidth",
        c_g(avg_busbw),
        bw_verdict
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected strings are what glibc's printf gives for nccl-tests' formats.
    #[test]
    fn float_str_matches_get_float_str() {
        assert_eq!(float_str(12.3456, 7), "  12.35");
        assert_eq!(float_str(1234.5, 7), "1234.50");
        assert_eq!(float_str(12345.67, 7), "12345.7");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(123.456, 6), "123.46");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(float_str(123456.0, 6), "123456");
        assert_eq!(float_str(1234567.0, 6), " 1e+06");
        assert_eq!(float_str(0.004, 6), "  0.00");
    }

    #[test]
    fn c_g_matches_printf_g() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(3.0), "3");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(21.9438), "21.9438");
        assert_eq!(c_g(0.5), "0.5");
        assert_eq!(c_g(100000.0), "100000");
        assert_eq!(c_g(0.000123), "0.000123");
    }

    #[test]
    fn header_lines_are_nccl_tests_lines() {
        let h = header(Extras::default());
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines[0], "#");
        assert_eq!(lines[1], "#                                                              out-of-place                       in-place          ");
        assert_eq!(lines[2], "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ");
        assert_eq!(lines[3], "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ");
    }

    #[test]
    fn rows_are_nccl_tests_rows() {
        let c = Cell {
            time_us: 23.45,
            algbw: 0.35,
            busbw: 0.61,
            wrong: Some(0),
        };
        let row = format!(
            "{}{}{}",
            row_start(8192, 2048, "float", "sum", -1),
            cell(&c),
            cell(&c)
        );
        assert_eq!(row, "        8192          2048     float     sum      -1    23.45    0.35    0.61       0    23.45    0.35    0.61       0");
        let n = Cell { wrong: None, ..c };
        assert!(cell(&n).ends_with("    N/A"));
        assert_eq!(
            row_start(1, 1, "bfloat16", "none", 0),
            "           1             1  bfloat16    none       0"
        );
    }

    #[test]
    fn footer_is_nccl_tests_footer() {
        assert_eq!(
            footer(0, 1.23456, None, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.23456 \n#\n# Collective test concluded: all_reduce_perf\n#\n\n"
        );
        assert!(footer(2, 5.0, Some(10.0), "x")
            .contains(": 2 FAILED\n# Avg bus bandwidth    : 5 FAILED\n"));
        assert!(footer(0, 9.5, Some(10.0), "x").contains("Avg bus bandwidth    : 9.5 OK"));
    }

    #[test]
    fn preamble_and_device_lines() {
        let p = preamble(&Preamble {
            program: "all_reduce_perf",
            min_bytes: 8,
            max_bytes: 128,
            step: (2, true),
            warmup: 5,
            iters: 20,
            agg: 1,
            check: 1,
            blocking: 0,
            nccl_version: 0,
        });
        assert!(p.contains("# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"));
        assert!(p.ends_with("#\n# Using devices\n"));
        assert_eq!(
            device_line(3, 0, 4242, "vm", -1, "0000:00:00", "host (MPI)"),
            "#  Rank  3 Group  0 Pid   4242 on         vm device -1 [0000:00:00] host (MPI)\n"
        );
    }

    #[test]
    fn stats_follow_nccl_tests_percentiles() {
        let s = IterStats::of(&(1..=100).map(f64::from).collect::<Vec<_>>());
        assert_eq!(
            (s.min, s.max, s.p50, s.p95, s.p99),
            (1.0, 100.0, 51.0, 95.0, 99.0)
        );
        assert!((s.avg - 50.5).abs() < 1e-12);
        let r = RankStats::of(&[vec![1.0, 3.0], vec![10.0, 10.0], vec![]]);
        assert_eq!((r.rank_min, r.rank_max, r.rank_avg), (2.0, 10.0, 6.0));
        assert_eq!((r.all.min, r.all.max), (1.0, 10.0));
    }
}
