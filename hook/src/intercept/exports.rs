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

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::batches::{self, Composition};
use super::eval_callback::{self, OpDriver};
#[cfg(all(target_arch = "x86_64", not(windows)))]
use super::in_place::{self, in_place_export};
use super::route::{Resolved, describe_route, fallback, resolve};
use super::start::{say_no_function, start_tracing};
use crate::base::entry::Entry;
use crate::base::ggml::{EvalCallback, Helpers};
use crate::base::names::Owner;
use crate::base::{VERBOSE, say, say_once};
use crate::record::{self, GraphInfo, GraphScope, Recorder};

type Ptr = *mut c_void;

/// `GGML_STATUS_FAILED`: returned only when no loaded object defines the real function.
const GGML_STATUS_FAILED: c_int = -1;

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

use crate::base::contained as guarded;

/// The real function, resolved before tracing starts (so that the trace's metadata can name the
/// ggml version of the copy that is called); then tracing is started if this is the first call.
/// When our resolver fails, the call still goes to ggml, untraced ([`fallback`]).
fn real_function(entry: Entry, return_address: usize) -> Option<&'static Resolved> {
    let found = guarded(|| resolve(entry, return_address));
    start_tracing();
    match found {
        Some(Some((resolved, fresh))) => {
            if fresh && VERBOSE.load(Ordering::Relaxed) {
                say(format_args!(
                    "{}",
                    describe_route(entry, return_address, resolved)
                ));
            }
            Some(resolved)
        }
        Some(None) => {
            say_no_function(entry.c_name());
            None
        }
        None => {
            let real = fallback(entry);
            if real.is_none() {
                say_no_function(entry.c_name());
            }
            real
        }
    }
}

