//! The producer side: the events a wrapped call records around the real function, and each
//! thread's state and ring.
//!
//! Steady state (a thread that already has its ring, objects already named): read the clock,
//! take from the thread's share of the event cap, copy the event into the thread's ring. No
//! lock, no allocation, no system call. A thread's first event allocates and registers its ring,
//! once; first sights of names and tensors take their table's lock once each (see `super`).
//!
//! Here: each thread's state, what an event may take of its ring and the cap (and what becomes
//! of a pair whose begin was left out), op events. The builders of the other events: [`shares`]
//! (threads' shares of nodes and their barrier waits), [`graphs`] (graph computes and waits),
//! [`spans`] (application spans, RPC parts) and [`buffers`] (backend buffers).

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::raw::{Kind, OpEdge, OpInfo, OpShare, ThreadEdge};
use super::recorder::Recorder;
use super::session::{self, active};
use crate::base::names::Owner;
use crate::base::ring::{Pushed, RawEvent, Ring};
use crate::base::{clock, os};

pub(super) mod buffers;
pub(super) mod graphs;
mod shares;
pub(super) mod spans;

pub use shares::{ShareEdge, barrier_wait, release_share, thread_op, thread_ops};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use shares::{share_then_begin, share_then_wait, thread_op_at};

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
    /// The node our eval callback is driving, for its end event, and what became of its begin:
    /// while it is open, the graph computes and waits ggml makes for it are part of the op, not
    /// recorded on their own.
    open_op: Cell<Option<(OpInfo, Fate)>>,
    /// Threads mode: the begin event of this thread's op share, with its time, not yet in the
    /// ring (`holding`): while the share is open, its end joins it when nothing else is
    /// recorded before (see [`thread_op`]), or a barrier wait inside its op does; once it ended
    /// (at `share_ended`) as a barrier's wait began, the wait joins the two (see
    /// [`barrier_wait`]). Or the end event of a share whose begin went in, which ended as a
    /// wait began, for the wait to join. Anything else recorded first puts it in the ring
    /// before itself.
    held: Cell<RawEvent>,
    holding: Cell<Holding>,
    share_ended: Cell<u64>,
    /// Threads mode: what became of the begin of this thread's open op share where it went in
    /// on its own (not held, see [`thread_op`]).
    share_begin: Cell<Option<Fate>>,
    /// Ends owed to the begins stored and not yet ended: the ring slots and events of the cap
    /// kept for them (see [`Claim`]).
    promised: Cell<u32>,
    /// What became of the begins of the spans open on this thread (each brackets a call, so
    /// they nest), innermost last: the first `span_depth` (deeper ones are not paired).
    span_begins: Cell<[Fate; SPAN_DEPTH]>,
    span_depth: Cell<u32>,
}

/// What a thread holds of its op share (see `Local::held`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Holding {
    Nothing,
    /// The begin of its open share.
    Begin,
    /// The begin of a share that ended as a barrier's wait began, and its end.
    Share,
    /// The end of a share whose begin went in before it, which ended as a barrier's wait
    /// began.
    End,
}

/// Spans open on a thread whose begins are remembered for their ends.
const SPAN_DEPTH: usize = 8;

thread_local! {
    static LOCAL: Local = const {
        Local {
            ring: Cell::new(std::ptr::null()),
            generation: Cell::new(u64::MAX),
            tid: Cell::new(0),
            depth: Cell::new(0),
            recording: Cell::new(false),
            budget: Cell::new(0),
            open_op: Cell::new(None),
            held: Cell::new(RawEvent::ZERO),
            holding: Cell::new(Holding::Nothing),
            share_ended: Cell::new(0),
            share_begin: Cell::new(None),
            promised: Cell::new(0),
            span_begins: Cell::new([Fate::Stored; SPAN_DEPTH]),
            span_depth: Cell::new(0),
        }
    };
}

impl Local {
    /// Forgets what this thread held for an earlier recorder (its parent's, in a child after
    /// `fork`).
    fn reset(&self, generation: u64) {
        self.ring.set(std::ptr::null());
        self.generation.set(generation);
        self.tid.set(0);
        self.depth.set(0);
        self.recording.set(false);
        self.budget.set(0);
        self.open_op.set(None);
        self.holding.set(Holding::Nothing);
        self.share_begin.set(None);
        self.promised.set(0);
        self.span_depth.set(0);
    }

    /// A begin whose end will not come (another began in its place): its kept room is free.
    fn forget(&self, begin: Option<Fate>) {
        if begin == Some(Fate::Stored) {
            self.promised.set(self.promised.get().saturating_sub(1));
        }
    }
}

