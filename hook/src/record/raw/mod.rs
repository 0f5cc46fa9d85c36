//! The raw events: what the producer stores in a ring slot ([`RawEvent`]) and the writer turns
//! into GGMLVIZ records, kind by kind. As Tracy's queue items: a kind ([`Kind`], the slot's
//! `kind` byte) and, for each kind, a struct with a constructor into a slot (`event`) and a
//! decoder out of one (`of`). The producer (`events`, `device`) builds with them; the writer
//! matches on the kind and decodes with them. Neither reads or writes a slot's fields itself, and
//! the writer never imports the producer.
//!
//! A slot's `ticks` and `thread_id` are set as it is stored (`events::store`); the constructors
//! leave them 0.

use std::ffi::c_void;

use crate::base::ring::RawEvent;

mod extensions;
pub use extensions::{BufferHeld, BufferUse, RpcEdge, SPAN_SEQS, SeqRemoved, SpanEdge};

/// What a slot holds, and which struct reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A graph compute begins or ends ([`GraphEdge`]).
    GraphBegin = 1,
    GraphEnd = 2,
    /// A wait for a backend or scheduler, at its end ([`Wait`]).
    Wait = 3,
    /// A node's op begins or ends, each edge in a slot of its own ([`OpEdge`]): a node the eval
    /// callback drives, or a thread's share whose begin could not wait for its end.
    OpBegin = 4,
    OpEnd = 5,
    /// A thread's whole share of a node in one slot ([`OpShare`]): both records.
    OpShare = 6,
    /// A worker thread's wait at `ggml_barrier`, which no entry point records ([`WorkerWait`]).
    WorkerWait = 7,
    /// A thread's first event, or its exit ([`ThreadEdge`]).
    ThreadBegin = 8,
    ThreadFree = 9,
    /// A backend buffer made or freed ([`BufferEdge`]).
    BufferAlloc = 10,
    BufferFree = 11,
    /// What the program said a buffer holds ([`BufferHeld`]).
    BufferUse = 12,
    /// An application span's begin or end ([`SpanEdge`]).
    SpanBegin = 13,
    SpanEnd = 14,
    /// `llama_memory_seq_rm`'s span, with what it removed ([`SeqRemoved`]).
    SeqRmBegin = 15,
    SeqRmEnd = 16,
    /// A part of a ggml-rpc command begins or ends ([`RpcEdge`]).
    RpcBegin = 17,
    RpcEnd = 18,
    /// A device queue's lane is named ([`DeviceLaneNamed`]). Its time is the device's,
    /// calibrated to `CLOCK_MONOTONIC` nanoseconds, not the thread's ticks.
    DeviceLane = 19,
    /// A node a device timed, in one slot: both records ([`DeviceOp`]). Monotonic
    /// nanoseconds, as [`Kind::DeviceLane`].
    DeviceOp = 20,
    /// A worker thread's whole share of a node and its wait at the `ggml_barrier` after it, in
    /// one slot ([`ShareAndWait`]): the share's two records and the wait's.
    ShareAndWait = 21,
    /// The begin of a worker's share and its first wait at a `ggml_barrier` inside the node's
    /// op (`mul_mat`'s), in one slot ([`ShareAndWait`], [`Part::Begin`]).
    BeginAndWait = 22,
    /// The end of a worker's share whose begin went in before it, and the wait after it, in one
    /// slot ([`ShareAndWait`], [`Part::End`]).
    EndAndWait = 23,
}

impl Kind {
    const ALL: [Kind; 23] = [
        Kind::GraphBegin,
        Kind::GraphEnd,
        Kind::Wait,
        Kind::OpBegin,
        Kind::OpEnd,
        Kind::OpShare,
        Kind::WorkerWait,
        Kind::ThreadBegin,
        Kind::ThreadFree,
        Kind::BufferAlloc,
        Kind::BufferFree,
        Kind::BufferUse,
        Kind::SpanBegin,
        Kind::SpanEnd,
        Kind::SeqRmBegin,
        Kind::SeqRmEnd,
        Kind::RpcBegin,
        Kind::RpcEnd,
        Kind::DeviceLane,
        Kind::DeviceOp,
        Kind::ShareAndWait,
        Kind::BeginAndWait,
        Kind::EndAndWait,
    ];

