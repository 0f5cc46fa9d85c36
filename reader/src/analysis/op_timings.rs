//! Per-op timings from a trace: each op begin/end pair is one thread's share of a node, named
//! from the trace's own records (tensor-info, op-name and backend-name extension records). The
//! shares of one node on several threads (threads-mode op timing: every worker thread computes
//! part of every node) are joined into one [`OpSample`], the node: its wall time runs from its
//! first thread's start to its last thread's end. Samples are then grouped by op, tensor name,
//! backend or layer.
//!
//! Joining: every share of one compute of a graph lies inside that graph compute (the calling
//! thread waits for its pool's threads before it returns), so shares are grouped by tensor and
//! by the outermost graph compute their start lies in; within a group, sorted by start, a node
//! ends where a thread that already has a share in it starts another (a thread's shares of one
//! tensor are successive computes of it). Each thread's barrier waits (threads mode) count for
//! the node that thread computed last: time it spent waiting for the slowest.

use std::collections::{BTreeMap, HashMap};

use crate::analysis::stats::DurationSummary;
use crate::format::Damage;
use crate::format::ext::{self, BackendNames, OpNames, SpanBoundary, TensorInfo};
use crate::format::{Event, EventType, ExtensionKind, Payload};

/// Whether an op ran for a multi-token batch (prompt processing) or a single token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Prefill,
    Generation,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Generation => "generation",
        }
    }
}

/// One timed node.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSample {
    /// `MUL_MAT`, `SILU`, … (the sub-op for unary and GLU ops; `RMS_NORM+MUL` for a fused call).
    pub op: String,
    pub tensor: String,
    pub backend: String,
    /// Wall time: the first thread's start to the last thread's end.
    pub duration_ns: u64,
    /// Threads that computed a share of it (1 with the eval callback).
    pub threads: u32,
    /// The threads' shares, summed.
    pub thread_ns: u64,
    /// Of the threads that had work (a share of at least 1/8 of the slowest's: ops that split
    /// no work return at once on the other threads), the time each finished before the slowest,
    /// summed; and how many they were.
    pub idle_ns: u64,
    pub working_threads: u32,
    /// The longest share.
    pub slowest_ns: u64,
    /// Barrier waits of its threads after it (threads mode).
    pub wait_ns: u64,
    pub flops: Option<u64>,
    /// Bytes of the result (`ggml_nbytes`).
    pub bytes: u64,
    /// From the enclosing llama_decode / llama_encode span, when there is one.
    pub phase: Option<Phase>,
}

impl OpSample {
    /// llama.cpp names tensors `<name>-<layer>`.
    pub fn layer(&self) -> Option<u32> {
        self.tensor
            .rsplit_once('-')
            .and_then(|(_, l)| l.parse().ok())
    }
}

/// What `ggml-viz ops` shows.
#[derive(Clone, Debug, Default)]
pub struct OpAnalysis {
    pub ops: Vec<OpSample>,
    /// Total time of the outermost graph computes that contain timed ops.
    pub timed_graph_ns: u64,
    /// How the writer took op timings ([`op_timing_note`]).
    pub timing_note: Option<String>,
    /// Per thread: its shares of nodes and its barrier waits, by thread id.
    pub threads: Vec<ThreadTotals>,
    pub damage: Option<Damage>,
}

/// One thread's time in node shares and in barrier waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadTotals {
    pub thread_id: u32,
    pub shares: u64,
    pub share_ns: u64,
    pub waits: u64,
    pub wait_ns: u64,
}

/// One thread's share of a node, before joining.
struct Share {
    thread_id: u32,
    begin: u64,
    end: u64,
    tensor_ptr: u64,
    tensor: String,
    op_type: u32,
    bytes: u64,
    backend: u64,
    phase: Option<Phase>,
    wait_ns: u64,
    /// The graph compute its start lies in (an index into the sorted windows; `usize::MAX`:
    /// none).
    window: usize,
}

#[derive(Default)]
struct Thread {
    /// Begin of the op being timed: time, tensor pointer, tensor name, op type, result bytes,
    /// backend.
    open_op: Option<(u64, u64, String, u32, u64, u64)>,
    /// The share this thread ended last (an index into the shares), for its barrier waits.
    last_share: Option<usize>,
    graph_depth: u32,
    graph_begin: u64,
    graph_has_ops: bool,
    phase: Option<Phase>,
}

