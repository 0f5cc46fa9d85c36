//! The trace writer: encodes what the rings hold into GGMLVIZ v1, with the reader crate's
//! `format` module (one definition of the format), and writes it. It returns every I/O error to
//! the session, which decides what a failure means.
//!
//! The first record is the metadata extension record (which is also the layout marker); names
//! of backends precede the events that use them; tensor-info records precede the first op event
//! of each tensor; counters records carry the events that could not be recorded, as running
//! totals, and always end the trace.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ggml_viz_config::Config;
use ggml_viz_format::ext::{self, Counters, Metadata};
use ggml_viz_format::{self as format, EventType, ExtensionKind, Layout, Payload};

use super::output::Output;
use super::raw::{
    BufferEdge, BufferHeld, DeviceLaneNamed, DeviceOp, GraphEdge, Kind, OpEdge, OpInfo, OpShare,
    Part, RpcEdge, SeqRemoved, ShareAndWait, SpanEdge, ThreadEdge, Wait, WorkerWait,
};
use super::tensors::{MAX_TENSORS, Tensors};

mod extensions;
mod share_records;
use share_records::ShareRecords;

use crate::base::clock::{self, TickConverter};
use crate::base::entry::Entry;
use crate::base::names::{self, Names};
use crate::base::ring::{RawEvent, Ring};
use crate::base::tensor::TensorRecord;
use crate::base::{os, say};

const GRAPH_BEGIN: u8 = EventType::GraphComputeBegin.code();
const GRAPH_END: u8 = EventType::GraphComputeEnd.code();
const OP_BEGIN: u8 = EventType::OpComputeBegin.code();
const OP_END: u8 = EventType::OpComputeEnd.code();
const BARRIER_WAIT: u8 = EventType::BarrierWait.code();
const THREAD_BEGIN: u8 = EventType::ThreadBegin.code();
const THREAD_FREE: u8 = EventType::ThreadFree.code();

/// The payload of a thread's begin or exit: nothing in it.
const NO_THREAD_PAYLOAD: Payload = Payload::Thread {
    object_ptr: 0,
    thread_index: 0,
    n_threads: 0,
    value: 0,
};

/// The encoding buffer's first capacity: one flush of a 100 ms interval at ~20,000 events/s.
const BUF_CAPACITY: usize = 1 << 20;

/// Name ids an event can carry: the name table's slots and 0 for none.
const NAME_IDS: usize = names::SLOTS + 1;

/// What one flush drains: the rings registered so far, the names and tensors their events
/// refer to, and the counters of what could not be recorded.
pub struct Drain<'a> {
    pub rings: Vec<&'static Ring>,
    pub names: &'a Names,
    pub tensors: &'a Tensors,
    pub counters: Counters,
}

pub struct TraceWriter {
    /// The file, written by a thread of its own once the header is on disk.
    output: Output,
    path: PathBuf,
    layout: Layout,
    /// Op events carry their tensor's name as label (`tensor_names`).
    tensor_names: bool,
    /// Encoding buffer, reused (and the buffers the output hands back as spares are as large).
    /// It starts at [`BUF_CAPACITY`]: memory that is reserved, not touched, until a flush
    /// fills it, where a smaller start is copied at each doubling on the way (a copy of every
    /// byte once more, each time).
    buf: Vec<u8>,
    /// The largest capacity a flush's buffer had: what the next one is taken with.
    capacity: usize,
    /// For each group of tensors (a name and op type), the tensor info last written (the reader
    /// keeps the latest of each).
    info_of_group: Vec<u16>,
    /// Buffers allocated and not yet freed: handle to size and buffer type.
    live_buffers: std::collections::BTreeMap<u64, (u64, String)>,
    /// A JSON payload being made (span records), reused.
    json: Vec<u8>,
    /// Each tensor's pair of op records, copied for its shares.
    share_records: ShareRecords,
    /// Op types whose names were written.
    op_names_written: rustc_hash::FxHashSet<u32>,
    labels: Labels,
    /// Names already written in a backend_names record.
    names_written: usize,
    counters_written: Counters,
    closed: bool,
    clock: TickConverter,
    /// Per ring (one thread's), the latest time its events were converted to.
    floors: Vec<u64>,
}

