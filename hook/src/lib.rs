//! `libggml_viz_hook`: preloaded into an unmodified GGML program (`LD_PRELOAD`), it records
//! every graph compute as GGMLVIZ v1, and changes nothing else.
//!
//! Three layers; each module imports only from its own layer and those below it (a test in
//! `tests/hook.rs` fails on any upward import):
//! - `intercept`: the front ends. The exported wrappers of ggml's entry points, which find the
//!   real function (per OS), record around it and call it exactly once; inline hooks and their
//!   installers; per-op timing through the eval callback.
//! - `record`: the recording core. Per-thread rings and the event builders (an event is born
//!   there and buffered in its thread's ring), the trace writer (drains the rings and encodes
//!   with the `ggml-viz-format` crate), the session (start, flusher, exit and fork). It never
//!   names an interception mechanism.
//! - `base`: entry-point names, OS services, clocks, the ring, interned names, the ggml
//!   functions we call and the tensor fields we read, the metadata record.
//!
//! Nothing starts until the first wrapped call: a process that never calls ggml (a shell, a
//! compiler that inherited `LD_PRELOAD`) gets no thread, no file and no output. A failure (bad
//! setting, unwritable output) is said once on stderr and the program runs on untraced.
//!
//! What this library exports as Rust is the recording core's API, for its benchmarks and tests.

mod base;
mod intercept;
mod record;

pub use base::clock::now_ticks;
pub use base::entry::Entry;
pub use record::{
    GraphInfo, GraphScope, OpInfo, Recorder, Setup, ShareEdge, ThisThread, Transfer, WaitScope,
    active, barrier_wait, buffer_event, finish, graph_begin, graph_end, name_id, op_begin, op_end,
    release_share, rpc_accepted, rpc_after, rpc_before, rpc_closed, rpc_connected, rpc_listening,
    span, start_once, thread_op, thread_ops, wait_begin, wait_end,
};
