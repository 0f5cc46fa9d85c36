//! Threads mode: a worker thread's shares of nodes and its barrier waits, which go into its
//! ring together where they fit one slot (a share and the wait after it; a share's begin and the
//! first wait inside its op; a share's end and the wait after it), else each on its own.

use std::ffi::c_void;

use super::{
    Claim, Fate, Holding, Local, ThisThread, end, held_share, op_event, push_at, ready, release,
    store,
};
use crate::base::clock;
use crate::base::ring::RawEvent;
use crate::record::raw::{OpEdge, OpInfo, OpShare, Part, ShareAndWait, WorkerWait};
use crate::record::recorder::Recorder;
use crate::record::session::active;

/// Threads mode: the recorder, if the nodes being computed now are to be recorded.
pub fn thread_ops() -> Option<&'static Recorder> {
    active().filter(|r| r.thread_ops())
}

/// How a thread's share of a node begins or ends (see [`thread_op`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ShareEdge {
    Begin,
    End,
    /// The share ends as a barrier's wait begins, which [`barrier_wait`] records.
    EndAtWait,
}

/// Threads mode: this thread begins or ends its share of a node (a span of its own, whatever
/// other threads do).
///
/// A share whose thread records nothing else before it ends takes one ring slot: an
/// `OpShare` with the ticks since its begin, which the writer writes as both records. The
/// begin is held until then: a barrier wait within the op joins it in its slot (see
/// [`barrier_wait`]); anything else recorded first, or a share too long for the slot, stores it
/// on its own. A share, or the end of one whose begin went in, that ends at a wait is held in
/// its turn, for the wait to join.
///
/// Returns the time (in ticks) the event is stamped with.
#[inline]
pub fn thread_op(t: ThisThread, r: &'static Recorder, edge: ShareEdge, op: &OpInfo) -> u64 {
    let ticks = clock::now_ticks();
    thread_op_at(t, r, edge, op, ticks);
    ticks
}

/// [`thread_op`] at `ticks`, read by the caller.
#[inline(always)]
pub fn thread_op_at(t: ThisThread, r: &'static Recorder, edge: ShareEdge, op: &OpInfo, ticks: u64) {
    let l = t.0.for_recorder(r);
    if edge == ShareEdge::Begin {
        begin_at(l, r, op, ticks);
    } else {
        end_at(l, r, edge, op, ticks);
    }
}

/// Threads mode: this thread's share of the node of `ended` ended at `ended_at` ticks, and its
/// share of the node of `op` begins now: what [`thread_op_at`] at [`ShareEdge::End`] and then
/// [`thread_op`] at [`ShareEdge::Begin`] do, in one visit (a barrier of one thread ends a share
/// with no call of ours; the next share's begin records it). Returns the begin's ticks.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[inline(always)]
pub fn share_then_begin(
    t: ThisThread,
    r: &'static Recorder,
    ended: &OpInfo,
    ended_at: u64,
    op: &OpInfo,
) -> u64 {
    let ticks = clock::now_ticks();
    let l = t.0.for_recorder(r);
    end_at(l, r, ShareEdge::End, ended, ended_at);
    begin_at(l, r, op, ticks);
    ticks
}

/// [`thread_op_at`]'s begin: held where the ring is ready, else stored on its own.
#[inline(always)]
fn begin_at(l: &Local, r: &'static Recorder, op: &OpInfo, ticks: u64) {
    release(l, r);
    if l.share_begin.get().is_some() {
        l.forget(l.share_begin.take());
    }
    let event = op_event(true, op);
    // Held only when the ring is ready: a thread's first events (its ring, its THREAD_BEGIN)
    // go in at the time they are taken. Where only the thread's share of the cap ran out, it
    // is topped up first, so that the share still takes one slot.
    let needed = 2 + u64::from(l.promised.get());
    if !ready(l, needed) {
        top_up(l, r, needed);
    }
    if ready(l, needed) {
        l.held.set(RawEvent { ticks, ..event });
        l.holding.set(Holding::Begin);
    } else {
        let fate = store(l, r, event, ticks, 1, Claim::OpBegin);
        l.share_begin.set(Some(fate));
    }
}

/// [`thread_op_at`]'s end (`edge` [`ShareEdge::End`] or [`ShareEdge::EndAtWait`]): with its
/// held begin in one slot where it fits, held in its turn where it ends at a wait.
#[inline(always)]
fn end_at(l: &Local, r: &'static Recorder, edge: ShareEdge, op: &OpInfo, ticks: u64) {
    if l.holding.get() == Holding::Begin {
        let held = l.held.get();
        let took = ticks.wrapping_sub(held.ticks);
        if OpEdge::of(&held).op.tensor == op.tensor
            && let Ok(took) = u32::try_from(took)
        {
            if edge == ShareEdge::EndAtWait {
                l.holding.set(Holding::Share);
                l.share_ended.set(ticks);
            } else {
                l.holding.set(Holding::Nothing);
                store(l, r, OpShare { op: *op, took }.event(), ticks, 2, Claim::Op);
            }
            return;
        }
    }
    let event = op_event(false, op);
    release(l, r);
    match l.share_begin.take() {
        // Held for the wait to join (see `barrier_wait`).
        Some(Fate::Stored) if edge == ShareEdge::EndAtWait => {
            l.held.set(RawEvent { ticks, ..event });
            l.holding.set(Holding::End);
            l.share_ended.set(ticks);
        }
        Some(begin) => end(l, r, event, ticks, begin),
        // The share began before this thread recorded (or for another recorder).
        None => {
            store(l, r, event, ticks, 1, Claim::Op);
        }
    }
}

