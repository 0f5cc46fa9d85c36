//! One trace's shared state: the configuration, every thread's ring, the interned names and
//! tensors, the event cap and the counters of what could not be recorded, and the writer.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ggml_viz_config::{Config, OpTiming};
use ggml_viz_format::ext::Counters;

use super::tensors::Tensors;
use super::writer::{Drain, TraceWriter};
use crate::base::names::Names;
use crate::base::ring::Ring;
use crate::base::tensor::TensorRecord;

/// Events of calls that arrived while the recorder was being started, in this process.
static MISSED_WHILE_STARTING: AtomicU64 = AtomicU64::new(0);
/// Bumped per recorder, so that a thread's cached state is known to be stale after a fork.
static GENERATION: AtomicU64 = AtomicU64::new(0);

pub(super) fn count_missed_while_starting(events: u64) {
    MISSED_WHILE_STARTING.fetch_add(events, Ordering::Relaxed);
}

/// Transport calls of ggml-rpc that no connection's record follows (`super::rpc_commands`: its table's
/// lock was not had, or the table was full of live sockets), in this process.
static RPC_CALLS_UNFOLLOWED: AtomicU64 = AtomicU64::new(0);

pub(super) fn count_rpc_call_unfollowed() {
    RPC_CALLS_UNFOLLOWED.fetch_add(1, Ordering::Relaxed);
}

/// In a child after `fork`: its parent's misses are not its own.
pub(super) fn forget_missed_while_starting() {
    MISSED_WHILE_STARTING.store(0, Ordering::Relaxed);
}

/// How nodes are timed in this trace: `GGML_VIZ_OP_TIMING` with `auto` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpMode {
    Off = 0,
    /// The scheduler's eval callback.
    Sched = 1,
    /// Spans on the CPU backend's worker threads.
    Threads = 2,
}

impl OpMode {
    pub fn name(self) -> &'static str {
        match self {
            OpMode::Off => "off",
            OpMode::Sched => "sched",
            OpMode::Threads => "threads",
        }
    }

    /// The mode for the setting `wanted`, given whether the CPU backend's per-op functions reach
    /// our wrappers (`Err`: why not); and why this mode, for the metadata record.
    pub fn choose(wanted: OpTiming, cpu_functions: &Result<(), String>) -> (OpMode, String) {
        match (wanted, cpu_functions) {
            (OpTiming::Off, _) => (OpMode::Off, "GGML_VIZ_OP_TIMING=off".into()),
            (OpTiming::Sched, _) => (OpMode::Sched, "GGML_VIZ_OP_TIMING=sched".into()),
            (OpTiming::Threads | OpTiming::Auto, Ok(())) => (
                OpMode::Threads,
                format!(
                    "GGML_VIZ_OP_TIMING={}: the CPU backend's per-op functions and ggml_barrier \
                     are reachable",
                    wanted.name()
                ),
            ),
            (OpTiming::Threads | OpTiming::Auto, Err(why)) => (
                OpMode::Sched,
                format!(
                    "GGML_VIZ_OP_TIMING={}: {why}; using the scheduler's eval callback instead",
                    wanted.name()
                ),
            ),
        }
    }

    fn from_code(code: u8) -> OpMode {
        match code {
            1 => OpMode::Sched,
            2 => OpMode::Threads,
            _ => OpMode::Off,
        }
    }
}

/// Whether a recorder times nodes per thread now: the last value any recorder's `thread_ops` was
/// set to (one recorder is active at a time). One byte at a fixed address, which a front end's
/// fast path tests before anything else: while it is false, a worker thread with no share of a
/// node open has nothing to record (the graph compute running is one `op_sample` leaves untimed,
/// or none is), and its calls can go straight to ggml. It may be true when nothing is timed (the
/// recorder stopped): the fast path then only takes the longer way.
pub static THREAD_OPS_NOW: AtomicBool = AtomicBool::new(false);

/// Everything one trace needs. A new one is made after `fork`: the child must not touch locks
/// or rings that threads of its parent may have held.
pub struct Recorder {
    pub(super) config: Config,
    pub(super) generation: u64,
    rings: Mutex<Vec<&'static Ring>>,
    pub(super) names: Names,
    /// Events handed out to threads' budgets from the cap (`max_events`), at most the cap.
    reserved: AtomicU64,
    pub(super) over_max_events: AtomicU64,
    /// [`OpMode`] as its code: threads mode turns itself off when ggml's compute params look
    /// wrong.
    op_mode: AtomicU8,
    /// Threads mode: whether the nodes computed now belong to a recorded, sampled graph compute
    /// (set by each outermost graph compute; worker threads have no graph compute of their own),
    /// through [`Recorder::set_thread_ops`].
    thread_ops: AtomicBool,
    /// Recorded graph computes considered for op timing (for `op_sample`).
    pub(super) op_timed_graphs: AtomicU64,
    /// Tensors seen by op timing: name, op, type, shape.
    tensors: Tensors,
    /// Outermost graph computes begun, recorded or not; counted only when a capture window is set.
    pub(super) graphs_begun: AtomicU64,
    pub(super) writer: Mutex<TraceWriter>,
    /// The flusher thread, woken early when a ring becomes half full.
    pub(super) flusher: OnceLock<std::thread::Thread>,
    /// The trace file's descriptor, which a child after `fork` closes (see `os::close_in_child`).
    pub(super) trace_descriptor: i64,
}