impl OpAnalysis {
    pub fn collect<'a>(events: impl IntoIterator<Item = Result<Event<'a>, Damage>>) -> OpAnalysis {
        let mut a = OpAnalysis::default();
        let mut op_names: HashMap<u32, String> = HashMap::new();
        let mut infos: HashMap<String, TensorInfo> = HashMap::new();
        let mut backends: HashMap<u64, String> = HashMap::new();
        let mut threads: HashMap<u32, Thread> = HashMap::new();
        let mut shares: Vec<Share> = Vec::new();
        // Outermost graph computes, begin and end, in order of end.
        let mut windows: Vec<(u64, u64)> = Vec::new();
        for item in events {
            let e = match item {
                Ok(e) => e,
                Err(damage) => {
                    a.damage = Some(damage);
                    break;
                }
            };
            let label = e.label.as_deref().unwrap_or_default();
            if let Payload::Extension(x) = e.payload {
                match x.kind {
                    ExtensionKind::Metadata => {
                        if let Some(m) = ext::parse_payload::<ext::Metadata>(label) {
                            a.timing_note = op_timing_note(&m.settings);
                        }
                    }
                    ExtensionKind::OpNames => {
                        for (k, v) in ext::parse_payload::<OpNames>(label)
                            .unwrap_or_default()
                            .names
                        {
                            if let Ok(k) = k.parse() {
                                op_names.insert(k, v);
                            }
                        }
                    }
                    ExtensionKind::TensorInfo => {
                        if let Some(info) = ext::parse_payload::<TensorInfo>(label) {
                            infos.insert(info.name.clone(), info);
                        }
                    }
                    ExtensionKind::BackendNames => {
                        for b in ext::parse_payload::<BackendNames>(label)
                            .unwrap_or_default()
                            .backends
                        {
                            backends.insert(b.ptr, b.name);
                        }
                    }
                    ExtensionKind::SpanBegin | ExtensionKind::SpanEnd => {
                        let t = threads.entry(e.thread_id).or_default();
                        let span = ext::parse_payload::<SpanBoundary>(label).unwrap_or_default();
                        t.phase = (x.kind == ExtensionKind::SpanBegin)
                            .then(|| span.is_prefill())
                            .flatten()
                            .map(|prefill| {
                                if prefill {
                                    Phase::Prefill
                                } else {
                                    Phase::Generation
                                }
                            });
                    }
                    _ => {}
                }
                continue;
            }
            let t = threads.entry(e.thread_id).or_default();
            match (e.event_type(), e.payload) {
                (Some(EventType::GraphComputeBegin), _) => {
                    if t.graph_depth == 0 {
                        t.graph_begin = e.timestamp_ns;
                        t.graph_has_ops = false;
                    }
                    t.graph_depth += 1;
                }
                (Some(EventType::GraphComputeEnd), _) => {
                    t.graph_depth = t.graph_depth.saturating_sub(1);
                    if t.graph_depth == 0 {
                        windows.push((t.graph_begin, e.timestamp_ns));
                    }
                    if t.graph_depth == 0 && t.graph_has_ops {
                        a.timed_graph_ns = a
                            .timed_graph_ns
                            .saturating_add(e.timestamp_ns.saturating_sub(t.graph_begin));
                    }
                }
                (
                    Some(EventType::OpComputeBegin),
                    Payload::Op {
                        tensor_ptr,
                        op_type,
                        op_size,
                        backend_ptr,
                    },
                ) => {
                    let name = String::from_utf8_lossy(label).into_owned();
                    t.open_op = Some((
                        e.timestamp_ns,
                        tensor_ptr,
                        name,
                        op_type,
                        op_size,
                        backend_ptr,
                    ));
                    t.graph_has_ops = true;
                }
                (Some(EventType::OpComputeEnd), _) => {
                    let Some((begin, tensor_ptr, tensor, op_type, bytes, backend)) =
                        t.open_op.take()
                    else {
                        continue;
                    };
                    t.last_share = Some(shares.len());
                    shares.push(Share {
                        thread_id: e.thread_id,
                        begin,
                        end: e.timestamp_ns.max(begin),
                        tensor_ptr,
                        tensor,
                        op_type,
                        bytes,
                        backend,
                        phase: t.phase,
                        wait_ns: 0,
                        window: usize::MAX,
                    });
                }
                // A worker's wait at a barrier (no entry point recorded it: no label but ours).
                (Some(EventType::BarrierWait), Payload::Thread { value, .. })
                    if label == b"ggml_barrier" =>
                {
                    let totals = thread_totals(&mut a.threads, e.thread_id);
                    totals.waits += 1;
                    totals.wait_ns = totals.wait_ns.saturating_add(value);
                    if let Some(share) = t.last_share.and_then(|i| shares.get_mut(i)) {
                        share.wait_ns = share.wait_ns.saturating_add(value);
                    }
                }
                _ => {}
            }
        }
        for s in &shares {
            let totals = thread_totals(&mut a.threads, s.thread_id);
            totals.shares += 1;
            totals.share_ns = totals.share_ns.saturating_add(s.end - s.begin);
        }
        a.threads.sort_by_key(|t| t.thread_id);
        let namer = Namer {
            op_names: &op_names,
            infos: &infos,
            backends: &backends,
        };
        windows.sort_unstable();
        for s in &mut shares {
            s.window = window_of(&windows, s.begin);
        }
        a.ops = join_shares(shares, &namer);
        a
    }

    /// Total time of the timed ops.
    pub fn op_ns(&self) -> u64 {
        self.ops
            .iter()
            .fold(0u64, |a, o| a.saturating_add(o.duration_ns))
    }

    /// Whether any node was computed by more than one thread (threads-mode op timing).
    pub fn has_thread_shares(&self) -> bool {
        self.ops.iter().any(|o| o.threads > 1)
    }

    /// Whether any op ran inside a llama_decode / llama_encode span.
    pub fn has_phases(&self) -> bool {
        self.ops.iter().any(|o| o.phase.is_some())
    }
}

