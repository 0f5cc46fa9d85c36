//! NVIDIA's CUDA backend, through CUPTI: today the capture that attributing kernels to ggml
//! nodes is to be worked out on (`GGML_VIZ_CUPTI_CAPTURE`), not yet per-node timing.
//!
//! A graph compute of a backend or scheduler named `CUDA…` starts the capture (once); [`cupti`]
//! is the library's ABI, found with `dlopen` and checked against CUDA 13.0's headers in the
//! tests; [`capture`] subscribes to the launches, graph nodes and activity records and writes
//! them out. Nothing here runs unless the setting names a file.

mod capture;
mod cupti;

use std::ffi::c_void;

use crate::base::ggml::Helpers;
use crate::record::GraphScope;
pub use capture::finish;

/// A graph compute begins: with the capture on and a CUDA backend computing it, its nodes are
/// written, and the capture is what [`graph_ends`] is told.
///
/// # Safety
/// `graph` is the graph being computed, of the copy of ggml `h` belongs to.
pub unsafe fn graph_begins(
    scope: &GraphScope,
    h: &Helpers,
    graph: *mut c_void,
) -> Option<&'static capture::Capture> {
    let path = scope.recorder().cupti_capture();
    if path.is_empty() {
        return None;
    }
    let object = scope.object_name();
    if !object.contains("CUDA") {
        return None;
    }
    let c = capture::capture(path)?;
    // SAFETY: per the contract.
    unsafe { c.graph_begins(h, object, graph) };
    Some(c)
}

/// The graph compute [`graph_begins`] returned `capture` for has returned.
pub fn graph_ends(capture: Option<&'static capture::Capture>, graph: *mut c_void) {
    if let Some(c) = capture {
        c.graph_ends(graph);
    }
}
