//! Judging a doctor run in two stages.
//!
//! 1. **Suspects.** Whatever is below `threshold` × the median of its kind
//!    in the concurrent rounds. A node whose links are all slow is one
//!    suspect (its median link falls below the median of the links it does
//!    not touch), not each of its links; a slow link between two healthy
//!    nodes is the link (held to the links between healthy nodes).
//! 2. **Confirmed alone.** Each suspect is measured again with every other
//!    rank idle ([`plan`] lists the measurements: the suspect's own, and a
//!    few of its comparable healthy peers' as the reference), so two pairs
//!    sharing the cores of a busy node never look like a slow link. Only a
//!    suspect still below `threshold` × the median of the reference taken
//!    alone becomes a [`Finding`] ([`confirm`]), with both figures.

use super::{Measurements, NodeResult, PairResult};
use serde::{Deserialize, Serialize};

/// At most this many suspects are measured alone (the lowest first); the
/// rest are reported as found in the rounds. Keeps the extra time bounded.
pub const MAX_SUSPECTS: usize = 16;
/// Seconds a retake's timed repetitions may take, judged by the rounds'
/// figure: a link at 50 Mbit/s would otherwise take seconds per pass
/// (docs/BENCHMARKS.md, "Tuned constants").
pub const RETAKE_BUDGET_S: f64 = 0.25;
/// Most passes over a suspect still low alone.
pub const PASSES: usize = 3;
/// Retakes of a suspect node's or rank's links (with healthy peers).
const PER_SUSPECT: usize = 3;
/// Healthy measurements of each kind retaken alone as the reference.
const REFERENCES: usize = 6;

/// What a suspect or finding is about (node indices and world ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Subject {
    /// A node, judged by its links to the other nodes.
    Node(usize),
    /// The link between two nodes.
    Link(usize, usize),
    /// A node's all_reduce over its own ranks.
    NodeAllReduce(usize),
    /// A node's device all_reduce (NCCL) over its own ranks.
    NodeDeviceAllReduce(usize),
    /// A node whose NCCL library differs from the job's or is missing.
    Library(usize),
    /// A rank, judged by its pairs within its node.
    Rank(usize),
}

impl Subject {
    /// Whether the link between nodes `a` and `b` is part of it.
    pub fn covers_link(&self, a: usize, b: usize) -> bool {
        match *self {
            Subject::Node(n) => n == a || n == b,
            Subject::Link(x, y) => (x, y) == (a.min(b), a.max(b)),
            _ => false,
        }
    }

    /// `node`, `link`, `node all_reduce` or `rank`.
    pub fn kind(&self) -> &'static str {
        match self {
            Subject::Node(_) => "node",
            Subject::Link(..) => "link",
            Subject::NodeAllReduce(_) => "node all_reduce",
            Subject::NodeDeviceAllReduce(_) => "node device all_reduce",
            Subject::Library(_) => "nccl",
            Subject::Rank(_) => "rank",
        }
    }

    /// What is compared with what: links between nodes, node all_reduces,
    /// pairs within nodes.
    fn scope(&self) -> Scope {
        match self {
            Subject::Node(_) | Subject::Link(..) => Scope::Between,
            Subject::NodeAllReduce(_) => Scope::AllReduce,
            Subject::NodeDeviceAllReduce(_) | Subject::Library(_) => Scope::Device,
            Subject::Rank(_) => Scope::Within,
        }
    }

    /// `3 (host)`, `node 0 (h0) <-> node 2 (h2)`, `5`.
    fn name(&self, m: &Measurements) -> String {
        let host = |n: usize| {
            m.nodes
                .iter()
                .find(|x| x.node == n)
                .map_or(String::new(), |x| x.host.clone())
        };
        match *self {
            Subject::Node(n)
            | Subject::NodeAllReduce(n)
            | Subject::NodeDeviceAllReduce(n)
            | Subject::Library(n) => format!("{n} ({})", host(n)),
            Subject::Link(a, b) => format!("node {a} ({}) <-> node {b} ({})", host(a), host(b)),
            Subject::Rank(r) => r.to_string(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Between,
    AllReduce,
    Device,
    Within,
}

const SCOPES: [Scope; 4] = [
    Scope::Between,
    Scope::AllReduce,
    Scope::Device,
    Scope::Within,
];

impl Scope {
    fn unit(self) -> &'static str {
        match self {
            Scope::Between => "links",
            Scope::AllReduce => "node all_reduces",
            Scope::Device => "node device all_reduces",
            Scope::Within => "pairs",
        }
    }
}

/// A figure each node has of its own (an all_reduce over its ranks, on the
/// host or the device), with its subject and its retake.
#[derive(Clone, Copy)]
struct NodeWide {
    figure: fn(&NodeResult) -> Option<f64>,
    subject: fn(usize) -> Subject,
    task: fn(usize) -> Task,
}

impl NodeWide {
    const HOST: NodeWide = NodeWide {
        figure: |n| n.all_reduce_busbw,
        subject: Subject::NodeAllReduce,
        task: Task::AllReduce,
    };
    const DEVICE: NodeWide = NodeWide {
        figure: |n| n.device_busbw,
        subject: Subject::NodeDeviceAllReduce,
        task: Task::DeviceAllReduce,
    };
}

/// Below the threshold in the concurrent rounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspect {
    /// What.
    pub subject: Subject,
    /// Its figure in the rounds, GB/s.
    pub concurrent: f64,
    /// The median of its kind in the rounds, GB/s.
    pub median: f64,
}

