//! What the calls do on their way in and out: a thread's share of a node begins at the
//! dispatcher's marker or the outermost per-op call and ends at the barrier after the node; a
//! barrier's wait is recorded around it.

use std::ffi::c_void;
use std::sync::atomic::AtomicBool;

use super::worker::{EndedAt, Kind, Share, SiteSlot, WORKER, Worker, node_tensor, set_worker_slot};
use crate::base::ggml::Helpers;
use crate::base::{clock, contained, say_once};
use crate::intercept::route::Resolved;
use crate::record::{self, OpInfo, Recorder, ShareEdge};

type Ptr = *mut c_void;

/// The recorder calls are timed per thread in now, if they are. When not (op timing off or by
/// the eval callback, or not tracing), there is nothing to keep, but a share left open when that
/// began is ended; and where nothing will be timed for the rest of the process, the thread's
/// calls go straight to ggml from now on.
#[inline(always)]
pub(super) fn threads_timed(w: &Worker) -> Option<&'static Recorder> {
    let r = record::thread_ops();
    if r.is_some() {
        return r;
    }
    if w.depth.get() == 0 && (w.open_tensor.get() != 0 || w.ended_at.get() != 0) {
        contained(|| end_node(w));
    } else if w.depth.get() == 0 && record::thread_ops_never() {
        w.passthrough.set(true);
        set_worker_slot(w);
    }
    None
}

/// A call at depth 0 (the depth already counts it) timed in recorder `r`: its site stands in
/// for tail calls from inside it, and unless it continues the node this thread's share is open
/// for, a share begins.
pub(super) fn outermost_call(
    w: &Worker,
    r: &'static Recorder,
    kind: Kind,
    resolved: &Resolved,
    site: usize,
    args: [Ptr; 3],
) {
    w.outer_site.set(site);
    if !w.continues_node(kind, args[1], args[2]) {
        contained(|| node_begins(w, r, kind, resolved.helpers, args[0], args[1], args[2]));
    } else if kind != Kind::Marker {
        w.node_computed.set(true);
    }
}

/// `common`'s fast path at the dispatcher's marker (`ggml_cpu_extra_compute_forward(params,
/// node)`) at depth 0, from a site this thread resolved before (its entry `entry` of the
/// call-site cache): what [`enter`](super::trampoline) would do, less the depth, which `common`
/// takes up around the call when this says the call is timed.
pub(super) extern "C" fn begin_share(
    worker: *const Worker,
    site: usize,
    resolved: *const Resolved,
    params: Ptr,
    node: Ptr,
    entry: *const SiteSlot,
) -> bool {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it; and a `Resolved` from its call-site
    // cache, leaked and never freed.
    let (w, resolved) = unsafe { (&*worker, &*resolved) };
    w.marker_lines
        .set((entry as usize, resolved as *const Resolved as usize));
    let Some(r) = threads_timed(w) else {
        return false;
    };
    outermost_call(
        w,
        r,
        Kind::Marker,
        resolved,
        site,
        [params, node, std::ptr::null_mut()],
    );
    true
}

/// `common`'s fast path at a barrier of one thread, called from `site` with a share open whose
/// end `common` does not stamp itself (a node no per-op call computed, or ticks other than the
/// TSC): the share ends if the barrier follows its node (what [`enter`](super::trampoline)
/// would do there, whether or not per-thread timing goes on).
pub(super) extern "C" fn end_share(worker: *const Worker, site: usize) {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it.
    let w = unsafe { &*worker };
    if w.barrier_follows_node(site) {
        contained(|| end_node(w));
    }
}

/// `common`'s fast path at a barrier of several threads, called from `site`: what [`enter`](super::trampoline)
/// would do there (the share ends if the barrier follows its node; the wait begins if it is
/// recorded, and then [`exit`] follows the call).
pub(super) extern "C" fn wait_begins(worker: *const Worker, site: usize) -> bool {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it.
    let w = unsafe { &*worker };
    threads_timed(w).is_some() && timed_wait(w, site)
}

/// A barrier call from `site` while threads are timed: whether its wait is recorded (then it
/// began now, and [`exit`] follows the call).
pub(super) fn timed_wait(w: &Worker, site: usize) -> bool {
    contained(|| {
        let start = clock::now_ticks();
        let (recorder, ended) = wait_began(w, site);
        end_at_wait(w, ended, recorder, start);
        w.barrier_start
            .set(if recorder.is_some() { start } else { 0 });
        recorder.is_some()
    }) == Some(true)
}

