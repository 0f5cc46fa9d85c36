//! The GGMLVIZ v1 record format: the one definition of it, used by the reader and by the hook's
//! writer. Standard library only, so that the preloaded hook stays small.
//!
//! `reader/FORMAT.md` is the prose version of this module; keep the two in step.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// `GGMLVIZ1`, the first eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"GGMLVIZ1";
/// The only format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Magic plus the little-endian `u32` version.
pub const HEADER_LEN: usize = 12;
/// Type byte, `u64` timestamp and `u32` thread id come before the event union.
pub const UNION_OFFSET: usize = 13;
/// Longest label we accept. Longer lengths are taken as corruption, not as a truncated tail,
/// so that a damaged length field can never make a reader wait for (or allocate) gigabytes.
pub const MAX_LABEL_LEN: u32 = 16 << 20;

/// Type code of the ggml-viz extension records (see [`Extension`]). Spec-following readers skip
/// it like any other unknown type.
pub const EXTENSION_TYPE_CODE: u8 = 0xC0;
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

    /// The name used by `ggml-viz dump --format jsonl` and everywhere else.
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
    /// that follow, until the next record for the same name (JSON).
    TensorInfo,
    /// Backend buffers still allocated when the writer closed the trace (JSON).
    LiveBuffers,
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

    /// Bytes this event takes on disk in `layout`.
    pub fn encoded_len(&self, layout: Layout) -> usize {
        layout.fixed_len() + self.label.as_ref().map_or(0, |l| 4 + l.len())
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Offset of `op_size` inside the op variant: right after `op_type`, or after 4 padding bytes.
const fn op_size_offset(layout: Layout) -> usize {
    match layout {
        Layout::Packed => 12,
        Layout::Padded => 16,
    }
}

/// Decodes the union of an event with `type_code` from `u`, which holds `layout.union_len()` bytes.
pub fn decode_payload(type_code: u8, u: &[u8], layout: Layout) -> Payload {
    debug_assert_eq!(u.len(), layout.union_len());
    match type_code {
        0 | 1 => Payload::Graph {
            graph_ptr: u64_at(u, 0),
            n_nodes: u32_at(u, 8),
            n_threads: u32_at(u, 12),
            backend_ptr: u64_at(u, 16),
        },
        2 | 3 => {
            let size_at = op_size_offset(layout);
            Payload::Op {
                tensor_ptr: u64_at(u, 0),
                op_type: u32_at(u, 8),
                op_size: u64_at(u, size_at),
                backend_ptr: u64_at(u, size_at + 8),
            }
        }
        4 | 5 => Payload::Memory {
            ptr: u64_at(u, 0),
            size: u64_at(u, 8),
        },
        6..=8 => Payload::Thread {
            object_ptr: u64_at(u, 0),
            thread_index: u32_at(u, 8),
            n_threads: u32_at(u, 12),
            value: u64_at(u, 16),
        },
        _ => match decode_extension(type_code, u) {
            Some(ext) if ext.layout == layout => Payload::Extension(ext),
            _ => {
                let mut raw = [0u8; 32];
                raw[..u.len()].copy_from_slice(u);
                Payload::Unknown { raw }
            }
        },
    }
}

/// Reads an extension union, whatever layout the rest of the file turns out to use. `u` needs
/// at least 12 bytes, which both layouts have.
pub fn decode_extension(type_code: u8, u: &[u8]) -> Option<Extension> {
    if type_code != EXTENSION_TYPE_CODE || u.len() < 12 || u[..4] != EXTENSION_MAGIC {
        return None;
    }
    let kind = ExtensionKind::from_code(u16::from_le_bytes([u[4], u[5]]));
    let version = u16::from_le_bytes([u[6], u[7]]);
    let layout = Layout::from_union_len(u32_at(u, 8))?;
    Some(Extension {
        kind,
        version,
        layout,
    })
}

/// True when the bytes that the layout says are padding or zero fill are all zero. Used as
/// evidence when the layout of a file without our marker has to be inferred.
pub fn padding_is_zero(type_code: u8, u: &[u8], layout: Layout) -> bool {
    let zero = |range: std::ops::Range<usize>| u[range].iter().all(|&b| b == 0);
    match type_code {
        0 | 1 | 6..=8 => zero(24..u.len()),
        2 | 3 => layout == Layout::Packed || zero(12..16),
        4 | 5 => zero(16..u.len()),
        _ => true,
    }
}

/// Writes the 12-byte file header.
pub fn encode_header(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
}

/// Appends one event in `layout`. The payload is written as given; for the spec's types it should
/// be the variant that matches the type code (the decoder picks the variant by type code).
pub fn encode_event(out: &mut Vec<u8>, layout: Layout, event: &Event<'_>) {
    encode_record(
        out,
        layout,
        event.type_code,
        event.timestamp_ns,
        event.thread_id,
        &event.payload,
        event.label.as_deref(),
    );
}

/// Appends one record from its parts; the writer's entry point, which needs no [`Event`].
pub fn encode_record(
    out: &mut Vec<u8>,
    layout: Layout,
    type_code: u8,
    timestamp_ns: u64,
    thread_id: u32,
    payload: &Payload,
    label: Option<&[u8]>,
) {
    // The fixed part is assembled on the stack and appended in one copy.
    let mut fixed = [0u8; UNION_OFFSET + 32 + 1 + 4];
    fixed[0] = type_code;
    fixed[1..9].copy_from_slice(&timestamp_ns.to_le_bytes());
    fixed[9..13].copy_from_slice(&thread_id.to_le_bytes());
    let u = &mut fixed[UNION_OFFSET..UNION_OFFSET + 32];
    match *payload {
        Payload::Graph {
            graph_ptr,
            n_nodes,
            n_threads,
            backend_ptr,
        } => put_quad(u, graph_ptr, n_nodes, n_threads, backend_ptr),
        Payload::Op {
            tensor_ptr,
            op_type,
            op_size,
            backend_ptr,
        } => {
            let at = op_size_offset(layout);
            u[0..8].copy_from_slice(&tensor_ptr.to_le_bytes());
            u[8..12].copy_from_slice(&op_type.to_le_bytes());
            u[at..at + 8].copy_from_slice(&op_size.to_le_bytes());
            u[at + 8..at + 16].copy_from_slice(&backend_ptr.to_le_bytes());
        }
        Payload::Memory { ptr, size } => {
            u[0..8].copy_from_slice(&ptr.to_le_bytes());
            u[8..16].copy_from_slice(&size.to_le_bytes());
        }
        Payload::Thread {
            object_ptr,
            thread_index,
            n_threads,
            value,
        } => put_quad(u, object_ptr, thread_index, n_threads, value),
        Payload::Extension(ext) => {
            u[0..4].copy_from_slice(&EXTENSION_MAGIC);
            u[4..6].copy_from_slice(&ext.kind.code().to_le_bytes());
            u[6..8].copy_from_slice(&ext.version.to_le_bytes());
            // The marker names the layout actually written, whatever the caller put there.
            u[8..12].copy_from_slice(&(layout.union_len() as u32).to_le_bytes());
        }
        Payload::Unknown { raw } => u.copy_from_slice(&raw),
    }
    // The union ends at the layout's size: has_label (and the label length) overwrite whatever a
    // 32-byte variant left beyond a 28-byte union.
    let has_label_at = layout.fixed_len() - 1;
    match label {
        Some(label) => {
            fixed[has_label_at] = 1;
            fixed[has_label_at + 1..has_label_at + 5]
                .copy_from_slice(&(label.len() as u32).to_le_bytes());
            out.extend_from_slice(&fixed[..has_label_at + 5]);
            out.extend_from_slice(label);
        }
        None => {
            fixed[has_label_at] = 0;
            out.extend_from_slice(&fixed[..has_label_at + 1]);
        }
    }
}

/// The shape the graph and thread variants share: u64, u32, u32, u64.
fn put_quad(u: &mut [u8], a: u64, b: u32, c: u32, d: u64) {
    u[0..8].copy_from_slice(&a.to_le_bytes());
    u[8..12].copy_from_slice(&b.to_le_bytes());
    u[12..16].copy_from_slice(&c.to_le_bytes());
    u[16..24].copy_from_slice(&d.to_le_bytes());
}

/// What can be wrong inside a record (as opposed to it being cut short).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// `has_label` must be 0 or 1.
    BadHasLabel(u8),
    /// The label length is over [`MAX_LABEL_LEN`].
    LabelTooLong(u32),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::BadHasLabel(b) => write!(f, "has_label byte is {b}, expected 0 or 1"),
            RecordError::LabelTooLong(n) => {
                write!(f, "label length {n} is over the {MAX_LABEL_LEN}-byte limit")
            }
        }
    }
}

