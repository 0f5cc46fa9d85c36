//! ggml-viz-format: the GGMLVIZ v1 record format, its one definition, shared by the hook's
//! writer and the reader (as Tracy's client and server share one header of queue types): event
//! types, the packed and padded layouts, encoding and decoding of records, extension payloads in
//! [`ext`], damage, layout detection. No reader and no model: the preloaded hook links this crate
//! alone.
//!
//! `reader/format/FORMAT.md` is the prose version of this crate; keep the two in step.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

mod codec;
mod damage;
mod detect;
pub mod ext;

pub use codec::{
    RecordError, RecordView, decode_extension, decode_framed_record, decode_payload, decode_record,
    encode_event, encode_header, encode_record, padding_is_zero, record_len,
};
pub use damage::check_header;
pub use damage::{Damage, DamageKind};
pub use detect::{LayoutChoice, LayoutSource, choose_layout, marker_layout};

/// `GGMLVIZ1`, the first eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"GGMLVIZ1";
/// The only format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Magic plus the little-endian `u32` version.
pub const HEADER_LEN: usize = 12;
/// Where a record's little-endian `u64` timestamp lies, after its type byte.
pub const TIMESTAMP_OFFSET: usize = 1;
/// Where its little-endian `u32` thread id lies.
pub const THREAD_ID_OFFSET: usize = 9;
/// Type byte, `u64` timestamp and `u32` thread id come before the event union.
pub const UNION_OFFSET: usize = 13;
/// Longest label we accept. Longer lengths are taken as corruption, not as a truncated tail,
/// so that a damaged length field can never make a reader wait for (or allocate) gigabytes.
pub const MAX_LABEL_LEN: u32 = 16 << 20;

/// Type code of the ggml-viz extension records (see [`Extension`]). Spec-following readers skip
/// it like any other unknown type.
pub const EXTENSION_TYPE_CODE: u8 = 0xC0;

/// The label of a buffer event (TENSOR_ALLOC / TENSOR_FREE, FORMAT.md "Buffers"):
/// `<buffer type name>@<base address>` (`CPU_Mapped@0x7f…`).
pub fn buffer_label(buffer_type: &str, base: u64) -> String {
    format!("{buffer_type}@{base:#x}")
}

/// The buffer type a buffer event's label names (see [`buffer_label`]): all of it where it has
/// no `@`.
pub fn buffer_type_of(label: &str) -> &str {
    buffer_parts(label).0
}

/// The buffer type and the base address a buffer event's label names (see [`buffer_label`]):
/// all of it and nothing where it has no `@`.
pub fn buffer_parts(label: &str) -> (&str, &str) {
    label.split_once('@').unwrap_or((label, ""))
}
/// First four bytes of an extension record's union: tells our records from another writer's use
/// of the same type code.
pub const EXTENSION_MAGIC: [u8; 4] = *b"GVZX";

/// How the event union is laid out on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// The spec's layout: fields written back to back, union of 28 bytes, 42-byte fixed part.
    Packed,
    /// The C++ tool's layout (v0.0.12): the in-memory C union of 32 bytes with 4 padding bytes
    /// after `op_type`, 46-byte fixed part.
    Padded,
}

impl Layout {
    /// Size of the event union in this layout.
    pub const fn union_len(self) -> usize {
        match self {
            Layout::Packed => 28,
            Layout::Padded => 32,
        }
    }

    /// Size of an event without its label length and label.
    pub const fn fixed_len(self) -> usize {
        UNION_OFFSET + self.union_len() + 1
    }

    /// The layout whose union has `len` bytes, if any.
    pub const fn from_union_len(len: u32) -> Option<Layout> {
        match len {
            28 => Some(Layout::Packed),
            32 => Some(Layout::Padded),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Layout::Packed => "packed",
            Layout::Padded => "padded",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "packed" => Ok(Layout::Packed),
            "padded" => Ok(Layout::Padded),
            other => Err(format!(
                "unknown layout {other:?}: expected `packed` or `padded`"
            )),
        }
    }
}

/// The event types of the spec, codes 0 to 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EventType {
    GraphComputeBegin = 0,
    GraphComputeEnd = 1,
    OpComputeBegin = 2,
    OpComputeEnd = 3,
    TensorAlloc = 4,
    TensorFree = 5,
    BarrierWait = 6,
    ThreadBegin = 7,
    ThreadFree = 8,
}

impl EventType {
    pub const ALL: [EventType; 9] = [
        EventType::GraphComputeBegin,
        EventType::GraphComputeEnd,
        EventType::OpComputeBegin,
        EventType::OpComputeEnd,
        EventType::TensorAlloc,
        EventType::TensorFree,
        EventType::BarrierWait,
        EventType::ThreadBegin,
        EventType::ThreadFree,
    ];

    pub const fn from_code(code: u8) -> Option<EventType> {
        if (code as usize) < Self::ALL.len() {
            Some(Self::ALL[code as usize])
        } else {
            None
        }
    }

    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The name used by `ggml-viz dump --to jsonl` and everywhere else.
    pub const fn name(self) -> &'static str {
        match self {
            EventType::GraphComputeBegin => "graph_compute_begin",
            EventType::GraphComputeEnd => "graph_compute_end",
            EventType::OpComputeBegin => "op_compute_begin",
            EventType::OpComputeEnd => "op_compute_end",
            EventType::TensorAlloc => "tensor_alloc",
            EventType::TensorFree => "tensor_free",
            EventType::BarrierWait => "barrier_wait",
            EventType::ThreadBegin => "thread_begin",
            EventType::ThreadFree => "thread_free",
        }
    }
}