/// Runs `f` on this thread's state for recorder `r`, reset first if it was another recorder's.
fn local<T>(r: &Recorder, f: impl FnOnce(&Local) -> T) -> T {
    LOCAL.with(|l| f(l.for_recorder(r)))
}

impl Local {
    /// This state for recorder `r`: reset first if it was another recorder's.
    fn for_recorder(&self, r: &Recorder) -> &Local {
        if self.generation.get() != r.generation {
            self.reset(r.generation);
        }
        self
    }
}

/// This thread's recording state, kept by a caller that records on it often (a worker thread's
/// op shares and waits): what the other calls reach through the thread-local, without looking
/// the thread-local up each time (from a preloaded library, a call into the dynamic loader's
/// `__tls_get_addr`). Neither `Send` nor `Sync`: it stays on its thread.
#[derive(Clone, Copy)]
pub struct ThisThread(&'static Local);

impl ThisThread {
    pub fn get() -> ThisThread {
        // SAFETY: `LOCAL` has no destructor, so it lives as long as this thread, and a
        // `ThisThread` (which holds `Cell`s) cannot leave the thread.
        LOCAL.with(|l| ThisThread(unsafe { &*(l as *const Local) }))
    }
}

fn thread_id(l: &Local) -> u32 {
    match l.tid.get() {
        0 => {
            // Once per thread.
            let tid = os::thread_id();
            l.tid.set(tid);
            tid
        }
        tid => tid,
    }
}

/// Whether this thread has a ring: made and registered on its first event (with a THREAD_BEGIN
/// event when thread tracking is on). Not when its memory cannot be had: then tracing stops.
fn has_ring(l: &Local, r: &'static Recorder) -> bool {
    if l.ring.get().is_null() {
        let Some(ring) = Ring::try_new(r.config.buffer_size as usize) else {
            session::stop(format_args!(
                "cannot allocate a ring of {} events for a new thread; tracing stops, the program runs on \
                 (lower GGML_VIZ_BUFFER_SIZE)",
                r.config.buffer_size
            ));
            return false;
        };
        let ring: &'static Ring = Box::leak(Box::new(ring));
        r.add_ring(ring);
        l.ring.set(ring);
        // The flusher backs the ring's first pages now, not at its next interval.
        r.wake_flusher();
        if r.config.thread_tracking {
            // Registers this thread's exit hook (a thread-local with a destructor).
            THREAD_EXIT.with(|_| {});
            push(l, r, thread_event(r, l, true), Claim::Plain);
        }
    }
    true
}

/// This thread's first event (`begin`) or its exit, labelled with its name.
fn thread_event(r: &Recorder, l: &Local, begin: bool) -> RawEvent {
    let tid = thread_id(l);
    let name_id = r.names.intern(tid as usize, Owner::Thread, os::thread_name);
    ThreadEdge { begin, name_id }.event()
}

/// Its destructor runs when the thread exits: the THREAD_FREE event.
struct ThreadExit;

impl Drop for ThreadExit {
    fn drop(&mut self) {
        crate::base::contained(|| {
            let Some(r) = active() else { return };
            LOCAL.with(|l| {
                if l.generation.get() == r.generation && !l.ring.get().is_null() {
                    push(l, r, thread_event(r, l, false), Claim::Plain);
                }
            });
        });
    }
}

thread_local! {
    static THREAD_EXIT: ThreadExit = const { ThreadExit };
}

/// Records `event` now on this thread (after the held begin of its op share, if any). Inlined:
/// an event built by the caller and copied from its stack in wider moves than the caller's
/// stores stalls the copy until those stores are done (perf: a third of this function's samples).
#[inline(always)]
fn push(l: &Local, r: &'static Recorder, event: RawEvent, claim: Claim) -> Fate {
    push_at(l, r, event, clock::now_ticks(), claim)
}

/// [`push`] with the time the caller read.
#[inline(always)]
fn push_at(l: &Local, r: &'static Recorder, event: RawEvent, ticks: u64, claim: Claim) -> Fate {
    release(l, r);
    store(l, r, event, ticks, 1, claim)
}

/// Stores `event`, standing for `events` records, in this thread's ring with `time` as its
/// `ticks` as given: a time a front end read off another clock, which the writer converts by the
/// event's kind (`device`). A device's node leaves the room op events leave; anything else, the
/// room any event leaves.
pub(super) fn store_as_given(r: &'static Recorder, event: RawEvent, time: u64, events: u64) {
    let claim = if Kind::of(&event) == Some(Kind::DeviceOp) {
        Claim::Op
    } else {
        Claim::Plain
    };
    local(r, |l| {
        release(l, r);
        store(l, r, event, time, events, claim);
    });
}

/// Puts this thread's held event, if there is one, in the ring.
#[inline(always)]
fn release(l: &Local, r: &'static Recorder) {
    if l.holding.get() != Holding::Nothing {
        store_held(l, r);
    }
}

/// [`release`] of what is held, with the times it was taken: a begin on its own, whose end
/// follows it, or a whole share.
#[cold]
#[inline(never)]
fn store_held(l: &Local, r: &'static Recorder) {
    let held = l.held.get();
    match l.holding.replace(Holding::Nothing) {
        Holding::Begin => {
            let fate = store(l, r, held, held.ticks, 1, Claim::OpBegin);
            l.share_begin.set(Some(fate));
        }
        Holding::Share => {
            let ended = l.share_ended.get();
            store(l, r, held_share(&held, ended).event(), ended, 2, Claim::Op);
        }
        // Held only where its begin was stored.
        Holding::End => {
            store(l, r, held, held.ticks, 1, Claim::End);
        }
        Holding::Nothing => {}
    }
}

/// The whole share whose held begin is `begin`, ended at `ended` (no more than `u32::MAX`
/// ticks later: [`thread_op`] holds no longer share).
#[inline(always)]
fn held_share(begin: &RawEvent, ended: u64) -> OpShare {
    OpShare {
        op: OpEdge::of(begin).op,
        took: ended.wrapping_sub(begin.ticks) as u32,
    }
}

/// What an event may take of its thread's ring and share of the event cap. A pair's begin (a
/// graph compute's, a span's, an op's) goes in only if its end will fit after it: it keeps a
/// slot and an event of the cap for its end, which the end then takes (and where the begin was
/// left out, the end is left out with it, see [`leave_out`]); every other event leaves the room
/// kept for the ends of what is open. Op events also leave [`structure_room`] for the graph
/// computes and spans to come, so that a ring full of op events still takes those: a graph
/// compute is in the trace whole or not at all, and what a full ring drops is op events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Anything but an op event or an edge of a pair.
    Plain,
    /// A whole op share, or a barrier wait (threads mode).
    Op,
    /// An op's begin whose end follows on its own: a sched-mode node's, or a share's that
    /// could not be held.
    OpBegin,
    /// A graph compute's or a span's begin.
    Begin,
    /// The end of a begin that was stored.
    End,
}

