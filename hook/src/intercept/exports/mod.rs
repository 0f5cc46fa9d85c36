//! The exported ggml entry points.
//!
//! Each export is a two-instruction trampoline that passes its own return address (which object
//! called us: see [`super::route`]) as an extra argument to the Rust function that does the
//! work. That function resolves the real function, records the begin event, calls the real
//! function exactly once — whatever happens in our code, which runs inside `catch_unwind` —
//! records the end event, and returns the real function's result unchanged.
//!
//! On Linux they are exported under ggml's own names (the dynamic loader then binds callers to
//! them first); on macOS with a `ggml_viz_` prefix, and dyld's interpose table names the
//! functions they replace ([`super::route`]).
//!
//! In four files besides this one, which makes the exports: [`calls`] (what every wrapper does
//! first: the real function, tracing started), [`graphs`] (graph computes, synchronize, the
//! scheduler's eval callback and its end), [`llama`] (llama.cpp's decode and encode spans, its
//! batches and sequences) and [`buffers`] (backend buffers made, used, freed).

use std::ffi::{c_int, c_void};

mod buffers;
mod calls;
mod graphs;
mod llama;

#[cfg(all(target_arch = "x86_64", not(windows)))]
use super::in_place::in_place_export;
#[cfg(any(target_os = "linux", windows))]
use crate::base::entry::Entry;
use crate::base::ggml::EvalCallback;
#[cfg(all(target_arch = "x86_64", not(windows)))]
use buffers::buffer_init_enter;
#[cfg(any(windows, not(target_arch = "x86_64")))]
use buffers::{IfaceRef, buffer_init};
use buffers::{alloc_ctx_tensors, buffer_free, buffer_set_usage};
use graphs::{
    backend_graph_compute, backend_graph_compute_async, backend_synchronize, graph_compute,
    graph_compute_with_ctx, sched_free, sched_graph_compute, sched_graph_compute_async,
    sched_set_eval_callback, sched_synchronize,
};
#[cfg(any(windows, not(target_arch = "x86_64")))]
use llama::{BatchRef, llama_decode_impl, llama_encode_impl};
use llama::{
    LlamaEmbd, batch_ext_add, batch_ext_add_embd, batch_ext_add_seq, batch_ext_add_token,
    batch_ext_clear, batch_ext_free, llama_process_impl, memory_seq_rm,
};
#[cfg(all(target_arch = "x86_64", not(windows)))]
use llama::{decode_enter, encode_enter, in_place_exit};

type Ptr = *mut c_void;

/// Defines an exported trampoline `$name` that jumps to `$imp` with the return address as the
/// argument after the C function's own `$n` arguments.
macro_rules! trampoline {
    ($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $imp:ident, x86_64: $x86:literal, aarch64: $arm:literal) => {
        #[doc = concat!("`", stringify!($name), "`, traced.\n\n# Safety\nggml's own contract: ggml objects from the caller's copy of ggml.")]
        #[cfg(all(target_arch = "x86_64", not(windows)))]
        #[unsafe(naked)]
        #[cfg_attr(not(target_os = "macos"), unsafe(no_mangle))]
        #[cfg_attr(target_os = "macos", unsafe(export_name = concat!("ggml_viz_", stringify!($name))))]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) $(-> $ret)? {
            // The return address is at [rsp] on entry; the jump leaves the stack as the caller
            // made it, so `$imp` returns straight to the caller.
            core::arch::naked_asm!(concat!("mov ", $x86, ", [rsp]"), "jmp {imp}", imp = sym $imp)
        }

        #[doc = concat!("`", stringify!($name), "`, traced.\n\n# Safety\nggml's own contract: ggml objects from the caller's copy of ggml.")]
        #[cfg(all(target_arch = "aarch64", not(windows)))]
        #[unsafe(naked)]
        #[cfg_attr(not(target_os = "macos"), unsafe(no_mangle))]
        #[cfg_attr(target_os = "macos", unsafe(export_name = concat!("ggml_viz_", stringify!($name))))]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) $(-> $ret)? {
            // The return address is in the link register, x30.
            core::arch::naked_asm!(concat!("mov ", $arm, ", x30"), "b {imp}", imp = sym $imp)
        }

        #[doc = concat!("`", stringify!($name), "`, traced.\n\n# Safety\nggml's own contract: ggml objects from the caller's copy of ggml.")]
        // Windows (no caller-scope resolution there: see `super::route`) and other
        // architectures: a plain function, without the return address.
        #[cfg(any(windows, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
        #[cfg_attr(not(target_os = "macos"), unsafe(no_mangle))]
        #[cfg_attr(target_os = "macos", unsafe(export_name = concat!("ggml_viz_", stringify!($name))))]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: forwarding the caller's arguments; no return address.
            unsafe { $imp($($arg,)* 0) }
        }
    };
}