/// One measurement retaken alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Task {
    /// Two world ranks exchange messages (a link's node leaders, or a pair
    /// within a node).
    Pair(usize, usize),
    /// A node's ranks run their all_reduce.
    AllReduce(usize),
    /// A node's ranks run their device all_reduce.
    DeviceAllReduce(usize),
}

/// What [`confirm`] needs: the tasks every rank runs in turn, which of them
/// measure each suspect, and which measure each scope's reference.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Run one at a time, in this order, every other rank idle.
    pub tasks: Vec<Task>,
    /// Timed repetitions of each task (as many warm-ups before them): five
    /// times the run's own, fewer where the rounds' figure says that many
    /// would take longer than [`RETAKE_BUDGET_S`].
    pub reps: Vec<usize>,
    /// Suspects measured alone, each with its tasks.
    suspects: Vec<(Suspect, Vec<usize>)>,
    /// Suspects over [`MAX_SUSPECTS`], judged by the rounds alone.
    unmeasured: Vec<Suspect>,
    /// The reference tasks of each scope (in `SCOPES` order).
    references: [Vec<usize>; 4],
}

/// One confirmed finding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// What it is about.
    pub of: Subject,
    /// `node`, `link`, `rank` or `node all_reduce`.
    pub kind: String,
    /// What is flagged (`3 (host)`, `node 0 (h0) <-> node 2 (h2)`, `5`).
    pub subject: String,
    /// Its figure measured alone, GB/s (the rounds' where not retaken).
    pub value: f64,
    /// Its figure in the concurrent rounds, GB/s.
    pub concurrent: f64,
    /// The reference it is judged against, GB/s.
    pub median: f64,
    /// What the reference is (`median of 6 links alone, 2.10-2.51 GB/s`).
    pub reference: String,
    /// What is wrong, for a finding that is not a figure (a library).
    pub note: Option<String>,
}

impl Finding {
    /// A finding that is not a figure: what is wrong with `subject`.
    fn noted(subject: Subject, m: &Measurements, note: String) -> Finding {
        Finding {
            of: subject,
            kind: subject.kind().into(),
            subject: subject.name(m),
            value: 0.0,
            concurrent: 0.0,
            median: 0.0,
            reference: String::new(),
            note: Some(note),
        }
    }

    /// One line for the report.
    pub fn line(&self) -> String {
        if let Some(note) = &self.note {
            return format!("{} {}: {note}", self.kind, self.subject);
        }
        format!(
            "{} {}: {:.3} GB/s alone ({:.3} in the rounds) is {:.2} of the reference {:.3} GB/s ({})",
            self.kind,
            self.subject,
            self.value,
            self.concurrent,
            ratio(self.value, self.median),
            self.median,
            self.reference
        )
    }
}

/// A suspect measured alone and found healthy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cleared {
    /// `node`, `link`, `rank` or `node all_reduce`.
    pub kind: String,
    /// What was suspected.
    pub subject: String,
    /// Its figure in the concurrent rounds, GB/s.
    pub concurrent: f64,
    /// Its figure measured alone, GB/s.
    pub alone: f64,
    /// The reference, GB/s.
    pub median: f64,
}

/// Everything judged: the findings and the suspects the retakes cleared.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Confirmed shortfalls.
    pub findings: Vec<Finding>,
    /// Suspects that measured healthy alone.
    pub cleared: Vec<Cleared>,
    /// Every retake: the task and its figure, GB/s.
    pub retakes: Vec<(Task, f64)>,
    /// Suspects from the rounds (measured alone or not).
    pub suspects: usize,
    /// Passes over the retakes (a suspect still low is measured again,
    /// up to [`PASSES`]).
    pub passes: usize,
    /// Wall time of the retakes, seconds.
    pub seconds: f64,
}