/// What became of an event: stored, or left out and counted as dropped with a full ring, as
/// over the event cap, or not at all (tracing stopped: no ring could be had).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Stored,
    Dropped,
    OverCap,
    Lost,
}

/// Most ring slots that op events leave free for graph computes and spans (see [`Claim`]): a
/// token's nested computes (scheduler, backend, CPU graph: three begins and ends) and its
/// decode span twice over.
const STRUCTURE_ROOM: usize = 16;

/// The ring slots op events leave free for graph computes and spans in `ring`:
/// [`STRUCTURE_ROOM`], or a quarter of a smaller ring.
fn structure_room(ring: &Ring) -> usize {
    (ring.capacity() / 4).min(STRUCTURE_ROOM)
}

/// Stores `event`, at `ticks`, in this thread's ring, standing for `events` events (two for a
/// whole op share) of its share of the cap, if it leaves the room its `claim` says.
#[inline(always)]
fn store(
    l: &Local,
    r: &'static Recorder,
    mut event: RawEvent,
    ticks: u64,
    events: u64,
    claim: Claim,
) -> Fate {
    if claim == Claim::End {
        l.promised.set(l.promised.get().saturating_sub(1));
    }
    let begins = matches!(claim, Claim::OpBegin | Claim::Begin);
    // Kept for the ends of what is open, and of this begin.
    let kept = u64::from(l.promised.get()) + u64::from(begins);
    if !ready(l, events + kept)
        && let Err(fate) = make_ready(l, r, events, kept)
    {
        return fate;
    }
    l.budget.set(l.budget.get() - events);
    event.thread_id = l.tid.get();
    event.ticks = ticks;
    // SAFETY: `make_ready` or an earlier event set a non-null ring pointer, a leaked, never
    // freed Ring; this thread is its only producer.
    let ring = unsafe { &*l.ring.get() };
    let mut keep_free = kept as usize;
    if matches!(claim, Claim::Op | Claim::OpBegin) {
        keep_free += structure_room(ring);
    }
    // SAFETY: this thread is the ring's only producer.
    match unsafe { ring.push(event, events, keep_free) } {
        Pushed::Dropped => return Fate::Dropped,
        Pushed::HalfFull => r.wake_flusher(),
        Pushed::Stored => {}
    }
    if begins {
        l.promised.set(l.promised.get() + 1);
    }
    Fate::Stored
}

