//! The counts and durations of a trace, computed in one pass over its events.
//!
//! A "graph compute" is an outermost graph begin/end pair on its thread. Pairs nested inside one
//! (the scheduler's splits, the backend call under them) are its sub-graphs: counted as such,
//! never as more graph computes.

use super::memory::MemoryStats;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use crate::format::Damage;
use crate::format::ext::{Counters, Metadata, parse_payload};
use crate::format::{Event, EventType, ExtensionKind, Payload};

#[derive(Clone, Debug, Default)]
pub struct TraceStats {
    /// Events per type code, extension records excluded.
    pub by_code: BTreeMap<u8, u64>,
    /// Extension records per kind.
    pub extensions: BTreeMap<ExtensionKind, u64>,
    /// Extension records of ours whose JSON could not be read.
    pub unreadable_extensions: u64,
    pub first_timestamp_ns: Option<u64>,
    pub last_timestamp_ns: Option<u64>,
    pub threads: BTreeSet<u32>,
    /// Outermost graph pairs.
    pub graph_computes: u64,
    /// Graph pairs nested inside another on the same thread.
    pub sub_graphs: u64,
    /// The most threads a graph compute said it ran on (ggml's CPU graph compute says its
    /// plan's; the scheduler's and the backend's say 0).
    pub graph_threads: u32,
    /// Durations of the outermost graph pairs, in file order.
    pub graph_durations_ns: Vec<u64>,
    pub unmatched_graph_begins: u64,
    pub unmatched_graph_ends: u64,
    /// Op begin events.
    pub ops: u64,
    /// Op begin events that name a backend inside a graph compute of their thread: timed through
    /// a scheduler's eval callback (in a threads-mode trace, those of graphs with nodes on other
    /// backends than the CPU).
    pub ops_with_backend: u64,
    /// Op begin events that name a backend outside any graph compute of their thread: nodes a
    /// device timed itself, each on its queue's lane (one per node).
    pub device_ops: u64,
    /// Op begin events per op type, and the names the trace gives the types (op_names records).
    pub ops_by_type: BTreeMap<u32, u64>,
    /// Op begin events on a thread inside a graph compute of its own, and those a device timed:
    /// one per node. A graph
    /// compute's caller times each of its nodes (the eval callback) or computes a share of each
    /// (threads-mode op timing: the caller is worker 0 of ggml's pool and of OpenMP's team);
    /// the other workers' shares lie outside any graph compute of theirs.
    pub nodes: u64,
    /// Those per op type.
    pub nodes_by_type: BTreeMap<u32, u64>,
    pub op_names: HashMap<u32, String>,
    /// Events that carry a label.
    pub labels: u64,
    /// Events whose timestamp is earlier than the previous one of the same thread.
    pub backwards_timestamps: u64,
    /// Backend buffers (TENSOR_ALLOC / TENSOR_FREE): counts, bytes, and the peak of live bytes.
    pub memory: MemoryStats,
    pub metadata: Option<Metadata>,
    /// The last counters record (running totals).
    pub counters: Option<Counters>,
    pub damage: Option<Damage>,
    open_graphs: OpenGraphs,
    last_by_thread: HashMap<u32, u64>,
}

/// The graph computes open on each thread, each known by its entry point (the event's label)
/// and graph, with when it began: which computes are outermost (begun with none open on their
/// thread) and how long they took. No ggml entry point computes a graph inside a compute of its
/// own, so a begin of a compute already open on its thread, or an end of one below the latest
/// begun, means that the ends of the computes begun after it were not recorded (dropped with a
/// full ring): they are closed, as unmatched begins, and one lost end does not leave every later
/// compute counted as nested in it.
#[derive(Clone, Debug, Default)]
pub struct OpenGraphs {
    open: HashMap<u32, Vec<(u64, u64)>>,
}

/// What a graph compute's begin or end did on its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphStep {
    /// The compute is an outermost one.
    pub outermost: bool,
    /// When the compute began (for an end).
    pub begin_ns: u64,
    /// Computes closed because their ends were lost.
    pub lost_ends: u64,
}

