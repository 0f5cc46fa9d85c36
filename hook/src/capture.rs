//! The producer side: what an interposed call does around the real function.
//!
//! Steady state (a thread that already has its ring): read the clock, bump one shared counter
//! (the event cap), copy the event into the thread's ring. No lock, no allocation, no system
//! call. A thread's first event allocates and registers its ring, once.

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use ggml_viz_config::Config;

use crate::names::{Names, Owner};
use crate::ring::{RawEvent, Ring};
use ggml_viz_reader::EventType;

/// The exported entry points; the number is stored in every event (its label's first word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Entry {
    SchedGraphCompute = 1,
    SchedGraphComputeAsync = 2,
    BackendGraphCompute = 3,
    BackendGraphComputeAsync = 4,
    GraphCompute = 5,
    GraphComputeWithCtx = 6,
    BackendSynchronize = 7,
    SchedSynchronize = 8,
    SchedSetEvalCallback = 9,
    LlamaDecode = 10,
    LlamaEncode = 11,
    LlamaProcess = 12,
    LlamaBatchExtAdd = 13,
    LlamaBatchExtAddToken = 14,
    LlamaBatchExtClear = 15,
    BufferInit = 16,
    BufferFree = 17,
}

impl Entry {
    pub const ALL: [Entry; 17] = [
        Entry::SchedGraphCompute,
        Entry::SchedGraphComputeAsync,
        Entry::BackendGraphCompute,
        Entry::BackendGraphComputeAsync,
        Entry::GraphCompute,
        Entry::GraphComputeWithCtx,
        Entry::BackendSynchronize,
        Entry::SchedSynchronize,
        Entry::SchedSetEvalCallback,
        Entry::LlamaDecode,
        Entry::LlamaEncode,
        Entry::LlamaProcess,
        Entry::LlamaBatchExtAdd,
        Entry::LlamaBatchExtAddToken,
        Entry::LlamaBatchExtClear,
        Entry::BufferInit,
        Entry::BufferFree,
    ];

    pub fn from_code(code: u8) -> Option<Entry> {
        Entry::ALL.get((code as usize).wrapping_sub(1)).copied()
    }

    pub fn c_name(self) -> &'static CStr {
        match self {
            Entry::SchedGraphCompute => c"ggml_backend_sched_graph_compute",
            Entry::SchedGraphComputeAsync => c"ggml_backend_sched_graph_compute_async",
            Entry::BackendGraphCompute => c"ggml_backend_graph_compute",
            Entry::BackendGraphComputeAsync => c"ggml_backend_graph_compute_async",
            Entry::GraphCompute => c"ggml_graph_compute",
            Entry::GraphComputeWithCtx => c"ggml_graph_compute_with_ctx",
            Entry::BackendSynchronize => c"ggml_backend_synchronize",
            Entry::SchedSynchronize => c"ggml_backend_sched_synchronize",
            Entry::SchedSetEvalCallback => c"ggml_backend_sched_set_eval_callback",
            Entry::LlamaDecode => c"llama_decode",
            Entry::LlamaEncode => c"llama_encode",
            Entry::LlamaProcess => c"llama_process",
            Entry::LlamaBatchExtAdd => c"llama_batch_ext_add",
            Entry::LlamaBatchExtAddToken => c"llama_batch_ext_add_token",
            Entry::LlamaBatchExtClear => c"llama_batch_ext_clear",
            Entry::BufferInit => c"ggml_backend_buffer_init",
            Entry::BufferFree => c"ggml_backend_buffer_free",
        }
    }

    /// The C name without its NUL (labels are built from it for every event).
    pub fn name(self) -> &'static str {
        // SAFETY: the names above are ASCII, so valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(self.c_name().to_bytes()) }
    }

    /// The backend an entry point always runs on, where its arguments name none.
    pub fn implied_backend(self) -> Option<&'static str> {
        matches!(self, Entry::GraphCompute | Entry::GraphComputeWithCtx).then_some("CPU")
    }
}