    /// The kind of `event` (`None`: a slot no constructor made).
    #[inline(always)]
    pub fn of(event: &RawEvent) -> Option<Kind> {
        Kind::ALL
            .get(usize::from(event.kind).wrapping_sub(1))
            .copied()
    }

    /// `begin`'s kind or `end`'s.
    pub(super) fn edge(begin: bool, if_begin: Kind, if_end: Kind) -> Kind {
        if begin { if_begin } else { if_end }
    }
}

/// A slot of `kind`, every other field 0.
pub(super) fn slot(kind: Kind) -> RawEvent {
    RawEvent {
        kind: kind as u8,
        ..RawEvent::ZERO
    }
}

/// What a graph event says, besides its edge and time.
#[derive(Clone, Copy, Debug)]
pub struct GraphInfo {
    pub graph: *mut c_void,
    pub n_nodes: u32,
    pub n_threads: u32,
    pub backend: *mut c_void,
    /// The backend's or scheduler's interned name (0: none).
    pub name_id: u16,
}

impl GraphInfo {
    pub const EMPTY: GraphInfo = GraphInfo {
        graph: std::ptr::null_mut(),
        n_nodes: 0,
        n_threads: 0,
        backend: std::ptr::null_mut(),
        name_id: 0,
    };
}

/// A graph compute's begin or end, made by the wrapper of `entry`.
#[derive(Clone, Copy, Debug)]
pub struct GraphEdge {
    pub begin: bool,
    pub entry: u8,
    pub info: GraphInfo,
}

impl GraphEdge {
    pub fn event(&self) -> RawEvent {
        let i = &self.info;
        RawEvent {
            words: [i.graph as u64, i.backend as u64, 0],
            halves: [i.n_nodes, i.n_threads],
            tag: self.entry,
            short: i.name_id,
            ..slot(Kind::edge(self.begin, Kind::GraphBegin, Kind::GraphEnd))
        }
    }

    pub fn of(e: &RawEvent) -> GraphEdge {
        GraphEdge {
            begin: e.kind == Kind::GraphBegin as u8,
            entry: e.tag,
            info: GraphInfo {
                graph: e.words[0] as *mut c_void,
                n_nodes: e.halves[0],
                n_threads: e.halves[1],
                backend: e.words[1] as *mut c_void,
                name_id: e.short,
            },
        }
    }
}

/// A wait (`*_synchronize`) of the wrapper of `entry` for `object`, named `name_id`, that took
/// `waited` ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub entry: u8,
    pub object: u64,
    pub waited: u64,
    pub name_id: u16,
}

impl Wait {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: [self.object, self.waited, 0],
            tag: self.entry,
            short: self.name_id,
            ..slot(Kind::Wait)
        }
    }

    pub fn of(e: &RawEvent) -> Wait {
        Wait {
            entry: e.tag,
            object: e.words[0],
            waited: e.words[1],
            name_id: e.short,
        }
    }
}

/// What an op event says about its node.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub tensor: *mut c_void,
    pub op_type: u32,
    /// The bytes of the node's result.
    pub op_size: u64,
    pub backend: *mut c_void,
    /// The tensor's entry in the recorder's tensor table (0: none).
    pub tensor_id: u16,
}

impl OpInfo {
    /// A slot of `kind` with this op in it.
    #[inline(always)]
    fn slot(&self, kind: Kind) -> RawEvent {
        RawEvent {
            words: [self.tensor as u64, self.backend as u64, self.op_size],
            halves: [self.op_type, 0],
            short: self.tensor_id,
            ..slot(kind)
        }
    }

    #[inline(always)]
    fn of(e: &RawEvent) -> OpInfo {
        OpInfo {
            tensor: e.words[0] as *mut c_void,
            op_type: e.halves[0],
            op_size: e.words[2],
            backend: e.words[1] as *mut c_void,
            tensor_id: e.short,
        }
    }
}

/// A node's op begins or ends, in a slot of its own.
#[derive(Clone, Copy, Debug)]
pub struct OpEdge {
    pub begin: bool,
    pub op: OpInfo,
}

impl OpEdge {
    #[inline(always)]
    pub fn event(&self) -> RawEvent {
        self.op
            .slot(Kind::edge(self.begin, Kind::OpBegin, Kind::OpEnd))
    }

