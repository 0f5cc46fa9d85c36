//! The graph entry points (`ggml_backend_sched_graph_compute[_async]`,
//! `ggml_backend_graph_compute[_async]`, `ggml_graph_compute[_with_ctx]`), the synchronize
//! calls, and the scheduler's eval callback (set, and forgotten when the scheduler is freed).

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicBool;

use super::calls::{guarded, name_of, real_function};
use crate::base::entry::Entry;
use crate::base::ggml::{EvalCallback, Helpers};
use crate::base::names::Owner;
use crate::base::say_once;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use crate::intercept::cuda;
use crate::intercept::eval_callback::{self, OpDriver};
use crate::intercept::route::Resolved;
use crate::record::{self, GraphInfo, GraphScope, Recorder};

type Ptr = *mut c_void;

/// `GGML_STATUS_FAILED`: returned only when no loaded object defines the real function.
const GGML_STATUS_FAILED: c_int = -1;

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
    crate::intercept::cpu_ops::graph_compute_returned();
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
/// gets our eval callback when its ops are to be timed (see [`crate::intercept::eval_callback`]).
fn object_compute(entry: Entry, owner: Owner, object: Ptr, graph: Ptr, ret: usize) -> c_int {
    traced_graph(
        entry,
        ret,
        |h, r| object_graph(h, r, object, owner, graph),
        |real, scope| {
            // SAFETY: the graph this copy of ggml is asked to compute.
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            let capture = scope.and_then(|s| {
                guarded(|| unsafe { cuda::graph_begins(s, real.helpers, graph) }).flatten()
            });
            let status = compute(real, scope, owner, object, graph);
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            guarded(|| cuda::graph_ends(capture, graph));
            status
        },
    )
}

/// The compute of [`object_compute`], timed by the eval callback where that is wanted.
fn compute(
    real: &'static Resolved,
    scope: Option<&GraphScope>,
    owner: Owner,
    object: Ptr,
    graph: Ptr,
) -> c_int {
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

pub(super) unsafe extern "C-unwind" fn sched_graph_compute(
    sched: Ptr,
    graph: Ptr,
    ret: usize,
) -> c_int {
    object_compute(
        Entry::SchedGraphCompute,
        Owner::Scheduler,
        sched,
        graph,
        ret,
    )
}

pub(super) unsafe extern "C-unwind" fn sched_graph_compute_async(
    sched: Ptr,
    graph: Ptr,
    ret: usize,
) -> c_int {
    object_compute(
        Entry::SchedGraphComputeAsync,
        Owner::Scheduler,
        sched,
        graph,
        ret,
    )
}

pub(super) unsafe extern "C-unwind" fn backend_graph_compute(
    backend: Ptr,
    graph: Ptr,
    ret: usize,
) -> c_int {
    object_compute(
        Entry::BackendGraphCompute,
        Owner::Backend,
        backend,
        graph,
        ret,
    )
}

pub(super) unsafe extern "C-unwind" fn backend_graph_compute_async(
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

pub(super) unsafe extern "C-unwind" fn graph_compute(graph: Ptr, cplan: Ptr, ret: usize) -> c_int {
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

pub(super) unsafe extern "C-unwind" fn graph_compute_with_ctx(
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

pub(super) unsafe extern "C-unwind" fn backend_synchronize(backend: Ptr, ret: usize) {
    traced_wait(
        Entry::BackendSynchronize,
        ret,
        backend,
        Owner::Backend,
        |f| call_wait(f, backend),
    )
}

pub(super) unsafe extern "C-unwind" fn sched_synchronize(sched: Ptr, ret: usize) {
    traced_wait(Entry::SchedSynchronize, ret, sched, Owner::Scheduler, |f| {
        call_wait(f, sched)
    })
}

pub(super) unsafe extern "C-unwind" fn sched_set_eval_callback(
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
pub(super) unsafe extern "C-unwind" fn sched_free(sched: Ptr, ret: usize) {
    let Some(real) = real_function(Entry::SchedFree, ret) else {
        return;
    };
    guarded(|| eval_callback::forget_app_callback(sched));
    type FreeFn = unsafe extern "C-unwind" fn(Ptr);
    // SAFETY: the real ggml_backend_sched_free, with the caller's argument.
    unsafe { std::mem::transmute::<usize, FreeFn>(real.real)(sched) }
}
