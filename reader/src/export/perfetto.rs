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
//! - Each lane's slices are a packet sequence of their own (as a tracer writes one per thread):
//!   its defaults name the lane's track, so that no event carries it, and its timestamps are on
//!   a sequence-scoped incremental clock (`ClockSnapshot.Clock.is_incremental`: each packet's
//!   timestamp is the delta from the sequence's previous one, mapped to the trace clock by the
//!   sequence's snapshot), a few bytes instead of nine. Descriptions, counters and instants are
//!   one more sequence, with absolute timestamps.
//! - A span's arguments are one debug annotation, `args`, whose value is their `key=value` pairs
//!   joined with `; ` (`tensor=attn_out-5; bytes=2048; shape=[512, 1, 1, 1]; type=f32; …`),
//!   interned: the same node every token costs a varint, not six annotations. (The Parquet
//!   export keeps every argument a column of its own, for queries.)
//! - Event names, categories and annotation names and values are interned per sequence
//!   (incremental state): a repeated op or tensor name costs a varint.
//! - A span with a `flow_id` argument (a ggml-rpc request and the server's serving of it, joined
//!   when several traces are merged) carries it in `flow_ids`: the viewer draws the arrow.
//! - Timestamps are the model's nanoseconds, whole: no origin, no rounding.
//! - [`PerfettoWriter::compressed`] deflates the packets, a megabyte at a time, into packets of
//!   `compressed_packets` (zlib), as Perfetto's tracing service does when asked to compress: the
//!   trace processor and the UI inflate them as they read, and interning, sequences and clocks
//!   work within them as outside.

use std::collections::HashMap;
use std::io::{self, Write};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::protobuf::Message;
use crate::telemetry::rpc_spans as rpc;
use crate::telemetry::{Arg, Args, ByAddress, Lane, Process, Record, RecordSink, Span, Text};
use crate::telemetry::{LaneId, ProcessId};

/// The sequence of descriptions, counters and instants; lane `l`'s slices are sequence `l + 2`.
const GLOBAL_SEQUENCE: u64 = 1;
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
/// `BUILTIN_CLOCK_BOOTTIME`, the trace clock our absolute timestamps are on.
const BOOTTIME: u64 = 6;
/// The first sequence-scoped clock id: each lane sequence's incremental clock.
const LANE_CLOCK: u64 = 64;

const SLICE_BEGIN: u64 = 1;
const SLICE_END: u64 = 2;
const INSTANT: u64 = 3;
const COUNTER: u64 = 4;
const UNIT_SIZE_BYTES: u64 = 3;

/// Track uuids: our id times 4 plus the kind, so that they stay small varints.
fn process_track(process: ProcessId) -> u64 {
    u64::from(process.0) * 4 + 1
}
fn lane_track(lane: LaneId) -> u64 {
    u64::from(lane.0) * 4 + 2
}
fn counter_track(n: u64) -> u64 {
    n * 4 + 3
}

/// Interned strings of one kind: iid by string, and the new ones to send with the next packet.
#[derive(Default)]
struct Interned {
    iids: FxHashMap<String, u64>,
    /// Each shared text's iid, found by its address.
    by_addr: ByAddress<u64>,
    fresh: Vec<(u64, String)>,
    /// Hashes of strings seen once and written inline ([`Interned::repeated_iid`]).
    seen_once: rustc_hash::FxHashSet<u64>,
}

/// Strings seen once that [`Interned::repeated_iid`] remembers (past this, it forgets them all).
const SEEN_ONCE_KEPT: usize = 1 << 16;

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

    fn text_iid(&mut self, t: &Text) -> u64 {
        if let Some(iid) = self.by_addr.get(t) {
            return iid;
        }
        let iid = self.iid(t);
        self.by_addr.insert(t, iid);
        iid
    }

    /// `t`'s iid if it was seen before (interned on its second sight), else `None`: the caller
    /// writes it inline. Interned strings are kept for the whole trace (the sequence refers to
    /// them), so strings that never repeat (an RPC span's arguments: its index and bytes) are
    /// not interned, and memory stays bounded.
    fn repeated_iid(&mut self, t: &Text) -> Option<u64> {
        if let Some(iid) = self.by_addr.get(t) {
            return Some(iid);
        }
        // One hash for a string never seen: an interned one met anew (a new text, its address
        // forgotten) is written inline once more, then found in `iids` on its next sight.
        let hash = {
            use std::hash::BuildHasher;
            rustc_hash::FxBuildHasher.hash_one(&**t)
        };
        if self.seen_once.remove(&hash) {
            return Some(self.text_iid(t));
        }
        if self.seen_once.len() >= SEEN_ONCE_KEPT {
            self.seen_once.clear();
        }
        self.seen_once.insert(hash);
        None
    }
}