/// The common body of the graph entry points.
fn traced_graph(
    entry: Entry,
    return_address: usize,
    describe: impl FnOnce(&Helpers, &'static Recorder) -> GraphInfo,
    call: impl FnOnce(&'static Resolved, Option<&GraphScope>) -> c_int,
) -> c_int {
    let Some(real) = real_function(entry, return_address) else {
        return GGML_STATUS_FAILED;
    };
    let scope = if real.untraced {
        None
    } else {
        guarded(|| record::graph_begin(entry, |r| describe(real.helpers, r))).flatten()
    };
    let status = call(real, scope.as_ref());
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    super::cpu_ops::graph_compute_returned();
    if let Some(scope) = scope {
        guarded(|| record::graph_end(scope));
    }
    status
}

/// The common body of the synchronize entry points.
fn traced_wait(
    entry: Entry,
    return_address: usize,
    object: Ptr,
    owner: Owner,
    call: impl FnOnce(usize),
) {
    let Some(real) = real_function(entry, return_address) else {
        return;
    };
    let scope = if real.untraced {
        None
    } else {
        guarded(|| record::wait_begin(entry, object, |r| name_of(r, real.helpers, object, owner)))
            .flatten()
    };
    call(real.real);
    if let Some(scope) = scope {
        guarded(|| record::wait_end(scope));
    }
}

fn name_of(r: &Recorder, helpers: &Helpers, object: Ptr, owner: Owner) -> u16 {
    record::name_id(r, object, owner, || match owner {
        // SAFETY: the object came from this copy of ggml through the call we are wrapping.
        Owner::Backend => unsafe { helpers.backend_name(object) },
        // SAFETY: a scheduler passed to the call we are wrapping, of this copy of ggml.
        Owner::Scheduler => unsafe { helpers.sched_name(object) },
        // SAFETY: a buffer type passed to the call we are wrapping (or the one of the buffer it
        // passed), of this copy of ggml.
        Owner::BufferType => unsafe { helpers.buft_name(object) },
        Owner::Thread | Owner::Endpoint => String::new(),
    })
}

/// Graph info for calls that name a backend or scheduler, which do not tell their thread count.
fn object_graph(h: &Helpers, r: &Recorder, object: Ptr, owner: Owner, graph: Ptr) -> GraphInfo {
    GraphInfo {
        graph,
        // SAFETY: `graph` is the caller's graph of this copy of ggml.
        n_nodes: unsafe { h.n_nodes(graph) },
        n_threads: 0,
        backend: if owner == Owner::Backend {
            object
        } else {
            std::ptr::null_mut()
        },
        name_id: name_of(r, h, object, owner),
    }
}

type ComputeFn = unsafe extern "C-unwind" fn(Ptr, Ptr) -> c_int;
type ComputeWithCtxFn = unsafe extern "C-unwind" fn(Ptr, Ptr, c_int) -> c_int;
type WaitFn = unsafe extern "C-unwind" fn(Ptr);

/// Calls the real two-argument compute function at `real`.
fn call2(real: usize, a: Ptr, b: Ptr) -> c_int {
    // SAFETY: `real` is the resolved ggml function of the entry point being called, whose C
    // signature this is.
    unsafe { std::mem::transmute::<usize, ComputeFn>(real)(a, b) }
}

/// The four entry points that take a scheduler or backend and a graph. A scheduler's compute
/// gets our eval callback when its ops are to be timed (see [`super::eval_callback`]).
fn object_compute(entry: Entry, owner: Owner, object: Ptr, graph: Ptr, ret: usize) -> c_int {
    traced_graph(
        entry,
        ret,
        |h, r| object_graph(h, r, object, owner, graph),
        |real, scope| {
            let timed = owner == Owner::Scheduler
                && real.helpers.can_time_ops()
                && eval_callback::app_callback_known(object)
                && scope.is_some_and(|s| {
                    s.wants_sched_op_timing(|| {
                        let only_cpu = graph_only_cpu(real.helpers, object, graph);
                        if !only_cpu && s.object_name().contains("RPC") {
                            say_once_sched_with_rpc();
                            return false;
                        }
                        if !only_cpu {
                            say_once_sched_for_devices();
                        }
                        !only_cpu
                    })
                });
            let Some(scope) = scope.filter(|_| timed) else {
                return call2(real.real, object, graph);
            };
            let mut driver = OpDriver::new(scope.recorder(), real.helpers, object);
            // SAFETY: `driver` stays in this frame until it is uninstalled below.
            unsafe { driver.install() };
            let status = call2(real.real, object, graph);
            driver.uninstall();
            status
        },
    )
}

/// [`Helpers::sched_graph_only_cpu`], remembered on this thread for the last (scheduler, graph,
/// node count) and asked again every 64th compute: llama.cpp computes the same graph object
/// token after token, and a scan of a graph's nodes costs a hash lookup each.
fn graph_only_cpu(helpers: &Helpers, sched: Ptr, graph: Ptr) -> bool {
    thread_local! {
        static LAST: std::cell::Cell<(usize, usize, u32, bool, u32)> =
            const { std::cell::Cell::new((0, 0, 0, false, 0)) };
    }
    // SAFETY: the caller's graph of this copy of ggml.
    let n_nodes = unsafe { helpers.n_nodes(graph) };
    let key = (sched as usize, graph as usize, n_nodes);
    let (s, g, n, answer, uses) = LAST.with(|l| l.get());
    if (s, g, n) == key && uses < 64 {
        LAST.with(|l| l.set((s, g, n, answer, uses + 1)));
        return answer;
    }
    // SAFETY: the scheduler and graph passed to this copy of ggml for this compute.
    let answer = unsafe { helpers.sched_graph_only_cpu(sched, graph) };
    LAST.with(|l| l.set((key.0, key.1, key.2, answer, 1)));
    answer
}

/// Said the first time `auto` leaves a scheduler's nodes on ggml-rpc backends untimed.
fn say_once_sched_with_rpc() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        format_args!(
            "op timing: a graph with nodes on ggml-rpc backends: those nodes are not timed here \
             (with the eval callback each would be a network round trip of its own); trace the \
             RPC servers, whose CPU threads time them"
        ),
    );
}

/// Said the first time `auto` times a scheduler's nodes with the eval callback because it has
/// other backends than the CPU.
fn say_once_sched_for_devices() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        format_args!(
            "op timing: a graph with nodes on other backends than the CPU: its nodes are timed with \
             the eval callback (each node computed and synchronized on its own)"
        ),
    );
}

unsafe extern "C-unwind" fn sched_graph_compute(sched: Ptr, graph: Ptr, ret: usize) -> c_int {
    object_compute(
        Entry::SchedGraphCompute,
        Owner::Scheduler,
        sched,
        graph,
        ret,
    )
}

