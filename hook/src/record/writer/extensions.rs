//! The writer's extension records (FORMAT.md): buffers and what they hold, application spans,
//! RPC parts, names, counters, and the writer's own records.

use ggml_viz_format::ext::{self, Counters};
use ggml_viz_format::{self as format, EventType, ExtensionKind, Payload};

use super::{Drain, TraceWriter};
use crate::base::clock;
use crate::base::entry::Entry;
use crate::base::names::{Names, Owner};
use crate::record::raw::{BufferEdge, RpcEdge, SPAN_SEQS, SeqRemoved, SpanEdge};

impl TraceWriter {
    /// TENSOR_ALLOC / TENSOR_FREE of a backend buffer: label `<buffer type>@<base address>`.
    pub(super) fn encode_buffer(
        &mut self,
        b: &BufferEdge,
        thread_id: u32,
        timestamp_ns: u64,
        d: &Drain<'_>,
    ) {
        let buft = d.names.get(b.name_id).map_or("", |(_, _, name)| name);
        let type_code = if b.alloc {
            self.live_buffers
                .insert(b.buffer, (b.size, buft.to_string()));
            EventType::TensorAlloc.code()
        } else {
            self.live_buffers.remove(&b.buffer);
            EventType::TensorFree.code()
        };
        let label = format::buffer_label(buft, b.base);
        let payload = Payload::Memory {
            ptr: b.buffer,
            size: b.size,
        };
        format::encode_record(
            &mut self.buf,
            self.layout,
            type_code,
            timestamp_ns,
            thread_id,
            &payload,
            Some(label.as_bytes()),
        );
    }

    /// What a buffer holds (an extension record on the thread that said it).
    pub(super) fn encode_buffer_use(
        &mut self,
        used: &ext::BufferUse,
        thread_id: u32,
        timestamp_ns: u64,
    ) {
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            ExtensionKind::BufferUse,
            timestamp_ns,
            thread_id,
            used,
        );
    }

    pub(super) fn encode_span(&mut self, span: &SpanEdge, thread_id: u32, timestamp_ns: u64) {
        let mut seqs = [(0, 0); SPAN_SEQS];
        let boundary = ext::SpanBoundaryRef {
            name: Entry::from_code(span.entry).map_or("span", Entry::name),
            n_tokens: (span.n_tokens != u32::MAX).then_some(span.n_tokens),
            seqs: span.seqs(&mut seqs),
            other_seq_tokens: u32::from(span.other_tokens),
            removed: None,
        };
        self.encode_span_boundary(span.begin, &boundary, thread_id, timestamp_ns);
    }

    pub(super) fn encode_seq_removed(
        &mut self,
        removed: &SeqRemoved,
        thread_id: u32,
        timestamp_ns: u64,
    ) {
        let boundary = ext::SpanBoundaryRef {
            name: Entry::LlamaMemorySeqRm.name(),
            removed: Some((removed.seq, removed.p0, removed.p1)),
            ..ext::SpanBoundaryRef::default()
        };
        self.encode_span_boundary(removed.begin, &boundary, thread_id, timestamp_ns);
    }

    /// The span record, its payload made in [`TraceWriter::json`] (no allocation once that has
    /// grown to a payload's size).
    fn encode_span_boundary(
        &mut self,
        begin: bool,
        boundary: &ext::SpanBoundaryRef,
        thread_id: u32,
        timestamp_ns: u64,
    ) {
        let kind = if begin {
            ExtensionKind::SpanBegin
        } else {
            ExtensionKind::SpanEnd
        };
        self.json.clear();
        boundary.write_json(&mut self.json);
        ext::encode_extension_json(
            &mut self.buf,
            self.layout,
            kind,
            timestamp_ns,
            thread_id,
            &self.json,
        );
    }

    pub(super) fn encode_rpc(
        &mut self,
        edge: &RpcEdge,
        thread_id: u32,
        timestamp_ns: u64,
        names: &Names,
    ) {
        let kind = if edge.begin {
            ExtensionKind::RpcBegin
        } else {
            ExtensionKind::RpcEnd
        };
        let rpc = ext::RpcBoundary {
            part: edge.part,
            command: edge.command,
            connection: edge.connection,
            index: edge.index,
            endpoint: names
                .get(edge.endpoint_id)
                .filter(|_| edge.begin)
                .map(|(_, _, name)| name.to_string()),
            sent: if edge.begin { 0 } else { edge.sent },
            received: if edge.begin { 0 } else { edge.received },
        };
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            kind,
            timestamp_ns,
            thread_id,
            &rpc,
        );
    }

    pub(super) fn encode_new_names(&mut self, names: &Names) {
        let n = names.len();
        if n == self.names_written {
            return;
        }
        let backends: Vec<_> = (self.names_written..n)
            .filter_map(|i| names.get(i as u16 + 1))
            .filter(|(_, owner, _)| !matches!(owner, Owner::Thread | Owner::Endpoint))
            .map(|(ptr, owner, name)| ext::BackendName {
                ptr: ptr as u64,
                name: name.into(),
                kind: owner.name().into(),
            })
            .collect();
        let payload = ext::BackendNames { backends };
        self.encode_own(ExtensionKind::BackendNames, &payload);
        self.names_written = n;
    }

    /// One of the writer's own extension records (thread 0, stamped now).
    pub(super) fn encode_own<T: serde::Serialize>(&mut self, kind: ExtensionKind, payload: &T) {
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            kind,
            clock::now_ns(),
            0,
            payload,
        );
    }

    pub(super) fn encode_counters(&mut self, counters: Counters) {
        self.encode_own(ExtensionKind::Counters, &counters);
        self.counters_written = counters;
    }
}