/// One packet sequence: its interned strings and, for a lane's, its clock.
#[derive(Default)]
struct Sequence {
    id: u64,
    started: bool,
    /// Lane sequences: the timestamp of the last packet on the incremental clock.
    clock_ns: Option<u64>,
    names: Interned,
    categories: Interned,
    arg_names: Interned,
    /// The iid of the one annotation name, `args` (0 until interned).
    args_iid: u64,
    arg_values: Interned,
}

/// Uncompressed bytes of packets per `compressed_packets` packet.
const DEFLATE_CHUNK: usize = 1 << 20;

/// Where packets go: the output, its first error, and the count; the packets not yet written,
/// built in place (a megabyte at a time), and whether they are deflated when written.
struct Output<W: Write> {
    out: W,
    error: Option<io::Error>,
    packets: u64,
    /// The `Trace`'s packets (field 1) not yet written.
    held: Message,
    deflate: bool,
}

impl<W: Write> Output<W> {
    fn new(out: W, deflate: bool) -> Output<W> {
        Output {
            out,
            error: None,
            packets: 0,
            held: Message {
                bytes: Vec::with_capacity(DEFLATE_CHUNK + (64 << 10)),
            },
            deflate,
        }
    }

    /// One packet, built by `build` where it will be written from.
    fn packet(&mut self, build: impl FnOnce(&mut Message)) {
        if self.error.is_some() {
            return;
        }
        self.packets += 1;
        self.held.nested(1, build);
        if self.held.bytes.len() >= DEFLATE_CHUNK
            && let Err(err) = self.write_held()
        {
            self.error = Some(err);
        }
    }

    /// Writes the packets held: as they are, or deflated (zlib, as the tracing service writes
    /// them when its `compression_type` is set) into one packet's `compressed_packets`.
    fn write_held(&mut self) -> io::Result<()> {
        if self.held.bytes.is_empty() {
            return Ok(());
        }
        let written = if self.deflate {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(&self.held.bytes)?;
            let mut packet = Message::default();
            packet.bytes(50, &z.finish()?);
            packet.write_as_field(1, &mut self.out)
        } else {
            self.out.write_all(&self.held.bytes)
        };
        self.held.clear();
        written
    }
}

impl Sequence {
    fn new(id: u64) -> Sequence {
        Sequence {
            id,
            ..Sequence::default()
        }
    }

    /// Ends `packet` on this sequence, with the strings interned since its last packet. The
    /// first packet clears the sequence's incremental state; later ones do not say that they
    /// need it (`SEQ_NEEDS_INCREMENTAL_STATE` only lets a reader skip packets of a sequence whose
    /// state was lost, which cannot happen in a file written whole: two bytes a packet saved).
    fn seal(&mut self, packet: &mut Message) {
        packet.uint(10, self.id);
        if !self.started {
            packet.uint(13, SEQ_INCREMENTAL_STATE_CLEARED);
        }
        self.started = true;
        let mut fresh = [
            (1, &mut self.categories.fresh),
            (2, &mut self.names.fresh),
            (3, &mut self.arg_names.fresh),
            (29, &mut self.arg_values.fresh),
        ];
        if fresh.iter().any(|(_, f)| !f.is_empty()) {
            packet.nested(12, |interned| {
                for (field, strings) in &mut fresh {
                    for (iid, s) in strings.drain(..) {
                        interned.nested(*field, |entry| {
                            entry.uint(1, iid).string(2, &s);
                        });
                    }
                }
            });
        }
    }

    fn args_iid(&mut self) -> u64 {
        if self.args_iid == 0 {
            self.args_iid = self.arg_names.iid("args");
        }
        self.args_iid
    }

    /// Writes a packet on this sequence, built by `build` (then sealed).
    fn emit<W: Write>(&mut self, out: &mut Output<W>, build: impl FnOnce(&mut Self, &mut Message)) {
        out.packet(|packet| {
            build(self, packet);
            self.seal(packet);
        });
    }