unsafe extern "C-unwind" fn sched_graph_compute_async(sched: Ptr, graph: Ptr, ret: usize) -> c_int {
    object_compute(
        Entry::SchedGraphComputeAsync,
        Owner::Scheduler,
        sched,
        graph,
        ret,
    )
}

unsafe extern "C-unwind" fn backend_graph_compute(backend: Ptr, graph: Ptr, ret: usize) -> c_int {
    object_compute(
        Entry::BackendGraphCompute,
        Owner::Backend,
        backend,
        graph,
        ret,
    )
}

unsafe extern "C-unwind" fn backend_graph_compute_async(
    backend: Ptr,
    graph: Ptr,
    ret: usize,
) -> c_int {
    object_compute(
        Entry::BackendGraphComputeAsync,
        Owner::Backend,
        backend,
        graph,
        ret,
    )
}

/// The start of `struct ggml_cplan`, up to the thread count.
#[repr(C)]
struct CplanPrefix {
    work_size: usize,
    work_data: *mut u8,
    n_threads: c_int,
}

unsafe extern "C-unwind" fn graph_compute(graph: Ptr, cplan: Ptr, ret: usize) -> c_int {
    let describe = |h: &Helpers, _: &Recorder| GraphInfo {
        graph,
        // SAFETY: `graph` is the caller's graph of this copy of ggml.
        n_nodes: unsafe { h.n_nodes(graph) },
        // SAFETY: a non-null cplan is the caller's `struct ggml_cplan`, which starts like CplanPrefix.
        n_threads: if cplan.is_null() {
            0
        } else {
            unsafe { (*(cplan as *const CplanPrefix)).n_threads.max(0) as u32 }
        },
        backend: std::ptr::null_mut(),
        name_id: 0,
    };
    traced_graph(Entry::GraphCompute, ret, describe, |real, _| {
        call2(real.real, graph, cplan)
    })
}

unsafe extern "C-unwind" fn graph_compute_with_ctx(
    ctx: Ptr,
    graph: Ptr,
    n_threads: c_int,
    ret: usize,
) -> c_int {
    let describe = |h: &Helpers, _: &Recorder| GraphInfo {
        graph,
        // SAFETY: `graph` is the caller's graph of this copy of ggml.
        n_nodes: unsafe { h.n_nodes(graph) },
        n_threads: n_threads.max(0) as u32,
        backend: std::ptr::null_mut(),
        name_id: 0,
    };
    traced_graph(Entry::GraphComputeWithCtx, ret, describe, |real, _| {
        // SAFETY: `real` is the real ggml_graph_compute_with_ctx, whose C signature this is.
        unsafe { std::mem::transmute::<usize, ComputeWithCtxFn>(real.real)(ctx, graph, n_threads) }
    })
}

fn call_wait(real: usize, object: Ptr) {
    // SAFETY: `real` is the resolved ggml synchronize function, whose C signature this is.
    unsafe { std::mem::transmute::<usize, WaitFn>(real)(object) }
}

unsafe extern "C-unwind" fn backend_synchronize(backend: Ptr, ret: usize) {
    traced_wait(
        Entry::BackendSynchronize,
        ret,
        backend,
        Owner::Backend,
        |f| call_wait(f, backend),
    )
}

unsafe extern "C-unwind" fn sched_synchronize(sched: Ptr, ret: usize) {
    traced_wait(Entry::SchedSynchronize, ret, sched, Owner::Scheduler, |f| {
        call_wait(f, sched)
    })
}

unsafe extern "C-unwind" fn sched_set_eval_callback(
    sched: Ptr,
    callback: Option<EvalCallback>,
    user_data: Ptr,
    ret: usize,
) {
    let Some(real) = real_function(Entry::SchedSetEvalCallback, ret) else {
        return;
    };
    guarded(|| eval_callback::remember_app_callback(sched, callback, user_data));
    type SetFn = unsafe extern "C-unwind" fn(Ptr, Option<EvalCallback>, Ptr);
    // SAFETY: the real ggml_backend_sched_set_eval_callback, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, SetFn>(real.real)(sched, callback, user_data) }
}

/// A scheduler is freed: the application's callback remembered for it is forgotten, so that a
/// new scheduler at the same address does not inherit it (and its freed user data).
unsafe extern "C-unwind" fn sched_free(sched: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::SchedFree, ret) else {
        return;
    };
    guarded(|| eval_callback::forget_app_callback(sched));
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real ggml_backend_sched_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(sched) }
}

