//! The payloads of ggml-viz extension records (FORMAT.md, "Extension records"): compact JSON in
//! the record's label, one struct per kind. Unknown fields are ignored and missing ones take
//! their defaults, so that older and newer writers stay readable.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::{self as format, EXTENSION_TYPE_CODE, Extension, ExtensionKind, Layout, Payload};

mod rpc;
pub use rpc::{RpcBoundary, RpcPart, rpc_command_name};

/// Payload version of every kind defined here.
pub const PAYLOAD_VERSION: u16 = 1;

/// First record of every trace our writer makes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Metadata {
    /// Program that wrote the trace, e.g. `ggml-viz-hook 0.1.0`.
    pub writer: String,
    pub pid: u32,
    pub host: String,
    pub command_line: Vec<String>,
    pub ggml_version: Option<String>,
    /// CPUs available to the process.
    pub n_cpus: u32,
    pub cpu_model: Option<String>,
    /// Settings in force, by name (`output`, `max_events`, …).
    pub settings: serde_json::Map<String, serde_json::Value>,
    pub distributed: Distributed,
}

/// The settings of a metadata record that readers act on, each by the key it is stored under
/// in [`Metadata::settings`]: the writer's configuration stores all of its own by name, and the
/// hook adds the op-timing mode that ran, why, and how a GPU's nodes were timed. Writers set
/// them and readers read them through [`Metadata::set`] and [`Metadata::setting`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The op timing asked for (`auto`, `threads`, `sched`, `off`; a boolean from writers that
    /// had no modes: on = the eval callback).
    OpTiming,
    /// The op timing mode that ran (`threads`, `sched`, `off`).
    OpTimingMode,
    /// Why that mode ran (what `auto` decided).
    OpTimingWhy,
    /// How a GPU's nodes were timed, where one was.
    GpuOpTiming,
    /// One graph compute in this many is op-timed.
    OpSample,
    /// The capture window: graph computes skipped first, then at most this many recorded.
    SkipGraphs,
    MaxGraphs,
    /// Events a thread's ring holds.
    BufferSize,
    /// The host's memory bandwidth as measured before the run, in MB/s (0: not measured).
    MemoryBandwidthMbS,
}

impl Setting {
    pub const ALL: [Setting; 9] = [
        Setting::OpTiming,
        Setting::OpTimingMode,
        Setting::OpTimingWhy,
        Setting::GpuOpTiming,
        Setting::OpSample,
        Setting::SkipGraphs,
        Setting::MaxGraphs,
        Setting::BufferSize,
        Setting::MemoryBandwidthMbS,
    ];

    /// The key it is stored under.
    pub const fn key(self) -> &'static str {
        match self {
            Setting::OpTiming => "op_timing",
            Setting::OpTimingMode => "op_timing_mode",
            Setting::OpTimingWhy => "op_timing_why",
            Setting::GpuOpTiming => "gpu_op_timing",
            Setting::OpSample => "op_sample",
            Setting::SkipGraphs => "skip_graphs",
            Setting::MaxGraphs => "max_graphs",
            Setting::BufferSize => "buffer_size",
            Setting::MemoryBandwidthMbS => "memory_bandwidth_mb_s",
        }
    }
}

impl Metadata {
    /// The value the record stores for `setting`, if any.
    pub fn setting(&self, setting: Setting) -> Option<&serde_json::Value> {
        self.settings.get(setting.key())
    }

    /// [`Metadata::setting`] where it is an unsigned number.
    pub fn setting_u64(&self, setting: Setting) -> Option<u64> {
        self.setting(setting)?.as_u64()
    }

    /// [`Metadata::setting`] where it is text.
    pub fn setting_str(&self, setting: Setting) -> Option<&str> {
        self.setting(setting)?.as_str()
    }

    /// Stores `value` for `setting` (a writer).
    pub fn set(&mut self, setting: Setting, value: impl Into<serde_json::Value>) {
        self.settings.insert(setting.key().into(), value.into());
    }
}

/// Which process of a distributed job wrote the trace (the TelemetryEvent v2 identity).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Distributed {
    pub job_id: Option<String>,
    pub rank: u32,
    pub local_rank: u32,
    pub world_size: u32,
}

