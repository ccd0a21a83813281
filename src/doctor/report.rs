//! A doctor run for people (table), for scripts (JSON) and at a glance (an
//! SVG heatmap of the node-to-node bandwidth matrix).

use super::verdict::{median, Cleared, Finding, Judgement, Task};
use super::{Measurements, Outcome};
use crate::bench::plot::escape;
use serde::Serialize;

/// The `-J` document.
#[derive(Serialize)]
pub struct Document<'a> {
    /// Everything measured in the concurrent rounds.
    pub measurements: &'a Measurements,
    /// Fraction of the reference below which something is flagged.
    pub threshold: f64,
    /// What was confirmed alone.
    pub findings: &'a [Finding],
    /// Suspects of the rounds that measured healthy alone.
    pub cleared: &'a [Cleared],
    /// Every measurement retaken alone, with its figure (GB/s).
    pub retakes: &'a [(Task, f64)],
    /// Wall time of the retakes, seconds.
    pub retake_seconds: f64,
    /// `OK` or `FAILED`.
    pub verdict: &'static str,
}

impl<'a> Document<'a> {
    /// The document of `o`, judged at `threshold`.
    pub fn new(o: &'a Outcome, threshold: f64) -> Self {
        let j = &o.judgement;
        Document {
            measurements: &o.measurements,
            threshold,
            findings: &j.findings,
            cleared: &j.cleared,
            retakes: &j.retakes,
            retake_seconds: j.seconds,
            verdict: verdict(&j.findings),
        }
    }
}

/// `OK` when nothing was flagged.
pub fn verdict(findings: &[Finding]) -> &'static str {
    if findings.is_empty() {
        "OK"
    } else {
        "FAILED"
    }
}

/// The readable report.
pub fn table(o: &Outcome, threshold: f64) -> String {
    let (m, j) = (&o.measurements, &o.judgement);
    let ranks: usize = m.nodes.iter().map(|n| n.ranks.len()).sum();
    let mut out = format!(
        "rankmesh doctor: {ranks} ranks on {} nodes; {} B messages, best of {}; flagged below {threshold:.2} of the reference, confirmed alone ({:.1} s, {:.1} s of it alone)\n",
        m.nodes.len(),
        m.bytes,
        m.reps,
        m.seconds + j.seconds,
        j.seconds
    );
    match m
        .reach
        .iter()
        .max_by(|a, b| a.latency_us.total_cmp(&b.latency_us))
    {
        Some(w) => {
            out += &format!(
                "reach: every rank answered every other; slowest small exchange {:.1} us (ranks {} and {})\n",
                w.latency_us, w.a, w.b
            )
        }
        None => out += "reach: one rank, nothing to reach\n",
    }
    out += &within_nodes(m);
    out += &devices(m);
    out += &between_nodes(m);
    out += &alone(j, threshold);
    out += &format!("\nverdict: {}\n", verdict(&j.findings));
    for f in &j.findings {
        out += &format!("  {}\n", f.line());
    }
    out
}

/// The within-node table: each node's all_reduce and slowest pair, and
/// the nodes whose ranks outnumber their CPUs.
fn within_nodes(m: &super::Measurements) -> String {
    let mut out = String::new();
    out += "\nwithin nodes\n";
    out += &format!(
        "  {:>4}  {:<20}  {:>5}  {:>17}  {:>18}\n",
        "node", "host", "ranks", "all_reduce (GB/s)", "slowest pair (GB/s)"
    );
    for n in &m.nodes {
        let slowest = m
            .intra_node
            .iter()
            .filter(|p| n.ranks.contains(&p.a))
            .map(|p| p.bandwidth_gbs)
            .fold(f64::INFINITY, f64::min);
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        out += &format!(
            "  {:>4}  {:<20}  {:>5}  {:>17}  {:>18}\n",
            n.node,
            n.host,
            n.ranks.len(),
            num(n.all_reduce_busbw),
            num(slowest.is_finite().then_some(slowest))
        );
    }
    for n in m.nodes.iter().filter(|n| n.ranks_share_cpus) {
        out += &format!(
            "  node {} ({}): its ranks outnumber their CPUs; ranks not judged by their pairs\n",
            n.node, n.host
        );
    }
    out
}