impl Recorder {
    pub(super) fn new(
        config: Config,
        op_mode: OpMode,
        writer: TraceWriter,
        trace_descriptor: i64,
    ) -> Recorder {
        Recorder {
            op_mode: AtomicU8::new(op_mode as u8),
            thread_ops: AtomicBool::new(false),
            config,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            rings: Mutex::new(Vec::new()),
            names: Names::new(),
            reserved: AtomicU64::new(0),
            over_max_events: AtomicU64::new(0),
            op_timed_graphs: AtomicU64::new(0),
            tensors: Tensors::new(op_mode != OpMode::Off),
            graphs_begun: AtomicU64::new(0),
            writer: Mutex::new(writer),
            flusher: OnceLock::new(),
            trace_descriptor,
        }
    }

    /// A ring has just become half full: the flusher drains it now rather than at its next
    /// interval (one `unpark` per filling of a ring, never per event).
    pub(super) fn wake_flusher(&self) {
        if let Some(flusher) = self.flusher.get() {
            flusher.unpark();
        }
    }

    /// Where the CUPTI capture goes (empty: none).
    pub fn cupti_capture(&self) -> &str {
        &self.config.cupti_capture
    }

    pub fn op_mode(&self) -> OpMode {
        OpMode::from_code(self.op_mode.load(Ordering::Relaxed))
    }

    /// Threads mode cannot go on (ggml's compute params are not what we read): graphs from now
    /// on are timed with the eval callback.
    pub fn threads_mode_failed(&self) {
        self.op_mode.store(OpMode::Sched as u8, Ordering::Relaxed);
        self.set_thread_ops(false);
    }

    /// Whether the nodes computed now are timed per thread (see `thread_ops`).
    pub(super) fn thread_ops(&self) -> bool {
        self.thread_ops.load(Ordering::Relaxed)
    }

    /// Sets `thread_ops`, and [`THREAD_OPS_NOW`] with it.
    pub(super) fn set_thread_ops(&self, on: bool) {
        self.thread_ops.store(on, Ordering::Relaxed);
        THREAD_OPS_NOW.store(on, Ordering::Relaxed);
    }

    /// The id of a node's tensor info (`key` hashes what makes it distinct), read by `info` on
    /// first sight; 0 when the table is full.
    pub fn tensor_id(&self, key: u64, info: impl FnOnce() -> TensorRecord) -> u16 {
        self.tensors.intern(key, info)
    }

    pub(super) fn add_ring(&self, ring: &'static Ring) {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ring);
    }

    /// The rings registered so far.
    fn rings(&self) -> Vec<&'static Ring> {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Has the pages each ring's producer writes next backed ([`Ring::populate_ahead`]).
    pub(super) fn populate_rings_ahead(&self) {
        for ring in self.rings() {
            ring.populate_ahead();
        }
    }

    /// Events dropped because a ring was full, over all rings.
    pub fn dropped_ring_full(&self) -> u64 {
        dropped(&self.rings())
    }

    /// What the writer drains: the rings registered so far, the names, tensors and counters.
    pub(super) fn drain(&self) -> Drain<'_> {
        let rings = self.rings();
        let counters = Counters {
            dropped_ring_full: dropped(&rings),
            over_max_events: self.over_max_events.load(Ordering::Relaxed),
            missed_while_starting: MISSED_WHILE_STARTING.load(Ordering::Relaxed),
            unnamed: self.names.refused(),
            without_tensor_info: self.tensors.refused(),
            rpc_calls_unfollowed: RPC_CALLS_UNFOLLOWED.load(Ordering::Relaxed),
        };
        Drain {
            rings,
            names: &self.names,
            tensors: &self.tensors,
            counters,
        }
    }

    pub(super) fn graph_in_window(&self, index: u64) -> bool {
        let c = &self.config;
        index >= c.skip_graphs && (c.max_graphs == 0 || index - c.skip_graphs < c.max_graphs)
    }

    /// Whether a capture window is set (else graph computes need no counting).
    pub(super) fn has_window(&self) -> bool {
        self.config.skip_graphs > 0 || self.config.max_graphs > 0
    }

    /// Takes up to [`BUDGET_CHUNK`] events from the cap for one thread; 0 when the cap is used up.
    pub(super) fn reserve(&self) -> u64 {
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

fn dropped(rings: &[&'static Ring]) -> u64 {
    rings.iter().map(|r| r.dropped()).sum()
}

/// Events a thread takes from the cap at a time, so that the producer does not touch a shared
/// counter on every event. A thread may be refused while another still holds unused budget:
/// then fewer than `max_events` are recorded, and the refusals are counted all the same.
pub(super) const BUDGET_CHUNK: u64 = 256;