impl OpenGraphs {
    /// A graph compute begins (`e` is its begin event).
    pub fn begin(&mut self, e: &Event<'_>) -> GraphStep {
        let (key, open) = (graph_key(e), self.open.entry(e.thread_id).or_default());
        let lost_ends = match open.iter().position(|&(k, _)| k == key) {
            Some(i) => {
                let lost = (open.len() - i) as u64;
                open.truncate(i);
                lost
            }
            None => 0,
        };
        open.push((key, e.timestamp_ns));
        GraphStep {
            outermost: open.len() == 1,
            begin_ns: e.timestamp_ns,
            lost_ends,
        }
    }

    /// A graph compute ends (`e` is its end event); `None` where no compute of its entry point
    /// and graph is open on its thread (its begin was not recorded).
    pub fn end(&mut self, e: &Event<'_>) -> Option<GraphStep> {
        let (key, open) = (graph_key(e), self.open.get_mut(&e.thread_id)?);
        let i = open.iter().rposition(|&(k, _)| k == key)?;
        let lost_ends = (open.len() - i - 1) as u64;
        let (_, begin_ns) = open[i];
        open.truncate(i);
        Some(GraphStep {
            outermost: open.is_empty(),
            begin_ns,
            lost_ends,
        })
    }

    /// When the outermost compute open on `thread` began, if one is.
    pub fn outermost_begin(&self, thread: u32) -> Option<u64> {
        self.open.get(&thread)?.first().map(|&(_, begin)| begin)
    }

    /// When the earliest outermost compute still open, on any thread, began.
    pub fn open_since(&self) -> Option<u64> {
        self.open
            .values()
            .filter_map(|o| o.first())
            .map(|&(_, b)| b)
            .min()
    }

    /// Closes every open compute: how many were open.
    pub fn close_all(&mut self) -> u64 {
        let open = self.open.values().map(|o| o.len() as u64).sum();
        self.open.clear();
        open
    }
}

/// A graph compute's entry point and graph, from its begin or end event, hashed.
fn graph_key(e: &Event<'_>) -> u64 {
    let graph = match e.payload {
        Payload::Graph { graph_ptr, .. } => graph_ptr,
        _ => 0,
    };
    let mut h = rustc_hash::FxHasher::default();
    e.label.as_deref().unwrap_or_default().hash(&mut h);
    graph.hash(&mut h);
    h.finish()
}

/// What to tell the user of a program whose graph computes ran on `graph_threads` threads where
/// the process had `n_cpus` CPUs to run on (0: not known): `None` unless there were more
/// threads than CPUs. ggml's threads meet at a barrier after every node; a thread that waits for
/// a core makes the others wait for it: OpenMP's threads sleep there, and the time lies between
/// nodes; the threads of ggml's own pool spin, keeping the cores from the ones they wait for,
/// and the nodes themselves grow (here, `llama-bench` 512×8 at 4 threads on 2 CPUs: tg64 157
/// against 568 tok/s at 2 with OpenMP, 1.2 against 641 with ggml's pool).
pub fn oversubscription_note(graph_threads: u32, n_cpus: u32) -> Option<String> {
    (n_cpus > 0 && graph_threads > n_cpus).then(|| {
        format!(
            "the graph computes ran {graph_threads} threads on {n_cpus} CPUs: at the barrier \
             after each node the threads waited for those waiting for a core (with OpenMP, time \
             between nodes; with ggml's own spinning thread pool, longer nodes); at most \
             {n_cpus} threads may well compute faster"
        )
    })
}

impl TraceStats {
    /// [`oversubscription_note`] for this trace (the CPUs from its metadata record).
    pub fn oversubscription_note(&self) -> Option<String> {
        oversubscription_note(self.graph_threads, self.metadata.as_ref()?.n_cpus)
    }

