//! The ggml-rpc analysis on any pair of GGMLVIZ traces (a client's and a server's: the input's
//! first four bytes say where the first ends): the join, the clock offsets, the per-token
//! breakdown and the alignment applied to a re-import. Invariants: no panic and no overflow
//! (cargo fuzz builds with overflow checks), whatever times, indices and byte counts the traces
//! hold; what cannot be used is a warning.
#![no_main]

use ggml_viz_reader::Summary;
use ggml_viz_reader::import::ggmlviz;
use ggml_viz_reader::rpc_join::{Aligned, RpcParts, analyse};
use ggml_viz_reader::telemetry::{Ids, ProcessId};
use ggml_viz_reader::{choose_layout, format::HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((split, rest)) = data.split_first_chunk::<4>() else { return };
    let split = (u32::from_le_bytes(*split) as usize).min(rest.len());
    let traces = [&rest[..split], &rest[split..]];
    let layout = |t: &[u8]| choose_layout(t.get(HEADER_LEN..).unwrap_or(&[]), None).layout;
    let mut parts = RpcParts::default();
    let mut ids = Ids::default();
    let mut input_of = Vec::new();
    for (i, trace) in traces.iter().enumerate() {
        let _ = ggmlviz::import(trace, layout(trace), "fuzz", &mut ids, &mut parts);
        input_of.resize(parts.processes.len(), i);
    }
    let analysis = analyse(&parts);
    let _ = analysis.tokens(&parts);
    for o in &analysis.offsets {
        let _ = o.uncertainty_ns();
    }
    let process_input = |process: ProcessId| {
        (parts.processes.iter())
            .position(|p| p.id == process)
            .and_then(|n| input_of.get(n).copied())
    };
    let alignments = analysis.alignments(&parts, traces.len(), process_input, true);
    let mut ids = Ids::default();
    for (trace, alignment) in traces.iter().zip(&alignments) {
        let mut summary = Summary::default();
        let mut aligned = Aligned::new(&mut summary, alignment);
        let _ = ggmlviz::import(trace, layout(trace), "fuzz", &mut ids, &mut aligned);
    }
});