/// The between-node matrices (bandwidth, small-message time) of the
/// leader ranks; nothing on one node.
fn between_nodes(m: &super::Measurements) -> String {
    let mut out = String::new();
    if m.nodes.len() > 1 {
        for (title, pick) in [
            (
                "between nodes: bandwidth per direction (GB/s), leader ranks",
                (|p: &super::PairResult| format!("{:.3}", p.bandwidth_gbs))
                    as fn(&super::PairResult) -> String,
            ),
            ("between nodes: small-message exchange (us)", |p| {
                format!("{:.1}", p.latency_us)
            }),
        ] {
            out += &format!("\n{title}\n  {:>6}", "");
            for n in &m.nodes {
                out += &format!("  {:>8}", format!("node{}", n.node));
            }
            out += "\n";
            for a in &m.nodes {
                out += &format!("  {:>6}", format!("node{}", a.node));
                for b in &m.nodes {
                    let cell = link(m, a.node, b.node).map_or("-".to_string(), pick);
                    out += &format!("  {cell:>8}");
                }
                out += "\n";
            }
        }
    }
    out
}

/// The GPU stack per node: devices, NCCL library, device all_reduce; one
/// line where no rank has a GPU.
fn devices(m: &Measurements) -> String {
    let Some(first) = m.devices.first() else {
        return String::new();
    };
    let nccl = |d: &super::DeviceFacts| match &d.nccl {
        Ok((path, v)) => format!("NCCL {v} ({path})"),
        Err(_) => "no NCCL".to_string(),
    };
    if m.devices
        .iter()
        .all(|d| !d.gpus.as_ref().is_ok_and(|n| *n > 0))
    {
        let why = match &first.gpus {
            Ok(_) => "it sees 0 CUDA devices".to_string(),
            Err(e) => e.clone(),
        };
        return format!(
            "\ndevices: no GPU on any rank (rank {}: {why}); {}\n",
            first.rank,
            nccl(first)
        );
    }
    let mut out = format!(
        "\ndevices\n  {:>4}  {:<20}  {:>4}  {:<44}  {:>24}\n",
        "node", "host", "gpus", "nccl", "device all_reduce (GB/s)"
    );
    for n in &m.nodes {
        let mine: Vec<&super::DeviceFacts> =
            m.devices.iter().filter(|d| d.node == n.node).collect();
        let gpus = mine
            .iter()
            .filter_map(|d| d.gpus.as_ref().ok())
            .max()
            .map_or("-".to_string(), |g| g.to_string());
        let mut libs: Vec<String> = mine.iter().map(|d| nccl(d)).collect();
        libs.dedup();
        let figure = match (&n.device_busbw, &n.device_error) {
            (Some(b), _) => format!("{b:.3}"),
            (None, Some(e)) => format!("failed: {e}"),
            (None, None) => "-".to_string(),
        };
        out += &format!(
            "  {:>4}  {:<20}  {:>4}  {:<44}  {:>24}\n",
            n.node,
            n.host,
            gpus,
            libs.join(", "),
            figure
        );
    }
    out
}

/// What the retakes found: how many, how long, and each suspect cleared.
fn alone(j: &Judgement, threshold: f64) -> String {
    let suspects = j.suspects;
    if suspects == 0 {
        return format!(
            "\nalone: nothing below {threshold:.2} of its median in the rounds, nothing retaken\n"
        );
    }
    let mut out = format!(
        "\nalone: {suspects} suspect(s) from the rounds measured again with every other rank idle ({} retakes, {} pass(es), {:.2} s)\n",
        j.retakes.len(),
        j.passes,
        j.seconds
    );
    for c in &j.cleared {
        out += &format!(
            "  cleared {} {}: {:.3} GB/s in the rounds, {:.3} alone, reference {:.3}\n",
            c.kind, c.subject, c.concurrent, c.alone, c.median
        );
    }
    out
}

fn link(m: &Measurements, a: usize, b: usize) -> Option<&super::PairResult> {
    let (a, b) = (a.min(b), a.max(b));
    m.inter_node.iter().find(|p| p.a == a && p.b == b)
}

