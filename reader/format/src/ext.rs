//! The payloads of ggml-viz extension records (FORMAT.md, "Extension records"): compact JSON in
//! the record's label, one struct per kind. Unknown fields are ignored and missing ones take
//! their defaults, so that older and newer writers stay readable.

use serde::{Deserialize, Serialize};

use crate::{self as format, EXTENSION_TYPE_CODE, Extension, ExtensionKind, Layout, Payload};

mod json;
mod rpc;
pub use json::{SpanBoundaryRef, TensorInfoRef};
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
    /// The record's payload: the bytes `serde_json::to_vec` makes of it (see
    /// [`SpanBoundaryRef::write_json`]).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.name.len() + 24 * self.seqs.len());
        SpanBoundaryRef::from(self).write_json(&mut out);
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

impl<'a> From<&'a SpanBoundary> for SpanBoundaryRef<'a> {
    fn from(span: &'a SpanBoundary) -> Self {
        SpanBoundaryRef {
            name: &span.name,
            n_tokens: span.n_tokens,
            seqs: &span.seqs,
            other_seq_tokens: span.other_seq_tokens,
            removed: span.removed,
        }
    }
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