/// Everything one trace needs. A new one is made after `fork`: the child must not touch locks
/// or rings that threads of its parent may have held.
pub struct Recorder {
    pub config: Config,
    /// Bumped per recorder, so that a thread's cached ring is known to be stale after a fork.
    pub generation: u64,
    pub rings: Mutex<Vec<&'static Ring>>,
    pub names: Names,
    /// Events handed out to threads' budgets from the cap (`max_events`), at most the cap.
    pub reserved: AtomicU64,
    pub over_max_events: AtomicU64,
    /// Recorded graph computes considered for op timing (for `op_sample`).
    pub op_timed_graphs: AtomicU64,
    /// Tensors seen by op timing: name, op, type, shape.
    pub tensors: crate::ops::Tensors,
    /// Outermost graph computes begun, recorded or not; counted only when a capture window is set.
    pub graphs_begun: AtomicU64,
    pub sink: Mutex<crate::sink::Sink>,
}

impl Recorder {
    /// Events dropped because a ring was full, over all rings.
    pub fn dropped_ring_full(&self) -> u64 {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|r| r.dropped())
            .sum()
    }

    fn graph_in_window(&self, index: u64) -> bool {
        let c = &self.config;
        index >= c.skip_graphs && (c.max_graphs == 0 || index - c.skip_graphs < c.max_graphs)
    }

    /// Whether a capture window is set (else graph computes need no counting).
    fn has_window(&self) -> bool {
        self.config.skip_graphs > 0 || self.config.max_graphs > 0
    }

    /// Takes up to [`BUDGET_CHUNK`] events from the cap for one thread; 0 when the cap is used up.
    fn reserve(&self) -> u64 {
        let max = self.config.max_events;
        let taken = self.reserved.fetch_add(BUDGET_CHUNK, Ordering::Relaxed);
        if taken >= max {
            // Keep the counter from creeping towards overflow once the cap is reached.
            self.reserved.store(max, Ordering::Relaxed);
            return 0;
        }
        BUDGET_CHUNK.min(max - taken)
    }
}

/// Events a thread takes from the cap at a time, so that the producer does not touch a shared
/// counter on every event. A thread may be refused while another still holds unused budget:
/// then fewer than `max_events` are recorded, and the refusals are counted all the same.
const BUDGET_CHUNK: u64 = 256;

const UNSTARTED: u8 = 0;
const STARTING: u8 = 1;
const ACTIVE: u8 = 2;
/// Disabled, misconfigured, or the output failed: every call goes straight through.
const INERT: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNSTARTED);
static RECORDER: AtomicPtr<Recorder> = AtomicPtr::new(std::ptr::null_mut());
static GENERATION: AtomicU64 = AtomicU64::new(0);
static MISSED_WHILE_STARTING: AtomicU64 = AtomicU64::new(0);

/// Per-thread state. No destructors: it stays usable while the host's `atexit` handlers run,
/// after Rust's own thread-locals are gone.
struct Local {
    ring: Cell<*const Ring>,
    generation: Cell<u64>,
    tid: Cell<u32>,
    /// Graph computes open on this thread.
    depth: Cell<u32>,
    /// Whether the outermost open graph compute is inside the capture window.
    recording: Cell<bool>,
    /// Events this thread may still record under the cap.
    budget: Cell<u64>,
    /// Our eval callback is driving a node: the graph computes and waits ggml makes for it are
    /// part of the op, not recorded on their own.
    in_op: Cell<bool>,
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            ring: Cell::new(std::ptr::null()),
            generation: Cell::new(u64::MAX),
            tid: Cell::new(0),
            depth: Cell::new(0),
            recording: Cell::new(false),
            budget: Cell::new(0),
            in_op: Cell::new(false),
        }
    };
}