/// The node-to-node bandwidth matrix of the rounds as an SVG heatmap: each
/// cell's text is the GB/s, its colour red for a link of a confirmed finding
/// (a slow node's or a slow link), else shading from amber at the threshold
/// to green at the median link.
pub fn heatmap(m: &Measurements, findings: &[Finding], threshold: f64) -> String {
    let n = m.nodes.len();
    let cell = 64.0;
    let (left, top) = (150.0, 70.0);
    let width = (left + cell * n as f64 + 30.0).max(480.0);
    let height = top + cell * n as f64 + 60.0;
    let med = median(
        &m.inter_node
            .iter()
            .map(|p| p.bandwidth_gbs)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(0.0);
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"28\" font-size=\"15\" text-anchor=\"middle\">Node-to-node bandwidth (GB/s per direction)</text>\n",
        width / 2.0
    );
    for (i, node) in m.nodes.iter().enumerate() {
        let label = escape(&format!("node{} {}", node.node, node.host));
        let y = top + cell * i as f64 + cell / 2.0 + 4.0;
        out += &format!(
            "<text x=\"{}\" y=\"{y}\" font-size=\"11\" text-anchor=\"end\">{label}</text>\n",
            left - 8.0
        );
        let x = left + cell * i as f64 + cell / 2.0;
        out += &format!(
            "<text x=\"{x}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">node{}</text>\n",
            top - 8.0,
            node.node
        );
    }
    for (i, a) in m.nodes.iter().enumerate() {
        for (j, b) in m.nodes.iter().enumerate() {
            let (x, y) = (left + cell * j as f64, top + cell * i as f64);
            let (fill, text) = match link(m, a.node, b.node) {
                Some(p) if med > 0.0 => (
                    if findings.iter().any(|f| f.of.covers_link(p.a, p.b)) {
                        RED.to_string()
                    } else {
                        colour(p.bandwidth_gbs / med, threshold)
                    },
                    format!("{:.2}", p.bandwidth_gbs),
                ),
                _ => ("#eeeeee".to_string(), "-".to_string()),
            };
            out += &format!("<rect x=\"{x}\" y=\"{y}\" width=\"{cell}\" height=\"{cell}\" fill=\"{fill}\" stroke=\"white\"/>\n");
            out += &format!(
                "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{text}</text>\n",
                x + cell / 2.0,
                y + cell / 2.0 + 4.0
            );
        }
    }
    out += &format!(
        "<text x=\"20\" y=\"{}\" font-size=\"11\">red: a slow node's or link's, confirmed alone (below {threshold:.2} of the reference); median link {med:.3} GB/s</text>\n\
         <text x=\"20\" y=\"{}\" font-size=\"11\">green: at or above the median</text>\n</svg>\n",
        top + cell * n as f64 + 24.0,
        top + cell * n as f64 + 40.0
    );
    out
}

/// A confirmed finding's cells.
const RED: &str = "#e06666";

/// Amber at or below the threshold, shading to green at the median and above.
fn colour(fraction: f64, threshold: f64) -> String {
    let t = ((fraction - threshold) / (1.0 - threshold).max(1e-9)).clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(255.0, 147.0),
        mix(229.0, 196.0),
        mix(153.0, 125.0)
    )
}

#[cfg(test)]
mod tests {
    use super::super::verdict::Subject;
    use super::super::{NodeResult, PairResult};
    use super::*;

    #[test]
    fn table_and_heatmap_show_every_link() {
        let m = Measurements {
            bytes: 1024,
            reps: 3,
            reach: vec![PairResult {
                a: 0,
                b: 1,
                latency_us: 12.5,
                bandwidth_gbs: 0.0,
            }],
            nodes: (0..2)
                .map(|i| NodeResult {
                    node: i,
                    host: format!("h<{i}>"),
                    ranks: vec![i],
                    all_reduce_busbw: None,
                    device_busbw: None,
                    device_error: None,
                    ranks_share_cpus: false,
                })
                .collect(),
            intra_node: vec![],
            inter_node: vec![PairResult {
                a: 0,
                b: 1,
                latency_us: 20.0,
                bandwidth_gbs: 1.5,
            }],
            devices: (0..2)
                .map(|i| super::super::DeviceFacts {
                    rank: i,
                    node: i,
                    nccl: Err("NCCL not found".into()),
                    gpus: Err("no CUDA driver".into()),
                })
                .collect(),
            seconds: 0.5,
        };
        let o = Outcome {
            measurements: m,
            judgement: Judgement::default(),
        };
        let t = table(&o, 0.8);
        assert!(t.contains("2 ranks on 2 nodes"), "{t}");
        assert!(t.contains("slowest small exchange 12.5 us (ranks 0 and 1)"));
        assert_eq!(t.matches("1.500").count(), 2, "symmetric matrix: {t}");
        assert!(t.contains("verdict: OK"));
        assert!(t.contains("alone: nothing below 0.80 of its median in the rounds"));
        assert!(
            t.contains("devices: no GPU on any rank (rank 0: no CUDA driver); no NCCL"),
            "{t}"
        );
        let m = &o.measurements;
        let svg = heatmap(m, &[], 0.8);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(
            doc.descendants().filter(|n| n.has_tag_name("rect")).count(),
            5
        );
        assert!(svg.contains("h&lt;0&gt;"));
        assert_eq!(
            colour(0.5, 0.8),
            "#ffe599",
            "low in the rounds alone: amber"
        );
        let slow = Finding {
            of: Subject::Node(1),
            kind: "node".into(),
            subject: "1 (h1)".into(),
            value: 0.1,
            concurrent: 0.1,
            median: 1.5,
            reference: String::new(),
            note: None,
        };
        let svg = heatmap(m, &[slow], 0.8);
        assert_eq!(svg.matches(RED).count(), 2, "node 1's link, both ways");
        assert_eq!(colour(1.0, 0.8), "#93c47d");
    }
}