impl Default for Distributed {
    fn default() -> Self {
        Distributed {
            job_id: None,
            rank: 0,
            local_rank: 0,
            world_size: 1,
        }
    }
}

/// Events the writer could not record. Later records of this kind supersede earlier ones (the
/// writer emits running totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// Dropped because a thread's ring was full.
    pub dropped_ring_full: u64,
    /// Not recorded because the event cap (`max_events`) was reached.
    pub over_max_events: u64,
    /// Not recorded because the call came while the writer was starting on another thread.
    pub missed_while_starting: u64,
    /// Recorded without their backend's, scheduler's, buffer type's or thread's name: the name
    /// table was full.
    pub unnamed: u64,
    /// Op events recorded without tensor info (name, type, shape, FLOPs): the tensor table was
    /// full.
    pub without_tensor_info: u64,
    /// ggml-rpc transport calls that no command's record follows: the connection table's lock
    /// was not had (after a `fork`), or the table was full of live connections.
    pub rpc_calls_unfollowed: u64,
}

impl Counters {
    pub fn lost(&self) -> u64 {
        self.dropped_ring_full + self.over_max_events + self.missed_while_starting
    }

    /// Events recorded with less than they should carry (a full name or tensor table).
    pub fn incomplete(&self) -> u64 {
        self.unnamed + self.without_tensor_info
    }
}

/// Appends an extension record of `kind` whose payload is `payload` serialized as JSON.
pub fn encode_extension<T: Serialize>(
    out: &mut Vec<u8>,
    layout: Layout,
    kind: ExtensionKind,
    timestamp_ns: u64,
    thread_id: u32,
    payload: &T,
) {
    let label = serde_json::to_vec(payload).expect("extension payloads serialize");
    encode_extension_json(out, layout, kind, timestamp_ns, thread_id, &label);
}

/// [`encode_extension`] of a payload already serialized (`json`): for a writer that repeats a
/// record (a tensor's info, written again wherever another tensor of its name and op came
/// between).
pub fn encode_extension_json(
    out: &mut Vec<u8>,
    layout: Layout,
    kind: ExtensionKind,
    timestamp_ns: u64,
    thread_id: u32,
    json: &[u8],
) {
    let label = json;
    let ext = Extension {
        kind,
        version: PAYLOAD_VERSION,
        layout,
    };
    format::encode_record(
        out,
        layout,
        EXTENSION_TYPE_CODE,
        timestamp_ns,
        thread_id,
        &Payload::Extension(ext),
        Some(label),
    );
}

/// Parses an extension payload; `None` if it is not valid JSON of the expected shape.
pub fn parse_payload<'de, T: Deserialize<'de>>(label: &'de [u8]) -> Option<T> {
    serde_json::from_slice(label).ok()
}

/// `ggml_op` value (as a decimal string) to `ggml_op_name`, for the ggml that ran. Records add to
/// the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpNames {
    pub names: std::collections::BTreeMap<String, String>,
}

/// Backends and schedulers by pointer. Records add to the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BackendNames {
    pub backends: Vec<BackendName>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BackendName {
    pub ptr: u64,
    pub name: String,
    /// `backend` or `scheduler`.
    pub kind: String,
}

/// The payload of a SPAN_BEGIN or SPAN_END record: one edge of an application-level span
/// (`llama_decode`, `llama_encode`), on the record's thread.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpanBoundary {
    pub name: String,
    /// Tokens in the batch, for llama_decode / llama_encode.
    pub n_tokens: Option<u32>,
    /// The batch's tokens by sequence: (sequence id, tokens), for up to six sequences, where the
    /// batch was built through `llama_batch_ext_add[_token]` (a server's slots are sequences).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<(i32, u32)>,
    /// Tokens of sequences beyond those in `seqs`.
    #[serde(skip_serializing_if = "is_zero")]
    pub other_seq_tokens: u32,
    /// `llama_memory_seq_rm`'s sequence and the positions it removes, `[p0, p1)` (negative: from
    /// the start, to the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<(i32, i32, i32)>,
}

