//! What the live view shows, kept up to date from the records a [`ggml_viz_reader::Follower`] returns.
//!
//! Each record is looked at once. Rates and rolling figures come from one bucket per refresh
//! (about a second of wall time): the bucket being filled, and the last `window` closed ones.
//! Op time is node wall time, as `ggml-viz ops` and the report have it: the op events (one per
//! worker thread's share of a node, in threads mode) go to an [`OpCollector`], which joins a
//! graph compute's shares into nodes a refresh after its end was read (the writer has drained
//! every thread's ring since). Memory is bounded by the window, a refresh's events, the number
//! of op types and the nesting depth, never by the trace's length.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use ggml_viz_reader::Histogram;
use ggml_viz_reader::format::ext::{self, Counters};
use ggml_viz_reader::format::{Event, EventType, ExtensionKind, Payload};
use ggml_viz_reader::telemetry::Text;
use ggml_viz_reader::{Damage, OpCollector};

#[derive(Debug, Default)]
struct Bucket {
    wall: Duration,
    events: u64,
    graphs: u64,
    graph_ns: Histogram,
    /// Per op (as `ggml-viz ops` names it): the wall time of its nodes joined in this bucket,
    /// and how many.
    op_ns: HashMap<Text, (u64, u64)>,
    /// Decode batches that named their sequences (a batching server's), and those sequences.
    batches: u64,
    batch_sequences: u64,
    /// Per generated token: the time since the same sequence's previous token.
    token_ns: Histogram,
    /// The trace's own time its events span: the first's and the last's timestamps.
    first_ns: Option<u64>,
    last_ns: u64,
}

/// Running totals and the rolling window.
pub struct LiveStats {
    pub events: u64,
    /// Outermost graph computes, op events and nodes that began, as `info` counts them (a
    /// node: an op begin on the thread of a graph compute; in threads mode each worker
    /// thread's share of a node is an op event of its own).
    pub graphs: u64,
    pub ops: u64,
    pub nodes: u64,
    /// The writer's latest running totals of what it could not record.
    pub counters: Counters,
    /// Duration of the latest outermost graph compute.
    pub latest_graph_ns: Option<u64>,
    pub damage: Option<Damage>,
    /// Joins op events into nodes (and knows the graph computes open on each thread); `handed`
    /// is what it had taken in at the last refresh.
    collector: OpCollector,
    handed: u64,
    /// Batches that named their sequences, all told.
    pub batches: u64,
    /// Per thread: the sequences (id, tokens) of each open decode span (empty: none named).
    open_batches: HashMap<u32, Vec<Vec<(i32, u32)>>>,
    /// Per sequence generating: when its last token's batch ended.
    last_token_ns: HashMap<i32, u64>,
    current: Bucket,
    closed: VecDeque<Bucket>,
    window: usize,
}

/// One op type's share of the window.
#[derive(Clone, Debug, PartialEq)]
pub struct TopOp {
    pub name: String,
    pub total_ns: u64,
    pub count: u64,
    /// Of all op time in the window.
    pub share: f64,
}

/// What a refresh shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub events: u64,
    pub graphs: u64,
    pub ops: u64,
    pub nodes: u64,
    pub lost: u64,
    /// Over the last closed bucket.
    pub events_per_s: f64,
    pub graphs_per_s: f64,
    pub latest_graph_ns: Option<u64>,
    /// Over the window: outermost graph computes that ended in it.
    pub window_graphs: u64,
    pub p50_graph_ns: Option<u64>,
    pub p99_graph_ns: Option<u64>,
    pub top_ops: Vec<TopOp>,
    /// A batching server's decode batches (those that named their sequences): all told, per
    /// second over the last bucket, sequences per batch over the window; the time between two
    /// tokens of one sequence (a generation step to the next), over the window.
    pub batches: u64,
    pub batches_per_s: f64,
    pub sequences_per_batch: Option<f64>,
    pub p50_token_ns: Option<u64>,
    pub p99_token_ns: Option<u64>,
    /// Wall time the window covers.
    pub window: Duration,
    /// Trace time the window's events span, and the batches per second of it (a trace read at
    /// once, after its program ended, spans seconds in a millisecond of wall time).
    pub window_trace_ns: u64,
    pub window_batches_per_s: f64,
    /// Where the graph computes ran more threads than the process had CPUs, what `info` and
    /// `ops` say of it.
    pub note: Option<String>,
}