/// Kinds of ggml-viz extension record. The number is stored in the record; never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExtensionKind {
    /// First record our writer emits: writer, layout, process identity, settings (JSON).
    Metadata,
    /// Events lost by the writer: ring full, over the event cap (JSON).
    Counters,
    /// `enum ggml_op` value to name table of the ggml that ran (JSON).
    OpNames,
    /// Backend pointer to name table (JSON).
    BackendNames,
    /// An application-level span opens; label is JSON with at least `name`.
    SpanBegin,
    /// An application-level span closes.
    SpanEnd,
    /// A node's name, op, type, shape and FLOP count; applies to the op events of that tensor name
    /// and op type that follow, until the next record for the same name and op type (JSON).
    TensorInfo,
    /// Backend buffers still allocated when the writer closed the trace (JSON).
    LiveBuffers,
    /// A ggml-rpc command begins on this thread: a client's request or answer, a server's
    /// serving of it (JSON, [`ext::RpcBoundary`]).
    RpcBegin,
    /// It ends, with the bytes it moved.
    RpcEnd,
    /// What a backend buffer holds: its usage as ggml was told it, or the first tensor allocated
    /// in it (JSON, [`ext::BufferUse`]).
    BufferUse,
    /// A kind this reader does not know (a newer writer); kept, shown by number.
    Other(u16),
}

impl ExtensionKind {
    pub const fn from_code(code: u16) -> ExtensionKind {
        match code {
            1 => ExtensionKind::Metadata,
            2 => ExtensionKind::Counters,
            3 => ExtensionKind::OpNames,
            4 => ExtensionKind::BackendNames,
            5 => ExtensionKind::SpanBegin,
            6 => ExtensionKind::SpanEnd,
            7 => ExtensionKind::TensorInfo,
            8 => ExtensionKind::LiveBuffers,
            9 => ExtensionKind::RpcBegin,
            10 => ExtensionKind::RpcEnd,
            11 => ExtensionKind::BufferUse,
            other => ExtensionKind::Other(other),
        }
    }

    pub const fn code(self) -> u16 {
        match self {
            ExtensionKind::Metadata => 1,
            ExtensionKind::Counters => 2,
            ExtensionKind::OpNames => 3,
            ExtensionKind::BackendNames => 4,
            ExtensionKind::SpanBegin => 5,
            ExtensionKind::SpanEnd => 6,
            ExtensionKind::TensorInfo => 7,
            ExtensionKind::LiveBuffers => 8,
            ExtensionKind::RpcBegin => 9,
            ExtensionKind::RpcEnd => 10,
            ExtensionKind::BufferUse => 11,
            ExtensionKind::Other(code) => code,
        }
    }

    pub fn name(self) -> Cow<'static, str> {
        match self {
            ExtensionKind::Metadata => "metadata".into(),
            ExtensionKind::Counters => "counters".into(),
            ExtensionKind::OpNames => "op_names".into(),
            ExtensionKind::BackendNames => "backend_names".into(),
            ExtensionKind::SpanBegin => "span_begin".into(),
            ExtensionKind::SpanEnd => "span_end".into(),
            ExtensionKind::TensorInfo => "tensor_info".into(),
            ExtensionKind::LiveBuffers => "live_buffers".into(),
            ExtensionKind::RpcBegin => "rpc_begin".into(),
            ExtensionKind::RpcEnd => "rpc_end".into(),
            ExtensionKind::BufferUse => "buffer_use".into(),
            ExtensionKind::Other(code) => format!("extension_{code}").into(),
        }
    }
}

/// The union of an extension record. The payload itself is the record's label (compact JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extension {
    pub kind: ExtensionKind,
    /// Version of this kind's payload; bumped when its JSON changes incompatibly.
    pub version: u16,
    /// The layout the writer used: our layout marker, so a reader never has to guess.
    pub layout: Layout,
}

/// The event union, decoded according to the event's type code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Types 0 and 1.
    Graph {
        graph_ptr: u64,
        n_nodes: u32,
        n_threads: u32,
        backend_ptr: u64,
    },
    /// Types 2 and 3.
    Op {
        tensor_ptr: u64,
        op_type: u32,
        op_size: u64,
        backend_ptr: u64,
    },
    /// Types 4 and 5.
    Memory { ptr: u64, size: u64 },
    /// Types 6 to 8, which the spec leaves undefined: our definition, see FORMAT.md.
    Thread {
        object_ptr: u64,
        thread_index: u32,
        n_threads: u32,
        value: u64,
    },
    /// A ggml-viz extension record (type [`EXTENSION_TYPE_CODE`] carrying [`EXTENSION_MAGIC`]).
    Extension(Extension),
    /// Any other type code: the union's bytes as found (the last 4 are zero in the packed layout).
    Unknown { raw: [u8; 32] },
}

/// One event. `label` borrows from the mapped file where it can.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub type_code: u8,
    pub timestamp_ns: u64,
    pub thread_id: u32,
    pub payload: Payload,
    pub label: Option<Cow<'a, [u8]>>,
}

impl Event<'_> {
    /// The spec's type, if the code is one of 0 to 8.
    pub fn event_type(&self) -> Option<EventType> {
        EventType::from_code(self.type_code)
    }

    /// The label as text; invalid UTF-8 (labels come from C strings) is replaced, never an error.
    pub fn label_str(&self) -> Option<Cow<'_, str>> {
        self.label.as_deref().map(String::from_utf8_lossy)
    }

    /// A copy that owns its label.
    pub fn into_owned(self) -> Event<'static> {
        Event {
            label: self.label.map(|l| Cow::Owned(l.into_owned())),
            ..self
        }
    }
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