fn thread_totals(threads: &mut Vec<ThreadTotals>, thread_id: u32) -> &mut ThreadTotals {
    let i = match threads.iter().position(|t| t.thread_id == thread_id) {
        Some(i) => i,
        None => {
            threads.push(ThreadTotals {
                thread_id,
                ..ThreadTotals::default()
            });
            threads.len() - 1
        }
    };
    &mut threads[i]
}

/// The trace's name tables.
struct Namer<'a> {
    op_names: &'a HashMap<u32, String>,
    infos: &'a HashMap<String, TensorInfo>,
    backends: &'a HashMap<u64, String>,
}

/// Joins the threads' shares into nodes (see the module's description), in order of start.
fn join_shares(mut shares: Vec<Share>, namer: &Namer<'_>) -> Vec<OpSample> {
    shares.sort_by_key(|s| (s.tensor_ptr, s.window, s.begin));
    let mut nodes: Vec<(u64, OpSample)> = Vec::new();
    let mut start = 0;
    while start < shares.len() {
        let mut end = start + 1;
        while end < shares.len()
            && shares[end].tensor_ptr == shares[start].tensor_ptr
            && shares[end].window == shares[start].window
            && !shares[start..end]
                .iter()
                .any(|s| s.thread_id == shares[end].thread_id)
        {
            end += 1;
        }
        let node = &shares[start..end];
        nodes.push((node[0].begin, sample_of(node, namer)));
        start = end;
    }
    nodes.sort_by_key(|(begin, _)| *begin);
    nodes.into_iter().map(|(_, n)| n).collect()
}

/// The latest-begun of the sorted `windows` that holds `at` (looking back over a few: graph
/// computes of several threads may overlap), or `usize::MAX`.
fn window_of(windows: &[(u64, u64)], at: u64) -> usize {
    let after = windows.partition_point(|&(begin, _)| begin <= at);
    (after.saturating_sub(64)..after)
        .rev()
        .find(|&i| windows[i].1 >= at)
        .unwrap_or(usize::MAX)
}

