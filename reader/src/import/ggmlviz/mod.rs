//! GGMLVIZ traces into the telemetry model: graph and op pairs become nested spans per thread,
//! synchronize waits short spans, llama_decode spans spans, buffer events a live-bytes counter per
//! buffer type.
//!
//! Pairs are matched by nesting order on their thread; an op end must carry its begin's
//! `tensor_ptr`. The C++ tool's own sample has crossing op pairs (begin A, begin B, end A, end
//! B): such an end is paired with its own begin by tensor, and reported with its byte offset.
//! Ends without a begin and begins never ended are reported too, never dropped silently.
//!
//! Besides the importer's core here: `templates` (one span per distinct begin, shared),
//! `describe` (what a begin's span is called, its category and arguments), `extensions`
//! (the writer's extension records: names, tensor infos, spans, RPC parts, counters) and
//! `buffers_threads` (buffer events as live bytes, thread events as lanes).

use rustc_hash::FxHashMap as HashMap;

use crate::format::Damage;
use crate::format::{Event, EventType, ExtensionKind, Payload, RecordView};
use crate::read::Events;
use crate::read::NameTables;
use crate::telemetry::Span;
use crate::telemetry::{
    Arg, Args, Clock, Closed, Ids, Lane, Process, Record, RecordSink, SpanStack, Text, Texts,
    clock_of,
};
use crate::telemetry::{LaneId, ProcessId};

use super::sequences::{self, Sequences};
use templates::{BeginKey, TemplateId, Templates, begin_key};

mod buffers_threads;
mod describe;
mod extensions;
mod templates;

#[derive(Default)]
struct Thread {
    lane: LaneId,
    stack: SpanStack<Opened>,
    /// The template of this thread's last graph, op and barrier begin (by [`BeginKey`]'s kind):
    /// the begin after it is most likely the one that followed it before.
    last: [Option<TemplateId>; 3],
}

/// What an open span carries: graph/op/other, the op's tensor pointer, and what it is called.
struct Opened {
    kind: Kind,
    tensor: u64,
    named: Named,
}

/// What an open span is called: a described begin's template, or its own.
enum Named {
    Template(TemplateId),
    Own(Box<Span>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Graph,
    Op,
    Call,
    /// A part of a ggml-rpc command.
    Rpc,
}

/// An end event: the span it closes (its kind, and its tensor for an op), on which thread, when;
/// its byte offset and the input's name, for warnings.
#[derive(Clone, Copy)]
struct End<'a> {
    tid: u32,
    kind: Kind,
    tensor: u64,
    ts: u64,
    offset: u64,
    input: &'a str,
}

impl<'a> End<'a> {
    fn of(e: &Event<'_>, kind: Kind, tensor: u64, offset: u64, input: &'a str) -> End<'a> {
        End {
            tid: e.thread_id,
            kind,
            tensor,
            ts: e.timestamp_ns,
            offset,
            input,
        }
    }

    /// Whether this ends `open`: its kind, and for an op its tensor.
    fn ends(&self, open: &Opened) -> bool {
        open.kind == self.kind && (self.kind != Kind::Op || open.tensor == self.tensor)
    }
}

struct Importer<'s, S: RecordSink> {
    sink: &'s mut S,
    ids: &'s mut Ids,
    process: ProcessId,
    /// Threads in the order first met; `thread_of` finds one by id, `last_thread` skips that
    /// lookup while events keep coming from one thread.
    threads: Vec<Thread>,
    thread_of: HashMap<u32, usize>,
    /// (None before any: a sentinel thread id would be a real one, `u32::MAX` included).
    last_thread: Option<(u32, usize)>,
    names: NameTables,
    live: HashMap<String, i64>,
    buffers: HashMap<u64, (String, u64)>,
    last_ns: u64,
    clock_said: bool,
    texts: Texts,
    /// By label, the template made for each distinct graph, op or barrier begin payload (see
    /// [`BeginKey`]): forgotten when a record it was made from changes.
    described: HashMap<Box<[u8]>, Vec<(BeginKey, TemplateId)>>,
    templates: Templates,
    /// By span id, the sequences of each open decode span whose batch named them.
    batches: HashMap<u64, Vec<(i32, u32)>>,
    sequences: Sequences,
    sequence_names: sequences::SequenceNames,
    graph_category: Text,
    op_category: Text,
    wait_category: Text,
    call_category: Text,
    no_args: Args,
}