/// `common`'s fast path after a barrier of several threads called from `site`, whose wait it
/// stamped as it began (`barrier_start`, ticks read as [`clock::now_ticks`] reads them): what
/// [`wait_begins`] and [`exit`] would do around the call, in one call after it.
pub(super) extern "C" fn waited(worker: *const Worker, site: usize) {
    // SAFETY: `common` passes this thread's own `WORKER` (from its TLS slot), which lives as
    // long as the thread, and only this thread uses it.
    let w = unsafe { &*worker };
    let start = w.barrier_start.replace(0);
    contained(|| match wait_began(w, site) {
        // The share and the wait after it, in one visit of the recording core.
        (Some(r), Some((op, owner))) if !cfg!(ggml_viz_floor) && std::ptr::eq(owner, r) => {
            record::share_then_wait(w.this_thread(), r, &op, start, w.ith.get(), w.nth.get());
        }
        (Some(r), ended) => {
            end_at_wait(w, ended, Some(r), start);
            record_wait(w, r, start);
        }
        (None, ended) => {
            end_at_wait(w, ended, None, start);
            threads_timed(w);
        }
    });
}

/// After a recorded barrier wait, on the thread whose `worker` [`enter`](super::trampoline) returned (after any
/// other call, `common` itself takes the depth down).
pub(super) extern "C" fn exit(worker: *const Worker) {
    // SAFETY: `enter` returned this thread's own `WORKER` (thread-local storage lives as long as
    // the thread, which is still in the call), and only this thread uses it.
    let w = unsafe { &*worker };
    contained(|| barrier_ends(w));
}

/// An outermost per-op call (or the dispatcher's marker) on this thread, timed in recorder `r`,
/// for another node than the one its share is open for.
fn node_begins(
    w: &Worker,
    r: &'static Recorder,
    kind: Kind,
    h: &'static Helpers,
    params: Ptr,
    arg1: Ptr,
    arg2: Ptr,
) {
    let tensor = node_tensor(kind, arg1, arg2);
    // The share before this one, if it has ended: recorded with this one's begin.
    let ended = ended_share(w);
    if tensor.is_null() || params.is_null() {
        record_ended(w, ended);
        return;
    }
    // SAFETY: `params` is ggml's `struct ggml_compute_params *` for this call, which starts
    // with `int ith, nth`.
    let (ith, nth) = unsafe { (*(params as *const i32), *(params as *const i32).add(1)) };
    if !(0..=65536).contains(&nth) || ith < 0 || ith >= nth {
        record_ended(w, ended);
        static SAID: AtomicBool = AtomicBool::new(false);
        say_once(
            &SAID,
            format_args!(
                "this ggml's compute params do not start with the thread index and count \
                 (read {ith} of {nth}); per-thread op timing stops, nodes are timed with the \
                 scheduler's eval callback from the next graph on"
            ),
        );
        r.threads_mode_failed();
        return;
    }
    w.ith.set(ith as u32);
    w.nth.set(nth as u32);
    if cfg!(ggml_viz_floor) {
        share_state_only(w, r, kind, tensor);
        return;
    }
    // SAFETY: `tensor` is the node this call of the copy `h` belongs to computes: live.
    let op = unsafe {
        if kind == Kind::Fused {
            w.fused_node_info(h, r, arg1, arg2)
        } else {
            w.node_info(h, r, tensor)
        }
    };
    match ended {
        Some((before, owner, at)) if std::ptr::eq(owner, r) => {
            record::share_then_begin(w.this_thread(), r, &before, at, &op);
        }
        ended => {
            record_ended(w, ended);
            record::thread_op(w.this_thread(), r, ShareEdge::Begin, &op);
        }
    }
    w.open_node(op, r, kind != Kind::Marker);
}

/// What a share costs below its recording, for `bench/shares.py --floor` (a build with
/// `--cfg ggml_viz_floor`, never shipped): the calls reach here as they do, the share before is
/// taken, the compute params read (the thread count decides whether waits are recorded), the
/// clock read for this one's begin, the share opens; nothing is described or stored, and
/// neither a share's end ([`record_end`]) nor a barrier wait ([`record_wait`], [`waited`]: its
/// end's clock read) is recorded.
#[inline(always)]
fn share_state_only(w: &Worker, r: &'static Recorder, kind: Kind, tensor: Ptr) {
    let op = OpInfo {
        tensor,
        op_type: 0,
        op_size: std::hint::black_box(clock::now_ticks()),
        backend: std::ptr::null_mut(),
        tensor_id: 0,
    };
    w.open_node(op, r, kind != Kind::Marker);
}