impl SpanBoundary {
    /// The record's payload: the bytes `serde_json::to_vec` makes of it, written directly (a
    /// writer makes two per decoded batch, and serde's path costs it ~3 times as much).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.name.len() + 24 * self.seqs.len());
        let mut digits = itoa::Buffer::new();
        out.extend_from_slice(b"{\"name\":");
        json_str(&mut out, &self.name);
        out.extend_from_slice(b",\"n_tokens\":");
        match self.n_tokens {
            Some(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        if !self.seqs.is_empty() {
            out.extend_from_slice(b",\"seqs\":[");
            for (i, &(seq, tokens)) in self.seqs.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                out.extend_from_slice(digits.format(seq).as_bytes());
                out.push(b',');
                out.extend_from_slice(digits.format(tokens).as_bytes());
                out.push(b']');
            }
            out.push(b']');
        }
        if self.other_seq_tokens != 0 {
            out.extend_from_slice(b",\"other_seq_tokens\":");
            out.extend_from_slice(digits.format(self.other_seq_tokens).as_bytes());
        }
        if let Some((seq, p0, p1)) = self.removed {
            out.extend_from_slice(b",\"removed\":[");
            for (i, n) in [seq, p0, p1].into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(digits.format(n).as_bytes());
            }
            out.push(b']');
        }
        out.push(b'}');
        out
    }

    /// Whether the batch holds a prompt: a sequence with several tokens in it, where the
    /// sequences are known (a server's batch of one token for each of four sequences is
    /// generation); else several tokens. `None` without a token count.
    pub fn is_prefill(&self) -> Option<bool> {
        if self.seqs.is_empty() {
            self.n_tokens.map(|n| n > 1)
        } else {
            Some(self.seqs.iter().any(|&(_, n)| n > 1))
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a node is: applies to the op events with this tensor name (their label) and op type that
/// follow it, until the next record for the same name and op type. One whose `op_type` is null
/// applies to every op of that name, until the next record for that name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TensorInfo {
    pub name: String,
    /// `ggml_op_desc`: the op, or the unary / GLU sub-op (`MUL_MAT`, `SILU`).
    pub op: String,
    /// `t->op` and `ggml_op_name` of it, when the writer could read the struct safely.
    pub op_type: Option<u32>,
    pub op_name: Option<String>,
    /// `ggml_type_name` of the result (`f32`, `q4_0`).
    #[serde(rename = "type")]
    pub type_name: String,
    pub ne: [i64; 4],
    /// Floating-point operations, where well defined (MUL_MAT: 2·K·M·N; MUL_MAT_ID: 2·K per
    /// element of the result).
    pub flops: Option<u64>,
    /// Bytes of its sources (`ggml_nbytes` of each, weights included): what the node reads,
    /// beside the result it writes (the op events' `op_size`).
    pub src_bytes: Option<u64>,
    /// A node a GPU computed: the kernels (Vulkan pipelines) it ran, in order, `, `-separated.
    pub kernels: Option<String>,
}

/// A [`TensorInfo`]'s fields, borrowed: what a writer has in hand when it makes the record
/// (ggml's own strings), without making a `String` of each.
#[derive(Clone, Copy, Debug)]
pub struct TensorInfoRef<'a> {
    pub name: &'a str,
    pub op: &'a str,
    pub op_type: Option<u32>,
    pub op_name: Option<&'a str>,
    pub type_name: &'a str,
    pub ne: [i64; 4],
    pub flops: Option<u64>,
    pub src_bytes: Option<u64>,
    pub kernels: Option<&'a str>,
}

impl<'a> From<&'a TensorInfo> for TensorInfoRef<'a> {
    fn from(info: &'a TensorInfo) -> Self {
        TensorInfoRef {
            name: &info.name,
            op: &info.op,
            op_type: info.op_type,
            op_name: info.op_name.as_deref(),
            type_name: &info.type_name,
            ne: info.ne,
            flops: info.flops,
            src_bytes: info.src_bytes,
            kernels: info.kernels.as_deref(),
        }
    }
}