/// The active recorder, starting it on the first call. `None`: do not trace this call. A call
/// that arrives while another thread is starting the recorder is not traced (it does not wait):
/// its `events` are counted as missed.
fn recorder(events: u64) -> Option<&'static Recorder> {
    if STATE.load(Ordering::Acquire) == UNSTARTED
        && STATE
            .compare_exchange(UNSTARTED, STARTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        let state = match crate::sink::start() {
            Some(recorder) => {
                let recorder: &'static Recorder = Box::leak(recorder);
                RECORDER.store(
                    recorder as *const Recorder as *mut Recorder,
                    Ordering::Release,
                );
                crate::sink::spawn_flusher(recorder);
                ACTIVE
            }
            None => INERT,
        };
        STATE.store(state, Ordering::Release);
    }
    match STATE.load(Ordering::Acquire) {
        ACTIVE => active(),
        STARTING => {
            MISSED_WHILE_STARTING.fetch_add(events, Ordering::Relaxed);
            None
        }
        _ => None,
    }
}

/// Events of calls that arrived while the recorder was being started.
pub fn missed_while_starting() -> u64 {
    MISSED_WHILE_STARTING.load(Ordering::Relaxed)
}

/// Starts the recorder if this is the first interposed call (so that the configuration, and
/// with it `verbose`, is known before the real function is looked up).
pub fn start_if_needed() {
    let _ = recorder(0);
}

/// The recorder if one is active, without starting one.
pub fn active() -> Option<&'static Recorder> {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return None;
    }
    // SAFETY: as in `recorder`.
    let r = RECORDER.load(Ordering::Acquire);
    (!r.is_null()).then(|| unsafe { &*r })
}

/// A new generation number for a new recorder.
pub fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// Stops tracing for good (the output failed); calls go straight through from now on.
pub fn go_inert() {
    STATE.store(INERT, Ordering::Release);
}

/// In a child after `fork`: forget the parent's recorder; the child starts its own on its next
/// call. Runs in the forking thread, the only thread of the child.
pub fn reset_after_fork() {
    RECORDER.store(std::ptr::null_mut(), Ordering::Release);
    STATE.store(UNSTARTED, Ordering::Release);
    MISSED_WHILE_STARTING.store(0, Ordering::Relaxed);
    LOCAL.with(|l| {
        l.ring.set(std::ptr::null());
        l.generation.set(u64::MAX);
        l.tid.set(0);
        l.depth.set(0);
        l.recording.set(false);
        l.budget.set(0);
        l.in_op.set(false);
    });
}

fn thread_id(l: &Local) -> u32 {
    match l.tid.get() {
        0 => {
            // Once per thread.
            let tid = crate::os::thread_id();
            l.tid.set(tid);
            tid
        }
        tid => tid,
    }
}

/// This thread's ring, made and registered on its first event (with a THREAD_BEGIN event when
/// thread tracking is on).
fn ring_of(l: &Local, r: &'static Recorder) -> &'static Ring {
    if l.generation.get() != r.generation || l.ring.get().is_null() {
        let ring: &'static Ring = Box::leak(Box::new(Ring::new(r.config.buffer_size as usize)));
        r.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ring);
        l.ring.set(ring);
        l.generation.set(r.generation);
        if r.config.thread_tracking {
            // Registers this thread's exit hook (a thread-local with a destructor).
            THREAD_EXIT.with(|_| {});
            push(l, r, thread_event(r, l, EventType::ThreadBegin));
        }
    }
    // SAFETY: rings are leaked, never freed.
    unsafe { &*l.ring.get() }
}

/// THREAD_BEGIN or THREAD_FREE for this thread, labelled with its name.
fn thread_event(r: &Recorder, l: &Local, ty: EventType) -> RawEvent {
    let tid = thread_id(l);
    let name_id = r
        .names
        .intern(tid as usize, Owner::Thread, crate::os::thread_name);
    RawEvent {
        type_code: ty.code(),
        name_id,
        ..RawEvent::default()
    }
}

/// Its destructor runs when the thread exits: the THREAD_FREE event.
struct ThreadExit;

impl Drop for ThreadExit {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let Some(r) = active() else { return };
            LOCAL.with(|l| {
                if l.generation.get() == r.generation && !l.ring.get().is_null() {
                    push(l, r, thread_event(r, l, EventType::ThreadFree));
                }
            });
        });
    }
}

