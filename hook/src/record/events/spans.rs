//! Application-level spans (`llama_decode`, `llama_encode`, `llama_memory_seq_rm`) and the
//! parts of ggml-rpc commands: built from what the wrappers read, recorded as pairs.

use ggml_viz_format::EXTENSION_TYPE_CODE;
use ggml_viz_format::ext::RpcPart;

use super::{Claim, local, push, span_edge};
use crate::base::entry::Entry;
use crate::base::names::Owner;
use crate::base::ring::RawEvent;
use crate::record::packing;
use crate::record::session::{active, current};

/// An application-level span (`llama_decode`, `llama_encode`): begin or end, with the batch's
/// tokens (`u32::MAX`: unknown) in `b` and, where known, its sequences: up to `SPAN_SEQS`
/// (sequence id, tokens) pairs packed two to a word in `a`, `d` and `size` (see
/// `packing::span_seqs`), the tokens of the others in `name_id`.
pub fn span(entry: Entry, begin: bool, count: u32, seqs: &[(i32, u32)], other_tokens: u32) {
    let Some(r) = current(1) else { return };
    let words = packing::span_words(seqs);
    let event = RawEvent {
        type_code: EXTENSION_TYPE_CODE,
        entry: entry as u8,
        b: count,
        c: u32::from(begin),
        a: words[0],
        d: words[1],
        size: words[2],
        name_id: other_tokens.min(u32::from(u16::MAX)) as u16,
        ..RawEvent::default()
    };
    local(r, |l| span_edge(l, r, event, begin));
}

/// `llama_memory_seq_rm(mem, seq, p0, p1)` begins or ends: a span of its own, with the sequence
/// in `a` and the positions removed, [p0, p1), in `d` and `size` (as `u32`s).
pub fn seq_removed(begin: bool, seq: i32, p0: i32, p1: i32) {
    let Some(r) = current(1) else { return };
    let event = RawEvent {
        type_code: EXTENSION_TYPE_CODE,
        entry: Entry::LlamaMemorySeqRm as u8,
        b: u32::MAX,
        c: u32::from(begin),
        a: u64::from(seq as u32),
        d: u64::from(p0 as u32),
        size: u64::from(p1 as u32),
        ..RawEvent::default()
    };
    local(r, |l| span_edge(l, r, event, begin));
}

/// One edge of one part of a ggml-rpc command (see [`crate::record::rpc_commands`]).
pub struct RpcEdge<'a> {
    pub part: RpcPart,
    pub command: u8,
    pub connection: u32,
    pub index: u32,
    pub sent: u64,
    pub received: u64,
    /// The far end (a client's) or the address served (a server's).
    pub endpoint: Option<&'a str>,
}

/// Records an edge of an RPC command part: `command` in `b`, the connection and the command's
/// index on it in `a`, bytes sent and received in `d` and `size`, the endpoint's interned name.
pub fn rpc_edge(begin: bool, edge: &RpcEdge<'_>) {
    let Some(r) = current(1) else { return };
    let name_id = edge.endpoint.map_or(0, |endpoint| {
        // Keyed by the text itself (a socket's address is reused by the next connection).
        let key = endpoint.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        }) | 1;
        r.names
            .intern(key as usize, Owner::Endpoint, || endpoint.to_string())
    });
    let event = RawEvent {
        type_code: EXTENSION_TYPE_CODE,
        entry: packing::rpc_entry(edge.part),
        a: (u64::from(edge.connection) << 32) | u64::from(edge.index),
        b: u32::from(edge.command),
        c: u32::from(begin),
        d: edge.sent,
        size: edge.received,
        name_id,
        ..RawEvent::default()
    };
    local(r, |l| push(l, r, event, Claim::Plain));
}

/// Asks the writer to write what the rings hold now rather than at its next interval: a
/// ggml-rpc server's client went away, and such servers are stopped with Ctrl-C, which ends
/// them without their exit handlers.
pub fn write_soon() {
    if let Some(r) = active() {
        r.wake_flusher();
    }
}