fn ratio(v: f64, of: f64) -> f64 {
    if of > 0.0 {
        v / of
    } else {
        0.0
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

/// Everything below `threshold` of its median in the concurrent rounds.
pub fn suspects(m: &Measurements, threshold: f64) -> Vec<Suspect> {
    let mut out = Vec::new();
    let mut flag = |subject, concurrent: f64, median: f64| {
        let low = concurrent < threshold * median;
        if low {
            out.push(Suspect {
                subject,
                concurrent,
                median,
            });
        }
        low
    };
    slow_between_nodes(m, &mut flag);
    slow_node_wide(m, &mut flag);
    slow_ranks(m, &mut flag);
    out
}

/// Flags `subject` when its figure is low against the median it is held
/// to; says whether it did.
type Flag<'a> = dyn FnMut(Subject, f64, f64) -> bool + 'a;

/// Between nodes: nodes first (needs 3 nodes to tell which end is slow),
/// then links whose two ends are both healthy. Each is held to the links it
/// does not touch: a slow node's links are a third or more of all of them
/// (half, on 4 nodes), and against a median they pull down, a node at 0.7
/// of its peers' rate passed while one of its links was blamed.
fn slow_between_nodes(m: &Measurements, flag: &mut Flag<'_>) {
    let links_without = |out: &dyn Fn(&PairResult) -> bool| {
        let rest: Vec<f64> = m
            .inter_node
            .iter()
            .filter(|p| !out(p))
            .map(|p| p.bandwidth_gbs)
            .collect();
        median(&rest)
    };
    let Some(med) = links_without(&|_| false) else {
        return;
    };
    let mut slow_nodes = Vec::new();
    if m.nodes.len() >= 3 {
        let nodes: Vec<usize> = m.nodes.iter().map(|n| n.node).collect();
        for (n, v) in member_medians(&m.inter_node, &nodes) {
            let others = links_without(&|p| p.a == n || p.b == n).unwrap_or(med);
            if flag(Subject::Node(n), v, others) {
                slow_nodes.push(n);
            }
        }
    }
    let touches_slow = |p: &PairResult| slow_nodes.contains(&p.a) || slow_nodes.contains(&p.b);
    let healthy = links_without(&touches_slow).unwrap_or(med);
    for p in m.inter_node.iter().filter(|p| !touches_slow(p)) {
        flag(Subject::Link(p.a, p.b), p.bandwidth_gbs, healthy);
    }
}

/// Within nodes: each node's all_reduce (host, and device where it has
/// GPUs) against the other nodes'.
fn slow_node_wide(m: &Measurements, flag: &mut Flag<'_>) {
    for kind in [NodeWide::HOST, NodeWide::DEVICE] {
        let busbw: Vec<(usize, f64)> = m
            .nodes
            .iter()
            .filter_map(|n| (kind.figure)(n).map(|b| (n.node, b)))
            .collect();
        if busbw.len() >= 2 {
            let med = median(&busbw.iter().map(|x| x.1).collect::<Vec<_>>()).unwrap_or(0.0);
            for (n, v) in busbw {
                flag((kind.subject)(n), v, med);
            }
        }
    }
}

/// Ranks against every intra-node pair. Ranks whose node has fewer CPUs
/// than ranks are not judged: there a pair's figure depends on whether the
/// scheduler ran its two ranks on one CPU or two (3 healthy ranks on 2
/// CPUs: pairs at 7, 11 and 20 GB/s in one run, and a rank's retakes alone
/// at 0.67 of another pair's).
fn slow_ranks(m: &Measurements, flag: &mut Flag<'_>) {
    let ranks: Vec<usize> = m
        .nodes
        .iter()
        .filter(|n| !n.ranks_share_cpus)
        .flat_map(|n| n.ranks.clone())
        .collect();
    let pairs: Vec<PairResult> = m
        .intra_node
        .iter()
        .filter(|p| ranks.contains(&p.a))
        .cloned()
        .collect();
    let intra: Vec<f64> = pairs.iter().map(|p| p.bandwidth_gbs).collect();
    if let Some(med) = median(&intra) {
        for (r, v) in member_medians(&pairs, &ranks) {
            flag(Subject::Rank(r), v, med);
        }
    }
}

/// The world rank that measures node `n`'s links (its lowest).
fn leader(m: &Measurements, n: usize) -> Option<usize> {
    m.nodes
        .iter()
        .find(|x| x.node == n)
        .and_then(|x| x.ranks.first().copied())
}

/// `want` items spread evenly over `items` (all of them when fewer).
fn spread<T: Copy>(items: &[T], want: usize) -> Vec<T> {
    if items.len() <= want {
        return items.to_vec();
    }
    (0..want).map(|i| items[i * items.len() / want]).collect()
}

/// A scope's reference pairs: up to [`REFERENCES`] of its `healthy` ones,
/// or, where every one is suspect (three ranks and one slow pair make two
/// rank suspects), its fastest in the rounds. Either way they are retaken
/// alone, as the suspects are: the rounds' own median, timed under other
/// load, once judged two healthy ranks of a noisy node slow.
fn reference_pairs<'a>(healthy: &[&'a PairResult], all: &'a [PairResult]) -> Vec<&'a PairResult> {
    if !healthy.is_empty() {
        return spread(healthy, REFERENCES);
    }
    let mut by_speed: Vec<&PairResult> = all.iter().collect();
    by_speed.sort_by(|x, y| y.bandwidth_gbs.total_cmp(&x.bandwidth_gbs));
    by_speed.truncate(REFERENCES);
    by_speed
}

/// `member`'s pairs in `pairs` with peers that are `healthy`, the fastest
/// in the rounds first, at most [`PER_SUSPECT`] of them: a suspect's retakes.
fn best_peers(
    pairs: &[PairResult],
    member: usize,
    healthy: impl Fn(usize) -> bool,
) -> impl Iterator<Item = &PairResult> {
    let mut peers: Vec<&PairResult> = pairs
        .iter()
        .filter(|l| (l.a == member || l.b == member) && healthy(l.a + l.b - member))
        .collect();
    peers.sort_by(|x, y| y.bandwidth_gbs.total_cmp(&x.bandwidth_gbs));
    peers.into_iter().take(PER_SUSPECT)
}

/// The retakes that confirm or clear `suspects`: for a node or rank, up to
/// three of its pairs with healthy peers; for a link or a node all_reduce,
/// itself; per kind, up to six healthy measurements as the reference.
pub fn plan(m: &Measurements, mut suspects: Vec<Suspect>) -> Plan {
    let mut p = Plan::default();
    suspects
        .sort_by(|a, b| ratio(a.concurrent, a.median).total_cmp(&ratio(b.concurrent, b.median)));
    let unmeasured = suspects.split_off(suspects.len().min(MAX_SUSPECTS));
    let suspect_node = |n: usize| suspects.iter().any(|s| s.subject == Subject::Node(n));
    let suspect_rank = |r: usize| suspects.iter().any(|s| s.subject == Subject::Rank(r));
    let task = |p: &mut Plan, t: Task| -> usize {
        p.tasks.iter().position(|x| *x == t).unwrap_or_else(|| {
            p.tasks.push(t);
            p.tasks.len() - 1
        })
    };
    let leaders = |a: usize, b: usize| Some(Task::Pair(leader(m, a)?, leader(m, b)?));
    // The healthy pairs of each scope, the lowest-bandwidth peers last so a
    // suspect's retakes go to its best peers.
    let healthy_links: Vec<&PairResult> = m
        .inter_node
        .iter()
        .filter(|l| !suspect_node(l.a) && !suspect_node(l.b))
        .filter(|l| {
            !suspects
                .iter()
                .any(|s| s.subject == Subject::Link(l.a, l.b))
        })
        .collect();
    let healthy_pairs: Vec<&PairResult> = m
        .intra_node
        .iter()
        .filter(|l| !suspect_rank(l.a) && !suspect_rank(l.b))
        .collect();
    for s in &suspects {
        let tasks: Vec<Task> = match s.subject {
            Subject::Link(a, b) => leaders(a, b).into_iter().collect(),
            Subject::NodeAllReduce(n) => vec![Task::AllReduce(n)],
            Subject::NodeDeviceAllReduce(n) | Subject::Library(n) => {
                vec![Task::DeviceAllReduce(n)]
            }
            Subject::Node(n) => best_peers(&m.inter_node, n, |x| !suspect_node(x))
                .filter_map(|l| leaders(l.a, l.b))
                .collect(),
            Subject::Rank(r) => best_peers(&m.intra_node, r, |x| !suspect_rank(x))
                .map(|l| Task::Pair(l.a, l.b))
                .collect(),
        };
        let ids = tasks.into_iter().map(|t| task(&mut p, t)).collect();
        p.suspects.push((s.clone(), ids));
    }
    for (i, scope) in SCOPES.iter().enumerate() {
        if !suspects.iter().any(|s| s.subject.scope() == *scope) {
            continue;
        }
        let refs: Vec<Task> = match scope {
            Scope::Between => reference_pairs(&healthy_links, &m.inter_node)
                .iter()
                .filter_map(|l| leaders(l.a, l.b))
                .collect(),
            Scope::AllReduce => node_wide_references(m, NodeWide::HOST, &suspects),
            Scope::Device => node_wide_references(m, NodeWide::DEVICE, &suspects),
            Scope::Within => reference_pairs(&healthy_pairs, &m.intra_node)
                .iter()
                .map(|l| Task::Pair(l.a, l.b))
                .collect(),
        };
        p.references[i] = refs.into_iter().map(|t| task(&mut p, t)).collect();
    }
    p.unmeasured = unmeasured;
    p.reps = p.tasks.iter().map(|t| retake_reps(m, t)).collect();
    p
}

/// The reference retakes of a node-wide figure: up to six nodes that have
/// it and are not suspected of it, spread over the nodes.
fn node_wide_references(m: &Measurements, kind: NodeWide, suspects: &[Suspect]) -> Vec<Task> {
    let nodes: Vec<usize> = m
        .nodes
        .iter()
        .filter(|n| (kind.figure)(n).is_some())
        .map(|n| n.node)
        .filter(|n| !suspects.iter().any(|s| s.subject == (kind.subject)(*n)))
        .collect();
    spread(&nodes, REFERENCES)
        .into_iter()
        .map(kind.task)
        .collect()
}

/// Timed repetitions for `task`: five times the run's (a few milliseconds
/// of samples on a fast link catch a core's busy spell too often for the
/// best of them to be what the link can do), or fewer (at least 2) when
/// its figure in the rounds says they would take longer than the budget.
fn retake_reps(m: &Measurements, task: &Task) -> usize {
    let node_of = |r: usize| {
        m.nodes
            .iter()
            .find(|n| n.ranks.contains(&r))
            .map(|n| n.node)
    };
    let pair = |pairs: &[PairResult], a: usize, b: usize| {
        pairs
            .iter()
            .find(|p| (p.a, p.b) == (a.min(b), a.max(b)))
            .map(|p| p.bandwidth_gbs)
    };
    let gbs = match *task {
        Task::Pair(a, b) => match (node_of(a), node_of(b)) {
            (Some(x), Some(y)) if x != y => pair(&m.inter_node, x, y),
            _ => pair(&m.intra_node, a, b),
        },
        Task::AllReduce(n) | Task::DeviceAllReduce(n) => {
            let kind = match task {
                Task::AllReduce(_) => NodeWide::HOST,
                _ => NodeWide::DEVICE,
            };
            m.nodes.iter().find(|x| x.node == n).and_then(kind.figure)
        }
    };
    match gbs.filter(|g| *g > 0.0) {
        Some(g) => {
            let each = m.bytes as f64 / (g * 1e9);
            ((RETAKE_BUDGET_S / each) as usize).clamp(2, 5 * m.reps.max(1))
        }
        None => 5 * m.reps,
    }
}

impl Plan {
    /// The reference of suspect `s`'s scope from the retakes `alone`: the
    /// median of its healthy retakes, and what it is; the rounds' median
    /// where the scope has none healthy to retake.
    fn reference(&self, s: &Suspect, alone: &[f64]) -> (f64, String) {
        let i = SCOPES
            .iter()
            .position(|x| *x == s.subject.scope())
            .unwrap_or(0);
        let refs: Vec<f64> = self.references[i].iter().map(|t| alone[*t]).collect();
        let unit = s.subject.scope().unit();
        match median(&refs) {
            Some(med) => {
                let lo = refs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = refs.iter().copied().fold(0.0, f64::max);
                let what = format!(
                    "median of {} {unit} alone, {lo:.3}-{hi:.3} GB/s",
                    refs.len()
                );
                (med, what)
            }
            None => (
                s.median,
                format!("median of the {unit} in the rounds: none healthy to retake"),
            ),
        }
    }

    /// Each measured suspect with its figure alone (the median of its
    /// retakes), its reference and whether it is below `threshold` of it.
    fn judged<'p>(
        &'p self,
        alone: &'p [f64],
        threshold: f64,
    ) -> impl Iterator<Item = (&'p Suspect, &'p [usize], f64, (f64, String), bool)> + 'p {
        self.suspects.iter().map(move |(s, tasks)| {
            let figures: Vec<f64> = tasks.iter().map(|t| alone[*t]).collect();
            let value = median(&figures).unwrap_or(s.concurrent);
            let (med, what) = self.reference(s, alone);
            (
                s,
                tasks.as_slice(),
                value,
                (med, what),
                value < threshold * med,
            )
        })
    }

    /// The tasks of the suspects that `alone` puts below `threshold` of
    /// their reference but not below half of that. They are measured
    /// again: noise on a shared machine only ever slows a measurement down,
    /// so the best of several passes is what the link can do. Further
    /// below is not noise (a healthy link measured alone was never seen
    /// under 0.5 of the reference here, with five times fewer samples), and
    /// measuring a link at 50 Mbit/s again costs seconds for nothing.
    pub fn still_low(&self, alone: &[f64], threshold: f64) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .judged(alone, threshold)
            .filter(|(_, _, value, (med, _), low)| *low && *value >= threshold / 2.0 * med)
            .flat_map(|j| j.1.iter().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Findings from the plan's retakes (`alone[i]`: task `i`'s best figure,
/// GB/s): a suspect stays a finding when its median retake is below
/// `threshold` × the median of its scope's reference retakes. A scope
/// without a healthy reference (every comparable measurement suspected)
/// keeps the rounds' median; suspects past [`MAX_SUSPECTS`] keep the
/// rounds' figures.
pub fn confirm(m: &Measurements, plan: &Plan, alone: &[f64], threshold: f64) -> Judgement {
    let mut j = Judgement {
        suspects: plan.suspects.len() + plan.unmeasured.len(),
        retakes: plan
            .tasks
            .iter()
            .copied()
            .zip(alone.iter().copied())
            .collect(),
        ..Judgement::default()
    };
    for (s, _, value, (med, what), low) in plan.judged(alone, threshold) {
        if low {
            j.findings.push(Finding {
                of: s.subject,
                kind: s.subject.kind().into(),
                subject: s.subject.name(m),
                value,
                concurrent: s.concurrent,
                median: med,
                reference: what,
                note: None,
            });
        } else {
            j.cleared.push(Cleared {
                kind: s.subject.kind().into(),
                subject: s.subject.name(m),
                concurrent: s.concurrent,
                alone: value,
                median: med,
            });
        }
    }
    for s in &plan.unmeasured {
        j.findings.push(Finding {
            of: s.subject,
            kind: s.subject.kind().into(),
            subject: s.subject.name(m),
            value: s.concurrent,
            concurrent: s.concurrent,
            median: s.median,
            reference: format!(
                "median in the rounds; not retaken, past the first {MAX_SUSPECTS} suspects"
            ),
            note: None,
        });
    }
    j.findings.extend(libraries(m));
    j.findings.extend(m.nodes.iter().filter_map(|n| {
        let e = n.device_error.as_ref()?;
        Some(Finding::noted(
            Subject::NodeDeviceAllReduce(n.node),
            m,
            format!("failed: {e}"),
        ))
    }));
    j
}

/// The nodes whose ranks load another NCCL than most ranks of the job, or
/// none where most do; nothing when no rank has NCCL (there is no GPU plane
/// to judge). Paths may differ between nodes; versions may not.
pub fn libraries(m: &Measurements) -> Vec<Finding> {
    let found: Vec<&str> = m
        .devices
        .iter()
        .filter_map(|d| d.nccl.as_ref().ok().map(|(_, v)| v.as_str()))
        .collect();
    let Some(usual) = most_common(&found) else {
        return Vec::new();
    };
    let with = found.iter().filter(|v| **v == usual).count();
    let total = m.devices.len();
    let mut out = Vec::new();
    for node in &m.nodes {
        let odd: Vec<String> = m
            .devices
            .iter()
            .filter(|d| d.node == node.node)
            .filter_map(|d| match &d.nccl {
                Ok((_, v)) if v == usual => None,
                Ok((path, v)) => Some(format!("rank {} loads NCCL {v} ({path})", d.rank)),
                Err(e) => Some(format!("rank {} has no NCCL ({e})", d.rank)),
            })
            .collect();
        if !odd.is_empty() {
            let note = format!(
                "{}, where {with} of {total} ranks load NCCL {usual}",
                odd.join("; ")
            );
            out.push(Finding::noted(Subject::Library(node.node), m, note));
        }
    }
    out
}

/// The value most entries share (the first of a tie); `None` if empty.
/// One pass: a job has a version per rank, thousands of them.
fn most_common<'a>(values: &[&'a str]) -> Option<&'a str> {
    let mut seen: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    for (i, v) in values.iter().enumerate() {
        seen.entry(v).or_insert((0, i)).0 += 1;
    }
    seen.into_iter()
        .max_by_key(|(_, (count, first))| (*count, std::cmp::Reverse(*first)))
        .map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
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
                device_busbw: None,
                device_error: None,
                ranks_share_cpus: false,
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
            devices: vec![],
            seconds: 0.0,
        }
    }

    /// Retakes as a fake cluster would give them: `alone(task)`.
    fn judge_with(m: &Measurements, alone: impl Fn(&Task) -> f64) -> (Plan, Judgement) {
        let p = plan(m, suspects(m, 0.8));
        let figures: Vec<f64> = p.tasks.iter().map(alone).collect();
        let j = confirm(m, &p, &figures, 0.8);
        (p, j)
    }

    fn four_nodes(slow: impl Fn(usize, usize) -> f64) -> Measurements {
        let mut links = vec![];
        for a in 0..4 {
            for b in a + 1..4 {
                links.push(link(a, b, slow(a, b)));
            }
        }
        run(links, 4)
    }

    /// One node of ranks 0-3, pair `(a, b)` at `gbs(a, b)` GB/s.
    fn one_node_of_four(gbs: impl Fn(usize, usize) -> f64) -> Measurements {
        let mut m = run(vec![], 1);
        m.nodes[0].ranks = vec![0, 1, 2, 3];
        for a in 0..4 {
            for b in a + 1..4 {
                m.intra_node.push(link(a, b, gbs(a, b)));
            }
        }
        m
    }

    #[test]
    fn a_slow_node_is_named_once_not_as_its_links() {
        let m = four_nodes(|_, b| if b == 3 { 0.01 } else { 1.0 });
        let s = suspects(&m, 0.8);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].subject, Subject::Node(3));
        let (p, j) = judge_with(&m, |t| match t {
            Task::Pair(_, 3) => 0.02,
            _ => 1.1,
        });
        // Its three links, then the three healthy links as the reference.
        assert_eq!(p.tasks.len(), 6, "{:?}", p.tasks);
        assert_eq!(j.findings.len(), 1, "{j:?}");
        let f = &j.findings[0];
        assert_eq!((f.kind.as_str(), f.subject.as_str()), ("node", "3 (h3)"));
        assert!(
            f.line().contains("0.020 GB/s alone (0.010 in the rounds)"),
            "{}",
            f.line()
        );
        assert!(
            f.line()
                .contains("median of 3 links alone, 1.100-1.100 GB/s"),
            "{}",
            f.line()
        );
    }

    /// A node only somewhat slow in the rounds (its link's limit near what
    /// the busy cores gave every pair): its three links are half of the six,
    /// so the median of all of them (0.85) would let it pass at 0.68.
    #[test]
    fn a_node_somewhat_slow_is_the_node_not_its_lowest_link() {
        let m = four_nodes(|a, b| match (a, b) {
            (2, 3) => 0.66,
            (_, 2) => 0.7,
            _ => 1.0,
        });
        let s = suspects(&m, 0.8);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].subject, Subject::Node(2));
        assert_eq!(s[0].median, 1.0, "held to the links it does not touch");
        let (_, j) = judge_with(&m, |t| match t {
            Task::Pair(a, b) if *a == 2 || *b == 2 => 0.5,
            _ => 1.0,
        });
        assert_eq!(j.findings.len(), 1, "{j:?}");
        assert_eq!(j.findings[0].subject, "2 (h2)");

        // As CI once measured it: also a link between two healthy nodes
        // low in a noisy round (0-3), which four low links of six made the
        // median. Node 2 is still the node; 0-3, healthy alone, is cleared.
        let m = four_nodes(|a, b| match (a, b) {
            (0, 3) => 0.2,
            (_, 2) | (2, _) => 0.5,
            _ => 1.0,
        });
        let s = suspects(&m, 0.8);
        let subjects: Vec<Subject> = s.iter().map(|x| x.subject).collect();
        assert_eq!(subjects, [Subject::Node(2), Subject::Link(0, 3)]);
        let (_, j) = judge_with(&m, |t| match t {
            Task::Pair(a, b) if *a == 2 || *b == 2 => 0.5,
            _ => 1.0,
        });
        assert_eq!(j.findings.len(), 1, "{j:?}");
        assert_eq!(j.findings[0].subject, "2 (h2)");
        assert_eq!(j.cleared.len(), 1, "{j:?}");
    }

    #[test]
    fn a_suspect_that_is_healthy_alone_is_cleared() {
        // Two pairs measured at once on a busy machine: 0.6 in the rounds.
        let m = four_nodes(|a, b| {
            if (a, b) == (0, 1) || (a, b) == (2, 3) {
                0.6
            } else {
                1.0
            }
        });
        let (p, j) = judge_with(&m, |_| 1.0);
        assert!(j.findings.is_empty(), "{j:?}");
        assert_eq!(j.cleared.len(), 2, "{j:?}");
        assert_eq!(j.cleared[0].alone, 1.0);
        // Each suspect link alone, and the four healthy ones as reference.
        assert_eq!(p.tasks.len(), 6, "{:?}", p.tasks);
    }

    #[test]
    fn only_suspects_still_low_are_measured_again() {
        let m = four_nodes(|a, b| match (a, b) {
            (0, 1) | (2, 3) => 0.5,
            _ => 1.0,
        });
        let p = plan(&m, suspects(&m, 0.8));
        assert_eq!(&p.tasks[..2], [Task::Pair(0, 1), Task::Pair(2, 3)]);
        // Link 0-1 still low alone, 2-3 cleared: only 0-1 again.
        let mut alone = vec![1.0; p.tasks.len()];
        alone[0] = 0.5;
        assert_eq!(p.still_low(&alone, 0.8), [0]);
        alone[0] = 0.9;
        assert!(p.still_low(&alone, 0.8).is_empty());
        // Far below the threshold is not noise: not measured again.
        alone[0] = 0.3;
        assert!(p.still_low(&alone, 0.8).is_empty());
    }

    #[test]
    fn a_slow_link_between_healthy_nodes_is_the_link() {
        let m = four_nodes(|a, b| if (a, b) == (1, 2) { 0.1 } else { 1.0 });
        let (_, j) = judge_with(&m, |t| if *t == Task::Pair(1, 2) { 0.12 } else { 0.95 });
        assert_eq!(j.findings.len(), 1, "{j:?}");
        assert_eq!(j.findings[0].kind, "link");
        assert!(j.findings[0]
            .subject
            .starts_with("node 1 (h1) <-> node 2 (h2)"));
    }

    #[test]
    fn a_healthy_run_has_no_suspects_and_slow_ranks_are_named() {
        let even = run(vec![link(0, 1, 1.0), link(0, 2, 0.9), link(1, 2, 1.05)], 3);
        assert!(suspects(&even, 0.8).is_empty());
        let (p, j) = judge_with(&even, |_| 1.0);
        assert!(p.tasks.is_empty() && j.findings.is_empty());
        let m = one_node_of_four(|_, b| if b == 3 { 0.5 } else { 5.0 });
        let (p, j) = judge_with(&m, |t| match t {
            Task::Pair(_, 3) => 0.5,
            _ => 5.0,
        });
        let ranks: Vec<&str> = j.findings.iter().map(|x| x.subject.as_str()).collect();
        assert_eq!(ranks, ["3"], "{j:?}");
        // Rank 3's three pairs, then the three pairs without it.
        assert_eq!(p.tasks.len(), 6, "{:?}", p.tasks);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ranks_that_share_cpus_are_not_judged_by_their_pairs() {
        // Four healthy ranks on two CPUs: pairs the scheduler ran on one
        // CPU read slow, in the rounds and alone.
        let mut m = one_node_of_four(|a, b| match (a, b) {
            (1, 3) => 11.0,
            (_, 3) => 7.0,
            _ => 20.0,
        });
        let slow = |t: &Task| match t {
            Task::Pair(_, 3) => 14.0,
            _ => 21.0,
        };
        let (_, j) = judge_with(&m, slow);
        assert!(!j.findings.is_empty(), "judged as on CPUs of their own");
        m.nodes[0].ranks_share_cpus = true;
        assert!(suspects(&m, 0.8).is_empty());
        let (p, j) = judge_with(&m, slow);
        assert!(p.tasks.is_empty() && j.findings.is_empty(), "{j:?}");
    }

    #[test]
    fn with_no_healthy_pair_the_reference_is_retaken_alone_too() {
        // Three ranks on a noisy node: pair (0, 1) slow in the rounds makes
        // ranks 0 and 1 suspects, leaving no pair free of a suspect. The
        // node is three times slower during the retakes, for everyone.
        let mut m = run(vec![], 1);
        m.nodes[0].ranks = vec![0, 1, 2];
        m.intra_node = vec![link(0, 1, 1.37), link(0, 2, 4.43), link(1, 2, 5.07)];
        assert_eq!(suspects(&m, 0.8).len(), 2);
        let (p, j) = judge_with(&m, |t| match t {
            Task::Pair(1, 2) => 1.45,
            _ => 1.3,
        });
        assert!(j.findings.is_empty(), "{j:?}");
        assert_eq!(j.cleared.len(), 2, "{j:?}");
        assert!(p.tasks.contains(&Task::Pair(0, 1)), "{:?}", p.tasks);
        // Rank 0 slow with its best peer alone, the fastest pairs not: the
        // fastest pairs, retaken alone, are the reference that names it.
        let (_, j) = judge_with(&m, |t| match t {
            Task::Pair(0, 2) => 0.3,
            _ => 5.0,
        });
        let named: Vec<&str> = j.findings.iter().map(|x| x.subject.as_str()).collect();
        assert_eq!(named, ["0"], "{j:?}");
        assert!(j.findings[0].reference.contains("alone"), "{j:?}");
    }

    #[test]
    fn retakes_are_bounded_and_the_rest_keep_the_rounds_figures() {
        // 40 nodes, every link of nodes 0..20 slow in the rounds.
        let n = 40;
        let mut links = vec![];
        for a in 0..n {
            for b in a + 1..n {
                links.push(link(a, b, if a < 20 { 0.1 } else { 1.0 }));
            }
        }
        let m = run(links, n);
        let (p, j) = judge_with(&m, |_| 1.0);
        assert!(
            p.tasks.len() <= MAX_SUSPECTS * PER_SUSPECT + REFERENCES,
            "{}",
            p.tasks.len()
        );
        let kept = j
            .findings
            .iter()
            .filter(|f| f.reference.contains("not retaken"))
            .count();
        assert_eq!(kept + j.cleared.len(), suspects(&m, 0.8).len(), "{j:?}");
    }

    #[test]
    fn a_retake_of_a_slow_link_fits_its_budget() {
        let mut m = four_nodes(|_, b| if b == 3 { 0.006 } else { 2.5 });
        (m.bytes, m.reps) = (1 << 20, 10);
        let p = plan(&m, suspects(&m, 0.8));
        // 1 MiB at 6 MB/s is 0.17 s: 2 repetitions (the least) for node 3's
        // links; the healthy ones take five times the run's 10.
        let slow: Vec<usize> = (0..p.tasks.len())
            .filter(|i| matches!(p.tasks[*i], Task::Pair(_, 3)))
            .map(|i| p.reps[i])
            .collect();
        assert_eq!(slow, [2, 2, 2]);
        assert!(
            p.reps.iter().filter(|r| **r == 50).count() == 3,
            "{:?}",
            p.reps
        );
    }

    #[test]
    fn a_node_whose_nccl_differs_or_is_missing_is_named() {
        use super::super::DeviceFacts;
        let mut m = run(vec![], 3);
        let lib = |v: &str| Ok((format!("/opt/{v}/libnccl.so.2"), v.to_string()));
        m.devices = vec![
            DeviceFacts {
                rank: 0,
                node: 0,
                nccl: lib("2.27.3"),
                gpus: Ok(1),
            },
            DeviceFacts {
                rank: 1,
                node: 1,
                nccl: lib("2.21.5"),
                gpus: Ok(1),
            },
            DeviceFacts {
                rank: 2,
                node: 2,
                nccl: Err("NCCL not found".into()),
                gpus: Ok(1),
            },
            DeviceFacts {
                rank: 3,
                node: 0,
                nccl: lib("2.27.3"),
                gpus: Ok(1),
            },
        ];
        let f = libraries(&m);
        let lines: Vec<String> = f.iter().map(Finding::line).collect();
        assert_eq!(
            lines,
            [
                "nccl 1 (h1): rank 1 loads NCCL 2.21.5 (/opt/2.21.5/libnccl.so.2), where 2 of 4 ranks load NCCL 2.27.3",
                "nccl 2 (h2): rank 2 has no NCCL (NCCL not found), where 2 of 4 ranks load NCCL 2.27.3",
            ]
        );
        assert_eq!(
            most_common(&["b", "a", "a", "b", "c"]),
            Some("b"),
            "first of a tie"
        );
        assert_eq!(most_common(&[]), None);
        // No NCCL anywhere: no GPU plane to judge, nothing flagged.
        for d in &mut m.devices {
            d.nccl = Err("NCCL not found".into());
        }
        assert!(libraries(&m).is_empty());
    }

    #[test]
    fn a_failed_device_all_reduce_is_a_finding() {
        let mut m = run(vec![], 2);
        m.nodes[1].device_error = Some("gpu: NCCL ncclCommInitRank failed".into());
        let (_, j) = judge_with(&m, |_| 1.0);
        let lines: Vec<String> = j.findings.iter().map(Finding::line).collect();
        assert_eq!(
            lines,
            ["node device all_reduce 1 (h1): failed: gpu: NCCL ncclCommInitRank failed"]
        );
    }

    #[test]
    fn node_device_all_reduce_is_judged_as_the_host_one() {
        let mut m = run(vec![], 3);
        for (n, bw) in [(0, 40.0), (1, 10.0), (2, 41.0)] {
            m.nodes[n].device_busbw = Some(bw);
        }
        let (p, j) = judge_with(&m, |t| {
            if *t == Task::DeviceAllReduce(1) {
                11.0
            } else {
                40.0
            }
        });
        assert_eq!(
            p.tasks,
            [
                Task::DeviceAllReduce(1),
                Task::DeviceAllReduce(0),
                Task::DeviceAllReduce(2)
            ]
        );
        assert_eq!(j.findings.len(), 1, "{j:?}");
        assert_eq!(j.findings[0].kind, "node device all_reduce");
    }

    #[test]
    fn node_all_reduce_is_confirmed_against_the_others_alone() {
        let mut m = run(vec![], 3);
        for (n, bw) in [(0, 2.0), (1, 0.5), (2, 2.1)] {
            m.nodes[n].all_reduce_busbw = Some(bw);
        }
        let (p, j) = judge_with(&m, |t| if *t == Task::AllReduce(1) { 1.9 } else { 2.0 });
        assert_eq!(
            p.tasks,
            [Task::AllReduce(1), Task::AllReduce(0), Task::AllReduce(2)]
        );
        assert!(j.findings.is_empty(), "{j:?}");
        assert_eq!(j.cleared[0].kind, "node all_reduce");
    }
}
