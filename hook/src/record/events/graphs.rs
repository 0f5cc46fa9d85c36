//! Graph computes and waits: their begin and end events, with what names them (the backend or
//! scheduler, the graph's nodes and threads), and whether a graph compute's ops are timed.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use ggml_viz_config::OpTiming;

use super::{Claim, Fate, close_op, end, local, push};
use crate::base::clock;
use crate::base::entry::Entry;
use crate::base::names::Owner;
use crate::base::ring::RawEvent;
use crate::record::raw::{GraphEdge, GraphInfo, Wait};
use crate::record::recorder::{OpMode, Recorder};
use crate::record::session::current;

/// Interns the name of a backend or scheduler for the labels.
pub fn name_id(r: &Recorder, ptr: *mut c_void, owner: Owner, name: impl FnOnce() -> String) -> u16 {
    r.names.intern(ptr as usize, owner, name)
}

/// An open graph compute: what its end event needs.
pub struct GraphScope {
    recorder: &'static Recorder,
    entry: Entry,
    info: GraphInfo,
    /// What became of its begin event, where it is recorded (its end goes the same way).
    begin: Option<Fate>,
    /// Outermost, recorded and sampled for op timing (`op_sample`).
    ops_timed: bool,
}

fn graph_event(begin: bool, entry: Entry, info: &GraphInfo) -> RawEvent {
    GraphEdge {
        begin,
        entry: entry as u8,
        info: *info,
    }
    .event()
}

/// Before the real call: records the begin event if this graph compute is in the capture
/// window. `describe` runs only when tracing.
pub fn graph_begin(
    entry: Entry,
    describe: impl FnOnce(&'static Recorder) -> GraphInfo,
) -> Option<GraphScope> {
    // A begin and an end event.
    let r = current(2)?;
    local(r, |l| {
        let depth = l.depth.get();
        if depth == 0 {
            let in_window = !r.has_window()
                || r.graph_in_window(r.graphs_begun.fetch_add(1, Ordering::Relaxed));
            l.recording.set(in_window);
        }
        l.depth.set(depth + 1);
        let recording = l.recording.get() && l.open_op.get().is_none();
        let c = &r.config;
        let ops_timed = depth == 0
            && recording
            && r.op_mode() != OpMode::Off
            && r.op_timed_graphs
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(c.op_sample.max(1));
        if depth == 0 && r.op_mode() == OpMode::Threads {
            r.set_thread_ops(ops_timed);
        }
        let info = if recording {
            describe(r)
        } else {
            GraphInfo::EMPTY
        };
        let begin = recording.then(|| push(l, r, graph_event(true, entry, &info), Claim::Begin));
        Some(GraphScope {
            recorder: r,
            entry,
            info,
            begin,
            ops_timed,
        })
    })
}

impl GraphScope {
    pub fn recorder(&self) -> &'static Recorder {
        self.recorder
    }

    /// The name of the scheduler or backend computing (empty when unnamed).
    pub fn object_name(&self) -> &str {
        self.recorder
            .names
            .get(self.info.name_id)
            .map_or("", |(_, _, name)| name)
    }

    /// Whether this graph compute's ops are to be timed with the scheduler's eval callback: sched
    /// mode, and it is recorded, outermost (a nested scheduler call is timed by the outer one)
    /// and the one in `op_sample` that is sampled.
    ///
    /// In threads mode chosen by `auto`, a graph some of whose nodes the scheduler put on other
    /// backends than the CPU (`not_only_cpu`: a GPU computes them, which no CPU worker thread
    /// sees) is timed with the eval callback too, and the CPU worker threads record nothing
    /// meanwhile; unless a front end times the device's nodes on the device itself
    /// (`session::device_timing`).
    pub fn wants_sched_op_timing(&self, not_only_cpu: impl FnOnce() -> bool) -> bool {
        let r = self.recorder;
        match r.op_mode() {
            OpMode::Sched => self.ops_timed,
            OpMode::Threads
                if self.ops_timed
                    && r.config.op_timing == OpTiming::Auto
                    && !crate::record::session::device_timing()
                    && not_only_cpu() =>
            {
                r.set_thread_ops(false);
                true
            }
            _ => false,
        }
    }
}

/// After the real call: the end event. A node still open in a recorded graph compute (ggml
/// returned early: an abort callback, a failed compute, so the node's end never came) is ended
/// first, whatever the status.
pub fn graph_end(scope: GraphScope) {
    local(scope.recorder, |l| {
        if let Some(begin) = scope.begin {
            close_op(l, scope.recorder);
            let event = graph_event(false, scope.entry, &scope.info);
            end(l, scope.recorder, event, clock::now_ticks(), begin);
        }
        l.depth.set(l.depth.get().saturating_sub(1));
    });
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
    let r = current(1)?;
    let recording = local(r, |l| {
        if l.open_op.get().is_some() {
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
        start_ticks: clock::now_ticks(),
    })
}

pub fn wait_end(scope: WaitScope) {
    let waited = clock::now_ticks().saturating_sub(scope.start_ticks);
    let event = Wait {
        entry: scope.entry as u8,
        object: scope.object as u64,
        waited,
        name_id: scope.name_id,
    }
    .event();
    local(scope.recorder, |l| {
        push(l, scope.recorder, event, Claim::Plain)
    });
}
