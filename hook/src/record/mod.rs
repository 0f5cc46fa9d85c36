//! The recording core: what one trace holds and how events get into it. It never names an
//! interception mechanism: front ends call it (heaptrack's `libheaptrack` API, in its way), and
//! its tests call it directly, without preloading anything (`tests/hook.rs`).
//!
//! - [`events`]: the producer side. Steady state, for a thread that has its ring and for objects
//!   already named: read the clock, take from the thread's share of the event cap, copy the
//!   event into the ring: no lock, no allocation, no system call. A thread's first event
//!   allocates its ring; the first sight of a backend, scheduler, buffer type, thread name or
//!   tensor takes that table's lock and allocates the name or info, once each; every 256 events
//!   a thread takes more of the cap from one shared counter.
//! - [`device`]: nodes a GPU timed, on a lane per device queue.
//! - [`recorder`]: one trace's shared state (rings, names, tensors, cap, counters, writer).
//! - [`tensors`]: the tensor infos op events refer to.
//! - [`raw`]: the raw events' kinds, one struct each, built by the producer and decoded by the
//!   writer.
//! - [`writer`]: the consumer side: encodes what the rings hold and writes it, through
//!   [`output`]: a thread of its own that makes the file's writes.
//! - [`rpc_commands`]: ggml-rpc commands, read off the transport's calls that a front end reports.
//! - [`session`]: start (from the [`Setup`] the front end hands in), the flusher thread, the last
//!   flush at exit, the child's fresh start after `fork`, and stopping when the output fails.

mod device;
mod events;
mod output;
mod raw;
mod recorder;
mod rpc_commands;
mod session;
mod tensors;
mod writer;

pub use device::{DeviceLane, DeviceNode, device_node, device_nodes_wanted};
pub use events::buffers::{buffer_event, buffer_use};
pub use events::graphs::{
    GraphScope, WaitScope, graph_begin, graph_end, name_id, wait_begin, wait_end,
};
pub use events::spans::{seq_removed, span};
pub use events::{
    ShareEdge, ThisThread, barrier_wait, op_begin, op_end, release_share, thread_op, thread_ops,
};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use events::{share_then_begin, share_then_wait, thread_op_at};
pub use raw::{BufferUse, GraphInfo, OpInfo, SPAN_SEQS};
pub use recorder::Recorder;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use recorder::THREAD_OPS_NOW;
pub use rpc_commands::{
    Transfer, rpc_accepted, rpc_after, rpc_before, rpc_closed, rpc_connected, rpc_listening,
};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use session::thread_ops_never;
pub use session::{Setup, active, device_timing_on, finish, start_once, started};