impl LiveStats {
    /// `window`: how many refresh buckets the rolling figures span.
    pub fn new(window: usize) -> LiveStats {
        LiveStats {
            events: 0,
            graphs: 0,
            ops: 0,
            nodes: 0,
            counters: Counters::default(),
            latest_graph_ns: None,
            damage: None,
            collector: OpCollector::streaming(),
            handed: 0,
            batches: 0,
            open_batches: HashMap::new(),
            last_token_ns: HashMap::new(),
            current: Bucket::default(),
            closed: VecDeque::new(),
            window: window.max(1),
        }
    }

    pub fn add(&mut self, e: &Event<'_>) {
        let graph_step = self.collector.push(Ok(e));
        self.events += 1;
        self.current.events += 1;
        let ts = e.timestamp_ns;
        let first = self.current.first_ns.get_or_insert(ts);
        *first = (*first).min(ts);
        self.current.last_ns = self.current.last_ns.max(ts);
        match (e.event_type(), e.payload) {
            (_, Payload::Extension(x)) => match x.kind {
                ExtensionKind::Counters => {
                    if let Some(c) =
                        ext::parse_payload::<Counters>(e.label.as_deref().unwrap_or_default())
                    {
                        self.counters = c;
                    }
                }
                ExtensionKind::SpanBegin => {
                    let span: ext::SpanBoundary = e
                        .label
                        .as_deref()
                        .and_then(ext::parse_payload)
                        .unwrap_or_default();
                    self.open_batches
                        .entry(e.thread_id)
                        .or_default()
                        .push(span.seqs);
                }
                ExtensionKind::SpanEnd => {
                    let seqs = (self.open_batches.get_mut(&e.thread_id))
                        .and_then(|open| open.pop())
                        .unwrap_or_default();
                    self.batch_ended(&seqs, ts);
                }
                _ => {}
            },
            (Some(EventType::GraphComputeBegin), _) => {
                let outermost = u64::from(graph_step.is_some_and(|s| s.outermost));
                self.graphs += outermost;
                self.current.graphs += outermost;
            }
            (Some(EventType::GraphComputeEnd), _) => {
                if let Some(step) = graph_step
                    && step.outermost
                {
                    let ns = ts.saturating_sub(step.begin_ns);
                    self.current.graph_ns.add(ns);
                    self.latest_graph_ns = Some(ns);
                }
            }
            (Some(EventType::OpComputeBegin), _) => {
                self.ops += 1;
                if self.collector.graph_open_on(e.thread_id) {
                    self.nodes += 1;
                }
            }
            _ => {}
        }
    }

    /// A decode span holding `seqs` ended at `ts`: a batch; each sequence with one token in it
    /// generated a token (the time since its previous one is a token's latency), one with
    /// several prefilled (its next token starts a new count).
    fn batch_ended(&mut self, seqs: &[(i32, u32)], ts: u64) {
        if seqs.is_empty() {
            return;
        }
        self.batches += 1;
        self.current.batches += 1;
        self.current.batch_sequences += seqs.len() as u64;
        for &(seq, tokens) in seqs {
            let previous = self.last_token_ns.insert(seq, ts);
            if tokens == 1
                && let Some(previous) = previous
            {
                self.current.token_ns.add(ts.saturating_sub(previous));
            }
        }
    }

    /// Closes the bucket being filled, which covered `wall` of wall time, with the nodes of the
    /// graph computes whose end was read before the last refresh.
    pub fn tick(&mut self, wall: Duration) {
        self.collector.hand_out(self.handed);
        self.handed = self.collector.taken();
        self.take_nodes();
        let mut bucket = std::mem::take(&mut self.current);
        bucket.wall = wall;
        self.closed.push_back(bucket);
        while self.closed.len() > self.window {
            self.closed.pop_front();
        }
    }

    /// The writer is done and everything it wrote was read: the nodes of every graph compute
    /// that ended go to the bucket being filled.
    pub fn all_read(&mut self) {
        self.collector.hand_out(self.collector.taken());
        self.take_nodes();
    }

    fn take_nodes(&mut self) {
        for node in self.collector.take_ready() {
            let slot = self.current.op_ns.entry(node.op).or_default();
            slot.0 = slot.0.saturating_add(node.duration_ns);
            slot.1 += 1;
        }
    }