    /// Stats of a whole trace given as a `Result` iterator (the damage, if any, is kept).
    pub fn collect<'a>(events: impl IntoIterator<Item = Result<Event<'a>, Damage>>) -> TraceStats {
        let mut stats = TraceStats::default();
        for item in events {
            match item {
                Ok(event) => stats.add(&event),
                Err(damage) => stats.damage = Some(damage),
            }
        }
        stats.finish();
        stats
    }

    pub fn add(&mut self, event: &Event<'_>) {
        let ts = event.timestamp_ns;
        self.first_timestamp_ns = Some(self.first_timestamp_ns.map_or(ts, |t| t.min(ts)));
        self.last_timestamp_ns = Some(self.last_timestamp_ns.map_or(ts, |t| t.max(ts)));
        self.labels += u64::from(event.label.is_some());
        if let Payload::Extension(ext) = event.payload {
            // The writer's own records: not the program's threads or clock.
            *self.extensions.entry(ext.kind).or_default() += 1;
            self.add_extension(ext.kind, event.label.as_deref().unwrap_or_default());
            return;
        }
        self.threads.insert(event.thread_id);
        if let Some(prev) = self.last_by_thread.insert(event.thread_id, ts) {
            self.backwards_timestamps += u64::from(ts < prev);
        }
        *self.by_code.entry(event.type_code).or_default() += 1;
        match event.event_type() {
            Some(EventType::GraphComputeBegin) => {
                if let Payload::Graph { n_threads, .. } = event.payload {
                    self.graph_threads = self.graph_threads.max(n_threads);
                }
                let step = self.open_graphs.begin(event);
                self.unmatched_graph_begins += step.lost_ends;
                if step.outermost {
                    self.graph_computes += 1;
                } else {
                    self.sub_graphs += 1;
                }
            }
            Some(EventType::GraphComputeEnd) => match self.open_graphs.end(event) {
                Some(step) => {
                    self.unmatched_graph_begins += step.lost_ends;
                    if step.outermost {
                        self.graph_durations_ns
                            .push(ts.saturating_sub(step.begin_ns));
                    }
                }
                None => self.unmatched_graph_ends += 1,
            },
            Some(EventType::OpComputeBegin) => {
                self.ops += 1;
                if let Payload::Op {
                    op_type,
                    backend_ptr,
                    ..
                } = event.payload
                {
                    *self.ops_by_type.entry(op_type).or_default() += 1;
                    let in_graph = self.open_graphs.outermost_begin(event.thread_id).is_some();
                    // A node a device timed is on its queue's lane, where no graph compute runs.
                    let on_device = !in_graph && backend_ptr != 0;
                    self.ops_with_backend += u64::from(in_graph && backend_ptr != 0);
                    self.device_ops += u64::from(on_device);
                    if in_graph || on_device {
                        self.nodes += 1;
                        *self.nodes_by_type.entry(op_type).or_default() += 1;
                    }
                }
            }
            Some(EventType::TensorAlloc) => {
                if let Payload::Memory { ptr, size } = event.payload {
                    let label = event.label.as_deref().unwrap_or_default();
                    self.memory.alloc(ptr, size, label);
                }
            }
            Some(EventType::TensorFree) => {
                if let Payload::Memory { ptr, .. } = event.payload {
                    self.memory.free(ptr);
                }
            }
            _ => {}
        }
    }

    fn add_extension(&mut self, kind: ExtensionKind, label: &[u8]) {
        let readable = match kind {
            ExtensionKind::Metadata => {
                self.metadata = parse_payload(label);
                self.metadata.is_some()
            }
            ExtensionKind::Counters => {
                self.counters = parse_payload(label);
                self.counters.is_some()
            }
            ExtensionKind::OpNames => match parse_payload::<crate::format::ext::OpNames>(label) {
                Some(names) => {
                    self.op_names.extend(
                        names
                            .names
                            .into_iter()
                            .filter_map(|(k, v)| Some((k.parse().ok()?, v))),
                    );
                    true
                }
                None => false,
            },
            ExtensionKind::BufferUse => match parse_payload::<crate::format::ext::BufferUse>(label)
            {
                Some(used) => {
                    self.memory.use_of(used);
                    true
                }
                None => false,
            },
            ExtensionKind::LiveBuffers => {
                self.memory.live_at_exit = parse_payload::<crate::format::ext::LiveBuffers>(label)
                    .map(|l| l.buffers.len() as u64);
                self.memory.live_at_exit.is_some()
            }
            _ => parse_payload::<serde_json::Value>(label).is_some(),
        };
        self.unreadable_extensions += u64::from(!readable);
    }

    /// Closes the pass: graph begins still open are counted as unmatched.
    pub fn finish(&mut self) {
        self.unmatched_graph_begins += self.open_graphs.close_all();
    }

    /// Events in the trace, extension records included.
    pub fn events(&self) -> u64 {
        self.by_code.values().sum::<u64>() + self.extensions.values().sum::<u64>()
    }

    pub fn count(&self, ty: EventType) -> u64 {
        self.by_code.get(&ty.code()).copied().unwrap_or(0)
    }

    /// Op types with their op begin events, most frequent first, named where the trace names
    /// them.
    pub fn op_type_counts(&self) -> Vec<(String, u64)> {
        self.type_counts(&self.ops_by_type)
    }

    /// Op types with their nodes ([`TraceStats::nodes`]), most frequent first.
    pub fn node_type_counts(&self) -> Vec<(String, u64)> {
        self.type_counts(&self.nodes_by_type)
    }

    fn type_counts(&self, counts: &BTreeMap<u32, u64>) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = counts
            .iter()
            .map(|(t, n)| {
                (
                    self.op_names
                        .get(t)
                        .cloned()
                        .unwrap_or_else(|| format!("op {t}")),
                    *n,
                )
            })
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Type codes outside 0..=8 (other writers' extensions, newer types) and their counts.
    pub fn unknown_codes(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        self.by_code
            .iter()
            .filter(|(code, _)| EventType::from_code(**code).is_none())
            .map(|(c, n)| (*c, *n))
    }
}

