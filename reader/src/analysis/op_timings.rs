//! Per-op timings from a trace: each op begin/end pair becomes an [`OpSample`] named from the
//! trace's own records (tensor-info, op-name and backend-name extension records), then grouped
//! by op, tensor name, backend or layer.

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

/// One timed op.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSample {
    /// `MUL_MAT`, `SILU`, … (the sub-op for unary and GLU ops).
    pub op: String,
    pub tensor: String,
    pub backend: String,
    pub duration_ns: u64,
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
    pub damage: Option<Damage>,
}

#[derive(Default)]
struct Thread {
    /// Begin of the op being timed: time, tensor name, op type, result bytes, backend.
    open_op: Option<(u64, String, u32, u64, u64)>,
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
                            .then_some(span.n_tokens)
                            .flatten()
                            .map(|n| {
                                if n > 1 {
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
                    if t.graph_depth == 0 && t.graph_has_ops {
                        a.timed_graph_ns = a
                            .timed_graph_ns
                            .saturating_add(e.timestamp_ns.saturating_sub(t.graph_begin));
                    }
                }
                (
                    Some(EventType::OpComputeBegin),
                    Payload::Op {
                        op_type,
                        op_size,
                        backend_ptr,
                        ..
                    },
                ) => {
                    let name = String::from_utf8_lossy(label).into_owned();
                    t.open_op = Some((e.timestamp_ns, name, op_type, op_size, backend_ptr));
                    t.graph_has_ops = true;
                }
                (Some(EventType::OpComputeEnd), _) => {
                    let Some((begin, tensor, op_type, bytes, backend)) = t.open_op.take() else {
                        continue;
                    };
                    let info = infos
                        .get(&tensor)
                        .filter(|i| i.op_type.is_none_or(|o| o == op_type));
                    let op = match info {
                        Some(i) if !i.op.is_empty() => i.op.clone(),
                        _ => op_names
                            .get(&op_type)
                            .cloned()
                            .unwrap_or_else(|| format!("op {op_type}")),
                    };
                    a.ops.push(OpSample {
                        op,
                        tensor,
                        backend: backends
                            .get(&backend)
                            .cloned()
                            .unwrap_or_else(|| format!("{backend:#x}")),
                        duration_ns: e.timestamp_ns.saturating_sub(begin),
                        flops: info.and_then(|i| i.flops),
                        bytes,
                        phase: t.phase,
                    });
                }
                _ => {}
            }
        }
        a
    }

    /// Total time of the timed ops.
    pub fn op_ns(&self) -> u64 {
        self.ops
            .iter()
            .fold(0u64, |a, o| a.saturating_add(o.duration_ns))
    }

    /// Whether any op ran inside a llama_decode / llama_encode span.
    pub fn has_phases(&self) -> bool {
        self.ops.iter().any(|o| o.phase.is_some())
    }
}

/// What a reader should be told about how op timings were taken, from the writer's settings
/// (`op_timing`, `op_sample` of the metadata record); `None` when the trace does not say.
pub fn op_timing_note(settings: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let on = settings.get("op_timing")?.as_bool()?;
    let sample = settings
        .get("op_sample")
        .and_then(|v| v.as_u64())
        .unwrap_or(1);
    Some(match (on, sample) {
        (false, _) => "off (GGML_VIZ_OP_TIMING=0): graph times only".into(),
        (true, 1) => "on: each node computed and synchronized on its own, no op fusion".into(),
        (true, n) => format!(
            "on for 1 graph compute in {n}: those nodes computed and synchronized one by one, no op fusion"
        ),
    })
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
            }
        })
        .collect();
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.key.cmp(&b.key)));
    rows
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
            flops,
            bytes: 1000,
            phase: None,
        }
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