    #[inline(always)]
    pub fn of(e: &RawEvent) -> OpEdge {
        OpEdge {
            begin: e.kind == Kind::OpBegin as u8,
            op: OpInfo::of(e),
        }
    }
}

/// A thread's whole share of a node: it ended at the slot's time, `took` ticks after it began.
#[derive(Clone, Copy, Debug)]
pub struct OpShare {
    pub op: OpInfo,
    pub took: u32,
}

impl OpShare {
    #[inline(always)]
    pub fn event(&self) -> RawEvent {
        RawEvent {
            halves: [self.op.op_type, self.took],
            ..self.op.slot(Kind::OpShare)
        }
    }

    #[inline(always)]
    pub fn of(e: &RawEvent) -> OpShare {
        OpShare {
            op: OpInfo::of(e),
            took: e.halves[1],
        }
    }
}

/// A worker thread's share of a node, or a part of it, and a wait at a barrier, thread `ith` of
/// `nth`: the wait ended at the slot's time after `waited` ticks. What a node costs a worker
/// thread when there are several, in one slot instead of two or four; [`ShareAndWait::new`] says
/// whether it fits one.
#[derive(Clone, Copy, Debug)]
pub struct ShareAndWait {
    pub part: Part,
    /// The op, and (but for [`Part::End`]) the ticks from the share's begin to the wait's.
    pub share: OpShare,
    pub ith: u16,
    pub nth: u16,
    pub waited: u32,
}

/// What a [`ShareAndWait`] holds of the share: all of it or one edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The share, which ended where the wait (the barrier's after the node) began (one clock
    /// read for both).
    Whole,
    /// The share's begin, the share's `took` ticks before the wait began: a wait inside the
    /// node's op.
    Begin,
    /// The share's end (its begin went in before), where the wait began.
    End,
}

impl Part {
    fn kind(self) -> Kind {
        match self {
            Part::Whole => Kind::ShareAndWait,
            Part::Begin => Kind::BeginAndWait,
            Part::End => Kind::EndAndWait,
        }
    }
}

impl ShareAndWait {
    /// The pair, where its fields fit the slot: an op type below 256, a result below 4 GiB,
    /// thread numbers below 65,536 and a wait below 2^32 ticks (else the two go in slots of
    /// their own).
    #[inline(always)]
    pub fn new(
        part: Part,
        share: OpShare,
        ith: u32,
        nth: u32,
        waited: u64,
    ) -> Option<ShareAndWait> {
        let fits =
            share.op.op_type <= u32::from(u8::MAX) && share.op.op_size <= u64::from(u32::MAX);
        Some(ShareAndWait {
            part,
            share,
            ith: u16::try_from(ith).ok()?,
            nth: u16::try_from(nth).ok()?,
            waited: u32::try_from(waited).ok()?,
        })
        .filter(|_| fits)
    }

    /// An op's slot (see [`OpInfo::slot`]) with the op type in its tag and the thread numbers
    /// above the result's size, which leaves both halves to the share's and the wait's ticks.
    #[inline(always)]
    pub fn event(&self) -> RawEvent {
        let op = &self.share.op;
        let mut e = op.slot(self.part.kind());
        e.words[2] |= u64::from(self.ith) << 32 | u64::from(self.nth) << 48;
        e.halves = [self.share.took, self.waited];
        e.tag = op.op_type as u8;
        e
    }

    #[inline(always)]
    pub fn of(e: &RawEvent) -> ShareAndWait {
        let packed = e.words[2];
        let op = OpInfo {
            op_type: u32::from(e.tag),
            op_size: packed & u64::from(u32::MAX),
            ..OpInfo::of(e)
        };
        let part = match Kind::of(e) {
            Some(Kind::BeginAndWait) => Part::Begin,
            Some(Kind::EndAndWait) => Part::End,
            _ => Part::Whole,
        };
        ShareAndWait {
            part,
            share: OpShare {
                op,
                took: e.halves[0],
            },
            ith: (packed >> 32) as u16,
            nth: (packed >> 48) as u16,
            waited: e.halves[1],
        }
    }
}

/// A worker thread, `ith` of `nth` of `threadpool`, waited `waited` ticks at `ggml_barrier`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerWait {
    pub threadpool: u64,
    pub ith: u32,
    pub nth: u32,
    pub waited: u64,
}

