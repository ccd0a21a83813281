//! `rankmesh plot`: bus bandwidth and time against message size, log axes,
//! one line per run (JSON files from `rankmesh bench -J`, or nccl-tests' own
//! JSON), as a standalone SVG.

use crate::error::{Error, Result};

/// One run to draw: a label and (size B, bus GB/s, time µs) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points sorted by size.
    pub points: Vec<(f64, f64, f64)>,
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
    let mut points: Vec<(f64, f64, f64)> = results
        .iter()
        .filter_map(|r| {
            let oop = &r["out_of_place"];
            Some((
                r["size"].as_f64()?,
                oop["bus_bw"].as_f64()?,
                oop["time"].as_f64().or_else(|| oop["cpu_time"].as_f64())?,
            ))
        })
        .filter(|(s, _, _)| *s > 0.0)
        .collect();
    if points.is_empty() {
        return Err(bad("no results with a size above 0".into()));
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(Series {
        label: label.to_string(),
        points,
    })
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn human_bytes(b: f64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{}{}", (v * 100.0).round() / 100.0, units[u])
}

/// A panel: `y` picks the value, log10 on both axes.
fn panel(
    out: &mut String,
    series: &[Series],
    y: fn(&(f64, f64, f64)) -> f64,
    title: &str,
    top: f64,
) {
    let (left, width, height) = (80.0, 640.0, 260.0);
    let all: Vec<&(f64, f64, f64)> = series.iter().flat_map(|s| &s.points).collect();
    let positive = |v: f64| v.max(1e-9);
    let xs = all.iter().map(|p| positive(p.0).log10());
    let ys = all.iter().map(|p| positive(y(p)).log10());
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = ys.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let px = |v: f64| left + (positive(v).log10() - x0) / (x1 - x0) * width;
    let py = |v: f64| top + height - (positive(v).log10() - y0) / (y1 - y0) * height;
    *out += &format!(
        "<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        left + width / 2.0,
        top - 12.0,
        escape(title)
    );
    *out += &format!("<rect x=\"{left}\" y=\"{top}\" width=\"{width}\" height=\"{height}\" fill=\"none\" stroke=\"#333\"/>\n");
    for e in x0 as i32..=x1 as i32 {
        let x = left + (f64::from(e) - x0) / (x1 - x0) * width;
        *out += &format!(
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#ddd\"/>\n",
            top + height
        );
        *out += &format!(
            "<text x=\"{x:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
            top + height + 16.0,
            human_bytes(10f64.powi(e))
        );
    }
    for e in y0 as i32..=y1 as i32 {
        let yv = top + height - (f64::from(e) - y0) / (y1 - y0) * height;
        *out += &format!(
            "<line x1=\"{left}\" y1=\"{yv:.1}\" x2=\"{}\" y2=\"{yv:.1}\" stroke=\"#ddd\"/>\n",
            left + width
        );
        *out += &format!(
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">1e{e}</text>\n",
            left - 6.0,
            yv + 4.0
        );
    }
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(y(p))))
            .collect();
        let color = COLORS[i % COLORS.len()];
        *out += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            pts.join(" ")
        );
    }
}

/// The SVG document for `series`.
pub fn svg(series: &[Series]) -> String {
    let legend_h = 22.0 * series.len() as f64;
    let total_h = 40.0 + 300.0 * 2.0 + 30.0 + legend_h;
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{total_h}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    panel(
        &mut out,
        series,
        |p| p.1,
        "Bus bandwidth (GB/s) vs message size",
        40.0,
    );
    panel(
        &mut out,
        series,
        |p| p.2,
        "Time per call (us) vs message size",
        340.0,
    );
    let base = 40.0 + 600.0 + 20.0;
    for (i, s) in series.iter().enumerate() {
        let y = base + 22.0 * i as f64;
        let color = COLORS[i % COLORS.len()];
        out += &format!("<line x1=\"90\" y1=\"{y}\" x2=\"120\" y2=\"{y}\" stroke=\"{color}\" stroke-width=\"3\"/>\n");
        out += &format!(
            "<text x=\"128\" y=\"{}\" font-size=\"13\">{}</text>\n",
            y + 4.0,
            escape(&s.label)
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
}
