//! The writer's extension records (FORMAT.md): buffers and what they hold, application spans,
//! RPC parts, names, counters, and the writer's own records.

use ggml_viz_format::ext::{self, Counters, RpcPart};
use ggml_viz_format::{self as format, ExtensionKind, Payload};

use super::{Drain, TENSOR_ALLOC, TraceWriter, put_event};
use crate::base::clock;
use crate::base::entry::Entry;
use crate::base::names::{Names, Owner};
use crate::base::ring::RawEvent;
use crate::record::packing::span_seqs;

impl TraceWriter {
    /// TENSOR_ALLOC / TENSOR_FREE of a backend buffer: label `<buffer type>@<base address>`.
    pub(super) fn encode_buffer(&mut self, e: &RawEvent, timestamp_ns: u64, d: &Drain<'_>) {
        let buft = d.names.get(e.name_id).map_or("", |(_, _, name)| name);
        if e.type_code == TENSOR_ALLOC {
            self.live_buffers.insert(e.a, (e.size, buft.to_string()));
        } else {
            self.live_buffers.remove(&e.a);
        }
        let label = format::buffer_label(buft, e.d);
        let payload = Payload::Memory {
            ptr: e.a,
            size: e.size,
        };
        put_event(
            &mut self.buf,
            self.layout,
            e.type_code,
            e,
            timestamp_ns,
            &payload,
            Some(label.as_bytes()),
        );
    }

    /// What a buffer holds (an extension record on the thread that said it).
    pub(super) fn encode_buffer_use(
        &mut self,
        e: &RawEvent,
        timestamp_ns: u64,
        used: &ext::BufferUse,
    ) {
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            ExtensionKind::BufferUse,
            timestamp_ns,
            e.thread_id,
            used,
        );
    }

    pub(super) fn encode_span(&mut self, e: &RawEvent, timestamp_ns: u64) {
        let kind = if e.c == 1 {
            ExtensionKind::SpanBegin
        } else {
            ExtensionKind::SpanEnd
        };
        let entry = Entry::from_code(e.entry);
        let name = entry.map_or("span", Entry::name);
        let span = if entry == Some(Entry::LlamaMemorySeqRm) {
            ext::SpanBoundary {
                name: name.into(),
                removed: Some((e.a as u32 as i32, e.d as u32 as i32, e.size as u32 as i32)),
                ..ext::SpanBoundary::default()
            }
        } else {
            ext::SpanBoundary {
                name: name.into(),
                n_tokens: (e.b != u32::MAX).then_some(e.b),
                seqs: span_seqs(e),
                other_seq_tokens: u32::from(e.name_id),
                removed: None,
            }
        };
        ext::encode_extension_json(
            &mut self.buf,
            self.layout,
            kind,
            timestamp_ns,
            e.thread_id,
            &span.to_json(),
        );
    }

    pub(super) fn encode_rpc(
        &mut self,
        e: &RawEvent,
        part: RpcPart,
        timestamp_ns: u64,
        names: &Names,
    ) {
        let (kind, begin) = if e.c == 1 {
            (ExtensionKind::RpcBegin, true)
        } else {
            (ExtensionKind::RpcEnd, false)
        };
        let rpc = ext::RpcBoundary {
            part,
            command: e.b as u8,
            connection: (e.a >> 32) as u32,
            index: e.a as u32,
            endpoint: names
                .get(e.name_id)
                .filter(|_| begin)
                .map(|(_, _, name)| name.to_string()),
            sent: if begin { 0 } else { e.d },
            received: if begin { 0 } else { e.size },
        };
        ext::encode_extension(
            &mut self.buf,
            self.layout,
            kind,
            timestamp_ns,
            e.thread_id,
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