impl WorkerWait {
    #[inline(always)]
    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: [self.threadpool, self.waited, 0],
            halves: [self.ith, self.nth],
            ..slot(Kind::WorkerWait)
        }
    }

    #[inline(always)]
    pub fn of(e: &RawEvent) -> WorkerWait {
        WorkerWait {
            threadpool: e.words[0],
            ith: e.halves[0],
            nth: e.halves[1],
            waited: e.words[1],
        }
    }
}

/// A thread's first event (`begin`) or its exit, with its interned name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadEdge {
    pub begin: bool,
    pub name_id: u16,
}

impl ThreadEdge {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            short: self.name_id,
            ..slot(Kind::edge(self.begin, Kind::ThreadBegin, Kind::ThreadFree))
        }
    }

    pub fn of(e: &RawEvent) -> ThreadEdge {
        ThreadEdge {
            begin: e.kind == Kind::ThreadBegin as u8,
            name_id: e.short,
        }
    }
}

/// A backend buffer of `size` bytes at `base` made (`alloc`) or freed; `name_id` its buffer
/// type's interned name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferEdge {
    pub alloc: bool,
    pub buffer: u64,
    pub size: u64,
    pub base: u64,
    pub name_id: u16,
}

impl BufferEdge {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: [self.buffer, self.size, self.base],
            short: self.name_id,
            ..slot(Kind::edge(self.alloc, Kind::BufferAlloc, Kind::BufferFree))
        }
    }

    pub fn of(e: &RawEvent) -> BufferEdge {
        BufferEdge {
            alloc: e.kind == Kind::BufferAlloc as u8,
            buffer: e.words[0],
            size: e.words[1],
            base: e.words[2],
            name_id: e.short,
        }
    }
}

/// A device queue's lane, thread id `lane`, is named `name_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLaneNamed {
    pub lane: u32,
    pub name_id: u16,
}

impl DeviceLaneNamed {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            halves: [self.lane, 0],
            short: self.name_id,
            ..slot(Kind::DeviceLane)
        }
    }

    pub fn of(e: &RawEvent) -> DeviceLaneNamed {
        DeviceLaneNamed {
            lane: e.halves[0],
            name_id: e.short,
        }
    }
}

/// A node that device `op.backend` computed on lane `lane`: it ended at the slot's time, `took`
/// nanoseconds after it began. Its `op.tensor` is a key made from its name, its `op_size` 0.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOp {
    pub op: OpInfo,
    pub lane: u32,
    pub took: u32,
}

impl DeviceOp {
    pub fn event(&self) -> RawEvent {
        RawEvent {
            words: [
                self.op.tensor as u64,
                self.op.backend as u64,
                u64::from(self.lane),
            ],
            halves: [self.op.op_type, self.took],
            short: self.op.tensor_id,
            ..slot(Kind::DeviceOp)
        }
    }

