//! Two sides' op times compared (each side one recording or several of one command), with the
//! spread that tells a change from noise.
//!
//! The unit of comparison is the graph compute (a token, in llama.cpp's generation): per phase
//! (prefill, generation, neither) and op type, each graph's node time (its nodes' wall times,
//! summed; 0 in a graph without such a node). A change is the change of the mean per graph; its
//! 95 % interval comes from a two-level bootstrap: each round resamples a side's recordings with
//! replacement, then each chosen recording's graphs (2,000 rounds, a fixed seed: the same inputs
//! give the same interval). With one recording a side the interval holds the spread from token
//! to token only, not what differs from one run of a program to the next (its threads' placing,
//! the machine's other work): several recordings a side put that in. A change whose interval
//! holds 0 is within noise; with fewer than [`MIN_GRAPHS`] graphs on a side there is no spread to
//! judge by, and none is claimed.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use super::nodes::{OpSample, Phase};

/// Graphs a run needs in a phase for a change to be judged.
pub const MIN_GRAPHS: usize = 3;
const ROUNDS: usize = 2_000;

/// One run's node times, per phase, op type and graph compute.
#[derive(Default)]
pub struct PhaseOps {
    /// Per phase: its graphs' ids, and per op type its nodes and each graph's node time.
    phases: BTreeMap<Option<Phase>, PhaseNodes>,
}

#[derive(Default)]
struct PhaseNodes {
    graphs: HashMap<u64, ()>,
    ops: BTreeMap<String, (usize, HashMap<u64, u64>)>,
}

impl PhaseOps {
    pub fn add(&mut self, o: &OpSample) {
        let phase = self.phases.entry(o.phase).or_default();
        phase.graphs.insert(o.graph, ());
        let (nodes, per_graph) = phase.ops.entry(o.op.to_string()).or_default();
        *nodes += 1;
        let ns = per_graph.entry(o.graph).or_default();
        *ns = ns.saturating_add(o.duration_ns);
    }

    /// Each graph's node time of `op` in `phase`, every graph of the phase counted (0 where it
    /// had no such node), in a fixed order.
    fn samples(&self, phase: Option<Phase>, op: &str) -> Vec<f64> {
        let Some(p) = self.phases.get(&phase) else {
            return Vec::new();
        };
        let per_graph = p.ops.get(op).map(|(_, g)| g);
        let mut graphs: Vec<u64> = p.graphs.keys().copied().collect();
        graphs.sort_unstable();
        (graphs.iter())
            .map(|g| per_graph.and_then(|m| m.get(g)).copied().unwrap_or(0) as f64)
            .collect()
    }

    fn graphs(&self, phase: Option<Phase>) -> usize {
        self.phases.get(&phase).map_or(0, |p| p.graphs.len())
    }

    fn nodes(&self, phase: Option<Phase>, op: &str) -> usize {
        (self.phases.get(&phase))
            .and_then(|p| p.ops.get(op))
            .map_or(0, |(n, _)| *n)
    }
}

/// One op type in one phase, in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct OpChange {
    pub op: String,
    pub nodes: (usize, usize),
    /// Node time, all graphs together.
    pub total_ns: (u64, u64),
    /// Node time per graph, on average.
    pub per_graph_ns: (f64, f64),
    /// The change of the mean per graph, as a fraction (0.1: 10 % more); `None` where A had none.
    pub change: Option<f64>,
    /// Its 95 % interval; `None` with fewer than [`MIN_GRAPHS`] graphs in a run (or none in A).
    pub interval: Option<(f64, f64)>,
}

impl OpChange {
    /// What the interval says: `None` where there is none to judge by.
    pub fn verdict(&self) -> Option<&'static str> {
        let (lo, hi) = self.interval?;
        Some(if lo <= 0.0 && hi >= 0.0 {
            "within noise"
        } else if lo > 0.0 {
            "slower"
        } else {
            "faster"
        })
    }
}

/// One phase compared: its graphs in each run, and its op types, the largest first.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseChange {
    pub phase: Option<Phase>,
    pub graphs: (usize, usize),
    pub ops: Vec<OpChange>,
}