impl TensorInfoRef<'_> {
    /// The record's payload: the bytes `serde_json::to_vec` makes of the [`TensorInfo`], written
    /// directly (a writer makes one per distinct node, and serde's path costs it ~1.7 times as
    /// much).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.name.len());
        out.extend_from_slice(b"{\"name\":");
        json_str(&mut out, self.name);
        out.extend_from_slice(b",\"op\":");
        json_str(&mut out, self.op);
        out.extend_from_slice(b",\"op_type\":");
        let mut digits = itoa::Buffer::new();
        match self.op_type {
            Some(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"op_name\":");
        match self.op_name {
            Some(s) => json_str(&mut out, s),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"type\":");
        json_str(&mut out, self.type_name);
        out.extend_from_slice(b",\"ne\":[");
        for (i, n) in self.ne.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(digits.format(*n).as_bytes());
        }
        out.extend_from_slice(b"],\"flops\":");
        match self.flops {
            Some(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"src_bytes\":");
        match self.src_bytes {
            Some(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"kernels\":");
        match self.kernels {
            Some(s) => json_str(&mut out, s),
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
        out
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it: `"` and `\\`, the short forms of
/// backspace, form feed, newline, carriage return and tab, `\u00xx` for the other control
/// characters; everything else as it is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Names seldom need escaping: a scan without branches per byte finds that out first.
    if !bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    }) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        plain = i + 1;
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

/// A tensor info kept: its place in the order infos came, the info, and the record it came in.
type Kept = (u64, TensorInfo, Box<[u8]>);

/// The names a trace gives its numbers, as its op-name, tensor-info and backend-name records
/// come: what both the importer and the op analysis name nodes by.
#[derive(Clone, Debug, Default)]
pub struct NameTables {
    op_names: std::collections::HashMap<u32, String>,
    /// By tensor name, the latest info for each op type (`None`: an info that does not say its
    /// op, which applies to any), with its place in the order infos came and its record.
    infos: FxHashMap<String, Vec<Kept>>,
    infos_taken: u64,
    /// By record, the name and op type of each info kept: a record that comes again is found
    /// without parsing it.
    held: FxHashMap<Box<[u8]>, (String, Option<u32>)>,
    backends: std::collections::HashMap<u64, String>,
}

/// What a record taken in by [`NameTables::take`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamesChanged {
    /// Op or backend names: any node's name may have changed.
    All,
    /// The info of the tensor of this name.
    Tensor(String),
}

impl NameTables {
    /// Takes in an extension record of `kind` with `payload` if it is one of the tables'; what it
    /// changed (`None` for other kinds).
    pub fn take(&mut self, kind: ExtensionKind, payload: &[u8]) -> Option<NamesChanged> {
        match kind {
            ExtensionKind::OpNames => {
                let names = parse_payload::<OpNames>(payload).unwrap_or_default().names;
                for (k, v) in names {
                    if let Ok(k) = k.parse() {
                        self.op_names.insert(k, v);
                    }
                }
                Some(NamesChanged::All)
            }
            ExtensionKind::TensorInfo => {
                if let Some((name, op_type)) = self.held.get(payload)
                    && self.is_latest(name, *op_type)
                {
                    return None;
                }
                let info = parse_payload::<TensorInfo>(payload)?;
                let (name, op_type) = (info.name.clone(), info.op_type);
                self.infos_taken += 1;
                let taken = (self.infos_taken, info, payload.into());
                let of_name = self.infos.entry(name.clone()).or_default();
                match of_name.iter_mut().find(|(_, i, _)| i.op_type == op_type) {
                    Some(kept) => {
                        let replaced = std::mem::replace(kept, taken);
                        self.held.remove(&replaced.2);
                    }
                    None => of_name.push(taken),
                }
                self.held.insert(payload.into(), (name.clone(), op_type));
                Some(NamesChanged::Tensor(name))
            }
            ExtensionKind::BackendNames => {
                let names = parse_payload::<BackendNames>(payload).unwrap_or_default();
                for b in names.backends {
                    self.backends.insert(b.ptr, b.name);
                }
                Some(NamesChanged::All)
            }
            _ => None,
        }
    }

