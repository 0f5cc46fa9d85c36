//! Nodes grouped as `ggml-viz ops` and the report show them: by op, tensor name and op,
//! backend or layer, with their counts, totals, distributions and rates; and the shares of
//! threads' time a group's imbalance and waits are.

use rustc_hash::FxHashMap as HashMap;

use crate::analysis::histogram::Histogram;
use crate::analysis::nodes::OpSample;
use crate::analysis::stats::DurationSummary;

/// How to group ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Op,
    Name,
    Backend,
    Layer,
    /// The kernels a GPU node ran (`(none)` for a node without).
    Kernel,
}

impl GroupBy {
    /// The group of `node`: its op, tensor name and op (one name is several nodes: `Qcur-0` is a
    /// MUL_MAT and a ROPE), backend or layer.
    pub fn key(self, node: &OpSample) -> std::borrow::Cow<'_, str> {
        match self {
            GroupBy::Op => node.op.as_str().into(),
            GroupBy::Name => format!("{} ({})", node.tensor, node.op).into(),
            GroupBy::Backend => node.backend.as_str().into(),
            GroupBy::Layer => node
                .layer()
                .map_or_else(|| "(none)".into(), |l| format!("layer {l}").into()),
            GroupBy::Kernel if node.kernels.is_empty() => "(none)".into(),
            GroupBy::Kernel => node.kernels.as_ref().into(),
        }
    }
}

/// One row of `ggml-viz ops`.
#[derive(Clone, Debug, PartialEq)]
pub struct OpGroup {
    pub key: String,
    pub count: usize,
    pub total_ns: u64,
    pub durations: DurationSummary,
    /// FLOP/s over the ops whose FLOPs are known.
    pub flops_per_s: Option<f64>,
    pub bytes_per_s: f64,
    /// The nodes' threads' shares, summed.
    pub thread_ns: u64,
    /// Of the time the threads that had work spent in these nodes (as long as the slowest of
    /// each), the share they were done and waited for the slowest.
    pub imbalance: f64,
    /// Of the threads' time in these nodes and the barrier waits after them, the share spent
    /// waiting at barriers (after the nodes, and inside them: mul_mat's, …).
    pub wait_share: f64,
}

/// Groups `ops` by `by`, largest total time first.
pub fn group_ops<'a>(ops: impl IntoIterator<Item = &'a OpSample>, by: GroupBy) -> Vec<OpGroup> {
    let mut groups = OpGroups::new(by);
    ops.into_iter().for_each(|o| groups.add(o));
    groups.rows()
}

/// Nodes grouped as they come: per group, sums and the durations in 1 % buckets (p50 and p99
/// within 1 %, clamped to the exact extremes), nothing kept per node.
#[derive(Clone, Debug)]
pub struct OpGroups {
    by: GroupBy,
    groups: HashMap<String, GroupSums>,
}

#[derive(Clone, Debug, Default)]
struct GroupSums {
    count: usize,
    total_ns: u64,
    durations: Histogram,
    /// Time and FLOPs of the nodes whose FLOPs are known.
    flop_ns: u64,
    flops: u64,
    bytes: u64,
    thread_ns: u64,
    idle_ns: u64,
    /// Per node, the slowest share times the threads that had work.
    working_ns: u64,
    wait_ns: u64,
    inner_wait_ns: u64,
}

impl OpGroups {
    pub fn new(by: GroupBy) -> OpGroups {
        OpGroups {
            by,
            groups: HashMap::default(),
        }
    }

    /// Counts node `o` in its group. Values come from the trace: sums saturate rather than
    /// overflow on hostile input.
    pub fn add(&mut self, o: &OpSample) {
        let key = self.by.key(o);
        let g = match self.groups.get_mut(key.as_ref()) {
            Some(g) => g,
            None => self.groups.entry(key.into_owned()).or_default(),
        };
        g.count += 1;
        g.total_ns = g.total_ns.saturating_add(o.duration_ns);
        g.durations.add(o.duration_ns);
        if let Some(flops) = o.flops {
            g.flop_ns = g.flop_ns.saturating_add(o.duration_ns);
            g.flops = g.flops.saturating_add(flops);
        }
        g.bytes = g.bytes.saturating_add(o.bytes);
        g.thread_ns = g.thread_ns.saturating_add(o.thread_ns);
        g.idle_ns = g.idle_ns.saturating_add(o.idle_ns);
        g.working_ns = g.working_ns.saturating_add(o.working_ns());
        g.wait_ns = g.wait_ns.saturating_add(o.wait_ns);
        g.inner_wait_ns = g.inner_wait_ns.saturating_add(o.inner_wait_ns);
    }

    /// Whether no node was added.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The nodes added.
    pub fn nodes(&self) -> usize {
        self.groups.values().map(|g| g.count).sum()
    }

    /// The groups' time, summed.
    pub fn total_ns(&self) -> u64 {
        self.sum(|g| g.total_ns)
    }

    /// The groups' threads' shares, summed.
    pub fn thread_ns(&self) -> u64 {
        self.sum(|g| g.thread_ns)
    }

    fn sum(&self, of: fn(&GroupSums) -> u64) -> u64 {
        self.groups
            .values()
            .fold(0u64, |a, g| a.saturating_add(of(g)))
    }

    /// The rows, largest total time first.
    pub fn rows(&self) -> Vec<OpGroup> {
        let mut rows: Vec<OpGroup> = self
            .groups
            .iter()
            .map(|(key, g)| OpGroup {
                key: key.clone(),
                count: g.count,
                total_ns: g.total_ns,
                durations: DurationSummary {
                    count: g.count,
                    mean_ns: g.total_ns as f64 / g.count.max(1) as f64,
                    p50_ns: g.durations.quantile(0.5),
                    p99_ns: g.durations.quantile(0.99),
                    max_ns: g.durations.quantile(1.0),
                },
                flops_per_s: (g.flop_ns > 0).then(|| g.flops as f64 / (g.flop_ns as f64 / 1e9)),
                bytes_per_s: if g.total_ns > 0 {
                    g.bytes as f64 / (g.total_ns as f64 / 1e9)
                } else {
                    0.0
                },
                thread_ns: g.thread_ns,
                imbalance: imbalance(g.idle_ns, g.working_ns),
                wait_share: wait_share(g.thread_ns, g.wait_ns, g.inner_wait_ns),
            })
            .collect();
        rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.key.cmp(&b.key)));
        rows
    }
}

/// Of the time the threads that had work would have spent had each been as slow as the slowest
/// ([`OpSample::working_ns`], summed), the share they were done and waited
/// ([`OpSample::idle_ns`], summed): the imbalance `ggml-viz ops` shows.
pub fn imbalance(idle_ns: u64, working_ns: u64) -> f64 {
    ratio(idle_ns, working_ns)
}

/// Of nodes' threads' time (`thread_ns`, which holds the waits inside them, `inner_wait_ns`) and
/// the barrier waits after them (`after_ns`), the share spent waiting at barriers.
pub fn wait_share(thread_ns: u64, after_ns: u64, inner_wait_ns: u64) -> f64 {
    ratio(
        after_ns.saturating_add(inner_wait_ns),
        thread_ns.saturating_add(after_ns),
    )
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}