impl TraceWriter {
    /// A writer on the opened trace `file`, which starts with the header and the metadata record
    /// (also the layout marker). On error: the path and what failed.
    pub fn create(
        file: File,
        path: PathBuf,
        layout: Layout,
        config: &Config,
        metadata: &Metadata,
    ) -> Result<TraceWriter, (PathBuf, io::Error)> {
        // The header and metadata are written here, so that an unwritable file is said at once.
        let mut head = Vec::new();
        format::encode_header(&mut head);
        ext::encode_extension(
            &mut head,
            layout,
            ExtensionKind::Metadata,
            clock::now_ns(),
            0,
            metadata,
        );
        let mut file = file;
        if let Err(err) = os::without_sigxfsz(|| file.write_all(&head)) {
            return Err((path, err));
        }
        Ok(TraceWriter {
            output: Output::new(file),
            path,
            layout,
            tensor_names: config.tensor_names,
            buf: Vec::with_capacity(BUF_CAPACITY),
            capacity: BUF_CAPACITY,
            labels: Labels::default(),
            info_of_group: Vec::new(),
            live_buffers: Default::default(),
            json: Vec::new(),
            share_records: ShareRecords::default(),
            op_names_written: Default::default(),
            names_written: 0,
            counters_written: Counters::default(),
            closed: false,
            clock: TickConverter::new(),
            floors: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Hands what was encoded to the output; nothing at all when nothing was. The next flush
    /// takes a buffer of the same capacity ([`TraceWriter::flush`]); what is encoded after the
    /// last one (the closing records) goes in a small one of its own.
    fn write_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.capacity = self.capacity.max(self.buf.capacity());
        self.output.write(std::mem::take(&mut self.buf))
    }

    /// Drains every ring into the file, with new names and changed counters: how many events.
    /// After an error the writer is closed: nothing more is written.
    pub fn flush(&mut self, d: Drain<'_>) -> io::Result<usize> {
        if self.closed {
            return Ok(0);
        }
        // Before draining: every event drained now is older than this calibration point, or a
        // few microseconds newer.
        self.clock.recalibrate();
        if self.buf.capacity() == 0 {
            self.buf = self.output.buffer(self.capacity);
        }
        // Names come before the events that use them: the names known now, then the events,
        // then (in front of those events) the names interned while they were drained, which
        // cover every event drained (a name is interned before an event that uses it is
        // pushed).
        self.encode_new_names(d.names);
        let events_at = self.buf.len();
        let mut drained = 0;
        self.floors.resize(self.floors.len().max(d.rings.len()), 0);
        for (i, ring) in d.rings.iter().enumerate() {
            // A ring is one thread's: its events are converted against that thread's floor.
            let mut floor = self.floors[i];
            // SAFETY: the writer's lock is held by our caller, so this is the only consumer.
            drained += unsafe { ring.drain(|event| self.encode(event, &d, &mut floor)) };
            self.floors[i] = floor;
        }
        let names_at = self.buf.len();
        self.encode_new_names(d.names);
        let names_len = self.buf.len() - names_at;
        if names_len > 0 {
            self.buf[events_at..].rotate_right(names_len);
        }
        if d.counters != self.counters_written {
            self.encode_counters(d.counters);
        }
        let written = self.write_buf();
        self.closed = written.is_err();
        written.map(|()| drained)
    }

    /// The last flush: the buffers still live (with memory tracking), final counters, said on
    /// stderr when events were lost.
    pub fn close(&mut self, d: Drain<'_>, memory_tracking: bool) -> io::Result<()> {
        self.flush(d)?;
        // The writes so far are made by the output's thread: their errors are known once it is
        // done with them.
        if let Err(err) = self.output.sync() {
            self.closed = true;
            return Err(err);
        }
        if self.closed {
            return Ok(());
        }
        let counters = self.counters_written;
        if memory_tracking {
            let buffers = self
                .live_buffers
                .iter()
                .map(|(&ptr, (size, buft))| ext::LiveBuffer {
                    ptr,
                    size: *size,
                    buffer_type: buft.clone(),
                })
                .collect();
            let live = ext::LiveBuffers { buffers };
            self.encode_own(ExtensionKind::LiveBuffers, &live);
        }
        // Always end with a counters record: "nothing lost" is then written, not assumed.
        self.encode_counters(counters);
        let _ = self.write_buf();
        let _ = self.output.sync();
        self.closed = true;
        if counters.lost() > 0 {
            say(format_args!(
                "{} event(s) were not recorded in {}: {} dropped with a full ring (raise GGML_VIZ_BUFFER_SIZE), \
                 {} over GGML_VIZ_MAX_EVENTS, {} while tracing started",
                counters.lost(),
                self.path.display(),
                counters.dropped_ring_full,
                counters.over_max_events,
                counters.missed_while_starting
            ));
        }
        if counters.incomplete() > 0 {
            say(format_args!(
                "{} event(s) in {} lack what they should carry: {} without their object's name \
                 (the name table holds {} names), {} op event(s) without tensor info (the tensor \
                 table holds {} tensors)",
                counters.incomplete(),
                self.path.display(),
                counters.unnamed,
                names::SLOTS,
                counters.without_tensor_info,
                MAX_TENSORS
            ));
        }
        if counters.rpc_calls_unfollowed > 0 {
            say(format_args!(
                "{} ggml-rpc transport call(s) in {} not followed (the connection table was busy \
                 or full of live connections): their commands are not recorded",
                counters.rpc_calls_unfollowed,
                self.path.display(),
            ));
        }
        Ok(())
    }

    /// One event of the thread whose latest conversion is `floor`. Op shares and worker
    /// threads' barrier waits, most of a trace with op timing, take paths of their own, without
    /// the others' frame.
    #[inline(always)]
    fn encode(&mut self, e: &RawEvent, d: &Drain<'_>, floor: &mut u64) {
        match Kind::of(e) {
            Some(Kind::OpShare) => {
                self.encode_share(&OpShare::of(e), e.ticks, e.thread_id, d, floor)
            }
            Some(Kind::WorkerWait) => self.encode_worker_wait(&WorkerWait::of(e), e, floor),
            Some(Kind::ShareAndWait | Kind::BeginAndWait | Kind::EndAndWait) => {
                let pair = ShareAndWait::of(e);
                let (op, thread_id) = (&pair.share.op, e.thread_id);
                let wait_began = e.ticks.wrapping_sub(u64::from(pair.waited));
                match pair.part {
                    Part::Whole => self.encode_share(&pair.share, wait_began, thread_id, d, floor),
                    Part::Begin => {
                        let begun = wait_began.wrapping_sub(u64::from(pair.share.took));
                        let begin_ns = self.clock.convert_epoch_ns(begun, floor);
                        self.encode_op_begin(op, thread_id, begin_ns, d);
                    }
                    Part::End => {
                        let end_ns = self.clock.convert_epoch_ns(wait_began, floor);
                        self.encode_op_end(op, thread_id, end_ns);
                    }
                }
                let wait = WorkerWait {
                    threadpool: 0,
                    ith: u32::from(pair.ith),
                    nth: u32::from(pair.nth),
                    waited: u64::from(pair.waited),
                };
                self.encode_worker_wait(&wait, e, floor);
            }
            Some(Kind::OpBegin | Kind::OpEnd) => {
                let edge = OpEdge::of(e);
                let timestamp_ns = self.clock.convert_epoch_ns(e.ticks, floor);
                if edge.begin {
                    self.encode_op_begin(&edge.op, e.thread_id, timestamp_ns, d);
                } else {
                    self.encode_op_end(&edge.op, e.thread_id, timestamp_ns);
                }
            }
            Some(kind) => self.encode_other(kind, e, d, floor),
            None => {}
        }
    }

    /// A worker thread's wait at `ggml_barrier` (threads-mode op timing), which no entry point
    /// records: labelled for the function.
    #[inline(always)]
    fn encode_worker_wait(&mut self, w: &WorkerWait, e: &RawEvent, floor: &mut u64) {
        let timestamp_ns = self.clock.convert_epoch_ns(e.ticks, floor);
        let payload = Payload::Thread {
            object_ptr: w.threadpool,
            thread_index: w.ith,
            n_threads: w.nth,
            value: self.clock.to_ns(w.waited),
        };
        format::encode_record(
            &mut self.buf,
            self.layout,
            BARRIER_WAIT,
            timestamp_ns,
            e.thread_id,
            &payload,
            Some(b"ggml_barrier"),
        );
    }

    /// [`TraceWriter::encode`] of any event but an op event or a worker's wait.
    #[inline(never)]
    fn encode_other(&mut self, kind: Kind, e: &RawEvent, d: &Drain<'_>, floor: &mut u64) {
        if kind == Kind::DeviceLane || kind == Kind::DeviceOp {
            return self.encode_device(kind, e, d);
        }
        let timestamp_ns = self.clock.convert_epoch_ns(e.ticks, floor);
        let (type_code, payload, entry, name_id) = match kind {
            Kind::GraphBegin | Kind::GraphEnd => {
                let g = GraphEdge::of(e);
                let payload = Payload::Graph {
                    graph_ptr: g.info.graph as u64,
                    n_nodes: g.info.n_nodes,
                    n_threads: g.info.n_threads,
                    backend_ptr: g.info.backend as u64,
                };
                let ty = if g.begin { GRAPH_BEGIN } else { GRAPH_END };
                (ty, payload, g.entry, g.info.name_id)
            }
            Kind::Wait => {
                let w = Wait::of(e);
                let payload = Payload::Thread {
                    object_ptr: w.object,
                    thread_index: 0,
                    n_threads: 0,
                    value: self.clock.to_ns(w.waited),
                };
                (BARRIER_WAIT, payload, w.entry, w.name_id)
            }
            Kind::ThreadBegin | Kind::ThreadFree => {
                let t = ThreadEdge::of(e);
                let ty = if t.begin { THREAD_BEGIN } else { THREAD_FREE };
                (ty, NO_THREAD_PAYLOAD, 0, t.name_id)
            }
            Kind::BufferAlloc | Kind::BufferFree => {
                return self.encode_buffer(&BufferEdge::of(e), e.thread_id, timestamp_ns, d);
            }
            Kind::BufferUse => {
                return self.encode_buffer_use(&BufferHeld::of(e), e.thread_id, timestamp_ns);
            }
            Kind::SpanBegin | Kind::SpanEnd => {
                return self.encode_span(&SpanEdge::of(e), e.thread_id, timestamp_ns);
            }
            Kind::SeqRmBegin | Kind::SeqRmEnd => {
                return self.encode_seq_removed(&SeqRemoved::of(e), e.thread_id, timestamp_ns);
            }
            Kind::RpcBegin | Kind::RpcEnd => {
                return self.encode_rpc(&RpcEdge::of(e), e.thread_id, timestamp_ns, d.names);
            }
            // Taken by `encode` and above.
            Kind::OpBegin
            | Kind::OpEnd
            | Kind::OpShare
            | Kind::WorkerWait
            | Kind::ShareAndWait
            | Kind::BeginAndWait
            | Kind::EndAndWait
            | Kind::DeviceLane
            | Kind::DeviceOp => return,
        };
        let label = self.labels.get(entry, name_id, d.names);
        format::encode_record(
            &mut self.buf,
            self.layout,
            type_code,
            timestamp_ns,
            e.thread_id,
            &payload,
            (!label.is_empty()).then_some(label),
        );
    }

    /// A thread's whole share of a node, which ended at `ended` ticks on thread `thread_id`: both
    /// records.
    #[inline(always)]
    fn encode_share(
        &mut self,
        share: &OpShare,
        ended: u64,
        thread_id: u32,
        d: &Drain<'_>,
        floor: &mut u64,
    ) {
        let begun = ended.wrapping_sub(u64::from(share.took));
        let begin_ns = self.clock.convert_epoch_ns(begun, floor);
        let end_ns = self.clock.convert_epoch_ns(ended, floor);
        self.encode_op(&share.op, thread_id, begin_ns, end_ns, d);
    }

    /// An op's end record, which carries no label: readers take the node from its begin.
    #[inline(always)]
    fn encode_op_end(&mut self, op: &OpInfo, thread_id: u32, timestamp_ns: u64) {
        format::encode_record(
            &mut self.buf,
            self.layout,
            OP_END,
            timestamp_ns,
            thread_id,
            &op_payload(op),
            None,
        );
    }

    /// A device's event (see `device`): on its queue's lane, its time monotonic nanoseconds; a
    /// node's one slot written as its begin and end records.
    #[inline(never)]
    fn encode_device(&mut self, kind: Kind, e: &RawEvent, d: &Drain<'_>) {
        let timestamp_ns = clock::monotonic_epoch_ns(e.ticks);
        if kind == Kind::DeviceOp {
            let node = DeviceOp::of(e);
            let begin_ns = timestamp_ns.saturating_sub(u64::from(node.took));
            self.encode_op(&node.op, node.lane, begin_ns, timestamp_ns, d);
        } else {
            let lane = DeviceLaneNamed::of(e);
            let label = d
                .names
                .get(lane.name_id)
                .map(|(_, _, name)| name.as_bytes());
            format::encode_record(
                &mut self.buf,
                self.layout,
                THREAD_BEGIN,
                timestamp_ns,
                lane.lane,
                &NO_THREAD_PAYLOAD,
                label,
            );
        }
    }

    /// The begin record of `op` on thread `thread_id`, at `timestamp_ns`, after its tensor info
    /// where the reader does not have it yet.
    #[inline(always)]
    fn encode_op_begin(&mut self, op: &OpInfo, thread_id: u32, timestamp_ns: u64, d: &Drain<'_>) {
        let info = d.tensors.get(op.tensor_id);
        if let Some(info) = info {
            let group = info.group as usize;
            if self.info_of_group.len() <= group {
                self.info_of_group.resize(group + 1, 0);
            }
            if self.info_of_group[group] != op.tensor_id {
                self.info_of_group[group] = op.tensor_id;
                self.encode_tensor_info(info, timestamp_ns, thread_id);
            }
        }
        let label = info
            .filter(|_| self.tensor_names)
            .map(|i| i.name.as_bytes());
        format::encode_record(
            &mut self.buf,
            self.layout,
            OP_BEGIN,
            timestamp_ns,
            thread_id,
            &op_payload(op),
            label,
        );
    }

    /// A tensor info (written again wherever another tensor of its name and op came between:
    /// the prompt's graph and a generation step's give a node other shapes), preceded by the
    /// name of its op type the first time.
    fn encode_tensor_info(&mut self, info: &TensorRecord, timestamp_ns: u64, thread_id: u32) {
        if let Some(op_type) = info.op_type
            && self.op_names_written.insert(op_type)
        {
            let mut names = ext::OpNames::default();
            names
                .names
                .insert(op_type.to_string(), info.op_name.to_string());
            ext::encode_extension(
                &mut self.buf,
                self.layout,
                ExtensionKind::OpNames,
                timestamp_ns,
                thread_id,
                &names,
            );
        }
        ext::encode_extension_json(
            &mut self.buf,
            self.layout,
            ExtensionKind::TensorInfo,
            timestamp_ns,
            thread_id,
            &info.json,
        );
    }
}

/// An op event's payload.
#[inline(always)]
fn op_payload(op: &OpInfo) -> Payload {
    Payload::Op {
        tensor_ptr: op.tensor as u64,
        op_type: op.op_type,
        op_size: op.op_size,
        backend_ptr: op.backend as u64,
    }
}

/// Labels by entry point and name id (at `[entry][name_id]`, each row as long as the largest id
/// met): built once, not per event, and found without hashing.
#[derive(Default)]
struct Labels(Vec<Vec<Option<Box<[u8]>>>>);

impl Labels {
    /// The label of an event of the wrapper of `entry` for the object named `name_id` (see
    /// [`label_of`]).
    fn get(&mut self, entry: u8, name_id: u16, names: &Names) -> &[u8] {
        let (row, column) = (entry as usize, name_id as usize % NAME_IDS);
        if self.0.len() <= row {
            self.0.resize(row + 1, Vec::new());
        }
        let labels = &mut self.0[row];
        if labels.len() <= column {
            labels.resize(column + 1, None);
        }
        labels[column].get_or_insert_with(|| label_of(entry, name_id, names).into())
    }
}

/// An event's label: the entry point and the backend or scheduler name (`ggml_backend_graph_compute_async CPU`).
fn label_of(entry: u8, name_id: u16, names: &Names) -> Vec<u8> {
    let entry = Entry::from_code(entry);
    let mut label = entry.map(Entry::name).unwrap_or_default().to_string();
    let interned = names
        .get(name_id)
        .map(|(_, _, name)| name)
        .filter(|n| !n.is_empty());
    if let Some(name) = interned.or_else(|| entry.and_then(Entry::implied_backend)) {
        if !label.is_empty() {
            label.push(' ');
        }
        label.push_str(name);
    }
    label.into_bytes()
}