thread_local! {
    static THREAD_EXIT: ThreadExit = const { ThreadExit };
}

/// A backend buffer was made (`alloc`, after `ggml_backend_buffer_init` returned it) or is about
/// to be freed: TENSOR_ALLOC / TENSOR_FREE keyed by the buffer handle, with its real size, its
/// base address and its buffer type's name. Only with memory tracking on.
pub fn buffer_event(
    alloc: bool,
    buffer: *mut c_void,
    size: u64,
    base: u64,
    buft_name: impl FnOnce(&Recorder) -> u16,
) {
    let Some(r) = recorder(1) else { return };
    if !r.config.memory_tracking {
        return;
    }
    let ty = if alloc {
        EventType::TensorAlloc
    } else {
        EventType::TensorFree
    };
    let event = RawEvent {
        type_code: ty.code(),
        a: buffer as u64,
        size,
        d: base,
        name_id: buft_name(r),
        ..RawEvent::default()
    };
    LOCAL.with(|l| push(l, r, event));
}

fn push(l: &Local, r: &'static Recorder, mut event: RawEvent) {
    let ring = ring_of(l, r);
    let mut budget = l.budget.get();
    if budget == 0 {
        budget = r.reserve();
        if budget == 0 {
            r.over_max_events.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    l.budget.set(budget - 1);
    event.thread_id = thread_id(l);
    event.ticks = crate::clock::now_ticks();
    // SAFETY: this thread is its ring's only producer.
    unsafe { ring.push(event) };
}

/// What a graph event says, besides its type and time.
#[derive(Clone, Copy, Debug)]
pub struct GraphInfo {
    pub graph: *mut c_void,
    pub n_nodes: u32,
    pub n_threads: u32,
    pub backend: *mut c_void,
    pub name_id: u16,
}

/// Interns the name of a backend or scheduler for the labels.
pub fn name_id(r: &Recorder, ptr: *mut c_void, owner: Owner, name: impl FnOnce() -> String) -> u16 {
    r.names.intern(ptr as usize, owner, name)
}

/// An open graph compute: what its end event needs.
pub struct GraphScope {
    recorder: &'static Recorder,
    entry: Entry,
    info: GraphInfo,
    recording: bool,
    /// No other graph compute is open on this thread.
    outermost: bool,
}

fn graph_event(type_code: u8, entry: Entry, info: &GraphInfo) -> RawEvent {
    RawEvent {
        type_code,
        entry: entry as u8,
        a: info.graph as u64,
        b: info.n_nodes,
        c: info.n_threads,
        d: info.backend as u64,
        name_id: info.name_id,
        ..RawEvent::default()
    }
}

/// Before the real call: records the begin event if this graph compute is in the capture
/// window. `describe` runs only when tracing.
pub fn graph_begin(
    entry: Entry,
    describe: impl FnOnce(&'static Recorder) -> GraphInfo,
) -> Option<GraphScope> {
    // A begin and an end event.
    let r = recorder(2)?;
    LOCAL.with(|l| {
        let depth = l.depth.get();
        if depth == 0 {
            let in_window = !r.has_window()
                || r.graph_in_window(r.graphs_begun.fetch_add(1, Ordering::Relaxed));
            l.recording.set(in_window);
        }
        l.depth.set(depth + 1);
        let recording = l.recording.get() && !l.in_op.get();
        let info = if recording {
            describe(r)
        } else {
            GraphInfo::empty()
        };
        if recording {
            push(l, r, graph_event(0, entry, &info));
        }
        Some(GraphScope {
            recorder: r,
            entry,
            info,
            recording,
            outermost: depth == 0,
        })
    })
}

impl GraphScope {
    pub fn recorder(&self) -> &'static Recorder {
        self.recorder
    }

    /// Whether this graph compute's ops should be timed: it is recorded and outermost (a nested
    /// scheduler call is timed by the outer one), op timing is on, and it is the one in
    /// `op_sample` that is sampled.
    pub fn wants_op_timing(&self) -> bool {
        let c = &self.recorder.config;
        self.recording
            && self.outermost
            && c.op_timing
            && self
                .recorder
                .op_timed_graphs
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(c.op_sample.max(1))
    }
}

/// One node's op event: begin (`OP_COMPUTE_BEGIN`) or end.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub tensor: *mut c_void,
    pub op_type: u32,
    pub op_size: u64,
    pub backend: *mut c_void,
    /// The tensor's entry in the recorder's tensor table.
    pub tensor_id: u16,
}

fn op_event(type_code: u8, op: &OpInfo) -> RawEvent {
    RawEvent {
        type_code,
        a: op.tensor as u64,
        b: op.op_type,
        size: op.op_size,
        d: op.backend as u64,
        name_id: op.tensor_id,
        ..RawEvent::default()
    }
}

/// Our eval callback is about to let ggml compute one node.
pub fn op_begin(r: &'static Recorder, op: &OpInfo) {
    LOCAL.with(|l| {
        push(l, r, op_event(2, op));
        l.in_op.set(true);
    });
}

/// The node is computed and synchronized.
pub fn op_end(r: &'static Recorder, op: &OpInfo) {
    LOCAL.with(|l| {
        l.in_op.set(false);
        push(l, r, op_event(3, op));
    });
}

/// An application-level span (`llama_decode`, `llama_encode`): begin or end, with the batch's
/// tokens (`u32::MAX`: unknown) in `b`.
pub fn span(entry: Entry, begin: bool, count: u32) {
    let Some(r) = recorder(1) else { return };
    let event = RawEvent {
        type_code: ggml_viz_reader::format::EXTENSION_TYPE_CODE,
        entry: entry as u8,
        b: count,
        c: u32::from(begin),
        ..RawEvent::default()
    };
    LOCAL.with(|l| push(l, r, event));
}

/// After the real call: the end event.
pub fn graph_end(scope: GraphScope) {
    LOCAL.with(|l| {
        if scope.recording {
            push(l, scope.recorder, graph_event(1, scope.entry, &scope.info));
        }
        l.depth.set(l.depth.get().saturating_sub(1));
    });
}

impl GraphInfo {
    fn empty() -> GraphInfo {
        GraphInfo {
            graph: std::ptr::null_mut(),
            n_nodes: 0,
            n_threads: 0,
            backend: std::ptr::null_mut(),
            name_id: 0,
        }
    }
}

/// A wait for a backend or scheduler to finish (`*_synchronize`): one barrier_wait event at its
/// end, whose value is the time waited. Recorded inside recorded graph computes, and outside any
/// graph compute while the capture window is open.
pub struct WaitScope {
    recorder: &'static Recorder,
    entry: Entry,
    object: *mut c_void,
    name_id: u16,
    start_ticks: u64,
}

pub fn wait_begin(
    entry: Entry,
    object: *mut c_void,
    name_id: impl FnOnce(&'static Recorder) -> u16,
) -> Option<WaitScope> {
    let r = recorder(1)?;
    let recording = LOCAL.with(|l| {
        if l.in_op.get() {
            false
        } else if l.depth.get() > 0 {
            l.recording.get()
        } else {
            !r.has_window()
                || r.graph_in_window(r.graphs_begun.load(Ordering::Relaxed).saturating_sub(1))
        }
    });
    recording.then(|| WaitScope {
        recorder: r,
        entry,
        object,
        name_id: name_id(r),
        start_ticks: crate::clock::now_ticks(),
    })
}

pub fn wait_end(scope: WaitScope) {
    let waited = crate::clock::now_ticks().saturating_sub(scope.start_ticks);
    let event = RawEvent {
        type_code: EventType::BarrierWait.code(),
        entry: scope.entry as u8,
        a: scope.object as u64,
        d: waited,
        name_id: scope.name_id,
        ..RawEvent::default()
    };
    LOCAL.with(|l| push(l, scope.recorder, event));
}