/// Mean, median and 99th percentile of durations (nearest rank), in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DurationSummary {
    pub count: usize,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl DurationSummary {
    pub fn of(durations: &[u64]) -> Option<DurationSummary> {
        if durations.is_empty() {
            return None;
        }
        let mut sorted = durations.to_vec();
        sorted.sort_unstable();
        let rank =
            |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        Some(DurationSummary {
            count: sorted.len(),
            mean_ns: sorted.iter().map(|&d| d as f64).sum::<f64>() / sorted.len() as f64,
            p50_ns: rank(0.5),
            p99_ns: rank(0.99),
            max_ns: *sorted.last().expect("not empty"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ty: EventType, ts: u64, thread_id: u32, payload: Payload) -> Event<'static> {
        Event {
            type_code: ty.code(),
            timestamp_ns: ts,
            thread_id,
            payload,
            label: None,
        }
    }

    fn op(op_type: u32) -> Payload {
        Payload::Op {
            tensor_ptr: 0x1000 + u64::from(op_type),
            op_type,
            op_size: 0,
            backend_ptr: 0,
        }
    }

    /// A graph compute's end lost (dropped with a full ring): the end of the compute it was
    /// inside closes it (an unmatched begin), instead of ending it and leaving the outer one open
    /// with every later compute counted as nested in it (before: 1 graph compute of 3, 5
    /// sub-graphs).
    #[test]
    fn a_lost_graph_end_does_not_nest_every_later_compute() {
        let graph = |ptr| Payload::Graph {
            graph_ptr: ptr,
            n_nodes: 1,
            n_threads: 1,
            backend_ptr: 0,
        };
        let (begin, end) = (EventType::GraphComputeBegin, EventType::GraphComputeEnd);
        let mut events = Vec::new();
        for k in 0..3u64 {
            let t = 100 * k;
            // Each compute: the scheduler's (graph 1) holding the CPU backend's (graph 2).
            events.extend([
                event(begin, t, 1, graph(1)),
                event(begin, t + 1, 1, graph(2)),
                event(EventType::OpComputeBegin, t + 2, 1, op(7)),
                event(EventType::OpComputeEnd, t + 3, 1, op(7)),
            ]);
            // The first compute's inner end is lost.
            if k != 0 {
                events.push(event(end, t + 4, 1, graph(2)));
            }
            events.push(event(end, t + 10, 1, graph(1)));
        }
        let stats = TraceStats::collect(events.into_iter().map(Ok));
        assert_eq!(
            (stats.graph_computes, stats.sub_graphs, stats.nodes),
            (3, 3, 3)
        );
        assert_eq!(stats.graph_durations_ns, [10, 10, 10]);
        assert_eq!(
            (stats.unmatched_graph_begins, stats.unmatched_graph_ends),
            (1, 0)
        );
        // Both ends of a compute lost: the next compute of the same entry point and graph
        // begins while it is still open, and closes it.
        let events = [
            event(begin, 0, 1, graph(1)),
            event(begin, 1, 1, graph(2)),
            event(begin, 100, 1, graph(1)),
            event(begin, 101, 1, graph(2)),
            event(EventType::OpComputeBegin, 102, 1, op(7)),
            event(end, 104, 1, graph(2)),
            event(end, 110, 1, graph(1)),
        ];
        let stats = TraceStats::collect(events.into_iter().map(Ok));
        assert_eq!(
            (stats.graph_computes, stats.sub_graphs, stats.nodes),
            (2, 2, 1)
        );
        assert_eq!(stats.graph_durations_ns, [10]);
        assert_eq!(stats.unmatched_graph_begins, 2);
    }

    #[test]
    fn more_graph_threads_than_cpus_is_said() {
        let graph = |n_threads| Payload::Graph {
            graph_ptr: 1,
            n_nodes: 2,
            n_threads,
            backend_ptr: 0,
        };
        // The scheduler's and the backend's graph computes say 0 threads, ggml's CPU one its
        // plan's: the most is what counts.
        let events = [0, 0, 3, 0, 0, 0].into_iter().enumerate().map(|(i, n)| {
            let ty = if i < 3 {
                EventType::GraphComputeBegin
            } else {
                EventType::GraphComputeEnd
            };
            Ok(event(ty, i as u64, 1, graph(n)))
        });
        let mut stats = TraceStats::collect(events);
        assert_eq!(stats.graph_threads, 3);
        // No metadata record: the CPUs are not known, nothing is said.
        assert_eq!(stats.oversubscription_note(), None);
        for (cpus, said) in [(2, true), (3, false), (4, false), (0, false)] {
            stats.metadata = Some(Metadata {
                n_cpus: cpus,
                ..Default::default()
            });
            let note = stats.oversubscription_note();
            assert_eq!(note.is_some(), said, "{cpus} CPUs: {note:?}");
            if let Some(note) = note {
                assert!(note.contains("3 threads on 2 CPUs"), "{note}");
            }
        }
    }

    #[test]
    fn nodes_are_the_ops_their_graph_s_caller_begins() {
        let graph = Payload::Graph {
            graph_ptr: 1,
            n_nodes: 2,
            n_threads: 3,
            backend_ptr: 0,
        };
        let mut events = vec![event(EventType::GraphComputeBegin, 0, 1, graph)];
        // Two nodes (op types 7 and 9), a share of each on the caller (thread 1) and on two
        // pool workers.
        for (i, op_type) in [7, 9].into_iter().enumerate() {
            let ts = 10 + 10 * i as u64;
            for thread in [1, 2, 3] {
                events.push(event(EventType::OpComputeBegin, ts, thread, op(op_type)));
                events.push(event(EventType::OpComputeEnd, ts + 5, thread, op(op_type)));
            }
        }
        events.push(event(EventType::GraphComputeEnd, 40, 1, graph));
        // An op event outside any graph compute of its thread is not a node.
        events.push(event(EventType::OpComputeBegin, 50, 1, op(7)));
        let stats = TraceStats::collect(events.into_iter().map(Ok));
        assert_eq!((stats.ops, stats.nodes), (7, 2));
        assert_eq!(
            stats.node_type_counts(),
            vec![("op 7".to_string(), 1), ("op 9".to_string(), 1)]
        );
        assert_eq!(stats.op_type_counts()[0], ("op 7".to_string(), 4));
    }
}