    /// The packet's timestamp: on a lane sequence the delta on its incremental clock (absolute
    /// on the trace clock, where a time runs backwards); elsewhere absolute.
    fn stamp(&mut self, packet: &mut Message, time_ns: u64) {
        match self.clock_ns {
            Some(last) if time_ns >= last => {
                packet.uint(8, time_ns - last);
                self.clock_ns = Some(time_ns);
            }
            Some(_) => {
                packet.uint(8, time_ns).uint(58, BOOTTIME);
            }
            None => {
                packet.uint(8, time_ns);
            }
        }
    }
}

/// Argument lists whose text is kept.
const JOINED_KEPT: usize = 1 << 16;

/// A span's arguments as one text: `key=value` pairs joined with `; `.
fn join(args: &[(Text, Arg)]) -> Text {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(16 * args.len());
    for (i, (k, v)) in args.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        let _ = write!(text, "{sep}{k}={v}");
    }
    text.into()
}

/// Lane `lane`'s sequence; begun, the first time, with its defaults (the lane's track, the
/// incremental clock) and the clock's snapshot at `time_ns`.
fn lane_sequence<'a, W: Write>(
    lanes: &'a mut FxHashMap<LaneId, Sequence>,
    out: &mut Output<W>,
    lane: LaneId,
    time_ns: u64,
) -> &'a mut Sequence {
    lanes.entry(lane).or_insert_with(|| {
        let mut seq = Sequence::new(u64::from(lane.0) + 2);
        seq.emit(out, |_, defaults| {
            defaults.nested(59, |d| {
                d.uint(58, LANE_CLOCK).nested(11, |track_event| {
                    track_event.uint(11, lane_track(lane));
                });
            });
        });
        seq.emit(out, |_, snapshot| {
            snapshot.nested(6, |clocks| {
                clocks
                    .nested(1, |clock| {
                        clock.uint(1, LANE_CLOCK).uint(2, 0).uint(3, 1);
                    })
                    .nested(1, |clock| {
                        clock.uint(1, BOOTTIME).uint(2, time_ns);
                    });
            });
        });
        seq.clock_ns = Some(time_ns);
        seq
    })
}

pub struct PerfettoWriter<W: Write> {
    out: Output<W>,
    counters: HashMap<(ProcessId, String), u64>,
    /// Per lane, the closed spans of its outermost open span (the list kept, emptied, for the
    /// lane's next tree).
    pending: FxHashMap<LaneId, Vec<Span>>,
    /// A tree's spans in the order their begins are written, and those open: kept between trees.
    order: Vec<(u64, u32, u32)>,
    open: Vec<u32>,
    global: Sequence,
    lanes: FxHashMap<LaneId, Sequence>,
    /// Each distinct argument list's `args` text, by the list's address (the importers share one
    /// list among the spans of a node; the list is kept, so the address is not reused).
    joined: FxHashMap<usize, (Args, Text)>,
}

impl<W: Write> PerfettoWriter<W> {
    pub fn new(out: W) -> PerfettoWriter<W> {
        PerfettoWriter::with_output(Output::new(out, false))
    }

    /// A writer whose packets are deflated, a megabyte of them at a time, into
    /// `compressed_packets` (which Perfetto's trace processor and UI inflate as they read):
    /// several times smaller again, for some time spent compressing.
    pub fn compressed(out: W) -> PerfettoWriter<W> {
        PerfettoWriter::with_output(Output::new(out, true))
    }

    fn with_output(out: Output<W>) -> PerfettoWriter<W> {
        PerfettoWriter {
            out,
            counters: HashMap::new(),
            pending: FxHashMap::default(),
            order: Vec::new(),
            open: Vec::new(),
            global: Sequence::new(GLOBAL_SEQUENCE),
            lanes: FxHashMap::default(),
            joined: FxHashMap::default(),
        }
    }

    fn describe(&mut self, build: impl FnOnce(&mut Message)) {
        self.global.emit(&mut self.out, |_, packet| {
            packet.nested(60, build);
        });
    }

    fn process(&mut self, p: &Process) {
        let label = p.label();
        self.describe(|track| {
            track.uint(1, process_track(p.id)).nested(3, |process| {
                process.int(1, i64::from(p.id.0)).string(6, &label);
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
                        .int(1, i64::from(l.process.0))
                        .int(2, i64::from(l.id.0))
                        .string(5, &l.name);
                });
        });
    }

