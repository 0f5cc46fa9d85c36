//! Encoding and decoding single records: the byte-level half of the format definition.

use std::borrow::Cow;

use super::*;

/// Offset of `op_size` inside the op variant: right after `op_type`, or after 4 padding bytes.
const fn op_size_offset(layout: Layout) -> usize {
    match layout {
        Layout::Packed => 12,
        Layout::Padded => 16,
    }
}

/// Decodes the union of an event with `type_code` from `u`, which holds `layout.union_len()` bytes.
#[inline(always)]
pub fn decode_payload(type_code: u8, u: &[u8], layout: Layout) -> Payload {
    debug_assert_eq!(u.len(), layout.union_len());
    // The union's size known to the compiler: no bounds check per field.
    match layout {
        Layout::Packed => decode_sized::<{ Layout::Packed.union_len() }>(type_code, u, layout),
        Layout::Padded => decode_sized::<{ Layout::Padded.union_len() }>(type_code, u, layout),
    }
}

/// [`decode_payload`] of `u` if it holds `N` bytes, as a `N`-byte union.
#[inline(always)]
fn decode_sized<const N: usize>(type_code: u8, u: &[u8], layout: Layout) -> Payload {
    match <&[u8; N]>::try_from(u) {
        Ok(union) => decode_union(type_code, union, layout),
        Err(_) => unknown(u),
    }
}

/// [`decode_payload`] of a union of `N` bytes, `layout`'s.
#[inline(always)]
fn decode_union<const N: usize>(type_code: u8, u: &[u8; N], layout: Layout) -> Payload {
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
            _ => unknown(u),
        },
    }
}

/// A union of a type this format does not define: its bytes as found.
fn unknown(u: &[u8]) -> Payload {
    let mut raw = [0u8; 32];
    let n = u.len().min(32);
    raw[..n].copy_from_slice(&u[..n]);
    Payload::Unknown { raw }
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
#[inline]
pub fn encode_record(
    out: &mut Vec<u8>,
    layout: Layout,
    type_code: u8,
    timestamp_ns: u64,
    thread_id: u32,
    payload: &Payload,
    label: Option<&[u8]>,
) {
    let parts = (type_code, timestamp_ns, thread_id, payload, label);
    match layout {
        Layout::Packed => encode_in::<{ Layout::Packed.union_len() }>(out, layout, parts),
        Layout::Padded => encode_in::<{ Layout::Padded.union_len() }>(out, layout, parts),
    }
}

/// [`encode_record`] in the layout whose union has `UNION` bytes, where every offset and the
/// fixed part's length are constants: the fixed part is assembled on the stack and appended
/// with one copy of a constant size (a few moves, not a call).
#[inline(always)]
fn encode_in<const UNION: usize>(
    out: &mut Vec<u8>,
    layout: Layout,
    (type_code, timestamp_ns, thread_id, payload, label): (u8, u64, u32, &Payload, Option<&[u8]>),
) {
    debug_assert_eq!(layout.union_len(), UNION);
    let mut fixed = [0u8; UNION_OFFSET + 32 + 1 + 4];
    fixed[0] = type_code;
    fixed[TIMESTAMP_OFFSET..THREAD_ID_OFFSET].copy_from_slice(&timestamp_ns.to_le_bytes());
    fixed[THREAD_ID_OFFSET..UNION_OFFSET].copy_from_slice(&thread_id.to_le_bytes());
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
            u[8..12].copy_from_slice(&(UNION as u32).to_le_bytes());
        }
        Payload::Unknown { raw } => u.copy_from_slice(&raw),
    }
    // The union ends at the layout's size: has_label (and the label length) overwrite whatever a
    // 32-byte variant left beyond a 28-byte union.
    let has_label_at = UNION_OFFSET + UNION;
    let Some(label) = label else {
        fixed[has_label_at] = 0;
        return append(out, &fixed[..has_label_at + 1], &[]);
    };
    fixed[has_label_at] = 1;
    fixed[has_label_at + 1..has_label_at + 5].copy_from_slice(&(label.len() as u32).to_le_bytes());
    append(out, &fixed[..has_label_at + 5], label);
}