/// One node from its threads' shares (at least one). Its name, info and backend are those of
/// the share that has a name (threads mode: the first thread's; the others carry the node's
/// pointer and op only).
fn sample_of(node: &[Share], namer: &Namer<'_>) -> OpSample {
    let first = node
        .iter()
        .find(|s| !s.tensor.is_empty())
        .unwrap_or(&node[0]);
    let info = namer
        .infos
        .get(&first.tensor)
        .filter(|i| i.op_type.is_none_or(|o| o == first.op_type));
    let op = match info {
        Some(i) if !i.op.is_empty() => i.op.clone(),
        _ => namer
            .op_names
            .get(&first.op_type)
            .cloned()
            .unwrap_or_else(|| format!("op {}", first.op_type)),
    };
    let backend = match namer.backends.get(&first.backend) {
        Some(name) => name.clone(),
        // A CPU worker thread's share (threads-mode op timing) names no backend (FORMAT.md).
        None if first.backend == 0 => "CPU".into(),
        None => format!("{:#x}", first.backend),
    };
    let begin = node.iter().map(|s| s.begin).min().unwrap_or(0);
    let end = node.iter().map(|s| s.end).max().unwrap_or(begin);
    let slowest_ns = node.iter().map(|s| s.end - s.begin).max().unwrap_or(0);
    let working: Vec<u64> = node
        .iter()
        .map(|s| s.end - s.begin)
        .filter(|&d| d.saturating_mul(8) >= slowest_ns)
        .collect();
    OpSample {
        op,
        tensor: first.tensor.clone(),
        backend,
        duration_ns: end - begin,
        threads: node.len() as u32,
        thread_ns: node
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.end - s.begin)),
        idle_ns: working
            .iter()
            .fold(0u64, |a, &d| a.saturating_add(slowest_ns - d)),
        working_threads: working.len() as u32,
        slowest_ns,
        wait_ns: node.iter().fold(0u64, |a, s| a.saturating_add(s.wait_ns)),
        flops: info.and_then(|i| i.flops),
        bytes: node.iter().map(|s| s.bytes).max().unwrap_or(0),
        phase: node.iter().find_map(|s| s.phase),
    }
}

/// What a reader should be told about how op timings were taken, from the writer's settings
/// (`op_timing`, `op_sample` of the metadata record); `None` when the trace does not say.
/// The mode is `op_timing_mode` (the mode that ran; `op_timing_why` says why), or, from a
/// writer that had no modes, the boolean `op_timing` (on = the eval callback).
pub fn op_timing_note(settings: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let mode = match settings.get("op_timing_mode").and_then(|v| v.as_str()) {
        Some(mode) => mode,
        None => match settings.get("op_timing")?.as_bool()? {
            true => "sched",
            false => "off",
        },
    };
    let sample = settings
        .get("op_sample")
        .and_then(|v| v.as_u64())
        .unwrap_or(1);
    let what = match mode {
        "off" => return Some("off: graph times only".into()),
        "threads" => "threads: each worker thread's share of each node, as the run computed it \
             (nothing of the run changed)"
            .to_string(),
        "sched" => "sched: each node computed and synchronized on its own by the scheduler's \
             eval callback, no op fusion (small nodes read slower than they run)"
            .to_string(),
        other => other.to_string(),
    };
    let mut note = match sample {
        0 | 1 => what,
        n => format!("{what}; 1 graph compute in {n}"),
    };
    if let Some(why) = settings.get("op_timing_why").and_then(|v| v.as_str()) {
        note.push_str(&format!(" [{why}]"));
    }
    Some(note)
}

/// How to group ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Op,
    Name,
    Backend,
    Layer,
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
    /// Of the threads' time in these nodes and the barrier waits after them, the waits' share.
    pub wait_share: f64,
}

