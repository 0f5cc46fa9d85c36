//! Perfetto's native format: a `Trace` of protobuf `TracePacket`s carrying `TrackEvent`s, written
//! as the records arrive (the file is the packets one after another, which is a `Trace`).
//!
//! - Each process is a process track (`ProcessDescriptor`) named with its program, pid, host and
//!   rank; its `pid` is our process id, unique per export, because Perfetto merges processes by
//!   pid and two hosts can share one. Each lane is a thread track under it (`ThreadDescriptor`,
//!   `tid` = our lane id), each counter a counter track (bytes) under its process.
//! - Spans are `TYPE_SLICE_BEGIN` / `TYPE_SLICE_END` pairs on their lane's track, with their
//!   arguments as debug annotations; instants are `TYPE_INSTANT`, counter samples
//!   `TYPE_COUNTER`. Spans arrive when they close, children first: a lane's spans are held until
//!   its outermost open span closes, then written in begin order, each end before anything that
//!   begins after it, so that every track is nested in file order even where a child begins or
//!   ends at its parent's very nanosecond (a stable sort by time alone would invert them).
//! - Event names, categories, argument names and string argument values are interned
//!   (incremental state on one packet sequence): a repeated op or tensor name costs a varint.
//! - Timestamps are the model's nanoseconds, whole: no origin, no rounding.

use std::collections::HashMap;
use std::io::{self, Write};

use rustc_hash::FxHashMap;

use super::protobuf::Message;
use crate::telemetry::{Arg, Lane, Process, Record, RecordSink, Span};

/// The one packet sequence the writer uses.
const SEQUENCE: u64 = 1;
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;

const SLICE_BEGIN: u64 = 1;
const SLICE_END: u64 = 2;
const INSTANT: u64 = 3;
const COUNTER: u64 = 4;
const UNIT_SIZE_BYTES: u64 = 3;

/// Track uuids: our id times 4 plus the kind, so that they stay small varints.
fn process_track(process: u32) -> u64 {
    u64::from(process) * 4 + 1
}
fn lane_track(lane: u32) -> u64 {
    u64::from(lane) * 4 + 2
}
fn counter_track(n: u64) -> u64 {
    n * 4 + 3
}

/// Interned strings of one kind: iid by string, and the new ones to send with the next packet.
#[derive(Default)]
struct Interned {
    iids: FxHashMap<String, u64>,
    fresh: Vec<(u64, String)>,
}

impl Interned {
    fn iid(&mut self, s: &str) -> u64 {
        if let Some(&iid) = self.iids.get(s) {
            return iid;
        }
        let iid = self.iids.len() as u64 + 1;
        self.iids.insert(s.to_string(), iid);
        self.fresh.push((iid, s.to_string()));
        iid
    }
}

pub struct PerfettoWriter<W: Write> {
    out: W,
    counters: HashMap<(u32, String), u64>,
    /// Per lane, the closed spans of its outermost open span.
    pending: HashMap<u32, Vec<Span>>,
    names: Interned,
    categories: Interned,
    arg_names: Interned,
    arg_values: Interned,
    started: bool,
    error: Option<io::Error>,
    /// Packets written.
    packets: u64,
}

impl<W: Write> PerfettoWriter<W> {
    pub fn new(out: W) -> PerfettoWriter<W> {
        PerfettoWriter {
            out,
            counters: HashMap::new(),
            pending: HashMap::new(),
            names: Interned::default(),
            categories: Interned::default(),
            arg_names: Interned::default(),
            arg_values: Interned::default(),
            started: false,
            error: None,
            packets: 0,
        }
    }

    /// Writes `packet` as one `Trace.packet`, on the writer's sequence, with the strings
    /// interned since the last packet; `interned_refs`: it refers to interned strings.
    fn emit(&mut self, mut packet: Message, interned_refs: bool) {
        if self.error.is_some() {
            return;
        }
        packet.uint(10, SEQUENCE);
        if !self.started {
            packet.uint(
                13,
                SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE,
            );
        } else if interned_refs {
            packet.uint(13, SEQ_NEEDS_INCREMENTAL_STATE);
        }
        self.started = true;
        let fresh = [
            (1, std::mem::take(&mut self.categories.fresh)),
            (2, std::mem::take(&mut self.names.fresh)),
            (3, std::mem::take(&mut self.arg_names.fresh)),
            (29, std::mem::take(&mut self.arg_values.fresh)),
        ];
        if fresh.iter().any(|(_, f)| !f.is_empty()) {
            packet.nested(12, |interned| {
                for (field, strings) in &fresh {
                    for (iid, s) in strings {
                        interned.nested(*field, |entry| {
                            entry.uint(1, *iid).string(2, s);
                        });
                    }
                }
            });
        }
        self.packets += 1;
        if let Err(err) = packet.write_as_field(1, &mut self.out) {
            self.error = Some(err);
        }
    }

    fn describe(&mut self, build: impl FnOnce(&mut Message)) {
        let mut packet = Message::default();
        packet.nested(60, build);
        self.emit(packet, false);
    }