/// Size of the complete record at the start of `buf`: `Ok(None)` when `buf` ends before the
/// record does. Reads only the type-independent framing bytes: the fast path for counting.
#[inline]
pub fn record_len(buf: &[u8], layout: Layout) -> Result<Option<usize>, RecordError> {
    let fixed = layout.fixed_len();
    let Some(&has_label) = buf.get(fixed - 1) else {
        return Ok(None);
    };
    match has_label {
        0 => Ok(Some(fixed)),
        1 => {
            let Some(len_bytes) = buf.get(fixed..fixed + 4) else {
                return Ok(None);
            };
            let len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes"));
            if len > MAX_LABEL_LEN {
                return Err(RecordError::LabelTooLong(len));
            }
            let total = fixed + 4 + len as usize;
            Ok((buf.len() >= total).then_some(total))
        }
        other => Err(RecordError::BadHasLabel(other)),
    }
}

/// Decodes the record at the start of `buf`: the event and its size, `Ok(None)` when `buf` ends
/// before the record does.
#[inline]
pub fn decode_record(
    buf: &[u8],
    layout: Layout,
) -> Result<Option<(Event<'_>, usize)>, RecordError> {
    let Some(len) = record_len(buf, layout)? else {
        return Ok(None);
    };
    let fixed = layout.fixed_len();
    let type_code = buf[0];
    let event = Event {
        type_code,
        timestamp_ns: u64_at(buf, 1),
        thread_id: u32_at(buf, 9),
        payload: decode_payload(type_code, &buf[UNION_OFFSET..fixed - 1], layout),
        label: (len > fixed).then(|| Cow::Borrowed(&buf[fixed + 4..len])),
    };
    Ok(Some((event, len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op_event() -> Event<'static> {
        Event {
            type_code: 2,
            timestamp_ns: 7,
            thread_id: 9,
            payload: Payload::Op {
                tensor_ptr: 1,
                op_type: 27,
                op_size: 64,
                backend_ptr: 0,
            },
            label: Some(Cow::Borrowed(b"matmul")),
        }
    }

    #[test]
    fn fixed_parts_match_the_two_layouts() {
        assert_eq!(Layout::Packed.fixed_len(), 42);
        assert_eq!(Layout::Padded.fixed_len(), 46);
    }

    #[test]
    fn padded_op_puts_size_after_four_padding_bytes() {
        let mut out = Vec::new();
        encode_event(&mut out, Layout::Padded, &op_event());
        let u = &out[UNION_OFFSET..UNION_OFFSET + 32];
        assert_eq!(&u[12..16], &[0, 0, 0, 0]);
        assert_eq!(u64_at(u, 16), 64);
        assert_eq!(out.len(), 46 + 4 + 6);
    }

    #[test]
    fn truncated_record_needs_more() {
        let mut out = Vec::new();
        encode_event(&mut out, Layout::Packed, &op_event());
        for cut in 0..out.len() {
            assert_eq!(
                decode_record(&out[..cut], Layout::Packed),
                Ok(None),
                "cut at {cut}"
            );
        }
        assert_eq!(
            decode_record(&out, Layout::Packed).unwrap().unwrap().0,
            op_event()
        );
    }

    #[test]
    fn extension_record_carries_the_layout_written() {
        for layout in [Layout::Packed, Layout::Padded] {
            let ext = Extension {
                kind: ExtensionKind::Metadata,
                version: 1,
                layout: Layout::Packed,
            };
            let mut out = Vec::new();
            encode_record(
                &mut out,
                layout,
                EXTENSION_TYPE_CODE,
                0,
                0,
                &Payload::Extension(ext),
                None,
            );
            let found = decode_extension(out[0], &out[UNION_OFFSET..]).unwrap();
            assert_eq!(found.layout, layout);
        }
    }

    #[test]
    fn foreign_use_of_the_extension_code_is_unknown() {
        let raw = [0xAB; 32];
        let p = decode_payload(EXTENSION_TYPE_CODE, &raw[..28], Layout::Packed);
        assert!(matches!(p, Payload::Unknown { .. }));
    }
}