/// The type codes of the records that open or close a span.
const GRAPH_BEGIN: u8 = EventType::GraphComputeBegin as u8;
const GRAPH_END: u8 = EventType::GraphComputeEnd as u8;
const OP_BEGIN: u8 = EventType::OpComputeBegin as u8;
const OP_END: u8 = EventType::OpComputeEnd as u8;
const BARRIER_WAIT: u8 = EventType::BarrierWait as u8;

/// Whether records of type `code` open or close a span: graph and op begins and ends, and
/// barrier waits (a span each).
#[inline(always)]
fn is_span_event(code: u8) -> bool {
    code <= OP_END || code == BARRIER_WAIT
}

/// A span named `name` in `category` with `args`, its place and times still to be written.
fn unplaced(name: Text, category: Text, args: Args) -> Span {
    Span {
        id: 0,
        parent: None,
        depth: 0,
        lane: LaneId(0),
        name,
        category,
        start_ns: 0,
        end_ns: 0,
        self_ns: 0,
        args,
    }
}

/// Imports the trace in `file` (header included) read with `layout`. `name` names the process
/// when the trace has no metadata record. Returns the damage that ended the read, if any (also
/// reported as a warning).
pub fn import<S: RecordSink>(
    file: &[u8],
    layout: crate::format::Layout,
    name: &str,
    ids: &mut Ids,
    sink: &mut S,
) -> Option<Damage> {
    let mut events = Events::new(file, layout);
    let mut import = Import::new(name, ids, sink);
    loop {
        let offset = events.offset();
        let Some(item) = events.next() else { break };
        if !import.item(offset, item.as_ref().map_err(Clone::clone)) {
            break;
        }
    }
    import.finish()
}

/// One trace's import, fed event by event (from a mapped file, or a stream read with bounded
/// memory, whose events borrow the reader's buffer).
pub struct Import<'s, S: RecordSink> {
    imp: Importer<'s, S>,
    name: &'s str,
    named: bool,
    damage: Option<Damage>,
}

impl<'s, S: RecordSink> Import<'s, S> {
    pub fn new(name: &'s str, ids: &'s mut Ids, sink: &'s mut S) -> Import<'s, S> {
        let process = ids.process();
        let mut texts = Texts::default();
        let sequence_names = sequences::SequenceNames::new(&mut texts);
        let imp = Importer {
            sink,
            ids,
            process,
            threads: Vec::new(),
            thread_of: HashMap::default(),
            last_thread: None,
            names: NameTables::default(),
            live: HashMap::default(),
            buffers: HashMap::default(),
            last_ns: 0,
            clock_said: false,
            texts,
            described: HashMap::default(),
            templates: Templates::default(),
            batches: HashMap::default(),
            sequences: Sequences::default(),
            sequence_names,
            graph_category: "graph".into(),
            op_category: "op".into(),
            wait_category: "wait".into(),
            call_category: "llama".into(),
            no_args: Args::default(),
        };
        Import {
            imp,
            name,
            named: false,
            damage: None,
        }
    }

    /// The event (or damage) that begins at byte `offset`; false once nothing more is to be read.
    #[inline(always)]
    pub fn item(&mut self, offset: u64, item: Result<&Event<'_>, Damage>) -> bool {
        let name = self.name;
        match item {
            Err(d) => {
                self.imp
                    .sink
                    .record(Record::Warning(format!("{name}: {d}")));
                self.damage = Some(d);
                false
            }
            Ok(e) => {
                if !self.named
                    && !matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::Metadata)
                {
                    self.imp.sink.record(Record::Process(Process {
                        id: self.imp.process,
                        name: name.into(),
                        ..Process::default()
                    }));
                }
                self.named = true;
                self.imp.event(e, offset, name);
                true
            }
        }
    }

    /// [`Import::item`] of a record as it lies: graph and op begins and ends and barrier waits,
    /// most of a trace, are read straight from its bytes, the rest decoded whole.
    #[inline(always)]
    pub fn record(&mut self, offset: u64, record: RecordView<'_>) -> bool {
        let code = record.type_code();
        let started = self.named && self.imp.clock_said;
        if started && code <= OP_END {
            self.span_record(offset, record);
            return true;
        }
        if started && code == BARRIER_WAIT {
            self.wait_record(offset, record);
            return true;
        }
        self.item(offset, Ok(&record.event()))
    }

