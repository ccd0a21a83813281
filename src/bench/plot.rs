//! `rankmesh plot`: bus bandwidth and time against message size, log axes,
//! one line per run (JSON files from `rankmesh bench -J`, or nccl-tests' own
//! JSON), as a standalone SVG.

use crate::error::{Error, Result};

/// One run to draw: a label, (size B, bus GB/s, time µs) points, and the
/// raw-library baseline of the same run when it has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points sorted by size.
    pub points: Vec<(f64, f64, f64)>,
    /// `--baseline` points (same sizes), drawn dashed.
    pub baseline: Vec<(f64, f64, f64)>,
    /// What the baseline is (`raw MPI`, `raw NCCL`).
    pub baseline_name: &'static str,
}

/// Reads the out-of-place results of a `-J` document (rankmesh or nccl-tests).
pub fn series_from_json(label: &str, text: &str) -> Result<Series> {
    let bad = |m: String| Error::Usage {
        what: "plot",
        group: label.to_string(),
        msg: m,
    };
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let results = doc["results"]
        .as_array()
        .ok_or_else(|| bad("no \"results\" list".into()))?;
    let point = |r: &serde_json::Value, m: &serde_json::Value| {
        Some((
            r["size"].as_f64()?,
            m["bus_bw"].as_f64()?,
            m["time"].as_f64().or_else(|| m["cpu_time"].as_f64())?,
        ))
    };
    let collect = |key: &str| {
        let mut v: Vec<(f64, f64, f64)> = results
            .iter()
            .filter_map(|r| point(r, &r[key]))
            .filter(|(s, _, _)| *s > 0.0)
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let points = collect("out_of_place");
    if points.is_empty() {
        return Err(bad("no results with a size above 0".into()));
    }
    let (baseline, baseline_name) = match collect("mpi_baseline") {
        b if !b.is_empty() => (b, "raw MPI"),
        _ => (collect("nccl_baseline"), "raw NCCL"),
    };
    Ok(Series {
        label: label.to_string(),
        points,
        baseline,
        baseline_name,
    })
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Text made safe for SVG (XML) content and attributes.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A power of two as nccl-tests users write sizes: 512, 1K, 64K, 16M, 2G.
pub fn size_label(exp2: i32) -> String {
    let units = ["", "K", "M", "G", "T", "P"];
    let e = exp2.max(0);
    let unit = (e / 10).min(units.len() as i32 - 1);
    format!("{}{}", 1u64 << (e - unit * 10), units[unit as usize])
}

/// A value tick as a plain number (0.01, 0.5, 10, 2000); exponent form only
/// outside 1e-4..1e7.
pub fn value_label(v: f64) -> String {
    if v != 0.0 && !(1e-4..1e7).contains(&v.abs()) {
        return format!("{v:e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Size ticks: powers of two, every `step`-th exponent, at most 11 of them.
fn size_ticks(lo: i32, hi: i32) -> Vec<i32> {
    let step = [1, 2, 4, 5, 10, 20]
        .into_iter()
        .find(|s| (hi.div_euclid(*s) - (lo + s - 1).div_euclid(*s)) < 11)
        .unwrap_or(30);
    (lo..=hi).filter(|e| e.rem_euclid(step) == 0).collect()
}

/// Value ticks on a log10 axis: every decade, plus 2 and 5 when the axis
/// spans at most two decades.
fn value_ticks(lo: i32, hi: i32) -> Vec<f64> {
    let mut t = Vec::new();
    for e in lo..=hi {
        let d = 10f64.powi(e);
        t.push(d);
        if hi - lo <= 2 && e < hi {
            t.extend([2.0 * d, 5.0 * d]);
        }
    }
    t
}

const LEFT: f64 = 90.0;
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 260.0;
/// Title above a panel, tick labels and axis caption below it: the next
/// panel starts this far below the previous one's top.
const PANEL_PITCH: f64 = HEIGHT + 95.0;

/// The panel's axes over every point of `series` (baselines too): whole
/// log2 sizes across, whole log10 values of `y` up, each at least one wide.
fn axes(series: &[Series], y: fn(&(f64, f64, f64)) -> f64) -> ((f64, f64), (f64, f64)) {
    let positive = |v: f64| v.max(1e-9);
    let all: Vec<&(f64, f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().chain(&s.baseline))
        .collect();
    let span = |f: &dyn Fn(&(f64, f64, f64)) -> f64| {
        let (lo, hi) = all
            .iter()
            .map(|p| f(p))
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
        (lo.floor(), hi.ceil().max(lo.floor() + 1.0))
    };
    (
        span(&|p| positive(p.0).log2()),
        span(&|p| positive(y(p)).log10()),
    )
}

/// A panel: `y` picks the value; log2 sizes across, log10 values up.
fn panel(
    out: &mut String,
    series: &[Series],
    y: fn(&(f64, f64, f64)) -> f64,
    title: &str,
    unit: &str,
    top: f64,
) {
    let positive = |v: f64| v.max(1e-9);
    let ((x0, x1), (y0, y1)) = axes(series, y);
    let px = |v: f64| LEFT + (positive(v).log2() - x0) / (x1 - x0) * WIDTH;
    let py = |v: f64| top + HEIGHT - (positive(v).log10() - y0) / (y1 - y0) * HEIGHT;
    *out += &format!(
        "<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        LEFT + WIDTH / 2.0,
        top - 10.0,
        escape(title)
    );
    *out += &format!("<rect x=\"{LEFT}\" y=\"{top}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"none\" stroke=\"#333\"/>\n");
    for e in size_ticks(x0 as i32, x1 as i32) {
        let x = px(2f64.powi(e));
        *out += &format!(
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#ddd\"/>\n",
            top + HEIGHT
        );
        *out += &format!(
            "<text x=\"{x:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
            top + HEIGHT + 16.0,
            size_label(e)
        );
    }
    *out += &format!(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">message size (bytes)</text>\n",
        LEFT + WIDTH / 2.0,
        top + HEIGHT + 34.0
    );
    for v in value_ticks(y0 as i32, y1 as i32) {
        let yv = py(v);
        let decade = (v.log10() - v.log10().round()).abs() < 1e-9;
        let stroke = if decade { "#ccc" } else { "#eee" };
        *out += &format!(
            "<line x1=\"{LEFT}\" y1=\"{yv:.1}\" x2=\"{}\" y2=\"{yv:.1}\" stroke=\"{stroke}\"/>\n",
            LEFT + WIDTH
        );
        *out += &format!(
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
            LEFT - 6.0,
            yv + 4.0,
            value_label(v)
        );
    }
    let mid = top + HEIGHT / 2.0;
    *out += &format!(
        "<text x=\"22\" y=\"{mid}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 22 {mid})\">{}</text>\n",
        escape(unit)
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for (points, dash) in [(&s.points, ""), (&s.baseline, " stroke-dasharray=\"6 4\"")] {
            if points.is_empty() {
                continue;
            }
            let pts: Vec<String> = points
                .iter()
                .map(|p| format!("{:.1},{:.1}", px(p.0), py(y(p))))
                .collect();
            *out += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
                pts.join(" ")
            );
        }
    }
}

/// The SVG document for `series`.
pub fn svg(series: &[Series]) -> String {
    let entries: Vec<(usize, String, bool)> = series
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let base = (!s.baseline.is_empty())
                .then(|| (i, format!("{} ({})", s.label, s.baseline_name), true));
            std::iter::once((i, s.label.clone(), false)).chain(base)
        })
        .collect();
    let first_top = 40.0;
    let legend_top = first_top + 2.0 * PANEL_PITCH;
    let total_h = legend_top + 22.0 * entries.len() as f64 + 10.0;
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{total_h}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    panel(
        &mut out,
        series,
        |p| p.1,
        "Bus bandwidth vs message size",
        "bus bandwidth (GB/s)",
        first_top,
    );
    panel(
        &mut out,
        series,
        |p| p.2,
        "Time per call vs message size",
        "time per call (us)",
        first_top + PANEL_PITCH,
    );
    for (k, (i, label, dashed)) in entries.iter().enumerate() {
        let y = legend_top + 22.0 * k as f64;
        let color = COLORS[i % COLORS.len()];
        let dash = if *dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        out += &format!("<line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{color}\" stroke-width=\"3\"{dash}/>\n", LEFT + 30.0);
        out += &format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n",
            LEFT + 38.0,
            y + 4.0,
            escape(label)
        );
    }
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_results_and_draws_one_line_per_run() {
        let doc = r#"{"results":[{"size":1024,"out_of_place":{"time":5.0,"bus_bw":0.2}},{"size":8,"out_of_place":{"time":1.0,"bus_bw":0.01}}]}"#;
        let s = series_from_json("a<b", doc).unwrap();
        assert_eq!(s.points, vec![(8.0, 0.01, 1.0), (1024.0, 0.2, 5.0)]);
        assert!(s.baseline.is_empty());
        let svg = svg(&[
            s.clone(),
            Series {
                label: "b".into(),
                ..s
            },
        ]);
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("a&lt;b"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(series_from_json("x", "{}").is_err());
        assert!(series_from_json("x", "not json")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
    }

    #[test]
    fn baselines_are_dashed_and_named() {
        let doc = r#"{"results":[{"size":64,"out_of_place":{"time":2.0,"bus_bw":0.1},"mpi_baseline":{"time":1.0,"bus_bw":0.2}}]}"#;
        let s = series_from_json("run", doc).unwrap();
        assert_eq!(s.baseline, vec![(64.0, 0.2, 1.0)]);
        let svg = svg(&[s]);
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            3,
            "2 panels + legend"
        );
        assert!(svg.contains(">run (raw MPI)</text>"));
    }

    #[test]
    fn ticks_read_as_people_write_sizes_and_values() {
        let labels: Vec<String> = size_ticks(3, 29).into_iter().map(size_label).collect();
        assert_eq!(labels, ["16", "256", "4K", "64K", "1M", "16M", "256M"]);
        let labels: Vec<String> = size_ticks(10, 24).into_iter().map(size_label).collect();
        assert_eq!(
            labels,
            ["1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M"]
        );
        assert_eq!(size_label(0), "1");
        assert_eq!(size_label(31), "2G");
        let v: Vec<String> = value_ticks(-1, 1).into_iter().map(value_label).collect();
        assert_eq!(v, ["0.1", "0.2", "0.5", "1", "2", "5", "10"]);
        let v: Vec<String> = value_ticks(-2, 3).into_iter().map(value_label).collect();
        assert_eq!(v, ["0.01", "0.1", "1", "10", "100", "1000"]);
        assert_eq!(value_label(1e-6), "1e-6");
    }
}
