//! What a report shows, computed from the telemetry model in one pass: aggregates over every
//! span, and the spans the timeline draws (all of them up to a budget; beyond it, the op spans of
//! a uniform sample of their parent graphs, said on the page).
//!
//! Time per op type, tensor and backend counts nodes where an input is a GGMLVIZ trace with op
//! timings: its op spans are threads' shares of nodes (threads-mode op timing), joined into
//! nodes by the reader's op analysis as `ggml-viz ops` joins them ([`OpRows`]); other
//! inputs' op spans count one each.

use std::collections::HashMap;

use serde::Serialize;

use ggml_viz_reader::telemetry::{LaneId, ProcessId, Record, RecordSink, Span};

use super::sampling::TimelineSample;
use super::series::{Latency, POINT_BUDGET, Series, TopKind, TopSpan, latency, memory};
use super::slots::{SequenceRow, SequenceTable};
use super::tables::{Aggregate, OpRows, add, layer_number, merge, sorted};
use crate::say::MIB;

/// Rows of the per-tensor table.
const TOP_TENSORS: usize = 40;

/// Everything the page renders, serialized into it as JSON.
#[derive(Debug, Default, Serialize)]
pub struct ReportData {
    pub title: String,
    pub inputs: Vec<String>,
    pub generator: String,
    pub summary: Totals,
    /// Strings the span columns point into.
    pub strings: Vec<String>,
    pub lanes: Vec<LaneOut>,
    pub spans: SpanColumns,
    pub sampling: Sampling,
    pub by_op: Vec<Aggregate>,
    pub by_tensor: Vec<Aggregate>,
    pub tensors_not_shown: usize,
    pub by_backend: Vec<Aggregate>,
    /// Nodes by layer, in layer order (nodes of no layer last): empty without nodes.
    pub by_layer: Vec<Aggregate>,
    /// What `by_op` groups: nodes, op spans, or every span by name when there are neither.
    pub by_op_source: String,
    /// What op timing cost each input's run, where its trace can tell (see `ops`).
    pub timing_cost: Vec<String>,
    pub latency: Latency,
    /// A batching server's sequences (slots), in the timeline's order.
    pub sequences: Vec<SequenceRow>,
    pub memory: Vec<Series>,
    pub memory_note: Option<String>,
    /// The buffers by what they held (weights, KV cache, compute) and buffer type.
    pub memory_by_use: Vec<MemoryUseRow>,
}

