//! Application-level spans (`llama_decode`, `llama_encode`, `llama_memory_seq_rm`) and the
//! parts of ggml-rpc commands: built from what the wrappers read, recorded as pairs.

use super::{Claim, local, push, span_edge};
use crate::base::entry::Entry;
use crate::base::names::Owner;
use crate::record::raw::{RpcEdge, SeqRemoved, SpanEdge};
use crate::record::session::{active, current};

/// An application-level span (`llama_decode`, `llama_encode`): begin or end, with the batch's
/// tokens (`u32::MAX`: unknown) and, where known, its sequences' (up to `SPAN_SEQS` of them,
/// the tokens of the others together).
pub fn span(entry: Entry, begin: bool, count: u32, seqs: &[(i32, u32)], other_tokens: u32) {
    let Some(r) = current(1) else { return };
    let event = SpanEdge::new(begin, entry, count, seqs, other_tokens).event();
    local(r, |l| span_edge(l, r, event, begin));
}

/// `llama_memory_seq_rm(mem, seq, p0, p1)` begins or ends: a span of its own, with the sequence
/// and the positions removed, [p0, p1).
pub fn seq_removed(begin: bool, seq: i32, p0: i32, p1: i32) {
    let Some(r) = current(1) else { return };
    let event = SeqRemoved { begin, seq, p0, p1 }.event();
    local(r, |l| span_edge(l, r, event, begin));
}

/// Records an edge of an RPC command part (see [`crate::record::rpc_commands`]), its
/// `endpoint` interned for its label.
pub fn rpc_edge(edge: RpcEdge, endpoint: Option<&str>) {
    let Some(r) = current(1) else { return };
    let endpoint_id = endpoint.map_or(0, |endpoint| {
        // Keyed by the text itself (a socket's address is reused by the next connection).
        let key = endpoint.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        }) | 1;
        r.names
            .intern(key as usize, Owner::Endpoint, || endpoint.to_string())
    });
    let event = RpcEdge {
        endpoint_id,
        ..edge
    }
    .event();
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