/// Counts the end of a begin that was left out (`begin`) as that begin was counted, and stores
/// nothing.
fn leave_out(l: &Local, r: &Recorder, begin: Fate, events: u64) {
    match begin {
        // SAFETY: a begin dropped with a full ring had the thread's ring, a leaked, never
        // freed Ring; this thread is its only producer.
        Fate::Dropped => unsafe { (*l.ring.get()).count_dropped(events) },
        Fate::OverCap => {
            r.over_max_events.fetch_add(events, Ordering::Relaxed);
        }
        Fate::Stored | Fate::Lost => {}
    }
}

/// Whether this thread has its ring, its id and `events` of the event cap (else [`make_ready`]).
#[inline(always)]
fn ready(l: &Local, events: u64) -> bool {
    !l.ring.get().is_null() && l.budget.get() >= events && l.tid.get() != 0
}

/// Out of [`store`]'s way: this thread's ring, `events` of the event cap beyond the `kept` ones
/// and its id, where it has none yet; else what becomes of the events (not stored when no ring
/// can be had, or the cap is reached: then counted).
#[cold]
#[inline(never)]
fn make_ready(l: &Local, r: &'static Recorder, events: u64, kept: u64) -> Result<(), Fate> {
    if !has_ring(l, r) {
        return Err(Fate::Lost);
    }
    while l.budget.get() < events + kept {
        let budget = r.reserve();
        if budget == 0 {
            r.over_max_events.fetch_add(events, Ordering::Relaxed);
            return Err(Fate::OverCap);
        }
        l.budget.set(l.budget.get() + budget);
    }
    thread_id(l);
    Ok(())
}

/// A node's op begin (`OP_COMPUTE_BEGIN`) or end, in a slot of its own.
#[inline(always)]
fn op_event(begin: bool, op: &OpInfo) -> RawEvent {
    OpEdge { begin, op: *op }.event()
}

/// Our eval callback is about to let ggml compute one node.
pub fn op_begin(r: &'static Recorder, op: &OpInfo) {
    local(r, |l| {
        let fate = push(l, r, op_event(true, op), Claim::OpBegin);
        l.forget(l.open_op.replace(Some((*op, fate))).map(|(_, begin)| begin));
    });
}

/// The node is computed and synchronized.
pub fn op_end(r: &'static Recorder) {
    local(r, |l| close_op(l, r));
}

/// Ends the open node, if there is one.
fn close_op(l: &Local, r: &'static Recorder) {
    if let Some((op, begin)) = l.open_op.take() {
        let event = op_event(false, &op);
        end(l, r, event, clock::now_ticks(), begin);
    }
}

/// Records the end `event`, at `ticks`, of a begin whose fate was `begin`: stored in the room
/// the begin kept, or left out with it.
fn end(l: &Local, r: &'static Recorder, event: RawEvent, ticks: u64, begin: Fate) {
    if begin == Fate::Stored {
        push_at(l, r, event, ticks, Claim::End);
    } else {
        leave_out(l, r, begin, 1);
    }
}