/// A graph compute returned on this thread: a share still open here ends with it. ggml's graph
/// loop ends each share at its barrier after the node, but where the compiler inlined that
/// barrier into the loop (a ggml linked into the executable), a graph of one thread calls none,
/// and its last node's share would run on into the next graph compute.
pub fn graph_compute_returned() {
    WORKER.with(|w| {
        if w.depth.get() == 0 {
            contained(|| end_node(w));
        }
    });
}

/// Ends this thread's open share of a node, if any, now; or records the share `common` ended at
/// a barrier of one thread, if any ([`settle`]).
#[inline(always)]
fn end_node(w: &Worker) {
    record_ended(w, ended_share(w));
}

/// Records the end of this thread's share that `common` ended at a barrier of one thread, if
/// any, at the ticks it stamped there: before anything else this thread records (the next
/// share's begin, a wait) and when its graph compute returns.
#[inline(always)]
fn settle(w: &Worker) {
    record_ended(w, w.take_ended());
}

/// This thread's share that [`end_node`] ends, taken for the caller to record: the open one,
/// ended now, or the one `common` ended at a barrier of one thread, at the ticks it stamped.
#[inline(always)]
fn ended_share(w: &Worker) -> Option<EndedAt> {
    match w.take_node() {
        Some((op, r)) => Some((op, r, clock::now_ticks())),
        None => w.take_ended(),
    }
}

/// Records the share `ended`, if any, at the ticks it ended at.
#[inline(always)]
fn record_ended(w: &Worker, ended: Option<EndedAt>) {
    if let Some((op, r, at)) = ended {
        record_end(w, r, ShareEdge::End, &op, at);
    }
}

/// This thread's share of the node of `op`, recorded in `r`, ends at `edge`, at `ticks`
/// (recorded only while `r` still records).
#[inline(always)]
fn record_end(w: &Worker, r: &'static Recorder, edge: ShareEdge, op: &OpInfo, ticks: u64) {
    if !cfg!(ggml_viz_floor) && record::active().is_some_and(|a| std::ptr::eq(a, r)) {
        record::thread_op_at(w.this_thread(), r, edge, op, ticks);
    }
}

/// A barrier called from `site` as its wait began: the recorder the wait is recorded in, if it
/// is (else nothing is to be done when it ends); and the share open on this thread, and the
/// recorder it is recorded in, if the barrier follows its node: it ends where the wait began,
/// taken here for the caller to record ([`end_at_wait`], or with the wait).
#[inline(always)]
fn wait_began(w: &Worker, site: usize) -> (Option<&'static Recorder>, Option<Share>) {
    settle(w);
    let recorder = record::thread_ops().filter(|_| w.nth.get() > 1);
    // The node before this barrier is done, on this thread, unless the barrier is inside its
    // op: a call nested in its per-op function, or one from a function no wrapper reaches.
    let ended = if w.depth.get() == 0 && w.barrier_follows_node(site) {
        w.take_node()
    } else {
        None
    };
    (recorder, ended)
}

/// Records the end of the share `ended`, if any, at `start` ticks, where the wait of a barrier
/// began: held for the wait to join where that is recorded (in `recorder`).
fn end_at_wait(w: &Worker, ended: Option<Share>, recorder: Option<&Recorder>, start: u64) {
    if let Some((op, r)) = ended {
        let edge = if recorder.is_some() {
            ShareEdge::EndAtWait
        } else {
            ShareEdge::End
        };
        record_end(w, r, edge, &op, start);
    }
}

/// A recorded barrier wait ended: recorded, with the share that ended as it began, if any
/// (which goes in on its own where threads are no longer timed).
fn barrier_ends(w: &Worker) {
    let start = w.barrier_start.replace(0);
    if start == 0 {
        return;
    }
    match record::thread_ops() {
        Some(r) => record_wait(w, r, start),
        None => share_without_wait(w),
    }
}

/// This thread's barrier wait from `start` ticks to now, recorded in `r`.
fn record_wait(w: &Worker, r: &'static Recorder, start: u64) {
    if cfg!(ggml_viz_floor) {
        // The floor's wait: its end read, nothing recorded (see `share_state_only`).
        std::hint::black_box(clock::now_ticks());
        return;
    }
    record::barrier_wait(
        w.this_thread(),
        r,
        std::ptr::null_mut(),
        w.ith.get(),
        w.nth.get(),
        start,
    );
}

/// A wait ended that is not recorded after all (threads are no longer timed): the share that
/// ended as it began, if held for it, goes in on its own.
#[cold]
#[inline(never)]
fn share_without_wait(w: &Worker) {
    if let Some(r) = record::active() {
        record::release_share(w.this_thread(), r);
    }
}