/// Threads mode: this thread's share of the node of `op` ended at `start` ticks, where its wait
/// at a barrier began, which ended now (as thread `ith` of `nth`): what [`thread_op_at`] at
/// [`ShareEdge::EndAtWait`] and then [`barrier_wait`] do, in one visit where the two fit one
/// slot: the share whose begin is held, or the end of one whose begin went in.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn share_then_wait(
    t: ThisThread,
    r: &'static Recorder,
    op: &OpInfo,
    start: u64,
    ith: u32,
    nth: u32,
) {
    let now = clock::now_ticks();
    let l = t.0.for_recorder(r);
    let waited = now.saturating_sub(start);
    match l.holding.get() {
        Holding::Begin => {
            let held = l.held.get();
            let begun = OpEdge::of(&held).op;
            if begun.tensor == op.tensor
                && let Ok(took) = u32::try_from(start.wrapping_sub(held.ticks))
                && let Some((slot, events, claim)) =
                    with_wait(Part::Whole, OpShare { op: begun, took }, ith, nth, waited)
            {
                l.holding.set(Holding::Nothing);
                store(l, r, slot, now, events, claim);
                return;
            }
        }
        // Its begin went in (with a wait inside the op): its end joins the wait.
        Holding::Nothing if l.share_begin.get() == Some(Fate::Stored) => {
            if let Some((slot, events, claim)) =
                with_wait(Part::End, OpShare { op: *op, took: 0 }, ith, nth, waited)
            {
                l.share_begin.set(None);
                store(l, r, slot, now, events, claim);
                return;
            }
        }
        _ => {}
    }
    end_at(l, r, ShareEdge::EndAtWait, op, start);
    barrier_wait(t, r, std::ptr::null_mut(), ith, nth, start);
}

/// Threads mode: this thread waited at a `ggml_barrier` of `threadpool` from `start_ticks` to
/// now, as thread `ith` of `nth`. What a worker (`threadpool` null) holds of its share goes into
/// the wait's slot with it, where the two fit one: the share, or its end, held since it ended as
/// the wait began; or the begin of the share the wait is inside (`mul_mat`'s barrier).
pub fn barrier_wait(
    t: ThisThread,
    r: &'static Recorder,
    threadpool: *mut c_void,
    ith: u32,
    nth: u32,
    start_ticks: u64,
) {
    let now = clock::now_ticks();
    let l = t.0.for_recorder(r);
    if l.holding.get() != Holding::Nothing
        && threadpool.is_null()
        && joined(l, r, ith, nth, now, start_ticks)
    {
        return;
    }
    let event = WorkerWait {
        threadpool: threadpool as u64,
        ith,
        nth,
        waited: now.saturating_sub(start_ticks),
    }
    .event();
    // Stamped with the clock read that ended the wait (one read, not two).
    push_at(l, r, event, now, Claim::Op);
}

/// [`barrier_wait`]'s wait, which began at `start` and ended `now`, stored in one slot with what
/// this thread holds of its share, where they fit one: whether it was.
#[inline(always)]
fn joined(l: &Local, r: &'static Recorder, ith: u32, nth: u32, now: u64, start: u64) -> bool {
    let held = l.held.get();
    let (part, took) = match l.holding.get() {
        Holding::Share if l.share_ended.get() == start => {
            (Part::Whole, held_share(&held, start).took)
        }
        Holding::End if l.share_ended.get() == start => (Part::End, 0),
        Holding::Begin => match u32::try_from(start.wrapping_sub(held.ticks)) {
            Ok(took) => (Part::Begin, took),
            Err(_) => return false,
        },
        _ => return false,
    };
    let share = OpShare {
        op: OpEdge::of(&held).op,
        took,
    };
    let Some((slot, events, claim)) = with_wait(part, share, ith, nth, now.saturating_sub(start))
    else {
        return false;
    };
    l.holding.set(Holding::Nothing);
    let fate = store(l, r, slot, now, events, claim);
    if part == Part::Begin {
        l.share_begin.set(Some(fate));
    }
    true
}

/// The one slot of `part` of `share` and a wait of `waited` ticks (thread `ith` of `nth`), where
/// the two fit one, with the events of the cap it stands for and what it leaves (see [`Claim`]):
/// a whole share and its wait are three events, a begin or an end and its wait two, and a begin
/// keeps room for its end.
#[inline(always)]
fn with_wait(
    part: Part,
    share: OpShare,
    ith: u32,
    nth: u32,
    waited: u64,
) -> Option<(RawEvent, u64, Claim)> {
    let pair = ShareAndWait::new(part, share, ith, nth, waited)?;
    let (events, claim) = match part {
        Part::Whole => (3, Claim::Op),
        Part::Begin => (2, Claim::OpBegin),
        Part::End => (2, Claim::End),
    };
    Some((pair.event(), events, claim))
}

/// Threads mode: puts this thread's held share, if any, in the ring on its own (a wait it was
/// held for is not recorded after all).
pub fn release_share(t: ThisThread, r: &'static Recorder) {
    release(t.0.for_recorder(r), r);
}

/// Tops this thread's share of the event cap up to `events`, where it has its ring and id and
/// the cap has more; counts nothing where it has not (the event that needs them is counted as
/// it goes in, or not).
#[cold]
#[inline(never)]
fn top_up(l: &Local, r: &Recorder, events: u64) {
    if l.ring.get().is_null() || l.tid.get() == 0 {
        return;
    }
    while l.budget.get() < events {
        match r.reserve() {
            0 => return,
            budget => l.budget.set(l.budget.get() + budget),
        }
    }
}