/// Sides `a` and `b` (each one or more recordings) compared, phase by phase.
pub fn compare_runs(a: &[PhaseOps], b: &[PhaseOps]) -> Vec<PhaseChange> {
    let mut phases: Vec<Option<Phase>> = (a.iter().chain(b))
        .flat_map(|run| run.phases.keys().copied())
        .collect();
    phases.sort();
    phases.dedup();
    phases
        .into_iter()
        .map(|phase| {
            let mut ops: Vec<String> = (a.iter().chain(b))
                .filter_map(|run| run.phases.get(&phase))
                .flat_map(|p| p.ops.keys().cloned())
                .collect();
            ops.sort();
            ops.dedup();
            let graphs = |side: &[PhaseOps]| side.iter().map(|r| r.graphs(phase)).sum::<usize>();
            let nodes = |side: &[PhaseOps], op: &str| {
                side.iter().map(|r| r.nodes(phase, op)).sum::<usize>()
            };
            let mut changes: Vec<OpChange> = (ops.into_iter())
                .map(|op| {
                    let samples = |side: &[PhaseOps]| -> Vec<Vec<f64>> {
                        side.iter().map(|r| r.samples(phase, &op)).collect()
                    };
                    let (sa, sb) = (samples(a), samples(b));
                    let total = |s: &[Vec<f64>]| s.iter().flatten().sum::<f64>();
                    let (ma, mb) = (mean(&sa.concat()), mean(&sb.concat()));
                    let judged = graphs(a) >= MIN_GRAPHS && graphs(b) >= MIN_GRAPHS && ma > 0.0;
                    OpChange {
                        nodes: (nodes(a, &op), nodes(b, &op)),
                        total_ns: (total(&sa) as u64, total(&sb) as u64),
                        per_graph_ns: (ma, mb),
                        change: (ma > 0.0).then(|| mb / ma - 1.0),
                        interval: judged.then(|| bootstrap(&sa, &sb)),
                        op,
                    }
                })
                .collect();
            changes.sort_by(|x, y| {
                let size = |c: &OpChange| c.total_ns.0.max(c.total_ns.1);
                size(y).cmp(&size(x)).then_with(|| x.op.cmp(&y.op))
            });
            PhaseChange {
                phase,
                graphs: (graphs(a), graphs(b)),
                ops: changes,
            }
        })
        .collect()
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// The 2.5th and 97.5th percentiles of `stat(b') / stat(a') − 1` over resamples `a'`, `b'`:
/// each side's recordings drawn with replacement, then each drawn recording's values.
fn bootstrap_with(a: &[Vec<f64>], b: &[Vec<f64>], stat: fn(&mut [f64]) -> f64) -> (f64, f64) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut drawn = Vec::new();
    let mut resampled = |side: &[Vec<f64>]| {
        drawn.clear();
        for _ in 0..side.len() {
            let run = &side[next(side.len())];
            drawn.extend((0..run.len()).map(|_| run[next(run.len())]));
        }
        (!drawn.is_empty()).then(|| stat(&mut drawn))
    };
    let mut changes: Vec<f64> = (0..ROUNDS)
        .filter_map(|_| {
            let sa = resampled(a)?;
            let sb = resampled(b)?;
            (sa > 0.0).then(|| sb / sa - 1.0)
        })
        .collect();
    if changes.is_empty() {
        return (f64::NEG_INFINITY, f64::INFINITY);
    }
    changes.sort_by(f64::total_cmp);
    let at = |q: f64| changes[((changes.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

fn bootstrap(a: &[Vec<f64>], b: &[Vec<f64>]) -> (f64, f64) {
    bootstrap_with(a, b, |xs| mean(xs))
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// What timing ops cost the run, where the trace holds graph computes of one phase both timed
/// and untimed (op sampling, a capture window): their median durations, and the change from
/// untimed to timed with its 95 % interval.
#[derive(Clone, Debug, PartialEq)]
pub struct TimingCost {
    pub phase: Option<Phase>,
    /// (graph computes, median ns) without op timing, then with it.
    pub untimed: (usize, f64),
    pub timed: (usize, f64),
    pub change: f64,
    pub interval: (f64, f64),
}

/// [`TimingCost`] of the phase with the most graph computes that has at least [`MIN_GRAPHS`]
/// of each kind (generation, in llama.cpp: its graphs are alike, token after token).
pub fn timing_cost(graph_computes: &[(Option<Phase>, bool, u64)]) -> Option<TimingCost> {
    let mut phases: BTreeMap<Option<Phase>, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for &(phase, timed, ns) in graph_computes {
        let (untimed_ns, timed_ns) = phases.entry(phase).or_default();
        if timed { timed_ns } else { untimed_ns }.push(ns as f64);
    }
    let (phase, (mut untimed, mut timed)) = phases
        .into_iter()
        .filter(|(_, (u, t))| u.len() >= MIN_GRAPHS && t.len() >= MIN_GRAPHS)
        .max_by_key(|(_, (u, t))| u.len() + t.len())?;
    let (mu, mt) = (median(&mut untimed), median(&mut timed));
    if mu <= 0.0 {
        return None;
    }
    let counts = (untimed.len(), timed.len());
    let interval = bootstrap_with(&[untimed], &[timed], median);
    Some(TimingCost {
        phase,
        untimed: (counts.0, mu),
        timed: (counts.1, mt),
        change: mt / mu - 1.0,
        interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, phase: Option<Phase>, graph: u64, ns: u64) -> OpSample {
        OpSample {
            phase,
            graph,
            ..OpSample::on_one_thread(op, "t", ns)
        }
    }

    /// A run of `graphs` generation graphs: per graph two MUL_MAT nodes (`mul_mat` ns each,
    /// jittered by ±20 % from `seed`) and an ADD in every other graph; one prefill graph.
    fn run(graphs: u64, mul_mat: f64, seed: u64) -> PhaseOps {
        let mut ops = PhaseOps::default();
        let mut state = seed;
        let mut jitter = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            0.8 + 0.4 * ((state >> 33) as f64 / (1u64 << 31) as f64)
        };
        ops.add(&node("MUL_MAT", Some(Phase::Prefill), 0, 50_000));
        for g in 1..=graphs {
            for _ in 0..2 {
                ops.add(&node(
                    "MUL_MAT",
                    Some(Phase::Generation),
                    g,
                    (mul_mat * jitter()) as u64,
                ));
            }
            if g % 2 == 0 {
                ops.add(&node("ADD", Some(Phase::Generation), g, 1_000));
            }
        }
        ops
    }

    #[test]
    fn the_same_distribution_is_within_noise_and_a_doubled_op_is_slower() {
        let a = run(40, 10_000.0, 1);
        let same = compare_runs(std::slice::from_ref(&a), &[run(40, 10_000.0, 2)]);
        let generation = same
            .iter()
            .find(|p| p.phase == Some(Phase::Generation))
            .unwrap();
        assert_eq!(generation.graphs, (40, 40));
        let mul_mat = &generation.ops[0];
        assert_eq!((mul_mat.op.as_str(), mul_mat.nodes), ("MUL_MAT", (80, 80)));
        assert_eq!(mul_mat.verdict(), Some("within noise"), "{mul_mat:?}");
        // ADD in every other graph, 1 µs: 0.5 µs a graph, counted over all 40.
        let add = &generation.ops[1];
        assert_eq!(
            (add.per_graph_ns, add.total_ns),
            ((500.0, 500.0), (20_000, 20_000))
        );

        let doubled = compare_runs(std::slice::from_ref(&a), &[run(40, 20_000.0, 2)]);
        let generation = doubled
            .iter()
            .find(|p| p.phase == Some(Phase::Generation))
            .unwrap();
        let mul_mat = &generation.ops[0];
        assert_eq!(mul_mat.verdict(), Some("slower"), "{mul_mat:?}");
        let (lo, hi) = mul_mat.interval.unwrap();
        let change = mul_mat.change.unwrap();
        assert!(
            lo < change && change < hi && (0.8..1.2).contains(&change),
            "{mul_mat:?}"
        );
        // The prefill: one graph a run, nothing to judge by.
        let prefill = doubled
            .iter()
            .find(|p| p.phase == Some(Phase::Prefill))
            .unwrap();
        assert_eq!(prefill.graphs, (1, 1));
        assert_eq!(
            (prefill.ops[0].interval, prefill.ops[0].verdict()),
            (None, None)
        );
        assert_eq!(prefill.ops[0].change, Some(0.0));
    }

    /// Recordings whose runs differ from one another (one side's two at 10 and 14 µs a node,
    /// the other's at 12 and 16): one recording each tells a change the other recordings undo;
    /// both recordings each put the run-to-run spread in the interval, and the change is
    /// within noise.
    #[test]
    fn several_recordings_a_side_put_run_to_run_spread_in_the_interval() {
        let (a1, a2) = (run(40, 10_000.0, 1), run(40, 14_000.0, 2));
        let (b1, b2) = (run(40, 16_000.0, 3), run(40, 12_000.0, 4));
        let mul_mat = |phases: Vec<PhaseChange>| {
            let generation = phases
                .into_iter()
                .find(|p| p.phase == Some(Phase::Generation));
            generation.unwrap().ops.remove(0)
        };
        let one = mul_mat(compare_runs(
            std::slice::from_ref(&a1),
            std::slice::from_ref(&b1),
        ));
        assert_eq!(one.verdict(), Some("slower"), "{one:?}");
        let both = mul_mat(compare_runs(&[a1, a2], &[b1, b2]));
        assert_eq!(both.nodes, (160, 160));
        assert_eq!(both.verdict(), Some("within noise"), "{both:?}");
        let change = both.change.unwrap();
        assert!((0.1..0.25).contains(&change), "{both:?}");
    }

    /// Every other generation graph timed, those 10 % slower (±5 % jitter), and a prefill timed
    /// only: the cost is the generation's, about +10 %, its interval around it and off 0; with
    /// too few untimed graphs, none is claimed.
    #[test]
    fn the_cost_of_timing_is_told_from_untimed_graphs_of_one_phase() {
        let mut computes = vec![(Some(Phase::Prefill), true, 90_000)];
        for g in 0..60u64 {
            let jitter = 1.0 + 0.05 * ((g * 7 % 11) as f64 / 5.0 - 1.0);
            let timed = g % 2 == 0;
            let ns = 10_000.0 * jitter * if timed { 1.1 } else { 1.0 };
            computes.push((Some(Phase::Generation), timed, ns as u64));
        }
        let cost = timing_cost(&computes).unwrap();
        assert_eq!(cost.phase, Some(Phase::Generation));
        assert_eq!((cost.untimed.0, cost.timed.0), (30, 30));
        assert!((0.05..0.15).contains(&cost.change), "{cost:?}");
        let (lo, hi) = cost.interval;
        assert!(
            lo > 0.0 && lo <= cost.change && cost.change <= hi,
            "{cost:?}"
        );
        let few: Vec<_> = computes
            .iter()
            .copied()
            .filter(|c| c.1)
            .chain([(Some(Phase::Generation), false, 10_000)])
            .collect();
        assert_eq!(timing_cost(&few), None);
    }
}