/// One row of the memory table (see `ggml_viz_reader::MemoryRow`), of one input.
#[derive(Debug, Serialize)]
pub struct MemoryUseRow {
    pub input: String,
    pub held: &'static str,
    pub buffer_type: String,
    pub buffers: u64,
    pub peak_bytes: u64,
    pub end_bytes: u64,
    /// Both in MiB as llama.cpp prints its buffer sizes (`%.2f`: 0.125 is `0.12`).
    pub peak_mib: String,
    pub end_mib: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Totals {
    pub wall_ns: u64,
    pub graphs: u64,
    /// Nodes of traces with op timings, and op spans of other inputs.
    pub ops: u64,
    pub spans: u64,
    pub events: u64,
    pub dropped: u64,
    /// Damage found in the inputs (byte offsets named), and other warnings.
    pub damage: Vec<String>,
    pub warnings: Vec<String>,
    pub warnings_not_shown: usize,
    /// Whether timestamps are epoch nanoseconds.
    pub clock_relative: bool,
    /// The absolute start of the timeline (decimal, it may exceed 2^53).
    pub origin_ns: String,
}

#[derive(Debug, Default, Serialize)]
pub struct LaneOut {
    pub name: String,
    pub process: String,
    pub rows: u32,
}

/// One column per field: compact JSON, and typed arrays in the page.
#[derive(Debug, Default, Serialize)]
pub struct SpanColumns {
    pub lane: Vec<u32>,
    pub depth: Vec<u32>,
    /// Nanoseconds from the origin.
    pub start: Vec<u64>,
    pub dur: Vec<u64>,
    pub self_ns: Vec<u64>,
    pub name: Vec<u32>,
    pub cat: Vec<u32>,
    /// Index into `strings` (0: none) for the tensor name and for its type/shape/backend line.
    pub tensor: Vec<u32>,
    pub detail: Vec<u32>,
    pub bytes: Vec<u64>,
}

impl SpanColumns {
    /// Keeps the spans whose `keep` is true.
    fn retain(&mut self, keep: &[bool]) {
        fn column<T>(values: &mut Vec<T>, keep: &[bool]) {
            let mut i = 0;
            values.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        column(&mut self.lane, keep);
        column(&mut self.depth, keep);
        column(&mut self.start, keep);
        column(&mut self.dur, keep);
        column(&mut self.self_ns, keep);
        column(&mut self.name, keep);
        column(&mut self.cat, keep);
        column(&mut self.tensor, keep);
        column(&mut self.detail, keep);
        column(&mut self.bytes, keep);
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Sampling {
    pub total_spans: u64,
    pub drawn_spans: u64,
    /// Op spans drawn for 1 parent span in this many (1: all).
    pub op_stride: u64,
}

/// A [`RecordSink`] that builds [`ReportData`] as the records arrive.
pub struct ReportBuilder {
    data: ReportData,
    /// Which spans are drawn (all, up to the budget).
    sample: TimelineSample,
    /// The current input's op spans (see [`ReportBuilder::end_input`]).
    input_ops: OpRows,
    /// Spans, counter samples and instants met: what an input had, for inputs that are not
    /// traces.
    pub items: u64,
    /// The earliest time of anything: the origin of the page's times.
    earliest_ns: u64,
    string_ids: HashMap<String, u32>,
    process_names: HashMap<ProcessId, String>,
    /// Our lane id -> (process, name, index in `data.lanes` once it has a span).
    lanes: HashMap<LaneId, (ProcessId, String, Option<u32>)>,
    by_op: HashMap<String, Aggregate>,
    by_name: HashMap<String, Aggregate>,
    by_tensor: HashMap<String, Aggregate>,
    by_backend: HashMap<String, Aggregate>,
    by_layer: HashMap<String, Aggregate>,
    by_graph_backend: HashMap<String, Aggregate>,
    /// How the inputs' ops were timed, one note per distinct way.
    op_timing: Vec<String>,
    /// Graph spans whose parent is still open, by parent id: outermost unless it is a graph.
    graphs_by_parent: HashMap<u64, Vec<(String, Aggregate)>>,
    tops: HashMap<LaneId, Vec<TopSpan>>,
    sequences: SequenceTable,
    counters: HashMap<String, Vec<(u64, f64)>>,
    first_ns: u64,
    last_ns: u64,
}

impl ReportBuilder {
    pub fn new(title: String, inputs: Vec<String>) -> ReportBuilder {
        let mut b = ReportBuilder {
            data: ReportData {
                title,
                inputs,
                generator: format!("ggml-viz {}", env!("CARGO_PKG_VERSION")),
                ..ReportData::default()
            },
            sample: TimelineSample::new(),
            input_ops: OpRows::default(),
            items: 0,
            earliest_ns: u64::MAX,
            string_ids: HashMap::new(),
            process_names: HashMap::new(),
            lanes: HashMap::new(),
            by_op: HashMap::new(),
            by_name: HashMap::new(),
            by_tensor: HashMap::new(),
            by_backend: HashMap::new(),
            by_layer: HashMap::new(),
            by_graph_backend: HashMap::new(),
            op_timing: Vec::new(),
            graphs_by_parent: HashMap::new(),
            tops: HashMap::new(),
            sequences: SequenceTable::default(),
            counters: HashMap::new(),
            first_ns: u64::MAX,
            last_ns: 0,
        };
        b.string(""); // index 0: none
        b
    }

    fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.data.strings.len() as u32;
        self.data.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    fn lane_index(&mut self, lane: LaneId) -> u32 {
        let (process, name, index) = self
            .lanes
            .entry(lane)
            .or_insert_with(|| (ProcessId::default(), format!("lane {lane}"), None));
        if let Some(i) = index {
            return *i;
        }
        let i = self.data.lanes.len() as u32;
        *index = Some(i);
        let process = self.process_names.get(process).cloned().unwrap_or_default();
        self.data.lanes.push(LaneOut {
            name: name.clone(),
            process,
            rows: 1,
        });
        i
    }

    fn outermost_graph(&mut self, backend: &str, graph: &Aggregate) {
        self.data.summary.graphs += 1;
        add(
            &mut self.by_graph_backend,
            backend,
            graph.total_ns,
            graph.self_ns.unwrap_or(0),
        );
    }

    fn add_span(&mut self, span: &Span) {
        self.data.summary.spans += 1;
        self.earliest_ns = self.earliest_ns.min(span.start_ns);
        self.first_ns = self.first_ns.min(span.start_ns);
        self.last_ns = self.last_ns.max(span.end_ns);
        self.sequences.span(span);
        let tensor = span.arg("tensor").map(|a| a.to_string());
        let backend = span.arg("backend").map(|a| a.to_string());
        let is_op = span.category == "op";
        if is_op {
            let ops = &mut self.input_ops;
            ops.count += 1;
            add(&mut ops.by_op, &span.name, span.duration_ns(), span.self_ns);
            if let Some(t) = &tensor {
                add(&mut ops.by_tensor, t, span.duration_ns(), span.self_ns);
            }
            add(
                &mut ops.by_backend,
                backend.as_deref().unwrap_or("(unknown)"),
                span.duration_ns(),
                span.self_ns,
            );
        } else {
            add(
                &mut self.by_name,
                &span.name,
                span.duration_ns(),
                span.self_ns,
            );
        }
        // An outermost graph compute is a graph span whose parent is not a graph; parents close
        // after their children, so graph spans wait for theirs.
        let waiting = self.graphs_by_parent.remove(&span.id).unwrap_or_default();
        if span.category != "graph" {
            for (backend, graph) in waiting {
                self.outermost_graph(&backend, &graph);
            }
        }
        if span.category == "graph" {
            let key = backend.clone().unwrap_or_else(|| "(unknown)".into());
            let graph = Aggregate {
                count: 1,
                total_ns: span.duration_ns(),
                self_ns: Some(span.self_ns),
                ..Aggregate::default()
            };
            match span.parent {
                Some(parent) => self
                    .graphs_by_parent
                    .entry(parent)
                    .or_default()
                    .push((key, graph)),
                None => self.outermost_graph(&key, &graph),
            }
        }
        let kind = match (span.category.as_str(), span.name.as_str()) {
            ("llama", "llama_decode" | "llama_process" | "llama_encode") => Some(TopKind::Decode),
            // Other llama calls (`llama_memory_seq_rm` between a server's decodes) are not waits
            // that complete a call.
            ("llama", _) => None,
            ("graph", _) => Some(TopKind::Graph),
            _ => Some(TopKind::Other),
        };
        if span.depth == 0
            && let Some(kind) = kind
        {
            self.tops.entry(span.lane).or_default().push(TopSpan {
                start: span.start_ns,
                end: span.end_ns,
                kind,
                n_tokens: span.arg_uint("n_tokens"),
                // Where the batch's sequences are known: a sequence's prompt in it.
                prefill: span.arg_uint("prefill_tokens").map(|n| n > 0),
            });
        }
        let key = TimelineSample::key(span, is_op);
        if !self.sample.admits(key) {
            return;
        }
        let lane = self.lane_index(span.lane);
        let rows = &mut self.data.lanes[lane as usize].rows;
        *rows = (*rows).max(span.depth + 1);
        let detail = [
            span.arg("type").map(|a| a.to_string()),
            span.arg("shape").map(|a| a.to_string()),
            backend.map(|b| format!("on {b}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
        let bytes = span.arg_uint("bytes").unwrap_or(0);
        let name = self.string(&span.name);
        let cat = self.string(&span.category);
        let tensor = tensor.map_or(0, |t| self.string(&t));
        let detail = self.string(&detail);
        let c = &mut self.data.spans;
        c.lane.push(lane);
        c.depth.push(span.depth);
        // From the origin, known at the end.
        c.start.push(span.start_ns);
        c.dur.push(span.duration_ns());
        c.self_ns.push(span.self_ns);
        c.name.push(name);
        c.cat.push(cat);
        c.tensor.push(tensor);
        c.detail.push(detail);
        c.bytes.push(bytes);
        if let Some(keep) = self.sample.drawn(key) {
            self.data.spans.retain(&keep);
        }
    }

    /// Adds what was found outside the model: events and drops counted by the trace reader,
    /// damage and warnings.
    pub fn add_input_totals(&mut self, events: u64, dropped: u64, damage: Option<String>) {
        self.data.summary.events += events;
        self.data.summary.dropped += dropped;
        self.data.summary.damage.extend(damage);
    }

    /// The end of an input: its op spans count in the per-op, per-tensor and per-backend tables,
    /// unless the reader joined them into `nodes` (a GGMLVIZ trace with op timings), which count
    /// instead (a share of a node on each of its threads is not an op of its own).
    pub fn end_input(&mut self, nodes: OpRows) {
        let spans = std::mem::take(&mut self.input_ops);
        let rows = if nodes.count == 0 { spans } else { nodes };
        self.data.summary.ops += rows.count;
        merge(&mut self.by_op, rows.by_op);
        merge(&mut self.by_tensor, rows.by_tensor);
        merge(&mut self.by_backend, rows.by_backend);
        merge(&mut self.by_layer, rows.by_layer);
    }

    /// The memory table of input `input` (where its buffers said what they held).
    pub fn add_memory_by_use(&mut self, input: &str, rows: Vec<ggml_viz_reader::MemoryRow>) {
        if rows
            .iter()
            .all(|r| r.role == ggml_viz_reader::BufferRole::Other)
        {
            return;
        }
        self.data
            .memory_by_use
            .extend(rows.into_iter().map(|r| MemoryUseRow {
                input: input.to_string(),
                held: r.role.name(),
                buffer_type: r.buffer_type,
                buffers: r.buffers,
                peak_bytes: r.peak_bytes,
                end_bytes: r.end_bytes,
                peak_mib: format!("{:.2} MiB", r.peak_bytes as f64 / MIB),
                end_mib: format!("{:.2} MiB", r.end_bytes as f64 / MIB),
            }));
    }

    /// What op timing cost an input's run (one sentence, named for the input).
    pub fn add_timing_cost(&mut self, sentence: String) {
        self.data.timing_cost.push(sentence);
    }

    /// A warning the page lists with the inputs' own.
    pub fn warn(&mut self, warning: String) {
        self.data.summary.warnings.push(warning);
    }

    /// How an input's ops were timed (`op_timing_note` of its metadata), said beside the
    /// per-op table.
    pub fn add_op_timing(&mut self, note: String) {
        if !self.op_timing.contains(&note) {
            self.op_timing.push(note);
        }
    }

    /// Lanes in the order the page draws them: per process, its threads as met, then its
    /// sequences (a server's slots) by number. Returns each lane's new index by its old one.
    fn order_lanes(&mut self) -> Vec<u32> {
        let key = |l: &LaneOut| {
            let sequence = l
                .name
                .strip_prefix("sequence ")
                .and_then(|n| n.parse::<i64>().ok());
            (l.process.clone(), sequence.is_some(), sequence)
        };
        let mut order: Vec<usize> = (0..self.data.lanes.len()).collect();
        order.sort_by_key(|&i| key(&self.data.lanes[i]));
        let mut new_index = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new as u32;
        }
        let mut lanes: Vec<Option<LaneOut>> = std::mem::take(&mut self.data.lanes)
            .into_iter()
            .map(Some)
            .collect();
        self.data.lanes = order.iter().filter_map(|&i| lanes[i].take()).collect();
        for lane in &mut self.data.spans.lane {
            *lane = new_index[*lane as usize];
        }
        new_index
    }

    pub fn finish(mut self) -> ReportData {
        // An input not ended (one read without the reader's op analysis) counts its spans.
        self.end_input(OpRows::default());
        for (backend, graph) in std::mem::take(&mut self.graphs_by_parent)
            .into_values()
            .flatten()
        {
            self.outermost_graph(&backend, &graph);
        }
        let new_index = self.order_lanes();
        let (lanes, out) = (&self.lanes, &self.data.lanes);
        let several_processes = out.iter().any(|l| l.process != out[0].process);
        // A lane's place in the timeline, once ordered (a sequence's lane has spans: it has one).
        let place = |id: LaneId| Some(new_index[lanes.get(&id)?.2? as usize]);
        self.data.sequences = std::mem::take(&mut self.sequences).finish(
            |id| place(id).unwrap_or(u32::MAX),
            |id| {
                let name = lanes.get(&id).map_or_else(String::new, |l| l.1.clone());
                match place(id) {
                    Some(i) if several_processes => format!("{} · {name}", out[i as usize].process),
                    _ => name,
                }
            },
        );
        let origin = if self.earliest_ns == u64::MAX {
            0
        } else {
            self.earliest_ns
        };
        for start in &mut self.data.spans.start {
            *start -= origin;
        }
        let seconds = |ns: u64| ns.saturating_sub(origin) as f64 / 1e9;
        let d = &mut self.data;
        d.summary.wall_ns = self.last_ns.saturating_sub(self.first_ns.min(self.last_ns));
        d.summary.origin_ns = origin.to_string();
        d.sampling = Sampling {
            total_spans: d.summary.spans,
            drawn_spans: d.spans.lane.len() as u64,
            op_stride: self.sample.stride(),
        };
        let damage = &d.summary.damage;
        d.summary.warnings.retain(|w| !damage.contains(w));
        const SHOWN_WARNINGS: usize = 20;
        if d.summary.warnings.len() > SHOWN_WARNINGS {
            d.summary.warnings_not_shown = d.summary.warnings.len() - SHOWN_WARNINGS;
            d.summary.warnings.truncate(SHOWN_WARNINGS);
        }
        if self.by_op.is_empty() {
            d.by_op = sorted(std::mem::take(&mut self.by_name));
            d.by_op_source = "spans by name (the trace has no op spans)".into();
            d.by_backend = sorted(std::mem::take(&mut self.by_graph_backend));
        } else {
            d.by_op = sorted(std::mem::take(&mut self.by_op));
            // Rows of nodes have their threads' time; rows of spans have none.
            let what = if d.by_op.iter().any(|a| a.thread_ns.is_some()) {
                "nodes: each node's wall time (its first thread's start to its last thread's end) \
                 and its threads' time, summed"
            } else {
                "op spans"
            };
            d.by_op_source = match self.op_timing.as_slice() {
                [] => what.into(),
                notes => format!("{what}; op timing {}", notes.join("; ")),
            };
            d.by_backend = sorted(std::mem::take(&mut self.by_backend));
        }
        d.by_backend
            .retain(|a| a.name != "(unknown)" || a.count > 0);
        d.by_layer = sorted(std::mem::take(&mut self.by_layer));
        d.by_layer.sort_by_key(|a| layer_number(&a.name));
        let mut tensors = sorted(std::mem::take(&mut self.by_tensor));
        d.tensors_not_shown = tensors.len().saturating_sub(TOP_TENSORS);
        tensors.truncate(TOP_TENSORS);
        d.by_tensor = tensors;
        d.latency = latency(&mut self.tops, seconds);
        d.memory = memory(std::mem::take(&mut self.counters), seconds);
        if d.memory.iter().any(|s| s.t.len() >= POINT_BUDGET) {
            d.memory_note = Some(format!(
                "more than {POINT_BUDGET} changes: each point is the highest value of its interval"
            ));
        }
        self.data
    }
}

impl RecordSink for ReportBuilder {
    fn span(&mut self, span: &Span) {
        self.items += 1;
        self.add_span(span);
    }

    fn record(&mut self, record: Record) {
        if let Record::Counter(_) | Record::Instant(_) = record {
            self.items += 1;
        }
        match record {
            Record::Process(p) => {
                let mut name = if p.name.is_empty() {
                    format!("process {}", p.id)
                } else {
                    p.name
                };
                if p.pid != 0 {
                    name = format!("{name} (pid {})", p.pid);
                }
                if let (Some(rank), Some(world)) = (p.rank, p.world_size)
                    && world > 1
                {
                    name = format!("rank {rank} · {name}");
                }
                self.process_names.insert(p.id, name);
            }
            Record::Lane(l) => {
                let entry = self
                    .lanes
                    .entry(l.id)
                    .or_insert((l.process, String::new(), None));
                entry.0 = l.process;
                entry.1 = l.name;
            }
            Record::Counter(c) => {
                self.earliest_ns = self.earliest_ns.min(c.time_ns);
                let name = c.name.strip_prefix("live bytes ").unwrap_or(&c.name);
                self.counters
                    .entry(name.to_string())
                    .or_default()
                    .push((c.time_ns, c.value));
            }
            Record::Instant(i) => self.earliest_ns = self.earliest_ns.min(i.time_ns),
            // The memory table reads the trace's buffer events itself (analysis::memory).
            Record::Buffer(_) => {}
            Record::Warning(w) => self.data.summary.warnings.push(w),
            Record::Clock(c) => {
                self.data.summary.clock_relative |= c == ggml_viz_reader::telemetry::Clock::Relative
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sampling::{MAX_OP_STRIDE, SHARE_WINDOW_SHIFT, SPAN_BUDGET, mix};
    use ggml_viz_reader::OpSample;

    fn top(start: u64, end: u64, kind: TopKind, n_tokens: Option<u64>) -> TopSpan {
        TopSpan {
            start,
            end,
            kind,
            n_tokens,
            prefill: None,
        }
    }

    #[test]
    fn latency_runs_to_the_end_of_the_waits_that_follow_a_call() {
        let mut tops = HashMap::new();
        tops.insert(
            LaneId(1),
            vec![
                top(0, 10, TopKind::Decode, Some(8)),
                top(12, 30, TopKind::Other, None), // synchronize after an async decode
                top(40, 45, TopKind::Decode, Some(1)),
                top(50, 70, TopKind::Other, None),
                top(80, 82, TopKind::Decode, Some(1)),
            ],
        );
        let l = latency(&mut tops, |ns| ns as f64);
        assert_eq!(l.source, "llama_decode spans");
        let prefill = &l.series[0];
        assert_eq!((prefill.name.as_str(), prefill.count), ("prefill", 1));
        assert_eq!(prefill.p50_ns, 30);
        assert_eq!(prefill.per_token_ns, Some(30 / 8));
        let generation = &l.series[1];
        assert_eq!(generation.count, 2);
        assert_eq!((generation.p50_ns, generation.p99_ns), (2, 30));
    }

    /// A server's batch of four sequences generating a token each is generation, not a prefill of
    /// four tokens; a batch holding a prompt is prefill, whatever else it carries.
    #[test]
    fn a_batch_is_prefill_only_when_a_sequence_brings_several_tokens() {
        let mut tops = HashMap::new();
        let batch = |start, n_tokens, prefill| TopSpan {
            prefill: Some(prefill),
            ..top(start, start + 10, TopKind::Decode, Some(n_tokens))
        };
        tops.insert(
            LaneId(1),
            vec![batch(0, 4, false), batch(20, 4, false), batch(40, 13, true)],
        );
        let l = latency(&mut tops, |ns| ns as f64);
        let counts: Vec<(&str, u64)> = (l.series.iter())
            .map(|s| (s.name.as_str(), s.count))
            .collect();
        assert_eq!(counts, [("prefill", 1), ("generation", 2)]);
    }

    #[test]
    fn graphs_are_the_unit_without_decode_spans() {
        let mut tops = HashMap::new();
        tops.insert(
            LaneId(1),
            vec![
                top(0, 10, TopKind::Graph, None),
                top(10, 25, TopKind::Other, None),
            ],
        );
        let l = latency(&mut tops, |ns| ns as f64);
        assert_eq!(l.source, "outermost graph computes");
        assert_eq!((l.series[0].count, l.series[0].p50_ns), (1, 25));
    }

    #[test]
    fn downsampled_memory_keeps_the_peak() {
        let mut c = HashMap::new();
        let mut points: Vec<(u64, f64)> = (0..20_000).map(|i| (i, (i % 7) as f64)).collect();
        points[12_345].1 = 1e9;
        c.insert("CPU".to_string(), points);
        let m = memory(c, |ns| ns as f64);
        assert!(m[0].t.len() <= POINT_BUDGET + 1);
        assert_eq!(m[0].peak, 1e9);
        assert!(m[0].values.contains(&1e9));
    }

    /// Many more op spans than the budget, read once: the stride grows as they come, and the
    /// ops drawn are exactly those of the parents the final stride selects, every other span
    /// drawn, within the budget.
    #[test]
    fn op_spans_are_thinned_to_the_budget_in_one_pass() {
        let mut builder = ReportBuilder::new("t".into(), vec![]);
        let (graphs, ops_per_graph) = (4_000u64, 100u64);
        let mut id = 0;
        let mut graph_ids = Vec::new();
        for g in 0..graphs {
            id += 1;
            let graph_id = id;
            graph_ids.push(graph_id);
            let t0 = g * 1_000_000;
            for o in 0..ops_per_graph {
                id += 1;
                let mut op = span(id, Some(graph_id), 1, "op", t0 + o * 10);
                op.end_ns = op.start_ns + 5;
                builder.span(&op);
            }
            let mut graph = span(graph_id, None, 0, "graph", t0);
            graph.end_ns = t0 + ops_per_graph * 10;
            builder.span(&graph);
        }
        let data = builder.finish();
        let stride = data.sampling.op_stride;
        assert!(stride > 1, "{stride}");
        let selected = graph_ids
            .iter()
            .filter(|&&g| mix(g).is_multiple_of(stride))
            .count() as u64;
        assert_eq!(data.sampling.drawn_spans, graphs + selected * ops_per_graph);
        assert!(data.sampling.drawn_spans <= SPAN_BUDGET);
        assert_eq!(data.sampling.total_spans, graphs * (1 + ops_per_graph));
        // A stride half as large would not have fitted.
        let half = graph_ids
            .iter()
            .filter(|&&g| mix(g).is_multiple_of(stride / 2))
            .count() as u64;
        assert!(half * ops_per_graph > SPAN_BUDGET - graphs, "{half}");
        // Times are from the earliest span, as drawn.
        assert_eq!(data.spans.start.iter().min(), Some(&0));
    }

    /// Worker threads' shares have no parent span: they are thinned by time window, the same
    /// windows on every lane, so each worker's lane keeps its shares, spread over the run, and
    /// the page fits its budget (a parentless share was once never thinned, and the stride
    /// doubled until it wrapped: the report never ended).
    #[test]
    fn parentless_shares_are_thinned_by_window_on_every_lane() {
        let mut builder = ReportBuilder::new("t".into(), vec![]);
        let (windows, lanes, per_window) = (2_000u64, 3u32, 40u64);
        let window_ns = 1u64 << SHARE_WINDOW_SHIFT;
        let mut id = 0;
        for w in 0..windows {
            for lane in 0..lanes {
                for k in 0..per_window {
                    id += 1;
                    let mut share = span(id, None, 0, "op", w * window_ns + k * 100);
                    share.lane = LaneId(2 + lane);
                    share.end_ns = share.start_ns + 50;
                    builder.span(&share);
                }
            }
        }
        let data = builder.finish();
        let total = windows * u64::from(lanes) * per_window;
        assert_eq!(data.sampling.total_spans, total);
        assert!(data.sampling.drawn_spans <= SPAN_BUDGET);
        let stride = data.sampling.op_stride;
        assert!(stride > 1, "{stride}");
        // Exactly the windows the final stride selects, whole, on every lane (times are from
        // the earliest span drawn; the run starts at 0, and window 0's shares start it).
        let kept: Vec<u64> = (0..windows)
            .filter(|w| {
                let key = mix(w ^ 0x5a5a_5a5a_0000_0000);
                key.is_multiple_of(stride)
            })
            .collect();
        assert!(kept.len() > 10, "{}", kept.len());
        assert_eq!(
            data.sampling.drawn_spans,
            kept.len() as u64 * u64::from(lanes) * per_window
        );
        let origin = kept[0] * window_ns;
        let mut per_lane = vec![0u64; data.lanes.len()];
        for (lane, start) in data.spans.lane.iter().zip(&data.spans.start) {
            per_lane[*lane as usize] += 1;
            assert!(kept.contains(&((start + origin) / window_ns)), "{start}");
        }
        assert_eq!(per_lane.len(), lanes as usize);
        assert!(
            per_lane
                .iter()
                .all(|&n| n == kept.len() as u64 * per_window)
        );
        // Spread over the run, not bunched at its start: windows kept in each quarter.
        for quarter in 0..4 {
            let range = quarter * windows / 4..(quarter + 1) * windows / 4;
            assert!(kept.iter().any(|w| range.contains(w)), "{quarter}");
        }
    }

    /// Op spans under one key are thinned whole; under the key every stride divides (a parent
    /// whose mixed id is 0) no stride thins them: past the largest stride no op is drawn, and
    /// the pass ends.
    #[test]
    fn op_spans_under_one_key_end_within_the_budget() {
        assert_eq!(mix(0), 0);
        for parent in [None, Some(7), Some(0)] {
            let mut builder = ReportBuilder::new("t".into(), vec![]);
            let n = SPAN_BUDGET + 50_000;
            for id in 0..n {
                let mut op = span(100 + id, parent, 1, "op", id % 1000);
                op.end_ns = op.start_ns + 1;
                builder.span(&op);
            }
            let data = builder.finish();
            assert_eq!(data.sampling.total_spans, n);
            assert!(data.sampling.drawn_spans <= SPAN_BUDGET, "{parent:?}");
            if parent == Some(0) {
                assert_eq!(data.sampling.op_stride, MAX_OP_STRIDE * 2);
                assert_eq!(data.sampling.drawn_spans, 0);
            }
        }
    }

    /// A process's threads come first as met, then its sequences by number; each span stays on
    /// its lane.
    #[test]
    fn threads_come_before_sequences_in_their_order() {
        let mut builder = ReportBuilder::new("t".into(), vec![]);
        for (lane, name) in [(1, "sequence 10"), (2, "thread 5"), (3, "sequence 2")] {
            builder.record(Record::Lane(ggml_viz_reader::telemetry::Lane {
                id: LaneId(lane),
                process: ProcessId(1),
                tid: None,
                name: name.into(),
            }));
            let mut s = span(u64::from(lane), None, 0, name, u64::from(lane) * 10);
            s.lane = LaneId(lane);
            builder.span(&s);
        }
        let data = builder.finish();
        let names: Vec<&str> = data.lanes.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["thread 5", "sequence 2", "sequence 10"]);
        for (lane, start) in data.spans.lane.iter().zip(&data.spans.start) {
            // Times from the earliest span (the first lane's, at 10).
            let expected = match start {
                0 => "sequence 10",
                10 => "thread 5",
                _ => "sequence 2",
            };
            assert_eq!(data.lanes[*lane as usize].name, expected);
        }
    }

    #[test]
    fn an_input_s_nodes_count_instead_of_its_op_spans() {
        let mut builder = ReportBuilder::new("t".into(), vec![]);
        let op = |id, start: u64, ns: u64| {
            let mut s = span(id, None, 0, "op", start);
            s.name = "MUL_MAT".into();
            s.end_ns = start + ns;
            s.self_ns = ns;
            s
        };
        // A trace: one node, a share of it on each of 3 threads (100, 80 and 60 ns), 120 ns
        // from the first start to the last end.
        for (id, ns) in [(1, 100), (2, 80), (3, 60)] {
            builder.span(&op(id, 1_000, ns));
        }
        let mut nodes = OpRows::default();
        nodes.add_node(&OpSample {
            op: "MUL_MAT".into(),
            tensor: "ffn_up-0".into(),
            backend: "CPU".into(),
            duration_ns: 120,
            threads: 3,
            thread_ns: 240,
            idle_ns: 60,
            working_threads: 3,
            slowest_ns: 100,
            wait_ns: 30,
            inner_wait_ns: 20,
            flops: None,
            bytes: 0,
            phase: None,
            graph: ggml_viz_reader::NO_GRAPH,
            kernels: Default::default(),
        });
        builder.end_input(nodes);
        // Another input without op analysis (not a trace): its op span counts once.
        builder.span(&op(4, 2_000, 50));
        let data = builder.finish();
        assert_eq!(data.summary.ops, 2);
        let row = &data.by_op[0];
        assert_eq!(
            (row.name.as_str(), row.count, row.total_ns),
            ("MUL_MAT", 2, 120 + 50)
        );
        // Self time is the span's; thread time and imbalance the node's (60 ns idle of 3 threads
        // as slow as the slowest, 100 ns).
        assert_eq!((row.self_ns, row.thread_ns), (Some(50), Some(240)));
        assert_eq!(row.imbalance, Some(60.0 / 300.0));
        // Waits: 20 ns inside the node's shares, 30 after them, of 240 + 30.
        assert_eq!(row.wait_share, Some(50.0 / 270.0));
        assert_eq!(data.by_tensor[0].count, 1);
        assert!(
            data.by_op_source.starts_with("nodes"),
            "{}",
            data.by_op_source
        );
    }

    fn span(id: u64, parent: Option<u64>, depth: u32, category: &str, start_ns: u64) -> Span {
        Span {
            id,
            parent,
            depth,
            lane: LaneId(1),
            name: category.to_uppercase().as_str().into(),
            category: category.into(),
            start_ns,
            end_ns: start_ns,
            self_ns: 0,
            args: Default::default(),
        }
    }
}