/// Appends `fixed` (of a length known where this is inlined) and `label`, with one reservation.
#[inline(always)]
fn append(out: &mut Vec<u8>, fixed: &[u8], label: &[u8]) {
    let (n, total) = (fixed.len(), fixed.len() + label.len());
    out.reserve(total);
    let at = out.len();
    // SAFETY: `reserve` left room for `total` more bytes after the `at` initialised ones; both
    // sources are slices of their stated lengths, and neither lies in `out`'s buffer (which is
    // exclusively borrowed here). After the copies the first `at + total` bytes are initialised.
    unsafe {
        let end = out.as_mut_ptr().add(at);
        std::ptr::copy_nonoverlapping(fixed.as_ptr(), end, n);
        std::ptr::copy_nonoverlapping(label.as_ptr(), end.add(n), label.len());
        out.set_len(at + total);
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

/// Decodes `record`, one whole record whose length [`record_len`] gave: the framing is not read
/// again.
#[inline]
pub fn decode_framed_record(record: &[u8], layout: Layout) -> Event<'_> {
    match layout {
        Layout::Packed => decode_fixed::<{ Layout::Packed.union_len() }>(record, layout),
        Layout::Padded => decode_fixed::<{ Layout::Padded.union_len() }>(record, layout),
    }
}

/// [`decode_framed_record`] with a union of `U` bytes: the fixed part's size is known to the
/// compiler, so its fields are read without a bounds check each.
#[inline(always)]
fn decode_fixed<const U: usize>(record: &[u8], layout: Layout) -> Event<'_> {
    let fixed = UNION_OFFSET + U + 1;
    let (head, label) = record.split_at(fixed);
    let type_code = head[0];
    let union: &[u8; U] = head[UNION_OFFSET..UNION_OFFSET + U]
        .try_into()
        .expect("a union's bytes");
    Event {
        type_code,
        timestamp_ns: u64_at(head, TIMESTAMP_OFFSET),
        thread_id: u32_at(head, THREAD_ID_OFFSET),
        payload: decode_union(type_code, union, layout),
        label: label.get(4..).map(Cow::Borrowed),
    }
}

/// One whole record where it lies, its fields read when asked for: reading a whole trace
/// decodes the events it handles most (spans' begins and ends) only as far as it needs, and the
/// rest with [`RecordView::event`].
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    layout: Layout,
}

impl<'a> RecordView<'a> {
    /// `record`: one whole record, of the length [`record_len`] gave, in `layout`.
    #[inline(always)]
    pub fn new(record: &'a [u8], layout: Layout) -> RecordView<'a> {
        debug_assert!(record.len() >= layout.fixed_len());
        RecordView {
            bytes: record,
            layout,
        }
    }

    #[inline(always)]
    pub fn type_code(&self) -> u8 {
        self.bytes[0]
    }

    #[inline(always)]
    pub fn timestamp_ns(&self) -> u64 {
        u64_at(self.bytes, TIMESTAMP_OFFSET)
    }

    #[inline(always)]
    pub fn thread_id(&self) -> u32 {
        u32_at(self.bytes, THREAD_ID_OFFSET)
    }

    /// The union, as [`Event::payload`].
    #[inline(always)]
    pub fn payload(&self) -> Payload {
        let union = &self.bytes[UNION_OFFSET..UNION_OFFSET + self.layout.union_len()];
        decode_payload(self.type_code(), union, self.layout)
    }

    /// The label, as [`Event::label`].
    #[inline(always)]
    pub fn label(&self) -> Option<&'a [u8]> {
        self.bytes.get(self.layout.fixed_len() + 4..)
    }

    /// The whole event.
    #[inline(always)]
    pub fn event(&self) -> Event<'a> {
        decode_framed_record(self.bytes, self.layout)
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
    Ok(Some((decode_framed_record(&buf[..len], layout), len)))
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
