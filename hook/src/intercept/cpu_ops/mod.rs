//! Per-op timing on the CPU backend's worker threads (`GGML_VIZ_OP_TIMING=threads`, the default
//! where it works): nothing of the run changes, no callback, no extra synchronization, fusion
//! stays on.
//!
//! ggml's CPU backend exports its per-op functions (`ggml_compute_forward_mul_mat`, …),
//! `ggml_barrier` and `ggml_cpu_extra_compute_forward`, and calls them through the PLT, so the
//! dynamic loader binds those calls to the wrappers exported here. Every wrapper enters one
//! common trampoline that saves every argument register, asks [`enter`](trampoline) for the real function
//! (resolved by the caller's scope, as for the entry points), calls it with the registers as
//! they came, takes the thread's depth down (after a recorded barrier wait, keeps its return
//! value and tells [`exit`](shares::exit)), and returns that value: whatever the function's signature (the
//! fused functions take three arguments, `mul_mat_id_tiled` six and returns `bool`), nothing is
//! changed. None of these functions takes arguments on the stack.
//! From a call site a thread has resolved before, the dispatcher's marker, the calls that only
//! continue what is open (its per-op call after the marker, a call nested in an op), the
//! barriers, and every call where nothing is timed per thread take a fast path in the
//! trampoline itself, without `enter`.
//!
//! What a thread records (only while a recorded, sampled graph compute is running, see
//! [`record::thread_ops`](crate::record::thread_ops)):
//! - its share of a node: begun when `ggml_cpu_extra_compute_forward` is called for it (once
//!   per computed node, at the top of ggml's dispatcher: it also computes the repacked
//!   quantized weights, which call no per-op function) or, where that is not called (a fused
//!   call, an older ggml), by the outermost per-op call for another tensor; ended at the
//!   `ggml_barrier` that follows the node in ggml's graph loop: the thread's next one once a
//!   call computed the node, else the next one from a call site known to follow nodes (a
//!   barrier before any such call lies inside an op whose function is static, `mul_mat_id`).
//!   Calls nested in an op (`mul_mat` calling `mul_mat_tiled`, `unary` tail-calling `abs`) are
//!   not spans of their own;
//! - a fused call (`ggml_compute_forward_rms_norm_mul_fused`) is one span on the node it
//!   computed last, named for both ops (`RMS_NORM+MUL`);
//! - each `ggml_barrier` as a `BARRIER_WAIT` with the thread's index and count (read from
//!   ggml's `struct ggml_compute_params`, whose first two `int`s are `ith` and `nth`), when
//!   there is more than one thread; the barriers inside an op (`mul_mat`'s, `mul_mat_id`'s)
//!   are inside its span.
//!
//! Where ggml is linked into the executable, its per-op functions get inline hooks to these
//! wrappers (`install::static_exe`), and the compiler may have inlined `ggml_barrier` into the
//! graph loop: in an OpenMP build the loop then calls OpenMP's `GOMP_barrier`, wrapped here as
//! well (see [`Kind::OmpBarrier`](worker::Kind::OmpBarrier)); at one thread it calls nothing, and the graph compute's
//! return ends the last share ([`graph_compute_returned`]).
//!
//! A tail call (`unary` jumping to `abs`) reaches a wrapper with a return address inside our
//! own trampoline; the trampoline passes 0 then, and the thread's outermost call site stands in
//! for resolving it.

//!
//! In five files: [`table`] lists the wrapped functions; [`trampoline`] makes the exported
//! wrappers from the list, the trampoline they jump to, and its slow path; [`worker`] holds each
//! thread's state (its slot, its call-site and op-info caches); [`sequence`] is the op-info
//! cache a graph computed again finds its nodes in, in order; [`shares`] begins and ends the
//! threads' shares of nodes and their barrier waits.

#[macro_use]
mod table;
mod sequence;
mod shares;
mod trampoline;
mod worker;

pub use shares::graph_compute_returned;
pub use trampoline::wrapped;