/// The fields of `struct llama_batch` (llama.h) that are read: the first seven, at the same
/// offsets in every layout (the struct had three more fields before llama.cpp #9745). Only ever
/// read through a pointer to the caller's batch, never copied or passed by value.
#[repr(C)]
pub struct LlamaBatch {
    n_tokens: i32,
    token: Ptr,
    embd: Ptr,
    pos: Ptr,
    n_seq_id: Ptr,
    seq_id: Ptr,
    logits: Ptr,
}

/// A pointer to the caller's `llama_batch` (how aarch64 and Windows pass it by value).
#[cfg(any(windows, not(target_arch = "x86_64")))]
type BatchRef = *const LlamaBatch;

/// A decode or encode span's details, read from the caller's batch: its tokens (`u32::MAX`:
/// unknown) and, for a decode, their sequences.
///
/// # Safety
/// `batch` points at the caller's `llama_batch`, whose arrays are valid for its tokens (as
/// llama_decode requires).
unsafe fn batch_span(name: Entry, batch: *const LlamaBatch) -> (u32, Option<Composition>) {
    // SAFETY: per the contract; the first field is at offset 0 in every layout.
    let n_tokens = unsafe { (*batch).n_tokens };
    let composition = if name == Entry::LlamaDecode {
        // SAFETY: the batch's arrays, valid for its tokens, per the contract.
        guarded(|| unsafe {
            batches::classic_composition(
                n_tokens,
                (*batch).n_seq_id as *const i32,
                (*batch).seq_id as *const *const i32,
            )
        })
        .flatten()
    } else {
        None
    };
    (n_tokens.max(0) as u32, composition)
}

/// Calls the real function (`call` gets its address) between `mark(true)` and `mark(false)`;
/// untraced, the call alone.
fn around<T>(real: &Resolved, mark: impl Fn(bool), call: impl FnOnce(usize) -> T) -> T {
    if real.untraced {
        return call(real.real);
    }
    guarded(|| mark(true));
    let out = call(real.real);
    guarded(|| mark(false));
    out
}

/// A span around one llama call (`name` says which), with `n_tokens` (`u32::MAX`: unknown) and
/// the batch's sequences where known.
fn traced_span(
    name: Entry,
    n_tokens: u32,
    composition: Option<Composition>,
    real: &Resolved,
    call: impl FnOnce(usize) -> i32,
) -> i32 {
    around(
        real,
        |begin| span_mark(name, begin, n_tokens, composition),
        call,
    )
}

/// A llama span's begin or end.
fn span_mark(name: Entry, begin: bool, n_tokens: u32, composition: Option<Composition>) {
    let c = composition.unwrap_or_default();
    guarded(|| record::span(name, begin, n_tokens, &c.seqs[..c.n_seqs], c.other_tokens));
}

/// `llama_decode`/`llama_encode` where the batch comes by reference: the reference is handed on.
#[cfg(any(windows, not(target_arch = "x86_64")))]
fn traced_batch_call(name: Entry, ctx: Ptr, batch: BatchRef, ret: usize) -> i32 {
    let Some(real) = real_function(name, ret) else {
        return -1;
    };
    let (n_tokens, composition) = if real.untraced {
        (0, None)
    } else {
        // SAFETY: the caller's batch, per llama_decode's contract.
        guarded(|| unsafe { batch_span(name, batch) }).unwrap_or((u32::MAX, None))
    };
    type LlamaFn = unsafe extern "C-unwind" fn(Ptr, BatchRef) -> i32;
    // SAFETY: the real function, with the caller's arguments (the batch's reference as it came).
    traced_span(name, n_tokens, composition, real, |f| unsafe {
        std::mem::transmute::<usize, LlamaFn>(f)(ctx, batch)
    })
}

#[cfg(any(windows, not(target_arch = "x86_64")))]
unsafe extern "C-unwind" fn llama_decode_impl(ctx: Ptr, batch: BatchRef, ret: usize) -> i32 {
    traced_batch_call(Entry::LlamaDecode, ctx, batch, ret)
}

