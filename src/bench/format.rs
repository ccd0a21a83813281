//! nccl-tests' text output, byte for byte: the same printf formats, widths
//! and number formatting (`getFloatStr`). Scripts that parse nccl-tests by
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

/// C's `%g` (precision 6), as nccl-tests prints `#wrong` and the footer's
/// average: the exponent is taken after rounding to six significant digits,
/// so 999999.5 prints `1e+06` and 9.999996e-5 prints `0.0001`, as glibc does.
/// Rust's exact formatting rounds like glibc (ties to even on the exact
/// binary value).
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let rounded = format!("{value:.5e}");
    let exp: i32 = rounded
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..6).contains(&exp) {
        let prec = (5 - exp) as usize;
        return strip(&format!("{value:.prec$}"));
    }
    let (mant, _) = rounded.split_once('e').unwrap_or((&rounded, ""));
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{}e{sign}{:02}", strip(mant), exp.abs())
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
        2 => out += "# Blocking Enabled: wait after each inner iteration (-m), no barrier \n",
        _ => out += "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n",
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

/// The two header lines (plus the leading `#`), exactly nccl-tests'.
pub fn header() -> String {
    let top = format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ", "", "", "", "", "");
    let names = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    );
    let units = format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
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

/// nccl-tests' per-iteration report of one timing column: an iteration's
/// time is its slowest process's time, and the statistics are over those
/// (nccl-tests: "i_* uses max over process rows").
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PerIter {
    /// Each iteration's slowest process (µs).
    pub times_us: Vec<f64>,
    /// Every process's own per-iteration times (µs), in rank order.
    pub per_process_us: Vec<Vec<f64>>,
    /// Statistics over `times_us`.
    pub stats: IterStats,
}

impl PerIter {
    /// From each rank's per-iteration samples (µs), in rank order.
    pub fn of(per_rank: Vec<Vec<f64>>) -> PerIter {
        let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
        let times_us: Vec<f64> = (0..n)
            .map(|i| {
                per_rank
                    .iter()
                    .map(|r| r[i])
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect();
        PerIter {
            stats: IterStats::of(&times_us),
            times_us,
            per_process_us: per_rank,
        }
    }

    /// Coefficient of variation, percent (0 when the mean is 0).
    pub fn cv_pct(&self) -> f64 {
        if self.stats.avg > 0.0 {
            self.stats.stdev / self.stats.avg * 100.0
        } else {
            0.0
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
        let h = header();
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
        // Each iteration counts its slowest process, not a pool of all.
        let p = PerIter::of(vec![vec![1.0, 9.0, 2.0], vec![3.0, 1.0, 2.5]]);
        assert_eq!(p.times_us, [3.0, 9.0, 2.5]);
        assert_eq!((p.stats.min, p.stats.max, p.stats.p50), (2.5, 9.0, 3.0));
        assert_eq!(p.per_process_us.len(), 2);
    }

    #[test]
    fn c_g_rounds_before_choosing_the_form() {
        // glibc: printf("%g") of these doubles.
        for (v, want) in [
            (9.999995e-5, "0.0001"),
            (9.9999951e-5, "0.0001"),
            (0.000099999, "9.9999e-05"),
            (999999.5, "1e+06"),
            (999999.4, "999999"),
            (123456.5, "123456"),
            (1e-5, "1e-05"),
            (2.5e-5, "2.5e-05"),
            (1e6, "1e+06"),
            (1e-4, "0.0001"),
            (-0.5, "-0.5"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(c_g(v), want, "{v:e}");
        }
    }

    #[test]
    fn blocking_lines_match_each_mode() {
        let line = |z| {
            preamble(&Preamble {
                program: "p",
                min_bytes: 8,
                max_bytes: 8,
                step: (2, true),
                warmup: 1,
                iters: 1,
                agg: 1,
                check: 1,
                blocking: z,
                nccl_version: 0,
            })
            .lines()
            .find(|l| l.starts_with("# Blocking"))
            .map(str::to_string)
        };
        assert_eq!(line(0), None);
        assert!(line(1)
            .unwrap()
            .contains("wait and barrier after each inner iteration (-m)"));
        assert!(line(2).unwrap().contains("no barrier"));
        assert!(line(3)
            .unwrap()
            .contains("after each outer iteration (-n); time excludes barrier"));
    }
}