    fn process(&mut self, p: &Process) {
        let label = p.label();
        self.describe(|track| {
            track.uint(1, process_track(p.id)).nested(3, |process| {
                process.int(1, i64::from(p.id)).string(6, &label);
                if let Some(rank) = p.rank {
                    process.string(8, &format!("rank {rank}"));
                }
                if !p.host.is_empty() {
                    process.string(8, &format!("host {}", p.host));
                }
            });
        });
    }

    fn lane(&mut self, l: &Lane) {
        self.describe(|track| {
            track
                .uint(1, lane_track(l.id))
                .uint(5, process_track(l.process))
                .nested(4, |thread| {
                    thread
                        .int(1, i64::from(l.process))
                        .int(2, i64::from(l.id))
                        .string(5, &l.name);
                });
        });
    }

    /// A track event at `time_ns`, built by `build` after its type and track.
    fn event(&mut self, time_ns: u64, ty: u64, track: u64, build: impl FnOnce(&mut Message)) {
        let mut packet = Message::default();
        packet.uint(8, time_ns).nested(11, |event| {
            event.uint(9, ty).uint(11, track);
            build(event);
        });
        self.emit(packet, ty != SLICE_END && ty != COUNTER);
    }

    /// Holds `s` until its lane's outermost span closes; then writes that span's tree.
    fn span(&mut self, s: Span) {
        let lane = s.lane;
        let outermost = s.depth == 0;
        self.pending.entry(lane).or_default().push(s);
        if outermost {
            let tree = self.pending.remove(&lane).unwrap_or_default();
            self.tree(tree);
        }
    }

    /// One outermost span and its descendants: begins in order of start (parents first), each
    /// span's end written before the next span that starts at or after it.
    fn tree(&mut self, mut spans: Vec<Span>) {
        spans.sort_by_key(|s| (s.start_ns, s.depth));
        let mut open: Vec<Span> = Vec::new();
        for s in spans {
            while let Some(top) = open.last()
                && (top.end_ns <= s.start_ns || top.depth >= s.depth)
            {
                let top = open.pop().expect("checked");
                self.end(&top);
            }
            self.begin(&s);
            open.push(s);
        }
        while let Some(top) = open.pop() {
            self.end(&top);
        }
    }

    fn begin(&mut self, s: &Span) {
        let name = self.names.iid(&s.name);
        let category = self.categories.iid(&s.category);
        let args: Vec<(u64, &Arg, Option<u64>)> = s
            .args
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Arg::Str(text) => Some(self.arg_values.iid(text)),
                    _ => None,
                };
                (self.arg_names.iid(k), v, value)
            })
            .collect();
        self.event(s.start_ns, SLICE_BEGIN, lane_track(s.lane), |event| {
            event.uint(3, category).uint(10, name);
            for (iid, value, string_iid) in args {
                event.nested(4, |annotation| {
                    annotation.uint(1, iid);
                    match (value, string_iid) {
                        (_, Some(string_iid)) => annotation.uint(17, string_iid),
                        (Arg::Int(v), _) => annotation.int(4, *v),
                        (Arg::UInt(v), _) => annotation.uint(3, *v),
                        (Arg::Float(v), _) => annotation.double(5, *v),
                        (Arg::Str(v), None) => annotation.string(6, v),
                    };
                });
            }
        });
    }

    fn end(&mut self, s: &Span) {
        self.event(s.end_ns, SLICE_END, lane_track(s.lane), |_| {});
    }

    fn counter_track(&mut self, process: u32, name: &str) -> u64 {
        if let Some(&uuid) = self.counters.get(&(process, name.to_string())) {
            return uuid;
        }
        let uuid = counter_track(self.counters.len() as u64 + 1);
        self.counters.insert((process, name.to_string()), uuid);
        self.describe(|track| {
            track
                .uint(1, uuid)
                .uint(5, process_track(process))
                .string(2, name)
                .nested(8, |counter| {
                    counter.uint(3, UNIT_SIZE_BYTES);
                });
        });
        uuid
    }

    /// Writes the spans still held (of outermost spans never closed: a truncated input) and
    /// flushes the output; returns it and the packets written.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        let mut lanes: Vec<u32> = self.pending.keys().copied().collect();
        lanes.sort_unstable();
        for lane in lanes {
            let tree = self.pending.remove(&lane).unwrap_or_default();
            self.tree(tree);
        }
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        self.out.flush()?;
        Ok((self.out, self.packets))
    }
}

impl<W: Write> RecordSink for PerfettoWriter<W> {
    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => self.process(&p),
            Record::Lane(l) => self.lane(&l),
            Record::Span(s) => self.span(s),
            Record::Counter(c) => {
                let track = self.counter_track(c.process, &c.name);
                self.event(c.time_ns, COUNTER, track, |event| {
                    event.double(44, c.value);
                });
            }
            Record::Instant(i) => {
                let name = self.names.iid(&i.name);
                self.event(i.time_ns, INSTANT, lane_track(i.lane), |event| {
                    event.uint(10, name);
                });
            }
            Record::Warning(_) | Record::Clock(_) => {}
        }
    }
}