#[cfg(any(windows, not(target_arch = "x86_64")))]
unsafe extern "C-unwind" fn llama_encode_impl(ctx: Ptr, batch: BatchRef, ret: usize) -> i32 {
    traced_batch_call(Entry::LlamaEncode, ctx, batch, ret)
}

/// Before `llama_decode`/`llama_encode` on x86-64 System V: the batch is the first stack
/// argument; its span begins here and ends in [`in_place_exit`].
#[cfg(all(target_arch = "x86_64", not(windows)))]
fn batch_enter(name: Entry, batch: *const LlamaBatch, return_address: usize) -> in_place::Next {
    let Some(real) = real_function(name, return_address) else {
        return in_place::Next::NONE;
    };
    let mut frame = std::ptr::null_mut();
    if !real.untraced {
        // SAFETY: the caller's batch, in its frame, per llama_decode's contract.
        let (n_tokens, composition) =
            guarded(|| unsafe { batch_span(name, batch) }).unwrap_or((u32::MAX, None));
        let pending = in_place::Pending::Span {
            name,
            n_tokens,
            composition,
        };
        // The stack pointer at the export's entry: just below the stack arguments.
        let entry_sp = batch as usize - 8;
        frame = in_place::push(entry_sp, return_address, pending);
        if !frame.is_null() {
            span_mark(name, true, n_tokens, composition);
        }
    }
    in_place::Next {
        real: real.real,
        frame,
    }
}

#[cfg(all(target_arch = "x86_64", not(windows)))]
extern "C" fn decode_enter(
    _registers: &in_place::SavedRegisters,
    stack_args: *const LlamaBatch,
    return_address: usize,
) -> in_place::Next {
    batch_enter(Entry::LlamaDecode, stack_args, return_address)
}

#[cfg(all(target_arch = "x86_64", not(windows)))]
extern "C" fn encode_enter(
    _registers: &in_place::SavedRegisters,
    stack_args: *const LlamaBatch,
    return_address: usize,
) -> in_place::Next {
    batch_enter(Entry::LlamaEncode, stack_args, return_address)
}

/// After an in-place export's real function: records what was under way.
#[cfg(all(target_arch = "x86_64", not(windows)))]
extern "C" fn in_place_exit(result: usize) {
    match in_place::pop() {
        Some(in_place::Pending::Buffer { buft, helpers }) => {
            buffer_made(helpers, buft, result as Ptr)
        }
        Some(in_place::Pending::Span {
            name,
            n_tokens,
            composition,
        }) => span_mark(name, false, n_tokens, composition),
        None => {}
    }
}

/// `llama_process(ctx, LLAMA_PROCESS_TYPE_{ENCODE,DECODE}, batch_ext)`: recorded as the
/// llama_encode / llama_decode span it stands for.
unsafe extern "C-unwind" fn llama_process_impl(
    ctx: Ptr,
    kind: c_int,
    batch: Ptr,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaProcess, ret) else {
        return -1;
    };
    let name = if kind == 0 {
        Entry::LlamaEncode
    } else {
        Entry::LlamaDecode
    };
    let n_tokens = guarded(|| batches::batch_tokens(batch))
        .flatten()
        .unwrap_or(u32::MAX);
    let composition = guarded(|| batches::batch_composition(batch)).flatten();
    type ProcessFn = unsafe extern "C-unwind" fn(Ptr, c_int, Ptr) -> i32;
    // SAFETY: the real llama_process, with the caller's arguments.
    traced_span(name, n_tokens, composition, real, |f| unsafe {
        std::mem::transmute::<usize, ProcessFn>(f)(ctx, kind, batch)
    })
}

