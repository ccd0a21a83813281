//! What rankmesh adds to nccl-tests' report (`--baseline`, `--stats`), as
//! tables of `#` lines after each group's rows. A line that does not start
//! with `#` is then exactly an nccl-tests row, so every parser of nccl-tests
//! output reads rankmesh's rows the same: last-column readers (`$(NF-1)` is
//! the in-place bus bandwidth), header-column readers (superbench takes the
//! columns of the first header with `time` and `busbw` after the last line
//! holding `out-of-place`), and the `# Avg bus bandwidth` grep. These tables
//! therefore never contain `out-of-place`, `in-place`, `algbw`,
//! `Out of bounds` or `Avg bus bandwidth`.

use super::format::{float_str, Cell, PerIter};
use super::Row;

/// Which tables a run prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// `--baseline`: the same data movement through the raw library.
    pub baseline: bool,
    /// `--stats`: per-iteration statistics.
    pub stats: bool,
    /// Device plane: the baseline is raw NCCL, not raw MPI.
    pub device: bool,
}

/// The `#` tables for one group's rows (empty when no extra was asked).
pub fn tables(rows: &[Row], extras: Extras) -> String {
    let mut out = String::new();
    if extras.baseline {
        out += &baseline_table(rows, extras.device);
    }
    if extras.stats {
        out += &stats_table(rows);
    }
    out
}

fn baseline_table(rows: &[Row], device: bool) -> String {
    let raw = if device { "raw NCCL" } else { "raw MPI" };
    let mut out = format!(
        "#\n# rankmesh --baseline: {raw} calls on the same buffers, against the first timing column above\n\
         # {:>10}  {:>7}  {:>6}  {:>8}  {:>9}  {:>6}  {:>7}\n# {:>10}  {:>7}  {:>6}  {:>8}  {:>9}  {:>6}  {:>7}\n",
        "size", "time", "busbw", "raw time", "raw busbw", "ratio", "+time",
        "(B)", "(us)", "(GB/s)", "(us)", "(GB/s)", "", "(us)"
    );
    for r in rows {
        out += &format!(
            "# {:>10}  {}  {}  {}\n",
            r.size,
            float_str(r.out_of_place.time_us, 7),
            float_str(r.out_of_place.busbw, 6),
            baseline_cells(&r.out_of_place, r.baseline.as_ref())
        );
    }
    out
}

/// Raw time, raw bus bandwidth, rankmesh/raw bus-bandwidth ratio (time
/// ratio when nothing moves between ranks), and the time rankmesh adds.
fn baseline_cells(mine: &Cell, raw: Option<&Cell>) -> String {
    match raw {
        Some(m) => format!(
            "{:>8}  {:>9}  {}  {}",
            float_str(m.time_us, 8),
            float_str(m.busbw, 9),
            float_str(ratio(mine, m), 6),
            float_str(mine.time_us - m.time_us, 7)
        ),
        None => format!("{:>8}  {:>9}  {:>6}  {:>7}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// rankmesh's bus bandwidth over the raw library's (time ratio when the
/// raw bus bandwidth is 0, as for one rank).
pub fn ratio(mine: &Cell, raw: &Cell) -> f64 {
    if raw.busbw > 0.0 {
        mine.busbw / raw.busbw
    } else if mine.time_us > 0.0 {
        raw.time_us / mine.time_us
    } else {
        0.0
    }
}

fn stats_table(rows: &[Row]) -> String {
    let names = ["i_min", "i_p50", "i_p99", "i_max", "i_cv%"];
    let units = ["(us)", "(us)", "(us)", "(us)", "(%)"];
    let cols = |v: &[&str]| -> String { v.iter().map(|c| format!("  {c:>7}")).collect() };
    let mut out = format!(
        "#\n# rankmesh --stats: per-iteration times, each iteration's slowest rank; first timing column, then second\n\
         # {:>10}{}{}\n# {:>10}{}{}\n",
        "size",
        cols(&names),
        cols(&names),
        "(B)",
        cols(&units),
        cols(&units)
    );
    for r in rows {
        out += &format!("# {:>10}", r.size);
        match &r.per_iter {
            Some(cols) => {
                for p in cols {
                    out += &stats_cells(p);
                }
            }
            None => out += &format!("{:>90}", "N/A"),
        }
        out += "\n";
    }
    out
}

fn stats_cells(p: &PerIter) -> String {
    let s = &p.stats;
    [s.min, s.p50, s.p99, s.max, p.cv_pct()]
        .iter()
        .map(|v| format!("  {}", float_str(*v, 7)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(time: f64, busbw: f64, raw: Option<(f64, f64)>) -> Row {
        let cell = |t, b| Cell {
            time_us: t,
            algbw: b,
            busbw: b,
            wrong: Some(0),
        };
        Row {
            group: "world".into(),
            size: 1024,
            count: 256,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: cell(time, busbw),
            in_place: cell(time, busbw),
            baseline: raw.map(|(t, b)| cell(t, b)),
            per_iter: Some([
                PerIter::of(vec![vec![1.0, 2.0, 3.0]]),
                PerIter::of(vec![vec![2.0, 2.0, 2.0]]),
            ]),
        }
    }

    #[test]
    fn tables_are_comment_lines_without_parser_keywords() {
        let rows = [row(2.0, 1.0, Some((1.0, 2.0))), row(4.0, 2.0, None)];
        let all = Extras {
            baseline: true,
            stats: true,
            device: false,
        };
        let t = tables(&rows, all);
        assert!(t.lines().all(|l| l.starts_with('#')), "{t}");
        for word in [
            "out-of-place",
            "in-place",
            "algbw",
            "Out of bounds",
            "Avg bus bandwidth",
        ] {
            assert!(!t.contains(word), "{word} in\n{t}");
        }
        let base: Vec<&str> = t.lines().filter(|l| l.contains(" 1024 ")).collect();
        assert_eq!(base.len(), 4, "{t}");
        // ratio 1/2 = 0.5 of bus bandwidth, +1 µs; no baseline prints N/A.
        assert!(
            base[0].contains("0.50") && base[0].contains("1.00"),
            "{}",
            base[0]
        );
        assert!(base[1].contains("N/A"));
        // Stats: min 1, p50 2, p99 3, max 3, then a flat column (cv 0).
        let fields: Vec<&str> = base[2].split_whitespace().collect();
        assert_eq!(
            fields[2..],
            ["1.00", "2.00", "3.00", "3.00", "40.82", "2.00", "2.00", "2.00", "2.00", "0.00"]
        );
        assert_eq!(tables(&rows, Extras::default()), "");
    }

    #[test]
    fn ratio_falls_back_to_time_without_bus_traffic() {
        let c = |t, b| Cell {
            time_us: t,
            algbw: 0.0,
            busbw: b,
            wrong: None,
        };
        assert_eq!(ratio(&c(2.0, 4.0), &c(1.0, 8.0)), 0.5);
        assert_eq!(ratio(&c(2.0, 0.0), &c(1.0, 0.0)), 0.5);
    }
}