    pub fn of(e: &RawEvent) -> DeviceOp {
        DeviceOp {
            op: OpInfo {
                op_size: 0,
                ..OpInfo::of(e)
            },
            lane: e.words[2] as u32,
            took: e.halves[1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::entry::Entry;
    use ggml_viz_format::ext::RpcPart;

    /// Each kind's slot read back by its decoder gives what its constructor was given, and
    /// [`Kind::of`] names the kind.
    #[test]
    fn every_kind_comes_back_as_it_went() {
        let op = OpInfo {
            tensor: 0x1000 as *mut c_void,
            op_type: 26,
            op_size: 4096,
            backend: 0x2000 as *mut c_void,
            tensor_id: 7,
        };
        let same_op = |a: OpInfo, b: OpInfo| {
            (a.tensor, a.op_type, a.op_size, a.backend, a.tensor_id)
                == (b.tensor, b.op_type, b.op_size, b.backend, b.tensor_id)
        };
        for begin in [true, false] {
            let e = OpEdge { begin, op }.event();
            assert_eq!(
                Kind::of(&e),
                Some(if begin { Kind::OpBegin } else { Kind::OpEnd })
            );
            let back = OpEdge::of(&e);
            assert!(back.begin == begin && same_op(back.op, op));

            let info = GraphInfo {
                graph: 0x10 as *mut c_void,
                n_nodes: 3,
                n_threads: 4,
                backend: 0x20 as *mut c_void,
                name_id: 5,
            };
            let g = GraphEdge::of(
                &GraphEdge {
                    begin,
                    entry: Entry::SchedGraphCompute as u8,
                    info,
                }
                .event(),
            );
            assert_eq!(
                (
                    g.begin,
                    g.entry,
                    g.info.graph,
                    g.info.n_nodes,
                    g.info.n_threads
                ),
                (begin, 1, info.graph, 3, 4)
            );
            assert_eq!((g.info.backend, g.info.name_id), (info.backend, 5));

            let t = ThreadEdge { begin, name_id: 9 };
            assert_eq!(ThreadEdge::of(&t.event()), t);
            let b = BufferEdge {
                alloc: begin,
                buffer: 1,
                size: 2,
                base: 3,
                name_id: 4,
            };
            assert_eq!(BufferEdge::of(&b.event()), b);
            let s = SeqRemoved {
                begin,
                seq: -1,
                p0: 5,
                p1: -1,
            };
            assert_eq!(SeqRemoved::of(&s.event()), s);
            for part in [RpcPart::Request, RpcPart::Answer, RpcPart::Serve] {
                let r = RpcEdge {
                    begin,
                    part,
                    command: 11,
                    connection: 3,
                    index: 70_000,
                    sent: 1 << 40,
                    received: 12,
                    endpoint_id: 2,
                };
                assert_eq!(RpcEdge::of(&r.event()), r);
            }
        }
        let share = OpShare::of(&OpShare { op, took: 123 }.event());
        assert!(share.took == 123 && same_op(share.op, op));
        let share = OpShare {
            op: OpInfo {
                op_type: 255,
                op_size: u64::from(u32::MAX),
                ..op
            },
            took: 123,
        };
        for part in [Part::Whole, Part::Begin, Part::End] {
            let pair = ShareAndWait::new(part, share, 65_534, 65_535, u64::from(u32::MAX)).unwrap();
            let back = ShareAndWait::of(&pair.event());
            assert!(back.share.took == 123 && same_op(back.share.op, share.op));
            assert_eq!(
                (back.part, back.ith, back.nth, back.waited),
                (part, 65_534, 65_535, u32::MAX)
            );
        }
        // What does not fit one slot: each field one past its room.
        let beyond = |op_type, op_size| OpShare {
            op: OpInfo {
                op_type,
                op_size,
                ..op
            },
            took: 1,
        };
        assert!(ShareAndWait::new(Part::Whole, beyond(256, 1), 0, 2, 1).is_none());
        assert!(ShareAndWait::new(Part::Whole, beyond(1, 1 << 32), 0, 2, 1).is_none());
        assert!(ShareAndWait::new(Part::Whole, beyond(1, 1), 65_536, 65_537, 1).is_none());
        assert!(ShareAndWait::new(Part::Whole, beyond(1, 1), 0, 65_536, 1).is_none());
        assert!(ShareAndWait::new(Part::Whole, beyond(1, 1), 0, 2, 1 << 32).is_none());
        assert!(ShareAndWait::new(Part::Whole, beyond(1, 1), 0, 2, 1).is_some());
        let w = WorkerWait {
            threadpool: 0x30,
            ith: 1,
            nth: 2,
            waited: 77,
        };
        assert_eq!(WorkerWait::of(&w.event()), w);
        let wait = Wait {
            entry: 7,
            object: 0x40,
            waited: 9,
            name_id: 3,
        };
        assert_eq!(Wait::of(&wait.event()), wait);
        let lane = DeviceLaneNamed {
            lane: 0xD000_0001,
            name_id: 6,
        };
        assert_eq!(DeviceLaneNamed::of(&lane.event()), lane);
        let node = DeviceOp::of(
            &DeviceOp {
                op,
                lane: 0xD000_0002,
                took: 500,
            }
            .event(),
        );
        assert_eq!(
            (node.lane, node.took, node.op.op_size),
            (0xD000_0002, 500, 0)
        );
        assert!(same_op(node.op, OpInfo { op_size: 0, ..op }));
        assert_eq!(Kind::of(&RawEvent::ZERO), None);
        let kinds: Vec<u8> = Kind::ALL.iter().map(|&k| k as u8).collect();
        assert_eq!(kinds, (1..=Kind::ALL.len() as u8).collect::<Vec<_>>());
    }
}