    /// Whether taking the kept info of `name` for `op_type` again would change nothing: no info
    /// it competes with came after it (any of the name's for an info without an op; the name's
    /// info without an op, for one with).
    fn is_latest(&self, name: &str, op_type: Option<u32>) -> bool {
        let Some(of_name) = self.infos.get(name) else {
            return false;
        };
        let Some(&(taken, ..)) = of_name.iter().find(|(_, i, _)| i.op_type == op_type) else {
            return false;
        };
        (of_name.iter())
            .filter(|(_, i, _)| op_type.is_none() || i.op_type.is_none())
            .all(|&(t, ..)| t <= taken)
    }

    /// The info of the node computing tensor `name` with op `op_type`, if the trace gave one:
    /// the latest for that name and op, or for that name without an op if that came later.
    pub fn info(&self, name: &str, op_type: u32) -> Option<&TensorInfo> {
        self.infos
            .get(name)?
            .iter()
            .filter(|(_, i, _)| i.op_type.is_none_or(|o| o == op_type))
            .max_by_key(|(taken, ..)| *taken)
            .map(|(_, i, _)| i)
    }

    /// What a node of op `op_type` with `info` computes: the info's op (the sub-op of a unary or
    /// GLU op, a fused call's ops), else the op's name in the trace's table, else its number.
    pub fn op<'a>(
        &'a self,
        info: Option<&'a TensorInfo>,
        op_type: u32,
    ) -> std::borrow::Cow<'a, str> {
        match info {
            Some(i) if !i.op.is_empty() => i.op.as_str().into(),
            _ => match self.op_names.get(&op_type) {
                Some(name) => name.as_str().into(),
                None => format!("op {op_type}").into(),
            },
        }
    }

    /// The name of backend `ptr`, if the trace gave one.
    pub fn backend(&self, ptr: u64) -> Option<&str> {
        self.backends.get(&ptr).map(String::as_str)
    }
}

/// Backend buffers allocated and never freed, as the writer closed the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LiveBuffers {
    pub buffers: Vec<LiveBuffer>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LiveBuffer {
    /// The buffer handle (the `ptr` of its TENSOR_ALLOC).
    pub ptr: u64,
    pub size: u64,
    pub buffer_type: String,
}

/// What a backend buffer holds (kind 11), said when the program tells ggml: `usage` after
/// `ggml_backend_buffer_set_usage` (`any`, `weights`, `compute`, or the number of a usage this
/// writer does not know), `first_tensor` after `ggml_backend_alloc_ctx_tensors_from_buft` made
/// the buffer for a context's tensors (the name of its first tensor, at most
/// [`BufferUse::FIRST_TENSOR_BYTES`] bytes of it: llama.cpp's KV cache is `cache_k_l0`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BufferUse {
    /// The buffer handle (the `ptr` of its TENSOR_ALLOC).
    pub buffer: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_tensor: Option<String>,
}

impl BufferUse {
    /// The most of a first tensor's name a writer records.
    pub const FIRST_TENSOR_BYTES: usize = 16;