trampoline!(ggml_backend_sched_graph_compute(sched: Ptr, graph: Ptr) -> c_int, sched_graph_compute, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_backend_sched_graph_compute_async(sched: Ptr, graph: Ptr) -> c_int, sched_graph_compute_async, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_backend_graph_compute(backend: Ptr, graph: Ptr) -> c_int, backend_graph_compute, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_backend_graph_compute_async(backend: Ptr, graph: Ptr) -> c_int, backend_graph_compute_async, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_graph_compute(graph: Ptr, cplan: Ptr) -> c_int, graph_compute, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_graph_compute_with_ctx(ctx: Ptr, graph: Ptr, n_threads: c_int) -> c_int, graph_compute_with_ctx, x86_64: "rcx", aarch64: "x3");
trampoline!(ggml_backend_synchronize(backend: Ptr), backend_synchronize, x86_64: "rsi", aarch64: "x1");
trampoline!(ggml_backend_sched_synchronize(sched: Ptr), sched_synchronize, x86_64: "rsi", aarch64: "x1");
trampoline!(ggml_backend_sched_set_eval_callback(sched: Ptr, callback: Option<EvalCallback>, user_data: Ptr), sched_set_eval_callback, x86_64: "rcx", aarch64: "x3");
// Structs passed by value whose size depends on the host's version (`llama_batch`, ggml's buffer
// interface): aarch64 and Windows pass them by reference (a pointer to the caller's copy, handed
// on as it came); x86-64 System V in the caller's stack frame, where they are never copied
// ([`in_place`]).
#[cfg(any(windows, not(target_arch = "x86_64")))]
trampoline!(llama_decode(ctx: Ptr, batch: BatchRef) -> i32, llama_decode_impl, x86_64: "rdx", aarch64: "x2");
#[cfg(any(windows, not(target_arch = "x86_64")))]
trampoline!(llama_encode(ctx: Ptr, batch: BatchRef) -> i32, llama_encode_impl, x86_64: "rdx", aarch64: "x2");
#[cfg(any(windows, not(target_arch = "x86_64")))]
trampoline!(ggml_backend_buffer_init(buft: Ptr, iface: IfaceRef, context: Ptr, size: usize) -> Ptr, buffer_init, x86_64: "rcx", aarch64: "x4");
#[cfg(all(target_arch = "x86_64", not(windows)))]
in_place_export!(
    /// `llama_decode`, traced; its `llama_batch` (72 bytes before llama.cpp #9745, 56 since) is
    /// left in the caller's frame and read there.
    llama_decode, enter: decode_enter, exit: in_place_exit, missing: -1
);
#[cfg(all(target_arch = "x86_64", not(windows)))]
in_place_export!(
    /// `llama_encode`, traced; its batch as `llama_decode`'s.
    llama_encode, enter: encode_enter, exit: in_place_exit, missing: -1
);
#[cfg(all(target_arch = "x86_64", not(windows)))]
in_place_export!(
    /// `ggml_backend_buffer_init`, traced; its interface struct (11 words in ggml 0.25, more or
    /// fewer in others) is neither copied nor read (before: taken as 16 words by value, reading
    /// 40 bytes past the caller's argument).
    ggml_backend_buffer_init, enter: buffer_init_enter, exit: in_place_exit, missing: 0
);
trampoline!(ggml_backend_buffer_free(buffer: Ptr), buffer_free, x86_64: "rsi", aarch64: "x1");
trampoline!(ggml_backend_buffer_set_usage(buffer: Ptr, usage: c_int), buffer_set_usage, x86_64: "rdx", aarch64: "x2");
trampoline!(ggml_backend_alloc_ctx_tensors_from_buft(ctx: Ptr, buft: Ptr) -> Ptr, alloc_ctx_tensors, x86_64: "rdx", aarch64: "x2");
trampoline!(llama_process(ctx: Ptr, kind: c_int, batch: Ptr) -> i32, llama_process_impl, x86_64: "rcx", aarch64: "x3");
trampoline!(llama_batch_ext_add(batch: Ptr, seq_id: i32) -> i32, batch_ext_add, x86_64: "rdx", aarch64: "x2");
trampoline!(llama_batch_ext_add_token(batch: Ptr, seq_id: i32, token: i32) -> i32, batch_ext_add_token, x86_64: "rcx", aarch64: "x3");
trampoline!(llama_batch_ext_clear(batch: Ptr), batch_ext_clear, x86_64: "rsi", aarch64: "x1");
trampoline!(llama_batch_ext_free(batch: Ptr), batch_ext_free, x86_64: "rsi", aarch64: "x1");
trampoline!(ggml_backend_sched_free(sched: Ptr), sched_free, x86_64: "rsi", aarch64: "x1");
// The embedding is passed in memory on x86-64 (24 bytes) and by reference on aarch64, so the
// return address goes in the register after `seq_id` on x86-64 and after the reference on aarch64.
trampoline!(llama_batch_ext_add_embd(batch: Ptr, seq_id: i32, embd: LlamaEmbd) -> i32, batch_ext_add_embd, x86_64: "rdx", aarch64: "x3");
trampoline!(llama_batch_ext_add_seq(batch: Ptr, idx: i32, seq_id: i32) -> bool, batch_ext_add_seq, x86_64: "rcx", aarch64: "x3");
trampoline!(llama_memory_seq_rm(mem: Ptr, seq_id: i32, p0: i32, p1: i32) -> bool, memory_seq_rm, x86_64: "r8", aarch64: "x4");