    pub fn snapshot(&self, top: usize) -> Snapshot {
        let last = self.closed.back();
        let per_s = |n: u64| match last {
            Some(b) if !b.wall.is_zero() => n as f64 / b.wall.as_secs_f64(),
            _ => 0.0,
        };
        let mut graph_ns = Histogram::default();
        let mut token_ns = Histogram::default();
        let (mut batches, mut batch_sequences) = (0, 0);
        let mut op_ns: HashMap<&Text, (u64, u64)> = HashMap::new();
        for b in &self.closed {
            graph_ns.merge(&b.graph_ns);
            token_ns.merge(&b.token_ns);
            batches += b.batches;
            batch_sequences += b.batch_sequences;
            for (op, &(ns, n)) in &b.op_ns {
                let slot = op_ns.entry(op).or_default();
                slot.0 = slot.0.saturating_add(ns);
                slot.1 += n;
            }
        }
        let first_ns = self.closed.iter().filter_map(|b| b.first_ns).min();
        let last_ns = self.closed.iter().map(|b| b.last_ns).max();
        let window_trace_ns = first_ns
            .zip(last_ns)
            .map_or(0, |(f, l)| l.saturating_sub(f));
        let all: u64 = op_ns.values().map(|v| v.0).sum();
        let mut top_ops: Vec<TopOp> = op_ns
            .into_iter()
            .map(|(op, (total_ns, count))| TopOp {
                name: op.to_string(),
                total_ns,
                count,
                share: if all == 0 {
                    0.0
                } else {
                    total_ns as f64 / all as f64
                },
            })
            .collect();
        top_ops.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
        top_ops.truncate(top);
        let has = graph_ns.count() > 0;
        Snapshot {
            events: self.events,
            graphs: self.graphs,
            ops: self.ops,
            nodes: self.nodes,
            lost: self.counters.lost(),
            events_per_s: per_s(last.map_or(0, |b| b.events)),
            graphs_per_s: per_s(last.map_or(0, |b| b.graphs)),
            latest_graph_ns: self.latest_graph_ns,
            window_graphs: graph_ns.count(),
            p50_graph_ns: has.then(|| graph_ns.quantile(0.5)),
            p99_graph_ns: has.then(|| graph_ns.quantile(0.99)),
            top_ops,
            batches: self.batches,
            batches_per_s: per_s(last.map_or(0, |b| b.batches)),
            sequences_per_batch: (batches > 0).then(|| batch_sequences as f64 / batches as f64),
            p50_token_ns: (token_ns.count() > 0).then(|| token_ns.quantile(0.5)),
            p99_token_ns: (token_ns.count() > 0).then(|| token_ns.quantile(0.99)),
            window: self.closed.iter().map(|b| b.wall).sum(),
            window_trace_ns,
            window_batches_per_s: if window_trace_ns > 0 {
                batches as f64 / (window_trace_ns as f64 / 1e9)
            } else {
                0.0
            },
            note: self.collector.oversubscription_note(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(type_code: u8, ts: u64, tid: u32, payload: Payload) -> Event<'static> {
        Event {
            type_code,
            timestamp_ns: ts,
            thread_id: tid,
            payload,
            label: None,
        }
    }

    fn graph() -> Payload {
        nested_graph(1)
    }

    /// The payload of graph `graph_ptr` (a compute nested in another is of another graph).
    fn nested_graph(graph_ptr: u64) -> Payload {
        Payload::Graph {
            graph_ptr,
            n_nodes: 1,
            n_threads: 1,
            backend_ptr: 0,
        }
    }

    fn op(tensor_ptr: u64, op_type: u32) -> Payload {
        Payload::Op {
            tensor_ptr,
            op_type,
            op_size: 0,
            backend_ptr: 0,
        }
    }

    /// A snapshot's top ops: (name, time, nodes).
    fn top_ops(snap: &Snapshot) -> Vec<(&str, u64, u64)> {
        snap.top_ops
            .iter()
            .map(|o| (o.name.as_str(), o.total_ns, o.count))
            .collect()
    }

    /// The names of op types, as the hook writes them (an op_names record).
    fn op_names(names: &[(u32, &str)]) -> Event<'static> {
        let names = ext::OpNames {
            names: names
                .iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let mut bytes = Vec::new();
        let layout = ggml_viz_reader::format::Layout::Packed;
        ext::encode_extension(&mut bytes, layout, ExtensionKind::OpNames, 0, 0, &names);
        let (event, _) = ggml_viz_reader::format::decode_record(&bytes, layout)
            .unwrap()
            .unwrap();
        event.into_owned()
    }

    #[test]
    fn outermost_graphs_ops_and_the_window() {
        let mut s = LiveStats::new(2);
        // Bucket 1: one graph of 100 ns holding a nested graph and two ops (one op type named,
        // as the writer names them: before the events that use them).
        for e in [
            op_names(&[(29, "MUL_MAT")]),
            ev(0, 0, 1, graph()),
            ev(0, 5, 1, nested_graph(2)),
            ev(2, 10, 1, op(0xa, 29)),
            ev(3, 40, 1, op(0xa, 29)),
            ev(2, 50, 1, op(0xb, 7)),
            ev(3, 60, 1, op(0xb, 7)),
            ev(1, 90, 1, nested_graph(2)),
            ev(1, 100, 1, graph()),
        ] {
            s.add(&e);
        }
        s.tick(Duration::from_millis(500));
        let snap = s.snapshot(5);
        assert_eq!(
            (snap.graphs, snap.ops, snap.nodes, snap.events),
            (1, 2, 2, 9)
        );
        assert_eq!(snap.latest_graph_ns, Some(100));
        assert_eq!(snap.graphs_per_s, 2.0);
        assert_eq!(snap.events_per_s, 18.0);
        assert!(
            snap.top_ops.is_empty(),
            "a graph compute's nodes are joined a refresh after its end was read"
        );
        s.tick(Duration::from_millis(500));
        let snap = s.snapshot(5);
        assert_eq!(top_ops(&snap), [("MUL_MAT", 30, 1), ("op 7", 10, 1)]);
        assert!((snap.top_ops[0].share - 0.75).abs() < 1e-9);
        // Older buckets leave the window.
        s.add(&ev(0, 200, 2, graph()));
        s.add(&ev(1, 1200, 2, graph()));
        s.tick(Duration::from_secs(1));
        s.tick(Duration::from_secs(1));
        let snap = s.snapshot(5);
        assert_eq!(snap.window_graphs, 1, "the first bucket left the window");
        assert_eq!(snap.p50_graph_ns, Some(1000));
        assert!(snap.top_ops.is_empty());
        assert_eq!(snap.graphs_per_s, 0.0);
        assert_eq!(snap.window, Duration::from_secs(2));
    }

    /// Threads-mode op timing: each worker thread's share of a node is an op event of its own
    /// (the workers' outside any graph compute of theirs). An op's time is its nodes' wall
    /// time, first thread's start to last thread's end, as `ggml-viz ops` has it: here 60 and
    /// 10 ns, not the shares' 30 + 50 and 5 + 10 (before, the view summed the shares: MUL_MAT
    /// 84.4 % of a demo trace's op time where `ops` and the report said 57.3 %).
    #[test]
    fn an_op_is_its_nodes_wall_time_over_their_threads_shares() {
        let mut s = LiveStats::new(4);
        s.add(&op_names(&[(29, "MUL_MAT"), (2, "ADD")]));
        for e in [
            ev(0, 0, 1, graph()),
            ev(2, 10, 1, op(0xa, 29)),
            ev(3, 40, 1, op(0xa, 29)),
            ev(2, 80, 1, op(0xb, 2)),
            ev(3, 85, 1, op(0xb, 2)),
            ev(1, 100, 1, graph()),
            // The other thread's shares, drained from its ring after the first thread's end.
            ev(2, 20, 2, op(0xa, 29)),
            ev(3, 70, 2, op(0xa, 29)),
            ev(2, 80, 2, op(0xb, 2)),
            ev(3, 90, 2, op(0xb, 2)),
        ] {
            s.add(&e);
        }
        s.all_read();
        s.tick(Duration::from_secs(1));
        let snap = s.snapshot(5);
        assert_eq!((snap.ops, snap.nodes), (4, 2));
        assert_eq!(top_ops(&snap), [("MUL_MAT", 60, 1), ("ADD", 10, 1)]);
        assert!((snap.top_ops[0].share - 60.0 / 70.0).abs() < 1e-9);
    }

    /// A decode span's begin or end, naming `seqs` (sequence, tokens) at its begin.
    fn decode(ts: u64, begin: bool, seqs: &[(i32, u32)]) -> Event<'static> {
        let span = ext::SpanBoundary {
            name: "llama_decode".into(),
            n_tokens: Some(seqs.iter().map(|s| s.1).sum()),
            seqs: if begin { seqs.to_vec() } else { Vec::new() },
            ..ext::SpanBoundary::default()
        };
        let kind = if begin {
            ExtensionKind::SpanBegin
        } else {
            ExtensionKind::SpanEnd
        };
        let mut bytes = Vec::new();
        let layout = ggml_viz_reader::format::Layout::Packed;
        ext::encode_extension(&mut bytes, layout, kind, ts, 1, &span);
        let (event, _) = ggml_viz_reader::format::decode_record(&bytes, layout)
            .unwrap()
            .unwrap();
        event.into_owned()
    }

    /// A server's batches: counted, sequences per batch averaged, and each generated token's
    /// latency the time since its sequence's previous batch ended (a prefill starts the count);
    /// a decode that names no sequences is no batch of a server.
    #[test]
    fn batches_sequences_and_token_latency() {
        let mut s = LiveStats::new(2);
        type Batch = (u64, u64, &'static [(i32, u32)]);
        let batches: [Batch; 5] = [
            (0, 10, &[(0, 5)]),
            (20, 30, &[(0, 1), (1, 4)]),
            (40, 50, &[(0, 1), (1, 1)]),
            (60, 100, &[(0, 1)]),
            (110, 120, &[]),
        ];
        for (begin, end, seqs) in batches {
            s.add(&decode(begin, true, seqs));
            s.add(&decode(end, false, &[]));
        }
        s.tick(Duration::from_secs(2));
        let snap = s.snapshot(5);
        assert_eq!(snap.batches, 4);
        assert_eq!(snap.batches_per_s, 2.0);
        assert_eq!(snap.sequences_per_batch, Some(6.0 / 4.0));
        // Tokens of sequence 0 at 30, 50, 100 (after its prefill at 10); of sequence 1 at 50.
        assert_eq!(snap.p50_token_ns, Some(20));
        assert_eq!(snap.p99_token_ns, Some(50));
    }

    /// A finished trace read at once (the view started after the program ended): the window's
    /// span and the batch rate of the end line are over the trace's own time, not the
    /// millisecond the reading took (before: "19 batches (3008.6/s)" and "last 0 s" for
    /// llama-bench's 171 ms, 19-batch trace).
    #[test]
    fn a_trace_read_at_once_has_its_window_over_its_own_time() {
        let mut s = LiveStats::new(2);
        for i in 0..4u64 {
            let t = i * 500_000_000;
            s.add(&decode(t, true, &[(0, 1)]));
            s.add(&decode(t + 100_000_000, false, &[]));
        }
        s.tick(Duration::from_millis(1));
        let snap = s.snapshot(5);
        assert_eq!(snap.window_trace_ns, 1_600_000_000);
        assert!((snap.window_batches_per_s - 4.0 / 1.6).abs() < 1e-9);
        // The refresh's own rate stays over the wall time it covered.
        assert_eq!(snap.batches_per_s, 4000.0);
    }

    /// A trace cut off in the middle of a graph and an op (the writer killed): the view's totals
    /// are `info`'s, whose counts are of what began (before: the view counted what ended, one
    /// graph short of `info` on a killed writer's file).
    #[test]
    fn totals_agree_with_the_trace_stats_when_the_trace_stops_mid_graph() {
        let events = [
            ev(0, 0, 1, graph()),
            ev(2, 10, 1, op(0xa, 29)),
            ev(3, 40, 1, op(0xa, 29)),
            ev(1, 50, 1, graph()),
            ev(0, 60, 1, graph()),
            ev(2, 70, 1, op(0xa, 29)),
        ];
        let mut live = LiveStats::new(2);
        let mut stats = ggml_viz_reader::TraceStats::default();
        for e in &events {
            live.add(e);
            stats.add(e);
        }
        live.tick(Duration::from_secs(1));
        let snap = live.snapshot(5);
        assert_eq!(
            (snap.events, snap.graphs, snap.ops, snap.nodes),
            (stats.events(), stats.graph_computes, stats.ops, stats.nodes)
        );
        assert_eq!((snap.graphs, snap.ops, snap.nodes), (2, 2, 2));
        assert_eq!(snap.window_graphs, 1, "durations are of graphs that ended");
    }
}