unsafe extern "C-unwind" fn batch_ext_add(batch: Ptr, seq_id: i32, ret: usize) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAdd, ret) else {
        return -1;
    };
    type AddFn = unsafe extern "C-unwind" fn(Ptr, i32) -> i32;
    // SAFETY: the real llama_batch_ext_add, with the caller's arguments.
    let index = unsafe { std::mem::transmute::<usize, AddFn>(real.real)(batch, seq_id) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

unsafe extern "C-unwind" fn batch_ext_add_token(
    batch: Ptr,
    seq_id: i32,
    token: i32,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAddToken, ret) else {
        return -1;
    };
    type AddTokenFn = unsafe extern "C-unwind" fn(Ptr, i32, i32) -> i32;
    // SAFETY: the real llama_batch_ext_add_token, with the caller's arguments.
    let index =
        unsafe { std::mem::transmute::<usize, AddTokenFn>(real.real)(batch, seq_id, token) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

/// `struct llama_embd` (llama.h): rows of an input embedding, passed by value to
/// `llama_batch_ext_add_embd` (one batch entry whatever its rows).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LlamaEmbd {
    data: *const f32,
    n_rows: usize,
    n_embd: usize,
}

unsafe extern "C-unwind" fn batch_ext_add_embd(
    batch: Ptr,
    seq_id: i32,
    embd: LlamaEmbd,
    ret: usize,
) -> i32 {
    let Some(real) = real_function(Entry::LlamaBatchExtAddEmbd, ret) else {
        return -1;
    };
    type AddEmbdFn = unsafe extern "C-unwind" fn(Ptr, i32, LlamaEmbd) -> i32;
    // SAFETY: the real llama_batch_ext_add_embd, with the caller's arguments.
    let index = unsafe { std::mem::transmute::<usize, AddEmbdFn>(real.real)(batch, seq_id, embd) };
    if !real.untraced {
        guarded(|| batches::token_added(batch, index, seq_id));
    }
    index
}

unsafe extern "C-unwind" fn batch_ext_add_seq(
    batch: Ptr,
    idx: i32,
    seq_id: i32,
    ret: usize,
) -> bool {
    let Some(real) = real_function(Entry::LlamaBatchExtAddSeq, ret) else {
        return false;
    };
    type AddSeqFn = unsafe extern "C-unwind" fn(Ptr, i32, i32) -> bool;
    // SAFETY: the real llama_batch_ext_add_seq, with the caller's arguments.
    let added = unsafe { std::mem::transmute::<usize, AddSeqFn>(real.real)(batch, idx, seq_id) };
    if added && !real.untraced {
        guarded(|| batches::seq_added(batch, seq_id));
    }
    added
}

/// A span around `llama_memory_seq_rm`: a server clears a slot's sequence (from position 0) when
/// its next request starts, which tells where a request begins.
unsafe extern "C-unwind" fn memory_seq_rm(
    mem: Ptr,
    seq_id: i32,
    p0: i32,
    p1: i32,
    ret: usize,
) -> bool {
    let Some(real) = real_function(Entry::LlamaMemorySeqRm, ret) else {
        return false;
    };
    type SeqRmFn = unsafe extern "C-unwind" fn(Ptr, i32, i32, i32) -> bool;
    around(
        real,
        |begin| record::seq_removed(begin, seq_id, p0, p1),
        // SAFETY: the real llama_memory_seq_rm, with the caller's arguments.
        |f| unsafe { std::mem::transmute::<usize, SeqRmFn>(f)(mem, seq_id, p0, p1) },
    )
}

unsafe extern "C-unwind" fn batch_ext_clear(batch: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::LlamaBatchExtClear, ret) else {
        return;
    };
    type ClearFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real llama_batch_ext_clear, with the caller's argument.
    unsafe { std::mem::transmute::<usize, ClearFn>(real.real)(batch) };
    if !real.untraced {
        guarded(|| batches::batch_cleared(batch));
    }
}

/// A batch is freed: what was counted for it is forgotten, its slot free for the next (which may
/// be made at the same address).
unsafe extern "C-unwind" fn batch_ext_free(batch: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::LlamaBatchExtFree, ret) else {
        return;
    };
    if !real.untraced {
        guarded(|| batches::batch_freed(batch));
    }
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real llama_batch_ext_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(batch) };
}

/// A pointer to the caller's copy of `struct ggml_backend_buffer_i` (how aarch64 and Windows
/// pass that struct by value).
#[cfg(any(windows, not(target_arch = "x86_64")))]
type IfaceRef = *const c_void;

#[cfg(any(windows, not(target_arch = "x86_64")))]
unsafe extern "C-unwind" fn buffer_init(
    buft: Ptr,
    iface: IfaceRef,
    context: Ptr,
    size: usize,
    ret: usize,
) -> Ptr {
    let Some(real) = real_function(Entry::BufferInit, ret) else {
        return std::ptr::null_mut();
    };
    type InitFn = unsafe extern "C-unwind" fn(Ptr, IfaceRef, Ptr, usize) -> Ptr;
    // SAFETY: the real ggml_backend_buffer_init, with the caller's arguments (the interface by
    // reference, as it came).
    let buffer =
        unsafe { std::mem::transmute::<usize, InitFn>(real.real)(buft, iface, context, size) };
    if !real.untraced {
        buffer_made(real.helpers, buft, buffer);
    }
    buffer
}