/// Records a span's begin or end (`event`): the begin as a pair's, the end as its begin went
/// (the innermost span open on this thread's; an end whose begin came before tracing did, or
/// deeper than [`SPAN_DEPTH`], as any event).
fn span_edge(l: &Local, r: &'static Recorder, event: RawEvent, begin: bool) {
    let depth = l.span_depth.get() as usize;
    let mut begins = l.span_begins.get();
    if begin {
        l.span_depth.set(depth as u32 + 1);
        if depth < SPAN_DEPTH {
            begins[depth] = push(l, r, event, Claim::Begin);
            l.span_begins.set(begins);
        } else {
            push(l, r, event, Claim::Plain);
        }
    } else if depth == 0 {
        push(l, r, event, Claim::Plain);
    } else {
        l.span_depth.set(depth as u32 - 1);
        match begins.get(depth - 1) {
            Some(&fate) => end(l, r, event, clock::now_ticks(), fate),
            None => {
                push(l, r, event, Claim::Plain);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::entry::Entry;
    use crate::record::raw::{
        GraphEdge, GraphInfo, SeqRemoved, ShareAndWait, SpanEdge, WorkerWait,
    };
    use crate::record::recorder::{BUDGET_CHUNK, OpMode};
    use crate::record::writer::TraceWriter;
    use ggml_viz_config::Config;
    use ggml_viz_format::Layout;
    use ggml_viz_format::ext::Metadata;
    use std::ffi::c_void;

    /// A recorder with rings of `buffer_size` events on a scratch file, whose rings nothing
    /// drains (it has no flusher).
    fn recorder(buffer_size: u64) -> &'static Recorder {
        capped_recorder(buffer_size, Config::default().max_events)
    }

    /// [`recorder`] with an event cap of `max_events`.
    fn capped_recorder(buffer_size: u64, max_events: u64) -> &'static Recorder {
        let config = Config {
            buffer_size,
            max_events,
            ..Config::default()
        };
        // One file each: the tests make recorders at once.
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ggml-viz-events-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::File::create(&path).unwrap();
        let writer = TraceWriter::create(
            file,
            path.clone(),
            Layout::Packed,
            &config,
            &Metadata::default(),
        )
        .unwrap_or_else(|(path, e)| panic!("{}: {e}", path.display()));
        std::fs::remove_file(&path).unwrap();
        Box::leak(Box::new(Recorder::new(config, OpMode::Threads, writer, -1)))
    }

    /// The kind of each event in this thread's ring, taken out, and the events dropped.
    fn drained(l: &Local) -> (Vec<Kind>, u64) {
        let (events, dropped) = drained_events(l);
        (events.iter().filter_map(Kind::of).collect(), dropped)
    }

    /// The events in this thread's ring, taken out, and the events dropped.
    fn drained_events(l: &Local) -> (Vec<RawEvent>, u64) {
        // SAFETY: this thread's ring, leaked; the test has no flusher, so this is its only
        // consumer.
        let ring = unsafe { &*l.ring.get() };
        let mut events = Vec::new();
        // SAFETY: the only consumer, as above.
        unsafe { ring.drain(|e| events.push(*e)) };
        (events, ring.dropped())
    }

    /// Runs `body` on a thread of its own, which records in `r`; checks that it left nothing
    /// held and no end owed, and returns the kinds in its ring, the events dropped, and what
    /// `body` returned.
    fn on_a_thread<T: Send + 'static>(
        r: &'static Recorder,
        body: impl FnOnce(ThisThread, &Local) -> T + Send + 'static,
    ) -> (Vec<Kind>, u64, T) {
        std::thread::spawn(move || {
            let t = ThisThread::get();
            let l = t.0.for_recorder(r);
            let out = body(t, l);
            assert_eq!(l.holding.get(), Holding::Nothing);
            assert_eq!(l.promised.get(), 0);
            let (events, dropped) = drained(l);
            (events, dropped, out)
        })
        .join()
        .unwrap()
    }

    /// What `body` leaves in its thread's ring (and its kinds), recording at once (`true`) and
    /// in turn (`false`), with what it returned; checks that neither run left anything held,
    /// owed, in the ring after it or dropped.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn recorded_both_ways(
        r: &'static Recorder,
        body: impl Fn(bool, ThisThread, &Local) -> u64 + Copy + Send + 'static,
    ) -> Vec<(bool, Vec<RawEvent>, Vec<Kind>, u64)> {
        [true, false]
            .into_iter()
            .map(|at_once| {
                let (left, _, (returned, (events, dropped))) =
                    on_a_thread(r, move |t, l| (body(at_once, t, l), drained_events(l)));
                assert_eq!((left, dropped), (vec![], 0), "at once: {at_once}");
                let kinds = events.iter().map(|e| Kind::of(e).unwrap()).collect();
                (at_once, events, kinds, returned)
            })
            .collect()
    }

    const NODE: OpInfo = OpInfo {
        tensor: 0x100 as *mut c_void,
        op_type: 1,
        op_size: 4,
        backend: std::ptr::null_mut(),
        tensor_id: 0,
    };

    fn wait() -> RawEvent {
        WorkerWait {
            threadpool: 0,
            ith: 0,
            nth: 2,
            waited: 1,
        }
        .event()
    }

    fn graph(begin: bool) -> RawEvent {
        GraphEdge {
            begin,
            entry: Entry::GraphCompute as u8,
            info: GraphInfo::EMPTY,
        }
        .event()
    }

    #[test]
    fn a_ring_full_of_op_events_takes_graph_computes_whole_or_not_at_all() {
        let r = recorder(64);
        let share = OpShare { op: NODE, took: 4 }.event();
        let (events, dropped) = std::thread::spawn(move || {
            local(r, |l| {
                // Op shares fill the ring but for the room kept for graph computes.
                let shares = (0..64)
                    .filter(|_| store(l, r, share, 1, 2, Claim::Op) == Fate::Stored)
                    .count();
                assert_eq!(shares, 64 - STRUCTURE_ROOM);
                // Anything else may take it too (here one slot: an odd number is left).
                let wait = push(l, r, wait(), Claim::Plain);
                assert_eq!(wait, Fate::Stored);
                // Graph computes take the rest, each begin only with its end's slot kept, while
                // the op events inside them are left out: a share, and a sched-mode op whose end
                // is left out with its begin.
                let mut whole = 0;
                loop {
                    let begin = push(l, r, graph(true), Claim::Begin);
                    assert_eq!(store(l, r, share, 1, 2, Claim::Op), Fate::Dropped);
                    let op = push(l, r, op_event(true, &NODE), Claim::OpBegin);
                    assert_eq!(op, Fate::Dropped);
                    end(l, r, op_event(false, &NODE), 1, op);
                    end(l, r, graph(false), 1, begin);
                    if begin != Fate::Stored {
                        break;
                    }
                    whole += 1;
                }
                // The last slot is refused to a begin: its end would not fit.
                assert_eq!(whole, (STRUCTURE_ROOM - 1) / 2);
                assert_eq!(l.promised.get(), 0);
                drained(l)
            })
        })
        .join()
        .unwrap();
        let mut expected = vec![Kind::OpShare; 64 - STRUCTURE_ROOM];
        expected.push(Kind::WorkerWait);
        for _ in 0..(STRUCTURE_ROOM - 1) / 2 {
            expected.extend([Kind::GraphBegin, Kind::GraphEnd]);
        }
        assert_eq!(events, expected);
        // Shares of 2 events: the 16 refused first, and one in each compute tried (7 whole and
        // the one left out); the ops' begins and ends (2 per compute tried); the compute left out.
        let tried = (STRUCTURE_ROOM as u64 - 1) / 2 + 1;
        assert_eq!(
            dropped,
            2 * STRUCTURE_ROOM as u64 + 2 * tried + 2 * tried + 2
        );
    }

    #[test]
    fn a_share_whose_begin_went_in_on_its_own_ends_as_its_begin_went() {
        let r = recorder(8);
        let (events, dropped) = std::thread::spawn(move || {
            let t = ThisThread::get();
            let l = t.0.for_recorder(r);
            for _ in 0..3 {
                push(l, r, wait(), Claim::Plain);
            }
            // Two shares, each with a barrier wait inside, which puts its held begin in the ring
            // first (the wait began before the begin was held, which no slot of the two can
            // hold: each goes in on its own): the first share's begin goes in (3 of 8 taken: its end's slot and the
            // graph computes' 2 are free after it), the second's does not (6 taken), and its
            // end is left out with it.
            for _ in 0..2 {
                thread_op(t, r, ShareEdge::Begin, &NODE);
                barrier_wait(t, r, std::ptr::null_mut(), 0, 2, 0);
                thread_op(t, r, ShareEdge::End, &NODE);
            }
            assert_eq!(l.promised.get(), 0);
            drained(l)
        })
        .join()
        .unwrap();
        let (wait, begin, end) = (Kind::WorkerWait, Kind::OpBegin, Kind::OpEnd);
        assert_eq!(events, [wait, wait, wait, begin, wait, end]);
        // The second share's begin, its wait and its end.
        assert_eq!(dropped, 3);
    }

    /// A worker's share that ends as a barrier's wait begins goes into the wait's slot with it,
    /// as three events of the cap; anything the thread records in between puts the share in on
    /// its own first, as does a wait that does not fit the slot (65,536 threads), or one that is
    /// not recorded after all.
    #[test]
    fn a_share_and_the_wait_after_it_take_one_slot() {
        let r = recorder(64);
        let (events, dropped, budget_used) = on_a_thread(r, move |t, l| {
            // The thread's ring is made by its first event, which goes in as it is taken.
            push(l, r, wait(), Claim::Plain);
            let share_at_wait = |nth, between: bool| {
                thread_op(t, r, ShareEdge::Begin, &NODE);
                let ended = thread_op(t, r, ShareEdge::EndAtWait, &NODE);
                if between {
                    push(l, r, graph(true), Claim::Plain);
                }
                barrier_wait(t, r, std::ptr::null_mut(), 1, nth, ended);
            };
            let budget = l.budget.get();
            share_at_wait(2, false);
            let per_pair = budget - l.budget.get();
            share_at_wait(2, true);
            share_at_wait(65_536, false);
            thread_op(t, r, ShareEdge::Begin, &NODE);
            thread_op(t, r, ShareEdge::EndAtWait, &NODE);
            release_share(t, r);
            per_pair
        });
        let (pair, share, wait) = (Kind::ShareAndWait, Kind::OpShare, Kind::WorkerWait);
        assert_eq!(
            events,
            [
                wait,
                pair,
                share,
                Kind::GraphBegin,
                wait,
                share,
                wait,
                share
            ]
        );
        assert_eq!((dropped, budget_used), (0, 3));
    }

    /// A share with waits inside its op (`mul_mat`'s barrier) takes two slots: its begin with
    /// the first wait inside, its end with the wait after it; further waits inside take their
    /// own. Its begin and end count as a pair's: where the begin is left out, the end is too.
    #[test]
    fn a_share_with_a_wait_inside_takes_two_slots() {
        let r = recorder(64);
        let (events, dropped, budget_used) = on_a_thread(r, move |t, l| {
            push(l, r, wait(), Claim::Plain);
            let share = |inside: u64| {
                let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
                for i in 0..inside {
                    barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 10 * i + 5);
                }
                let ended = thread_op(t, r, ShareEdge::EndAtWait, &NODE);
                barrier_wait(t, r, std::ptr::null_mut(), 1, 2, ended);
            };
            let budget = l.budget.get();
            share(1);
            let used = budget - l.budget.get();
            share(2);
            // An end held for a wait that does not fit its slot (65,536 threads), and for one
            // not recorded after all: it goes in on its own, its begin's end.
            let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 5);
            let ended = thread_op(t, r, ShareEdge::EndAtWait, &NODE);
            barrier_wait(t, r, std::ptr::null_mut(), 1, 65_536, ended);
            let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 5);
            thread_op(t, r, ShareEdge::EndAtWait, &NODE);
            release_share(t, r);
            used
        });
        let (begin, end, alone) = (Kind::BeginAndWait, Kind::EndAndWait, Kind::WorkerWait);
        let on_its_own = Kind::OpEnd;
        assert_eq!(
            events,
            [
                alone, begin, end, begin, alone, end, begin, on_its_own, alone, begin, on_its_own
            ]
        );
        assert_eq!((dropped, budget_used), (0, 4));
        // In a ring of 8 with 5 taken, a begin and its wait keep its end's slot and the graph
        // computes' 2: the first share goes in whole, the second's begin and wait are left out,
        // its end with them, and its last wait goes in on its own.
        let r = recorder(8);
        let (events, dropped, ()) = on_a_thread(r, move |t, l| {
            for _ in 0..3 {
                push(l, r, wait(), Claim::Plain);
            }
            for _ in 0..2 {
                let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
                barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 5);
                let ended = thread_op(t, r, ShareEdge::EndAtWait, &NODE);
                barrier_wait(t, r, std::ptr::null_mut(), 1, 2, ended);
            }
        });
        assert_eq!(events, [alone, alone, alone, begin, end, alone]);
        // The second share's begin and first wait, and its end.
        assert_eq!(dropped, 3);
    }

    /// A share and the wait after it recorded in one call ([`share_then_wait`]: `common`'s path
    /// after a barrier of several threads) go in as [`thread_op_at`] at `EndAtWait` and then
    /// [`barrier_wait`] put them: in one slot where the share's begin is held, the end and the
    /// wait in one where the begin went in with a wait inside the op, each on its own where the
    /// wait does not fit a slot (65,536 threads); and the share ends where the wait began.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn a_share_and_its_wait_recorded_at_once_go_in_as_recorded_in_turn() {
        let r = recorder(64);
        let runs = recorded_both_ways(r, move |at_once, t, l| {
            let end = |ended: u64, nth: u32| {
                if at_once {
                    share_then_wait(t, r, &NODE, ended, 1, nth);
                } else {
                    thread_op_at(t, r, ShareEdge::EndAtWait, &NODE, ended);
                    barrier_wait(t, r, std::ptr::null_mut(), 1, nth, ended);
                }
            };
            // The thread's ring is made with its first event: op events after it are held.
            push(l, r, wait(), Claim::Plain);
            let first_begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            end(first_begun + 7, 2);
            let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 3);
            end(begun + 9, 2);
            let begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            end(begun + 11, 65_536);
            first_begun
        });
        for (at_once, events, kinds, begun) in runs {
            assert_eq!(
                kinds,
                [
                    Kind::WorkerWait,
                    Kind::ShareAndWait,
                    Kind::BeginAndWait,
                    Kind::EndAndWait,
                    Kind::OpShare,
                    Kind::WorkerWait
                ],
                "at once: {at_once}"
            );
            let pair = ShareAndWait::of(&events[1]);
            assert_eq!(pair.share.took, 7);
            assert_eq!(events[1].ticks - u64::from(pair.waited), begun + 7);
            assert_eq!(OpShare::of(&events[4]).took, 11);
        }
    }

    /// A share ended and the next one begun in one call ([`share_then_begin`]: the next begin
    /// after `common` ended a share at a barrier of one thread) go in as [`thread_op_at`] at
    /// `End` and then [`thread_op`] at `Begin` put them: the share in one slot where its begin is
    /// held, at the ticks it ended at; its end on its own where its begin went in (with a wait
    /// inside the op), and its begin and end each on its own where it is too long for a slot;
    /// the next share's begin held each time.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn a_share_ended_as_the_next_begins_goes_in_as_recorded_in_turn() {
        const NEXT: OpInfo = OpInfo {
            tensor: 0x200 as *mut c_void,
            ..NODE
        };
        let r = recorder(64);
        let runs = recorded_both_ways(r, move |at_once, t, l| {
            let end_then_begin = |ended: &OpInfo, at: u64, next: &OpInfo| {
                if at_once {
                    share_then_begin(t, r, ended, at, next)
                } else {
                    thread_op_at(t, r, ShareEdge::End, ended, at);
                    thread_op(t, r, ShareEdge::Begin, next)
                }
            };
            // The thread's ring is made with its first event: op events after it are held.
            push(l, r, wait(), Claim::Plain);
            let first_begun = thread_op(t, r, ShareEdge::Begin, &NODE);
            let begun = end_then_begin(&NODE, first_begun + 7, &NEXT);
            barrier_wait(t, r, std::ptr::null_mut(), 1, 2, begun + 3);
            let begun = end_then_begin(&NEXT, begun + 9, &NODE);
            let begun = end_then_begin(&NODE, begun + (1 << 33), &NEXT);
            thread_op_at(t, r, ShareEdge::End, &NEXT, begun + 11);
            first_begun
        });
        for (at_once, events, kinds, begun) in runs {
            assert_eq!(
                kinds,
                [
                    Kind::WorkerWait,
                    Kind::OpShare,
                    Kind::BeginAndWait,
                    Kind::OpEnd,
                    Kind::OpBegin,
                    Kind::OpEnd,
                    Kind::OpShare
                ],
                "at once: {at_once}"
            );
            let (first, last) = (OpShare::of(&events[1]), OpShare::of(&events[6]));
            assert_eq!((first.op.tensor, first.took), (NODE.tensor, 7));
            assert_eq!(events[1].ticks, begun + 7);
            assert_eq!(OpEdge::of(&events[3]).op.tensor, NEXT.tensor);
            assert_eq!((last.op.tensor, last.took), (NEXT.tensor, 11));
        }
    }

    /// A share begun as the thread's share of the event cap runs out is held as any other (the
    /// share is topped up first), so it and its wait still take one slot; where the cap is used
    /// up, its begin, end and wait are each counted over it, once.
    #[test]
    fn a_share_begun_as_the_threads_budget_runs_out_still_takes_one_slot() {
        // Three of the threads' chunks of the cap.
        let r = capped_recorder(64, 3 * BUDGET_CHUNK);
        let (events, dropped, ()) = on_a_thread(r, move |t, l| {
            push(l, r, wait(), Claim::Plain);
            let share_at_wait = || {
                thread_op(t, r, ShareEdge::Begin, &NODE);
                let ended = thread_op(t, r, ShareEdge::EndAtWait, &NODE);
                barrier_wait(t, r, std::ptr::null_mut(), 1, 2, ended);
            };
            // One event of the thread's share left, and none, as the cap has another chunk
            // each time; then none, with the cap used up.
            for left in [1, 0, 0] {
                l.budget.set(left);
                share_at_wait();
            }
        });
        let (pair, wait) = (Kind::ShareAndWait, Kind::WorkerWait);
        assert_eq!(events, [wait, pair, pair]);
        let over_cap = r.over_max_events.load(Ordering::Relaxed);
        assert_eq!((dropped, over_cap), (0, 3));
    }

    #[test]
    fn a_span_goes_in_whole_or_not_at_all() {
        let r = recorder(8);
        let decode_edge = |begin| SpanEdge::new(begin, Entry::LlamaDecode, 1, &[], 0).event();
        let (events, dropped) = std::thread::spawn(move || {
            let l = ThisThread::get().0.for_recorder(r);
            // A span with another inside it, whole; then 3 other events, which leave one slot:
            // not enough for a span's begin and end, and neither goes in.
            span_edge(l, r, decode_edge(true), true);
            span_edge(l, r, decode_edge(true), true);
            span_edge(l, r, decode_edge(false), false);
            span_edge(l, r, decode_edge(false), false);
            for _ in 0..3 {
                push(l, r, wait(), Claim::Plain);
            }
            span_edge(l, r, decode_edge(true), true);
            span_edge(l, r, decode_edge(false), false);
            assert_eq!((l.promised.get(), l.span_depth.get()), (0, 0));
            // An end whose begin came before this thread recorded goes in as any event, in the
            // last slot.
            let seq_rm = SeqRemoved {
                begin: false,
                seq: 0,
                p0: 0,
                p1: -1,
            };
            span_edge(l, r, seq_rm.event(), false);
            drained(l)
        })
        .join()
        .unwrap();
        let (begin, end, wait) = (Kind::SpanBegin, Kind::SpanEnd, Kind::WorkerWait);
        assert_eq!(
            events,
            [begin, begin, end, end, wait, wait, wait, Kind::SeqRmEnd]
        );
        assert_eq!(dropped, 2);
    }
}