    /// The name of `enum ggml_backend_buffer_usage` value `usage`.
    pub fn usage_name(usage: u32) -> String {
        match usage {
            0 => "any".into(),
            1 => "weights".into(),
            2 => "compute".into(),
            other => other.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hand-written payload is serde's, byte for byte, whatever the span holds (names
        /// that need escaping, no or several sequences, negative positions).
        #[test]
        fn span_payloads_are_serdes_bytes(
            name in ".{0,12}",
            n_tokens in proptest::option::of(any::<u32>()),
            seqs in proptest::collection::vec(any::<(i32, u32)>(), 0..7),
            other_seq_tokens in prop_oneof![Just(0u32), any::<u32>()],
            removed in proptest::option::of(any::<(i32, i32, i32)>()),
        ) {
            let span = SpanBoundary { name, n_tokens, seqs, other_seq_tokens, removed };
            prop_assert_eq!(span.to_json(), serde_json::to_vec(&span).unwrap());
        }
    }

    /// A node is named by its tensor's info when that info is for the node's op, else by the op
    /// table, else by number; a later record for a tensor replaces its info.
    #[test]
    fn nodes_are_named_from_the_latest_tables() {
        let mut t = NameTables::default();
        let ops = br#"{"names":{"29":"MUL_MAT","x":"bad"}}"#;
        assert_eq!(t.take(ExtensionKind::OpNames, ops), Some(NamesChanged::All));
        let info = br#"{"name":"ffn_out-0","op":"SILU","op_type":80,"type":"f32","ne":[8,1,1,1]}"#;
        let changed = t.take(ExtensionKind::TensorInfo, info);
        assert_eq!(changed, Some(NamesChanged::Tensor("ffn_out-0".into())));
        assert_eq!(t.take(ExtensionKind::TensorInfo, b"not json"), None);
        assert_eq!(t.take(ExtensionKind::Metadata, ops), None);
        assert_eq!(t.op(t.info("ffn_out-0", 80), 80), "SILU");
        // Another op under that name (a graph reusing it): the info is not that node's.
        assert_eq!(t.info("ffn_out-0", 29), None);
        assert_eq!(t.op(t.info("ffn_out-0", 29), 29), "MUL_MAT");
        assert_eq!(t.op(None, 7), "op 7");
        let info = br#"{"name":"ffn_out-0","op":"GELU","op_type":80}"#;
        t.take(ExtensionKind::TensorInfo, info);
        assert_eq!(t.op(t.info("ffn_out-0", 80), 80), "GELU");
        let backends = br#"{"backends":[{"ptr":4096,"name":"CUDA0"}]}"#;
        assert_eq!(
            t.take(ExtensionKind::BackendNames, backends),
            Some(NamesChanged::All)
        );
        assert_eq!((t.backend(4096), t.backend(0)), (Some("CUDA0"), None));
    }

    /// The tensor-info record of `Qcur-0` computed by `op` (`op_type`), `ne0` wide.
    fn qcur_info(op: &str, op_type: Option<u32>, ne0: i64) -> Vec<u8> {
        let info = TensorInfo {
            name: "Qcur-0".into(),
            op: op.into(),
            op_type,
            ne: [ne0, 1, 1, 1],
            ..TensorInfo::default()
        };
        serde_json::to_vec(&info).unwrap()
    }

    /// Two nodes of one name and different ops (llama.cpp's `Qcur-0`: a MUL_MAT, then the ROPE
    /// after it): each op finds its own info, in whatever order the records came; a record that
    /// does not say its op applies to every op of the name until one is given again.
    #[test]
    fn a_name_keeps_one_info_per_op() {
        let mut t = NameTables::default();
        let mut take = |op: &str, op_type: Option<u32>, ne0: i64| {
            let json = qcur_info(op, op_type, ne0);
            assert!(t.take(ExtensionKind::TensorInfo, &json).is_some());
            t.clone()
        };
        take("MUL_MAT", Some(29), 64);
        let t1 = take("ROPE", Some(45), 64);
        let op_of =
            |t: &NameTables, op_type| t.info("Qcur-0", op_type).map(|i| (i.op.clone(), i.ne[0]));
        assert_eq!(op_of(&t1, 29), Some(("MUL_MAT".into(), 64)));
        assert_eq!(op_of(&t1, 45), Some(("ROPE".into(), 64)));
        assert_eq!(op_of(&t1, 7), None);
        // A generation step's shape replaces the prompt's, for that op only.
        let t2 = take("MUL_MAT", Some(29), 1);
        assert_eq!(op_of(&t2, 29), Some(("MUL_MAT".into(), 1)));
        assert_eq!(op_of(&t2, 45), Some(("ROPE".into(), 64)));
        // Without an op: for every op, until one is given again.
        let t3 = take("?", None, 7);
        assert_eq!(
            (op_of(&t3, 29), op_of(&t3, 7)),
            (Some(("?".into(), 7)), Some(("?".into(), 7)))
        );
        let t4 = take("ROPE", Some(45), 8);
        assert_eq!(op_of(&t4, 45), Some(("ROPE".into(), 8)));
        assert_eq!(op_of(&t4, 29), Some(("?".into(), 7)));
        assert_eq!(t4.info("Kcur-0", 29), None);
    }

    /// A record the tables already hold, as the latest for its name and op, changes nothing (the
    /// hook repeats a tensor's info wherever another node of its name came between: llama.cpp's
    /// `Qcur-0` MUL_MAT and ROPE, every graph); one that would make an older info the latest again
    /// changes what a name's ops find.
    #[test]
    fn a_record_already_held_changes_nothing() {
        let mut t = NameTables::default();
        let (mul_mat, rope, any) = (
            qcur_info("MUL_MAT", Some(29), 64),
            qcur_info("ROPE", Some(48), 64),
            qcur_info("?", None, 7),
        );
        let changed = Some(NamesChanged::Tensor("Qcur-0".into()));
        let mut take = |json: &[u8]| t.take(ExtensionKind::TensorInfo, json);
        assert_eq!(take(&mul_mat), changed);
        assert_eq!(take(&rope), changed);
        for _ in 0..3 {
            assert_eq!(take(&mul_mat), None);
            assert_eq!(take(&rope), None);
        }
        // An info for any op, then the MUL_MAT's again: that one is the latest for op 29 again.
        assert_eq!(take(&any), changed);
        assert_eq!(take(&mul_mat), changed);
        assert_eq!(take(&mul_mat), None);
        let op_of = |t: &NameTables, op_type| t.info("Qcur-0", op_type).map(|i| i.op.clone());
        assert_eq!(op_of(&t, 29).as_deref(), Some("MUL_MAT"));
        assert_eq!(op_of(&t, 48).as_deref(), Some("?"));
        // The info for any op again: it is not the latest of its name, so it changes op 29's.
        assert_eq!(t.take(ExtensionKind::TensorInfo, &any), changed);
        assert_eq!(op_of(&t, 29).as_deref(), Some("?"));
        assert_eq!(t.take(ExtensionKind::TensorInfo, &any), None);
    }

    #[test]
    fn a_batch_is_prefill_when_a_sequence_brings_several_tokens() {
        let batch = |n_tokens, seqs: &[(i32, u32)]| SpanBoundary {
            name: "llama_decode".into(),
            n_tokens,
            seqs: seqs.to_vec(),
            ..SpanBoundary::default()
        };
        assert_eq!(
            batch(Some(4), &[(0, 1), (1, 1), (2, 1), (3, 1)]).is_prefill(),
            Some(false)
        );
        assert_eq!(batch(Some(14), &[(0, 1), (1, 13)]).is_prefill(), Some(true));
        assert_eq!(batch(Some(4), &[]).is_prefill(), Some(true));
        assert_eq!(batch(Some(1), &[]).is_prefill(), Some(false));
        assert_eq!(batch(None, &[]).is_prefill(), None);
    }

    /// Every ASCII character in one name, so that each escape is made at least once.
    #[test]
    fn a_tensor_infos_json_escapes_as_serde_json_does() {
        let info = TensorInfo {
            name: (0..=0x7f_u8).map(char::from).collect(),
            op_name: Some("é\u{1}".into()),
            ..TensorInfo::default()
        };
        assert_eq!(
            TensorInfoRef::from(&info).to_json(),
            serde_json::to_vec(&info).unwrap()
        );
    }

    proptest! {
        /// `TensorInfoRef::to_json` makes serde_json's bytes, for any names (quotes, backslashes,
        /// every control character, non-ASCII), any shape and either state of each option.
        #[test]
        fn a_tensor_infos_json_is_serde_jsons(
            name in "(\\PC|[\\x00-\\x1f\"\\\\\\x7f])*",
            op in "[A-Z_+]{0,12}",
            op_type in proptest::option::of(any::<u32>()),
            op_name in proptest::option::of("(\\PC|[\\x00-\\x1f])*"),
            type_name in "\\PC{0,6}",
            ne in any::<[i64; 4]>(),
            flops in proptest::option::of(any::<u64>()),
            src_bytes in proptest::option::of(any::<u64>()),
            kernels in proptest::option::of("(\\PC|[\\x00-\\x1f])*"),
        ) {
            let info = TensorInfo {
                name, op, op_type, op_name, type_name, ne, flops, src_bytes, kernels,
            };
            prop_assert_eq!(
                String::from_utf8(TensorInfoRef::from(&info).to_json()).unwrap(),
                serde_json::to_string(&info).unwrap()
            );
        }
    }
}