    /// [`Import::record`] of a span's record, once the first event has been seen.
    #[inline(always)]
    fn span_record(&mut self, offset: u64, record: RecordView<'_>) {
        let label = record.label().unwrap_or_default();
        let (code, tid, ts) = (
            record.type_code(),
            record.thread_id(),
            record.timestamp_ns(),
        );
        self.imp.last_ns = self.imp.last_ns.max(ts);
        let payload = record.payload();
        self.imp
            .span_event(code, tid, ts, label, payload, offset, self.name);
    }

    /// [`Import::span_record`] of a barrier wait, out of line: the begins' and ends' path stays
    /// small.
    #[inline(never)]
    fn wait_record(&mut self, offset: u64, record: RecordView<'_>) {
        self.span_record(offset, record)
    }

    /// Closes what is still open; the damage that ended the read, if any.
    pub fn finish(mut self) -> Option<Damage> {
        self.imp.finish(self.name);
        self.damage
    }
}

impl<S: RecordSink> Importer<'_, S> {
    #[inline(always)]
    fn thread(&mut self, tid: u32) -> &mut Thread {
        let i = self.thread_at(tid);
        &mut self.threads[i]
    }

    /// The index of thread `tid` in [`Importer::threads`].
    #[inline(always)]
    fn thread_at(&mut self, tid: u32) -> usize {
        match self.last_thread {
            Some((last, i)) if last == tid => i,
            _ => self.thread_index(tid),
        }
    }

    fn thread_index(&mut self, tid: u32) -> usize {
        self.thread_named(tid, None)
    }

    /// [`Importer::thread_index`]; a thread met first here gets its lane named `name` (a
    /// THREAD_BEGIN's label) rather than `thread <tid>`, described once.
    fn thread_named(&mut self, tid: u32, name: Option<String>) -> usize {
        let i = match self.thread_of.get(&tid) {
            Some(&i) => i,
            None => {
                let lane = self.ids.lane();
                self.sink.record(Record::Lane(Lane {
                    id: lane,
                    process: self.process,
                    tid: Some(tid as u64),
                    name: name.unwrap_or_else(|| format!("thread {tid}")),
                }));
                self.threads.push(Thread {
                    lane,
                    ..Thread::default()
                });
                self.thread_of.insert(tid, self.threads.len() - 1);
                self.threads.len() - 1
            }
        };
        self.last_thread = Some((tid, i));
        i
    }

    /// One event: spans' begins and ends here, on the path every op takes; the rest (records
    /// met once, memory and thread events) out of line, so that this stays small.
    #[inline(always)]
    fn event(&mut self, e: &Event<'_>, offset: u64, name: &str) {
        if !self.clock_said || matches!(e.payload, Payload::Extension(_)) {
            return self.rare_event(e.clone(), offset, name);
        }
        self.last_ns = self.last_ns.max(e.timestamp_ns);
        if is_span_event(e.type_code) {
            let label: &[u8] = e.label.as_deref().unwrap_or_default();
            let (code, tid, ts) = (e.type_code, e.thread_id, e.timestamp_ns);
            self.span_event(code, tid, ts, label, e.payload, offset, name)
        } else {
            self.other_event(e.clone())
        }
    }

    /// A graph or op begin or end or a barrier wait (see [`is_span_event`]) from its parts;
    /// `offset` and `input` (the input's name) for warnings.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn span_event(
        &mut self,
        code: u8,
        tid: u32,
        ts: u64,
        label: &[u8],
        payload: Payload,
        offset: u64,
        input: &str,
    ) {
        let end = |kind, tensor| End {
            tid,
            kind,
            tensor,
            ts,
            offset,
            input,
        };
        match (code, payload) {
            (GRAPH_BEGIN, Payload::Graph { .. }) | (OP_BEGIN, Payload::Op { .. }) => {
                let template = self.template(tid, label, &payload);
                let (kind, tensor) = match payload {
                    Payload::Op { tensor_ptr, .. } => (Kind::Op, tensor_ptr),
                    _ => (Kind::Graph, 0),
                };
                let named = Named::Template(template);
                let opened = Opened {
                    kind,
                    tensor,
                    named,
                };
                self.open(tid, opened, ts);
            }
            (GRAPH_END, _) => self.close(end(Kind::Graph, 0)),
            (OP_END, Payload::Op { tensor_ptr, .. }) => self.close(end(Kind::Op, tensor_ptr)),
            (BARRIER_WAIT, Payload::Thread { value, .. }) => {
                self.wait(label, &payload, value, end(Kind::Call, 0))
            }
            _ => {}
        }
    }

    /// A barrier wait, one record at its end (`end`): a span from `waited` ns before it.
    #[inline(always)]
    fn wait(&mut self, label: &[u8], payload: &Payload, waited: u64, end: End<'_>) {
        let named = Named::Template(self.template(end.tid, label, payload));
        let (kind, tensor) = (Kind::Call, 0);
        let opened = Opened {
            kind,
            tensor,
            named,
        };
        self.open(end.tid, opened, end.ts.saturating_sub(waited));
        self.close(end);
    }

    /// [`Importer::event`] of an extension record, or of the first event (which says what clock
    /// the trace's timestamps are on).
    #[cold]
    #[inline(never)]
    fn rare_event(&mut self, e: Event<'_>, offset: u64, name: &str) {
        if let Payload::Extension(x) = e.payload {
            let label = e.label.as_deref().unwrap_or_default();
            return self.extension(x.kind, &e, label);
        }
        self.clock_said = true;
        let clock = clock_of(e.timestamp_ns);
        self.sink.record(Record::Clock(clock));
        if clock == Clock::Relative {
            self.sink.record(Record::Warning(format!(
                "{name}: timestamps are not nanoseconds since the epoch (first: {} ns); kept relative to this trace",
                e.timestamp_ns
            )));
        }
        self.event(&e, offset, name);
    }

    /// The template of the span a graph, op or barrier begin with `label` and `payload` opens:
    /// made once per distinct begin (the same node every graph), then shared.
    /// A thread's begins come in the order they came before (the same graph, every token): the
    /// template that followed the thread's last one of the kind is tried first.
    #[inline(always)]
    fn template(&mut self, tid: u32, label: &[u8], payload: &Payload) -> TemplateId {
        let key = begin_key(payload);
        let kind = key[0] as usize;
        let thread = self.thread_at(tid);
        let last = self.threads[thread].last[kind];
        let found = match last.and_then(|t| self.templates.after(t, label, &key)) {
            Some(next) => next,
            None => {
                let found = self.find_template(label, key, *payload);
                if let Some(t) = last {
                    self.templates.get_mut(t).next = Some(found);
                }
                found
            }
        };
        self.threads[thread].last[kind] = Some(found);
        found
    }

    /// [`Importer::template`] by label and key, made if it is new.
    fn find_template(&mut self, label: &[u8], key: BeginKey, payload: Payload) -> TemplateId {
        if let Some(known) = self.described.get(label)
            && let Some(&(_, made)) = known.iter().find(|(k, _)| *k == key)
        {
            return made;
        }
        let made = self.describe(&String::from_utf8_lossy(label), payload);
        let made = self.templates.add(made, label, key);
        self.described
            .entry(label.into())
            .or_default()
            .push((key, made));
        made
    }

    #[inline(always)]
    fn open(&mut self, tid: u32, opened: Opened, ts: u64) {
        let id = self.ids.span();
        self.thread(tid).stack.push(id, ts, opened);
    }

    #[inline(always)]
    fn close(&mut self, end: End<'_>) {
        if let Some((span, lane)) = self.close_span(end) {
            self.deliver(span, lane);
        }
    }

    /// Lends the sink the span `closed` on `lane`.
    #[inline]
    fn deliver(&mut self, closed: Closed<Opened>, lane: LaneId) {
        let mut own;
        let span = match closed.naming.named {
            Named::Template(t) => &mut self.templates.get_mut(t).span,
            Named::Own(span) => {
                own = span;
                &mut *own
            }
        };
        closed.place.write(lane, span);
        self.sink.span(span);
    }

    /// The span `closed` on `lane`, owned: for a span that gets more arguments.
    fn owned(&self, closed: Closed<Opened>, lane: LaneId) -> Span {
        let mut span = match closed.naming.named {
            Named::Template(t) => self.templates.get(t).span.clone(),
            Named::Own(span) => *span,
        };
        closed.place.write(lane, &mut span);
        span
    }

    /// Closes the open span that `end` ends, and returns it with its lane; problems (no begin,
    /// crossing pairs) are warnings.
    #[inline(always)]
    fn close_span(&mut self, end: End<'_>) -> Option<(Closed<Opened>, LaneId)> {
        let t = self.thread(end.tid);
        if t.stack.top().is_some_and(|o| end.ends(&o.naming)) {
            let lane = t.lane;
            return t.stack.pop(end.ts).map(|c| (c, lane));
        }
        self.close_below(end)
    }

    /// Slots of templates no begin will find again: free once no open span names them.
    fn retire(&mut self, gone: impl IntoIterator<Item = TemplateId>) {
        let open: Vec<TemplateId> = (self.threads.iter())
            .flat_map(|t| t.stack.iter())
            .filter_map(|o| match o.naming.named {
                Named::Template(t) => Some(t),
                Named::Own(_) => None,
            })
            .collect();
        self.templates.retire(gone, &open);
    }

    /// [`Importer::close_span`] when the span it closes is not the innermost.
    #[cold]
    #[inline(never)]
    fn close_below(&mut self, end: End<'_>) -> Option<(Closed<Opened>, LaneId)> {
        let End {
            tid,
            kind,
            tensor,
            offset,
            input,
            ..
        } = end;
        let t = self.thread(tid);
        let lane = t.lane;
        let Some(i) = t.stack.iter().rposition(|o| end.ends(&o.naming)) else {
            self.sink.record(Record::Warning(format!(
                "{input}: {kind:?} end at byte offset {offset} has no begin on thread {tid}; ignored"
            )));
            return None;
        };
        // Crossing pairs: the right begin is closed, the spans begun after it stay open.
        let crossed = t.stack.depth() - 1 - i;
        let span = t.stack.remove(i, end.ts);
        self.sink.record(Record::Warning(format!(
            "{input}: {kind:?} end at byte offset {offset} (tensor {tensor:#x}) crosses {crossed} span(s) begun after its begin; paired with its own begin"
        )));
        span.map(|s| (s, lane))
    }

    fn finish(&mut self, name: &str) {
        let end = self.last_ns;
        let mut open = 0;
        for i in 0..self.threads.len() {
            let lane = self.threads[i].lane;
            while let Some(closed) = self.threads[i].stack.pop(end) {
                let mut span = self.owned(closed, lane);
                let unfinished = ("unfinished".into(), Arg::UInt(1));
                span.args = span.args.iter().cloned().chain([unfinished]).collect();
                open += 1;
                self.sink.span(&span);
            }
        }
        self.sequences.finish(self.sink, &self.sequence_names);
        if open > 0 {
            self.sink.record(Record::Warning(format!(
                "{name}: {open} span(s) begun and never ended; closed at the last timestamp and marked unfinished"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::templates::same_bytes;
    use super::*;

    /// Against `==`, for every length a label can have here and a difference at every place.
    #[test]
    fn same_bytes_is_equality() {
        let a: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for n in 0..=a.len() {
            let x = &a[..n];
            let copy = x.to_vec();
            assert!(same_bytes(x, &copy), "{n}");
            for at in 0..n {
                let mut y = x.to_vec();
                y[at] ^= 0x20;
                assert!(!same_bytes(x, &y), "{n} {at}");
            }
            if n > 0 {
                assert!(
                    !same_bytes(x, &a[..n - 1]) && !same_bytes(&a[..n - 1], x),
                    "{n}"
                );
            }
        }
    }

    /// A thread whose id is `u32::MAX` (any id a trace holds is possible) is a thread like any
    /// other: its graph compute becomes one span on its own lane (found by fuzzing the RPC
    /// analysis: the importer took that id for "no thread yet" and indexed past its threads).
    #[test]
    fn the_largest_thread_id_is_a_thread() {
        use crate::format::{self, Event, Layout, Payload};
        let mut file = Vec::new();
        format::encode_header(&mut file);
        let graph = Payload::Graph {
            graph_ptr: 0x1000,
            n_nodes: 1,
            n_threads: 1,
            backend_ptr: 0,
        };
        for (type_code, ts) in [(0, 100), (1, 250)] {
            let e = Event {
                type_code,
                timestamp_ns: ts,
                thread_id: u32::MAX,
                payload: graph,
                label: None,
            };
            format::encode_event(&mut file, Layout::Packed, &e);
        }
        let mut collected = crate::telemetry::Collected::default();
        let damage = import(
            &file,
            Layout::Packed,
            "t",
            &mut Ids::default(),
            &mut collected,
        );
        assert_eq!(damage, None);
        let lanes: Vec<_> = collected.lanes.iter().map(|l| l.tid).collect();
        assert_eq!(lanes, [Some(u64::from(u32::MAX))]);
        let spans: Vec<_> = (collected.spans.iter())
            .map(|s| (s.start_ns, s.end_ns, s.lane == collected.lanes[0].id))
            .collect();
        assert_eq!(spans, [(100, 250, true)]);
    }
}