    /// A counter sample or instant at `time_ns` on `track`, on the global sequence.
    fn global_event(
        &mut self,
        time_ns: u64,
        ty: u64,
        track: u64,
        build: impl FnOnce(&mut Message),
    ) {
        self.global.emit(&mut self.out, |global, packet| {
            global.stamp(packet, time_ns);
            packet.nested(11, |event| {
                event.uint(9, ty).uint(11, track);
                build(event);
            });
        });
    }

    /// Holds `s` until its lane's outermost span closes; then writes that span's tree.
    fn hold(&mut self, s: Span) {
        let lane = s.lane;
        let outermost = s.depth == 0;
        let held = self.pending.entry(lane).or_default();
        held.push(s);
        if outermost {
            let mut tree = std::mem::take(held);
            self.tree(&tree);
            tree.clear();
            self.pending.insert(lane, tree);
        }
    }

    /// One outermost span and its descendants, all of one lane: begins in order of start
    /// (parents first), each span's end written before the next span that starts at or after it.
    fn tree(&mut self, spans: &[Span]) {
        let Some(root) = spans.last() else { return };
        // Sorted by index (a span is ~100 bytes; its key and index 16). Spans arrive as they
        // close: the root last, its descendants mostly in order before it, so the root is put
        // first and the sort is skipped where that is already the order.
        let key = |(i, s): (usize, &Span)| (s.start_ns, s.depth, i as u32);
        let last = spans.len() - 1;
        self.order.clear();
        self.order.push(key((last, root)));
        self.order.extend(spans[..last].iter().enumerate().map(key));
        if !self.order.is_sorted() {
            self.order.sort_unstable();
        }
        // A new lane's clock starts at the tree's first begin.
        let first = spans[self.order[0].2 as usize].start_ns;
        let seq = lane_sequence(&mut self.lanes, &mut self.out, root.lane, first);
        self.open.clear();
        for &(_, _, i) in &self.order {
            let s = &spans[i as usize];
            while let Some(&top) = self.open.last() {
                let top = &spans[top as usize];
                if top.end_ns > s.start_ns && top.depth < s.depth {
                    break;
                }
                self.open.pop();
                end(seq, &mut self.out, top);
            }
            begin(seq, &mut self.out, &mut self.joined, s);
            self.open.push(i);
        }
        while let Some(top) = self.open.pop() {
            end(seq, &mut self.out, &spans[top as usize]);
        }
    }

    fn counter_track(&mut self, process: ProcessId, name: &str) -> u64 {
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
        let mut lanes: Vec<LaneId> = self.pending.keys().copied().collect();
        lanes.sort_unstable();
        for lane in lanes {
            let tree = self.pending.remove(&lane).unwrap_or_default();
            self.tree(&tree);
        }
        if let Some(err) = self.out.error.take() {
            return Err(err);
        }
        self.out.write_held()?;
        self.out.out.flush()?;
        Ok((self.out.out, self.out.packets))
    }
}

/// A span's begin on its lane's sequence `seq`.
fn begin<W: Write>(
    seq: &mut Sequence,
    out: &mut Output<W>,
    joined: &mut FxHashMap<usize, (Args, Text)>,
    s: &Span,
) {
    if joined.len() >= JOINED_KEPT {
        // Lists not shared (an importer that makes one per span): memory stays bounded.
        joined.clear();
    }
    let joined = (!s.args.is_empty()).then(|| {
        let (_, text) = joined
            .entry(Rc::as_ptr(&s.args) as *const () as usize)
            .or_insert_with(|| (s.args.clone(), join(&s.args)));
        text
    });
    let name = seq.names.text_iid(&s.name);
    let category = seq.categories.text_iid(&s.category);
    let args = joined.map(|text| (seq.args_iid(), seq.arg_values.repeated_iid(text), text));
    let flow = s.args.iter().find_map(|(k, v)| match v {
        Arg::UInt(id) if &**k == rpc::FLOW => Some(*id),
        _ => None,
    });
    seq.emit(out, |seq, packet| {
        seq.stamp(packet, s.start_ns);
        packet.nested(11, |event| {
            event.uint(9, SLICE_BEGIN).uint(3, category).uint(10, name);
            if let Some(id) = flow {
                // `flow_ids`: slices that carry one id are joined by an arrow, in time order.
                event.fixed64(47, id);
            }
            if let Some((key, value, text)) = args {
                event.nested(4, |annotation| {
                    annotation.uint(1, key);
                    match value {
                        // `string_value_iid`, else `string_value`.
                        Some(iid) => annotation.uint(17, iid),
                        None => annotation.string(6, text),
                    };
                });
            }
        });
    });
}

