//! The report's tables of time — per op type, backend, layer and tensor — and their rows: a
//! row's count and times summed over spans or nodes, and its threads' imbalance and wait.

use std::collections::HashMap;

use serde::Serialize;

use ggml_viz_reader::{GroupBy, OpSample, imbalance, wait_share};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Aggregate {
    pub name: String,
    pub count: u64,
    /// Spans: their durations; nodes: their wall times (first thread's start to last thread's
    /// end).
    pub total_ns: u64,
    /// Of the row's spans, their time less their children's (`None`: the row has only nodes).
    pub self_ns: Option<u64>,
    /// Of the row's nodes, their threads' shares summed (`None`: the row has only spans).
    pub thread_ns: Option<u64>,
    /// Of the row's nodes, the share of their working threads' time spent done and waiting for
    /// the slowest (`ggml-viz ops`' imbalance; `None`: the row has only spans).
    pub imbalance: Option<f64>,
    /// Of the row's nodes' threads' time and the barrier waits after the nodes, the share spent
    /// waiting at barriers, inside the nodes and after them (`ggml-viz ops`' wait; `None`: the
    /// row has only spans).
    pub wait_share: Option<f64>,
    /// Their parts, summed over the row's nodes.
    #[serde(skip)]
    pub(super) idle_ns: u64,
    #[serde(skip)]
    pub(super) working_ns: u64,
    #[serde(skip)]
    pub(super) wait_ns: u64,
    #[serde(skip)]
    pub(super) inner_wait_ns: u64,
}

/// Rows by op type, tensor and backend, of one input: its op spans, or its nodes.
#[derive(Default)]
pub struct OpRows {
    pub(super) count: u64,
    pub(super) by_op: HashMap<String, Aggregate>,
    pub(super) by_tensor: HashMap<String, Aggregate>,
    pub(super) by_backend: HashMap<String, Aggregate>,
    pub(super) by_layer: HashMap<String, Aggregate>,
}

impl OpRows {
    /// Counts a node: what `ggml-viz ops` counts of a GGMLVIZ trace (each node once, however
    /// many threads computed a share of it).
    pub fn add_node(&mut self, node: &OpSample) {
        self.count += 1;
        for (map, by) in [
            (&mut self.by_op, GroupBy::Op),
            (&mut self.by_tensor, GroupBy::Name),
            (&mut self.by_backend, GroupBy::Backend),
            (&mut self.by_layer, GroupBy::Layer),
        ] {
            let a = row(map, &by.key(node));
            a.count += 1;
            a.total_ns = a.total_ns.saturating_add(node.duration_ns);
            a.thread_ns = sum(a.thread_ns, Some(node.thread_ns));
            a.idle_ns = a.idle_ns.saturating_add(node.idle_ns);
            a.working_ns = a.working_ns.saturating_add(node.working_ns());
            a.wait_ns = a.wait_ns.saturating_add(node.wait_ns);
            a.inner_wait_ns = a.inner_wait_ns.saturating_add(node.inner_wait_ns);
        }
    }
}

/// The row of `key`, made empty if new.
pub(super) fn row<'a>(map: &'a mut HashMap<String, Aggregate>, key: &str) -> &'a mut Aggregate {
    map.entry(key.to_string()).or_insert_with(|| Aggregate {
        name: key.to_string(),
        ..Aggregate::default()
    })
}

/// A sum of values some rows have (`None`: none had one).
pub(super) fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// Counts one span (or outermost graph) of `total_ns`, `self_ns` under `key`.
pub(super) fn add(map: &mut HashMap<String, Aggregate>, key: &str, total_ns: u64, self_ns: u64) {
    let a = row(map, key);
    a.count += 1;
    a.total_ns = a.total_ns.saturating_add(total_ns);
    a.self_ns = sum(a.self_ns, Some(self_ns));
}

/// Adds `rows` to `map`'s rows of the same names.
pub(super) fn merge(map: &mut HashMap<String, Aggregate>, rows: HashMap<String, Aggregate>) {
    for (key, r) in rows {
        let a = row(map, &key);
        a.count += r.count;
        a.total_ns = a.total_ns.saturating_add(r.total_ns);
        a.self_ns = sum(a.self_ns, r.self_ns);
        a.thread_ns = sum(a.thread_ns, r.thread_ns);
        a.idle_ns = a.idle_ns.saturating_add(r.idle_ns);
        a.working_ns = a.working_ns.saturating_add(r.working_ns);
        a.wait_ns = a.wait_ns.saturating_add(r.wait_ns);
        a.inner_wait_ns = a.inner_wait_ns.saturating_add(r.inner_wait_ns);
    }
}

pub(super) fn sorted(map: HashMap<String, Aggregate>) -> Vec<Aggregate> {
    let mut v: Vec<Aggregate> = map.into_values().collect();
    for a in &mut v {
        a.imbalance = a.thread_ns.map(|_| imbalance(a.idle_ns, a.working_ns));
        a.wait_share = a
            .thread_ns
            .map(|thread_ns| wait_share(thread_ns, a.wait_ns, a.inner_wait_ns));
    }
    v.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
    v
}

/// The number of a per-layer row's key (`layer 12`); rows of no layer after every layer.
pub(super) fn layer_number(key: &str) -> u64 {
    key.strip_prefix("layer ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}
