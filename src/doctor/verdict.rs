//! Judging a doctor run: whatever is below `threshold` × the median of its
//! kind is flagged, with its numbers. A node whose links are all slow is
//! named as the node (its median link is what falls), not as each of its
//! links; a slow link between two healthy nodes is named as the link.

use super::{Measurements, PairResult};
use serde::{Deserialize, Serialize};

/// One flagged finding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// `node`, `link`, `rank` or `node all_reduce`.
    pub kind: String,
    /// What is flagged (`node 3 (host)`, `node 0 <-> node 2`, `rank 5`).
    pub subject: String,
    /// Its bandwidth, GB/s.
    pub value: f64,
    /// The median it is compared with, GB/s.
    pub median: f64,
}

impl Finding {
    /// One line for the report.
    pub fn line(&self) -> String {
        format!(
            "{} {}: {:.3} GB/s is {:.2} of the median {:.3} GB/s",
            self.kind,
            self.subject,
            self.value,
            if self.median > 0.0 {
                self.value / self.median
            } else {
                0.0
            },
            self.median
        )
    }
}

/// The median (mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Each member's median over the pairs it is part of.
fn member_medians(pairs: &[PairResult], members: &[usize]) -> Vec<(usize, f64)> {
    members
        .iter()
        .filter_map(|&m| {
            let mine: Vec<f64> = pairs
                .iter()
                .filter(|p| p.a == m || p.b == m)
                .map(|p| p.bandwidth_gbs)
                .collect();
            median(&mine).map(|v| (m, v))
        })
        .collect()
}

/// Everything below `threshold` of its median.
pub fn judge(m: &Measurements, threshold: f64) -> Vec<Finding> {
    let mut out = Vec::new();
    let host = |n: usize| {
        m.nodes
            .iter()
            .find(|x| x.node == n)
            .map_or(String::new(), |x| x.host.clone())
    };
    let below = |v: f64, med: f64| v < threshold * med;

    // Between nodes: nodes first (needs 3 nodes to tell which end is slow),
    // then links whose two ends are both healthy.
    let links: Vec<f64> = m.inter_node.iter().map(|p| p.bandwidth_gbs).collect();
    let mut slow_nodes = Vec::new();
    if let Some(med) = median(&links) {
        if m.nodes.len() >= 3 {
            let nodes: Vec<usize> = m.nodes.iter().map(|n| n.node).collect();
            for (n, v) in member_medians(&m.inter_node, &nodes) {
                if below(v, med) {
                    slow_nodes.push(n);
                    out.push(Finding {
                        kind: "node".into(),
                        subject: format!("{n} ({})", host(n)),
                        value: v,
                        median: med,
                    });
                }
            }
        }
        for p in &m.inter_node {
            if below(p.bandwidth_gbs, med)
                && !slow_nodes.contains(&p.a)
                && !slow_nodes.contains(&p.b)
            {
                out.push(Finding {
                    kind: "link".into(),
                    subject: format!(
                        "node {} ({}) <-> node {} ({})",
                        p.a,
                        host(p.a),
                        p.b,
                        host(p.b)
                    ),
                    value: p.bandwidth_gbs,
                    median: med,
                });
            }
        }
    }

    // Within nodes: each node's all_reduce against the others', then ranks
    // against every intra-node pair.
    let busbw: Vec<(usize, f64)> = m
        .nodes
        .iter()
        .filter_map(|n| n.all_reduce_busbw.map(|b| (n.node, b)))
        .collect();
    if busbw.len() >= 2 {
        let med = median(&busbw.iter().map(|x| x.1).collect::<Vec<_>>()).unwrap_or(0.0);
        for (n, v) in busbw {
            if below(v, med) {
                out.push(Finding {
                    kind: "node all_reduce".into(),
                    subject: format!("{n} ({})", host(n)),
                    value: v,
                    median: med,
                });
            }
        }
    }
    let intra: Vec<f64> = m.intra_node.iter().map(|p| p.bandwidth_gbs).collect();
    if let Some(med) = median(&intra) {
        let ranks: Vec<usize> = m.nodes.iter().flat_map(|n| n.ranks.clone()).collect();
        for (r, v) in member_medians(&m.intra_node, &ranks) {
            if below(v, med) {
                out.push(Finding {
                    kind: "rank".into(),
                    subject: r.to_string(),
                    value: v,
                    median: med,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::NodeResult;
    use super::*;

    fn link(a: usize, b: usize, bw: f64) -> PairResult {
        PairResult {
            a,
            b,
            latency_us: 10.0,
            bandwidth_gbs: bw,
        }
    }

    fn nodes(n: usize) -> Vec<NodeResult> {
        (0..n)
            .map(|i| NodeResult {
                node: i,
                host: format!("h{i}"),
                ranks: vec![i],
                all_reduce_busbw: None,
            })
            .collect()
    }

    fn run(inter: Vec<PairResult>, n: usize) -> Measurements {
        Measurements {
            bytes: 1,
            reps: 1,
            reach: vec![],
            nodes: nodes(n),
            intra_node: vec![],
            inter_node: inter,
            seconds: 0.0,
        }
    }

    #[test]
    fn a_slow_node_is_named_once_not_as_its_links() {
        let m = run(
            vec![
                link(0, 1, 1.0),
                link(0, 2, 1.1),
                link(0, 3, 0.01),
                link(1, 2, 0.9),
                link(1, 3, 0.01),
                link(2, 3, 0.02),
            ],
            4,
        );
        let f = judge(&m, 0.8);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].subject.as_str()),
            ("node", "3 (h3)")
        );
        assert!(f[0].line().contains("0.010 GB/s"));
    }

    #[test]
    fn a_slow_link_between_healthy_nodes_is_the_link() {
        let mut links = vec![];
        for a in 0..4 {
            for b in a + 1..4 {
                links.push(link(a, b, if (a, b) == (1, 2) { 0.1 } else { 1.0 }));
            }
        }
        let f = judge(&run(links, 4), 0.8);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, "link");
        assert!(f[0].subject.starts_with("node 1 (h1) <-> node 2 (h2)"));
    }

    #[test]
    fn a_healthy_run_flags_nothing_and_slow_ranks_are_named() {
        let even = run(vec![link(0, 1, 1.0), link(0, 2, 0.9), link(1, 2, 1.05)], 3);
        assert!(judge(&even, 0.8).is_empty());
        let mut m = run(vec![], 1);
        m.nodes[0].ranks = vec![0, 1, 2, 3];
        m.intra_node = vec![
            link(0, 1, 5.0),
            link(2, 3, 0.5),
            link(0, 2, 5.0),
            link(1, 3, 0.5),
            link(0, 3, 0.5),
            link(1, 2, 5.0),
        ];
        let f = judge(&m, 0.8);
        let ranks: Vec<&str> = f.iter().map(|x| x.subject.as_str()).collect();
        assert_eq!(ranks, ["3"], "{f:?}");
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