/// Records a buffer `ggml_backend_buffer_init` made (null: it failed, nothing to record).
fn buffer_made(helpers: &Helpers, buft: Ptr, buffer: Ptr) {
    if buffer.is_null() {
        return;
    }
    guarded(|| {
        // SAFETY: the buffer was just made by this copy of ggml.
        let (base, size, _) = unsafe { helpers.buffer(buffer) };
        record::buffer_event(true, buffer, size, base, |r| {
            name_of(r, helpers, buft, Owner::BufferType)
        });
    });
}

/// Before `ggml_backend_buffer_init(buft, iface, context, size)` on x86-64 System V: `buft` is
/// the first register argument; the interface struct on the stack is not looked at.
#[cfg(all(target_arch = "x86_64", not(windows)))]
extern "C" fn buffer_init_enter(
    registers: &in_place::SavedRegisters,
    stack_args: *const c_void,
    return_address: usize,
) -> in_place::Next {
    let Some(real) = real_function(Entry::BufferInit, return_address) else {
        return in_place::Next::NONE;
    };
    let pending = in_place::Pending::Buffer {
        buft: registers[0] as Ptr,
        helpers: real.helpers,
    };
    let frame = if real.untraced {
        std::ptr::null_mut()
    } else {
        in_place::push(stack_args as usize - 8, return_address, pending)
    };
    in_place::Next {
        real: real.real,
        frame,
    }
}

unsafe extern "C-unwind" fn buffer_free(buffer: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::BufferFree, ret) else {
        return;
    };
    if !buffer.is_null() && !real.untraced {
        guarded(|| {
            // SAFETY: the buffer is still live: it is freed below.
            let (base, size, buft) = unsafe { real.helpers.buffer(buffer) };
            record::buffer_event(false, buffer, size, base, |r| {
                name_of(r, real.helpers, buft, Owner::BufferType)
            });
        });
    }
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real ggml_backend_buffer_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(buffer) }
}

/// The program tells ggml what a buffer is for (llama.cpp: its weights, ggml's graph allocator:
/// compute buffers): recorded after the call, with memory tracking on.
unsafe extern "C-unwind" fn buffer_set_usage(buffer: Ptr, usage: c_int, ret: usize) {
    let Some(real) = real_function(Entry::BufferSetUsage, ret) else {
        return;
    };
    type SetUsageFn = unsafe extern "C-unwind" fn(Ptr, c_int);
    // SAFETY: the real ggml_backend_buffer_set_usage, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, SetUsageFn>(real.real)(buffer, usage) };
    if !buffer.is_null() && !real.untraced {
        guarded(|| record::buffer_use(buffer, record::BufferUse::Usage(usage as u32)));
    }
}

/// A buffer made for a context's tensors (llama.cpp's KV cache, a model's weights): recorded
/// after the call with the name of the context's first tensor, with memory tracking on.
unsafe extern "C-unwind" fn alloc_ctx_tensors(ctx: Ptr, buft: Ptr, ret: usize) -> Ptr {
    let Some(real) = real_function(Entry::AllocCtxTensors, ret) else {
        return std::ptr::null_mut();
    };
    type AllocFn = unsafe extern "C-unwind" fn(Ptr, Ptr) -> Ptr;
    // SAFETY: the real ggml_backend_alloc_ctx_tensors_from_buft, with the caller's arguments.
    let buffer = unsafe { std::mem::transmute::<usize, AllocFn>(real.real)(ctx, buft) };
    if !buffer.is_null() && !real.untraced {
        guarded(|| {
            // SAFETY: the caller's context, live for its call, of this copy of ggml; its first
            // tensor (when it has one) is live with it.
            let name = unsafe {
                let first = real.helpers.first_tensor(ctx);
                (!first.is_null()).then(|| real.helpers.tensor_name_cstr(first))
            };
            if let Some(name) = name {
                record::buffer_use(buffer, record::BufferUse::FirstTensor(name.to_bytes()));
            }
        });
    }
    buffer
}