/// Groups `ops` by `by`, largest total time first.
pub fn group_ops<'a>(ops: impl IntoIterator<Item = &'a OpSample>, by: GroupBy) -> Vec<OpGroup> {
    let mut groups: BTreeMap<String, Vec<&OpSample>> = BTreeMap::new();
    for o in ops {
        let key = match by {
            GroupBy::Op => o.op.clone(),
            GroupBy::Name => o.tensor.clone(),
            GroupBy::Backend => o.backend.clone(),
            GroupBy::Layer => o
                .layer()
                .map_or_else(|| "(none)".into(), |l| format!("layer {l}")),
        };
        groups.entry(key).or_default().push(o);
    }
    let mut rows: Vec<OpGroup> = groups
        .into_iter()
        .map(|(key, ops)| {
            let durations: Vec<u64> = ops.iter().map(|o| o.duration_ns).collect();
            let total_ns = durations.iter().fold(0u64, |a, &d| a.saturating_add(d));
            let with_flops: Vec<&&OpSample> = ops.iter().filter(|o| o.flops.is_some()).collect();
            // Values come from the trace: saturate rather than overflow on hostile input.
            let flop_ns = with_flops
                .iter()
                .fold(0u64, |a, o| a.saturating_add(o.duration_ns));
            let flops = with_flops
                .iter()
                .filter_map(|o| o.flops)
                .fold(0u64, u64::saturating_add);
            let bytes = ops.iter().fold(0u64, |a, o| a.saturating_add(o.bytes));
            let sum =
                |f: fn(&OpSample) -> u64| ops.iter().fold(0u64, |a, o| a.saturating_add(f(o)));
            let thread_ns = sum(|o| o.thread_ns);
            let idle_ns = sum(|o| o.idle_ns);
            let working_ns = sum(|o| o.slowest_ns.saturating_mul(o.working_threads as u64));
            let wait_ns = sum(|o| o.wait_ns);
            OpGroup {
                key,
                count: ops.len(),
                total_ns,
                durations: DurationSummary::of(&durations).expect("a group has ops"),
                flops_per_s: (flop_ns > 0).then(|| flops as f64 / (flop_ns as f64 / 1e9)),
                bytes_per_s: if total_ns > 0 {
                    bytes as f64 / (total_ns as f64 / 1e9)
                } else {
                    0.0
                },
                thread_ns,
                imbalance: ratio(idle_ns, working_ns),
                wait_share: ratio(wait_ns, thread_ns.saturating_add(wait_ns)),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.key.cmp(&b.key)));
    rows
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(op: &str, tensor: &str, ns: u64, flops: Option<u64>) -> OpSample {
        OpSample {
            op: op.into(),
            tensor: tensor.into(),
            backend: "CPU".into(),
            duration_ns: ns,
            threads: 1,
            thread_ns: ns,
            idle_ns: 0,
            working_threads: 1,
            slowest_ns: ns,
            wait_ns: 0,
            flops,
            bytes: 1000,
            phase: None,
        }
    }

    /// A share as the hook writes it: odd threads' carry the tensor's name and size (the first
    /// thread's), even threads' the pointer and op only.
    fn op_event(begin: bool, ts: u64, thread: u32, tensor: u64) -> Event<'static> {
        let named = thread % 2 == 1;
        Event {
            type_code: if begin {
                EventType::OpComputeBegin
            } else {
                EventType::OpComputeEnd
            } as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Op {
                tensor_ptr: tensor,
                op_type: 29,
                op_size: if named { 64 } else { 0 },
                backend_ptr: 0,
            },
            label: named.then(|| b"ffn_out-0"[..].into()),
        }
    }

    fn barrier(ts: u64, thread: u32, waited: u64) -> Event<'static> {
        Event {
            type_code: EventType::BarrierWait as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Thread {
                object_ptr: 0,
                thread_index: 0,
                n_threads: 2,
                value: waited,
            },
            label: Some(b"ggml_barrier"[..].into()),
        }
    }

    /// Two threads compute one node in two graph computes; the file holds thread 7's events of
    /// both computes before thread 8's (the writer drains one ring after the other).
    #[test]
    fn shares_of_one_node_on_several_threads_are_joined_per_compute() {
        let events = vec![
            // thread 7: compute 1 at 100..400, waits 50; compute 2 at 1000..1100, waits 200
            op_event(true, 100, 7, 0xA0),
            op_event(false, 400, 7, 0xA0),
            barrier(450, 7, 50),
            op_event(true, 1000, 7, 0xA0),
            op_event(false, 1100, 7, 0xA0),
            barrier(1300, 7, 200),
            // thread 8: compute 1 at 120..450; compute 2 at 1010..1300; and 1010..1012 is not
            // a third thread's share
            op_event(true, 120, 8, 0xA0),
            op_event(false, 450, 8, 0xA0),
            op_event(true, 1010, 8, 0xA0),
            op_event(false, 1300, 8, 0xA0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!(a.ops.len(), 2, "{:?}", a.ops);
        let (first, second) = (&a.ops[0], &a.ops[1]);
        assert_eq!(first.op, "op 29");
        assert_eq!((first.tensor.as_str(), first.bytes), ("ffn_out-0", 64));
        assert_eq!(first.backend, "CPU");
        assert_eq!((first.threads, first.duration_ns), (2, 450 - 100));
        assert_eq!(first.thread_ns, 300 + 330);
        assert_eq!((first.slowest_ns, first.idle_ns), (330, 30));
        assert_eq!(first.wait_ns, 50);
        assert_eq!((second.threads, second.duration_ns), (2, 1300 - 1000));
        assert_eq!((second.slowest_ns, second.idle_ns), (290, 190));
        assert_eq!(second.wait_ns, 200);
        let g = &group_ops(&a.ops, GroupBy::Op)[0];
        assert_eq!(g.count, 2);
        assert_eq!(g.total_ns, 350 + 300);
        assert_eq!(g.thread_ns, 630 + 390);
        assert!((g.imbalance - 220.0 / (2.0 * 330.0 + 2.0 * 290.0)).abs() < 1e-12);
        assert!((g.wait_share - 250.0 / (1020.0 + 250.0)).abs() < 1e-12);
        assert_eq!(a.threads.len(), 2);
        assert_eq!((a.threads[0].thread_id, a.threads[0].share_ns), (7, 400));
        assert_eq!((a.threads[0].waits, a.threads[0].wait_ns), (2, 250));
        assert_eq!((a.threads[1].shares, a.threads[1].share_ns), (2, 620));
    }

    fn graph(begin: bool, ts: u64, thread: u32) -> Event<'static> {
        Event {
            type_code: if begin {
                EventType::GraphComputeBegin
            } else {
                EventType::GraphComputeEnd
            } as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Graph {
                graph_ptr: 0x10,
                n_nodes: 1,
                n_threads: 2,
                backend_ptr: 0,
            },
            label: None,
        }
    }

    /// ggml's own thread pool, made for each compute: the second compute's new worker starts
    /// the node before the calling thread does, and still belongs to the second compute.
    #[test]
    fn new_workers_of_the_next_compute_are_not_joined_to_the_last() {
        let events = vec![
            graph(true, 0, 1),
            op_event(true, 10, 1, 0xC0),
            op_event(false, 20, 1, 0xC0),
            graph(false, 30, 1),
            graph(true, 100, 1),
            op_event(true, 105, 1, 0xC0),
            op_event(false, 115, 1, 0xC0),
            graph(false, 120, 1),
            op_event(true, 5, 2, 0xC0),
            op_event(false, 25, 2, 0xC0),
            op_event(true, 101, 4, 0xC0),
            op_event(false, 110, 4, 0xC0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        let nodes: Vec<(u32, u64)> = a.ops.iter().map(|o| (o.threads, o.duration_ns)).collect();
        assert_eq!(nodes, [(2, 25 - 5), (2, 115 - 101)]);
    }

    /// A share of 1/8 of the slowest or less is a thread with nothing to do, not an imbalance.
    #[test]
    fn threads_without_work_are_not_imbalance() {
        let events = vec![
            op_event(true, 0, 1, 0xB0),
            op_event(false, 800, 1, 0xB0),
            op_event(true, 0, 2, 0xB0),
            op_event(false, 100, 2, 0xB0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!((a.ops[0].working_threads, a.ops[0].idle_ns), (2, 700));
        let events = vec![
            op_event(true, 0, 1, 0xB0),
            op_event(false, 800, 1, 0xB0),
            op_event(true, 0, 2, 0xB0),
            op_event(false, 99, 2, 0xB0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!((a.ops[0].working_threads, a.ops[0].idle_ns), (1, 0));
    }

    #[test]
    fn groups_sum_and_rate() {
        let ops = [
            op("MUL_MAT", "Qcur-0", 1000, Some(2_000)),
            op("MUL_MAT", "Kcur-1", 3000, Some(6_000)),
            op("ADD", "ffn_out-1", 500, None),
        ];
        let by_op = group_ops(&ops, GroupBy::Op);
        assert_eq!(by_op[0].key, "MUL_MAT");
        assert_eq!((by_op[0].count, by_op[0].total_ns), (2, 4000));
        assert_eq!(by_op[0].flops_per_s, Some(8_000.0 / 4e-6));
        assert_eq!(by_op[1].flops_per_s, None);
        assert_eq!(by_op[1].bytes_per_s, 1000.0 / 500e-9);
        let by_layer = group_ops(&ops, GroupBy::Layer);
        assert_eq!(
            by_layer.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(),
            ["layer 1", "layer 0"]
        );
    }
}