/// Our exported wrapper of `entry` (where an inline hook sends the executable's own calls).
#[cfg(any(target_os = "linux", windows))]
pub fn wrapper(entry: Entry) -> *const () {
    match entry {
        Entry::SchedGraphCompute => ggml_backend_sched_graph_compute as *const (),
        Entry::SchedGraphComputeAsync => ggml_backend_sched_graph_compute_async as *const (),
        Entry::BackendGraphCompute => ggml_backend_graph_compute as *const (),
        Entry::BackendGraphComputeAsync => ggml_backend_graph_compute_async as *const (),
        Entry::GraphCompute => ggml_graph_compute as *const (),
        Entry::GraphComputeWithCtx => ggml_graph_compute_with_ctx as *const (),
        Entry::BackendSynchronize => ggml_backend_synchronize as *const (),
        Entry::SchedSynchronize => ggml_backend_sched_synchronize as *const (),
        Entry::SchedSetEvalCallback => ggml_backend_sched_set_eval_callback as *const (),
        Entry::LlamaDecode => llama_decode as *const (),
        Entry::LlamaEncode => llama_encode as *const (),
        Entry::LlamaProcess => llama_process as *const (),
        Entry::LlamaBatchExtAdd => llama_batch_ext_add as *const (),
        Entry::LlamaBatchExtAddToken => llama_batch_ext_add_token as *const (),
        Entry::LlamaBatchExtClear => llama_batch_ext_clear as *const (),
        Entry::LlamaBatchExtFree => llama_batch_ext_free as *const (),
        Entry::LlamaBatchExtAddEmbd => llama_batch_ext_add_embd as *const (),
        Entry::LlamaBatchExtAddSeq => llama_batch_ext_add_seq as *const (),
        Entry::LlamaMemorySeqRm => llama_memory_seq_rm as *const (),
        Entry::BufferInit => ggml_backend_buffer_init as *const (),
        Entry::BufferFree => ggml_backend_buffer_free as *const (),
        Entry::SchedFree => ggml_backend_sched_free as *const (),
        Entry::BufferSetUsage => ggml_backend_buffer_set_usage as *const (),
        Entry::AllocCtxTensors => ggml_backend_alloc_ctx_tensors_from_buft as *const (),
    }
}
