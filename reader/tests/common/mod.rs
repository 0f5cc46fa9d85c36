//! Event generators shared by the reader's tests.
#![allow(dead_code)] // each test file uses a different part of this module

use std::borrow::Cow;

use ggml_viz_reader::format::{
    self, EXTENSION_TYPE_CODE, Event, Extension, ExtensionKind, Layout, Payload,
};
use proptest::prelude::*;

/// Any event that encodes and decodes exactly in `layout`.
pub fn event(layout: Layout) -> impl Strategy<Value = Event<'static>> {
    let label = prop::option::of(prop::collection::vec(any::<u8>(), 0..40));
    (
        any::<u8>(),
        any::<u64>(),
        any::<u32>(),
        any::<[u64; 4]>(),
        any::<[u8; 32]>(),
        1u16..8,
        label,
    )
        .prop_map(move |(code, ts, tid, w, raw, ext_kind, label)| {
            let payload = match code {
                0 | 1 => Payload::Graph {
                    graph_ptr: w[0],
                    n_nodes: w[1] as u32,
                    n_threads: w[2] as u32,
                    backend_ptr: w[3],
                },
                2 | 3 => Payload::Op {
                    tensor_ptr: w[0],
                    op_type: w[1] as u32,
                    op_size: w[2],
                    backend_ptr: w[3],
                },
                4 | 5 => Payload::Memory {
                    ptr: w[0],
                    size: w[1],
                },
                6..=8 => Payload::Thread {
                    object_ptr: w[0],
                    thread_index: w[1] as u32,
                    n_threads: w[2] as u32,
                    value: w[3],
                },
                EXTENSION_TYPE_CODE => Payload::Extension(Extension {
                    kind: ExtensionKind::from_code(ext_kind),
                    version: w[0] as u16,
                    layout,
                }),
                _ => {
                    let mut raw = raw;
                    raw[layout.union_len()..].fill(0);
                    Payload::Unknown { raw }
                }
            };
            Event {
                type_code: code,
                timestamp_ns: ts,
                thread_id: tid,
                payload,
                label: label.map(Cow::Owned),
            }
        })
}

pub fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Packed), Just(Layout::Padded)]
}

/// A whole trace: header and records, plus where each record ends.
pub fn encode(events: &[Event<'_>], layout: Layout) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::new();
    format::encode_header(&mut bytes);
    let mut ends = Vec::new();
    for e in events {
        format::encode_event(&mut bytes, layout, e);
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// A small realistic trace: our metadata marker first, nested graphs, labelled ops.
pub fn sample_trace(layout: Layout) -> Vec<Event<'static>> {
    let mut out = Vec::new();
    let marker = Payload::Extension(Extension {
        kind: ExtensionKind::Metadata,
        version: 1,
        layout,
    });
    out.push(Event {
        type_code: EXTENSION_TYPE_CODE,
        timestamp_ns: 1,
        thread_id: 7,
        payload: marker,
        label: Some(Cow::Borrowed(br#"{"pid":7}"#)),
    });
    // The scheduler's compute holding the CPU backend's, as the hook writes them (each entry
    // point its own label).
    let graph = |code, ts, n, label: &'static [u8]| Event {
        type_code: code,
        timestamp_ns: ts,
        thread_id: 7,
        payload: Payload::Graph {
            graph_ptr: 0x5000 + n as u64,
            n_nodes: n,
            n_threads: 2,
            backend_ptr: 0,
        },
        label: Some(Cow::Borrowed(label)),
    };
    let (sched, backend) = (
        &b"ggml_backend_sched_graph_compute_async CPU"[..],
        &b"ggml_backend_graph_compute_async CPU"[..],
    );
    for i in 0..3u32 {
        let t = 100 * (i as u64 + 1);
        out.push(graph(0, t, 10 + i, sched));
        out.push(graph(0, t + 1, 10 + i, backend));
        for k in 0..2u64 {
            let op = Payload::Op {
                tensor_ptr: 0x9000 + k,
                op_type: 27,
                op_size: 4096,
                backend_ptr: 0,
            };
            let label = (k == 0).then_some(Cow::Borrowed(&b"ffn_out-0"[..]));
            out.push(Event {
                type_code: 2,
                timestamp_ns: t + 2 + k,
                thread_id: 7,
                payload: op,
                label: label.clone(),
            });
            out.push(Event {
                type_code: 3,
                timestamp_ns: t + 3 + k,
                thread_id: 7,
                payload: op,
                label,
            });
        }
        out.push(graph(1, t + 8, 10 + i, backend));
        out.push(graph(1, t + 9, 10 + i, sched));
    }
    out
}

/// Hands out at most `chunk` bytes per read.
pub struct ChunkedReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    chunk: usize,
}

impl<'a> ChunkedReader<'a> {
    pub fn new(bytes: &'a [u8], chunk: usize) -> Self {
        ChunkedReader {
            bytes,
            pos: 0,
            chunk,
        }
    }
}

impl std::io::Read for ChunkedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.bytes.len() - self.pos);
        buf[..n].copy_from_slice(&self.bytes[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