/// A span's end on its lane's sequence `seq`.
fn end<W: Write>(seq: &mut Sequence, out: &mut Output<W>, s: &Span) {
    seq.emit(out, |seq, packet| {
        seq.stamp(packet, s.end_ns);
        // Field 11, `track_event`, two bytes long: its field 9, `type`, = TYPE_SLICE_END.
        const TRACK_EVENT_SLICE_END: [u8; 4] = [(11 << 3) | 2, 2, 9 << 3, SLICE_END as u8];
        packet.encoded(&TRACK_EVENT_SLICE_END);
    });
}

impl<W: Write> RecordSink for PerfettoWriter<W> {
    fn span(&mut self, span: &Span) {
        self.hold(span.clone());
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => self.process(&p),
            Record::Lane(l) => self.lane(&l),
            Record::Counter(c) => {
                let track = self.counter_track(c.process, &c.name);
                self.global_event(c.time_ns, COUNTER, track, |event| {
                    event.double(44, c.value);
                });
            }
            Record::Instant(i) => {
                let name = self.global.names.iid(&i.name);
                self.global_event(i.time_ns, INSTANT, lane_track(i.lane), |event| {
                    event.uint(10, name);
                });
            }
            Record::Buffer(_) | Record::Warning(_) | Record::Clock(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::SpanStack;
    use crate::telemetry::{LaneId, ProcessId};

    /// The records of a lane with `n` nested graph/op pairs, written by `writer`.
    fn write<W: Write>(mut writer: PerfettoWriter<W>, n: u64) -> W {
        writer.record(Record::Lane(Lane {
            id: LaneId(1),
            process: ProcessId(1),
            tid: Some(7),
            name: "thread 7".into(),
        }));
        let mut stack = SpanStack::default();
        for i in 0..n {
            let t = 1_000 * i;
            stack.open(
                2 * i + 1,
                "graph".into(),
                "graph".into(),
                t,
                Args::default(),
            );
            stack.open(
                2 * i + 2,
                "MUL_MAT".into(),
                "op".into(),
                t + 10,
                Args::default(),
            );
            writer.span(&stack.close(LaneId(1), t + 500).unwrap());
            writer.span(&stack.close(LaneId(1), t + 900).unwrap());
        }
        writer.finish().unwrap().0
    }

    /// Splits a `Trace` into its packets' bytes (field 1, length-delimited).
    fn packets(mut bytes: &[u8]) -> Vec<&[u8]> {
        let varint = |b: &mut &[u8]| {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    return v;
                }
            }
        };
        let mut out = Vec::new();
        while !bytes.is_empty() {
            assert_eq!(varint(&mut bytes), (1 << 3) | 2, "a packet field");
            let len = varint(&mut bytes) as usize;
            out.push(&bytes[..len]);
            bytes = &bytes[len..];
        }
        out
    }

    /// Deflated, the writer's packets are those it writes plain, one after another, inflated
    /// from the `compressed_packets` (field 50) of packets that hold nothing else.
    #[test]
    fn deflated_packets_inflate_to_the_plain_ones() {
        use std::io::Read;
        // More than a chunk of packets: several deflated packets.
        let n = 60_000;
        let plain = write(PerfettoWriter::new(Vec::new()), n);
        let deflated = write(PerfettoWriter::compressed(Vec::new()), n);
        assert!(plain.len() > 2 * DEFLATE_CHUNK, "{}", plain.len());
        let outer = packets(&deflated);
        assert!(outer.len() >= 2, "{}", outer.len());
        let mut inflated = Vec::new();
        for packet in outer {
            // Tag of field 50, length-delimited: 0x92 0x03; then the length and the bytes.
            assert_eq!(&packet[..2], &[0x92, 0x03]);
            let mut rest = &packet[2..];
            let (mut len, mut shift) = (0usize, 0);
            loop {
                let byte = rest[0];
                rest = &rest[1..];
                len |= usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    break;
                }
            }
            assert_eq!(rest.len(), len, "nothing else in the packet");
            flate2::read::ZlibDecoder::new(rest)
                .read_to_end(&mut inflated)
                .unwrap();
        }
        assert!(
            inflated == plain,
            "inflated packets differ from the plain ones"
        );
        assert!(deflated.len() * 5 < plain.len());
    }
}
