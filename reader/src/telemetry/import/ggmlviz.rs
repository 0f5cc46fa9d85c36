//! GGMLVIZ traces into the telemetry model: graph and op pairs become nested spans per thread,
//! synchronize waits short spans, llama_decode spans spans, buffer events a live-bytes counter per
//! buffer type.
//!
//! Pairs are matched by nesting order on their thread; an op end must carry its begin's
//! `tensor_ptr`. The C++ tool's own sample has crossing op pairs (begin A, begin B, end A, end
//! B): such an end is paired with its own begin by tensor, and reported with its byte offset.
//! Ends without a begin and begins never ended are reported too, never dropped silently.

use std::collections::HashMap;

use crate::format::Damage;
use crate::format::ext::{self, BackendNames, OpNames, TensorInfo};
use crate::format::{Event, EventType, ExtensionKind, Payload};
use crate::read::Events;
use crate::telemetry::{Arg, Clock, Ids, Lane, Process, Record, RecordSink, SpanStack, clock_of};

#[derive(Default)]
struct Thread {
    lane: u32,
    stack: SpanStack,
    /// For each open span: graph/op/other, and the op's tensor pointer.
    kinds: Vec<(Kind, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Graph,
    Op,
    Call,
}

struct Importer<'s, S: RecordSink> {
    sink: &'s mut S,
    ids: &'s mut Ids,
    process: u32,
    threads: HashMap<u32, Thread>,
    op_names: HashMap<u32, String>,
    infos: HashMap<String, TensorInfo>,
    backends: HashMap<u64, String>,
    live: HashMap<String, i64>,
    buffers: HashMap<u64, (String, u64)>,
    last_ns: u64,
    clock_said: bool,
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
    let with_offsets = std::iter::from_fn(|| {
        let offset = events.offset();
        events.next().map(|item| (offset, item))
    });
    import_events(with_offsets, name, ids, sink)
}

/// Imports events given with the byte offset where each begins (a mapped file, or a stream read
/// with bounded memory).
pub fn import_events<'a, S: RecordSink>(
    events: impl Iterator<Item = (u64, Result<Event<'a>, Damage>)>,
    name: &str,
    ids: &mut Ids,
    sink: &mut S,
) -> Option<Damage> {
    let process = ids.process();
    let mut imp = Importer {
        sink,
        ids,
        process,
        threads: HashMap::new(),
        op_names: HashMap::new(),
        infos: HashMap::new(),
        backends: HashMap::new(),
        live: HashMap::new(),
        buffers: HashMap::new(),
        last_ns: 0,
        clock_said: false,
    };
    let mut named = false;
    let mut damage = None;
    for (offset, item) in events {
        match item {
            Err(d) => {
                imp.sink.record(Record::Warning(format!("{name}: {d}")));
                damage = Some(d);
                break;
            }
            Ok(e) => {
                if !named
                    && !matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::Metadata)
                {
                    imp.sink.record(Record::Process(Process {
                        id: process,
                        name: name.into(),
                        ..Process::default()
                    }));
                }
                named = true;
                imp.event(&e, offset, name);
            }
        }
    }
    imp.finish(name);
    damage
}

impl<S: RecordSink> Importer<'_, S> {
    fn thread(&mut self, tid: u32) -> &mut Thread {
        if !self.threads.contains_key(&tid) {
            let lane = self.ids.lane();
            self.sink.record(Record::Lane(Lane {
                id: lane,
                process: self.process,
                tid: Some(tid as u64),
                name: format!("thread {tid}"),
            }));
            self.threads.insert(
                tid,
                Thread {
                    lane,
                    ..Thread::default()
                },
            );
        }
        self.threads.get_mut(&tid).expect("just inserted")
    }

    fn event(&mut self, e: &Event<'_>, offset: u64, name: &str) {
        let label = e.label_str().unwrap_or_default().into_owned();
        if let Payload::Extension(x) = e.payload {
            self.extension(x.kind, e, &label);
            return;
        }
        if !self.clock_said {
            self.clock_said = true;
            let clock = clock_of(e.timestamp_ns);
            self.sink.record(Record::Clock(clock));
            if clock == Clock::Relative {
                self.sink.record(Record::Warning(format!(
                    "{name}: timestamps are not nanoseconds since the epoch (first: {} ns); kept relative to this trace",
                    e.timestamp_ns
                )));
            }
        }
        self.last_ns = self.last_ns.max(e.timestamp_ns);
        let ts = e.timestamp_ns;
        match (e.event_type(), e.payload) {
            (
                Some(EventType::GraphComputeBegin),
                Payload::Graph {
                    graph_ptr,
                    n_nodes,
                    n_threads,
                    backend_ptr,
                },
            ) => {
                let mut words = label.splitn(2, ' ');
                let entry = words
                    .next()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("graph_compute")
                    .to_string();
                let mut args = vec![
                    ("n_nodes".to_string(), Arg::UInt(n_nodes as u64)),
                    ("n_threads".to_string(), Arg::UInt(n_threads as u64)),
                    ("graph".to_string(), Arg::Str(format!("{graph_ptr:#x}"))),
                ];
                if let Some(backend) = words
                    .next()
                    .map(str::to_string)
                    .or_else(|| self.backends.get(&backend_ptr).cloned())
                {
                    args.push(("backend".into(), Arg::Str(backend)));
                }
                self.open(e.thread_id, Kind::Graph, 0, entry, "graph", ts, args);
            }
            (
                Some(EventType::OpComputeBegin),
                Payload::Op {
                    tensor_ptr,
                    op_type,
                    op_size,
                    backend_ptr,
                },
            ) => {
                let info = self
                    .infos
                    .get(&label)
                    .filter(|i| i.op_type.is_none_or(|o| o == op_type));
                let op = match info {
                    Some(i) if !i.op.is_empty() => i.op.clone(),
                    _ => self
                        .op_names
                        .get(&op_type)
                        .cloned()
                        .unwrap_or_else(|| format!("op {op_type}")),
                };
                let mut args = vec![
                    ("tensor".to_string(), Arg::Str(label.clone())),
                    ("bytes".to_string(), Arg::UInt(op_size)),
                ];
                if let Some(i) = info {
                    args.push(("shape".into(), Arg::Str(format!("{:?}", i.ne))));
                    args.push(("type".into(), Arg::Str(i.type_name.clone())));
                    if let Some(f) = i.flops {
                        args.push(("flops".into(), Arg::UInt(f)));
                    }
                }
                // A backend the trace never named is still told apart from the others; none at
                // all is a CPU worker thread's share (threads-mode op timing, FORMAT.md).
                let backend = match self.backends.get(&backend_ptr) {
                    Some(b) => b.clone(),
                    None if backend_ptr == 0 => "CPU".into(),
                    None => format!("backend {backend_ptr:#x}"),
                };
                args.push(("backend".into(), Arg::Str(backend)));
                self.open(e.thread_id, Kind::Op, tensor_ptr, op, "op", ts, args);
            }
            (Some(EventType::GraphComputeEnd), _) => {
                self.close(e.thread_id, Kind::Graph, 0, ts, offset, name)
            }
            (Some(EventType::OpComputeEnd), Payload::Op { tensor_ptr, .. }) => {
                self.close(e.thread_id, Kind::Op, tensor_ptr, ts, offset, name)
            }
            (Some(EventType::BarrierWait), Payload::Thread { value, .. }) => {
                let entry = label
                    .split(' ')
                    .next()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("barrier_wait")
                    .to_string();
                self.open(
                    e.thread_id,
                    Kind::Call,
                    0,
                    entry,
                    "wait",
                    ts.saturating_sub(value),
                    vec![],
                );
                self.close(e.thread_id, Kind::Call, 0, ts, offset, name);
            }
            (Some(EventType::TensorAlloc), Payload::Memory { ptr, size }) => {
                let buft = label.split('@').next().unwrap_or_default().to_string();
                let live = self.live.entry(buft.clone()).or_default();
                *live = live.saturating_add(size.min(i64::MAX as u64) as i64);
                self.buffers.insert(ptr, (buft.clone(), size));
                self.counter(buft, ts);
            }
            (Some(EventType::TensorFree), Payload::Memory { ptr, .. }) => {
                if let Some((buft, size)) = self.buffers.remove(&ptr) {
                    let live = self.live.entry(buft.clone()).or_default();
                    *live = live.saturating_sub(size.min(i64::MAX as u64) as i64);
                    self.counter(buft, ts);
                }
            }
            (Some(ty @ (EventType::ThreadBegin | EventType::ThreadFree)), _) => {
                let lane = self.thread(e.thread_id).lane;
                if ty == EventType::ThreadBegin && !label.is_empty() {
                    let lane = Lane {
                        id: lane,
                        process: self.process,
                        tid: Some(e.thread_id as u64),
                        name: label,
                    };
                    self.sink.record(Record::Lane(lane));
                }
                let name = ty.name().to_string();
                self.sink.record(Record::Instant(crate::telemetry::Instant {
                    lane,
                    name,
                    time_ns: ts,
                }));
            }
            _ => {}
        }
    }

    fn extension(&mut self, kind: ExtensionKind, e: &Event<'_>, label: &str) {
        let bytes = label.as_bytes();
        match kind {
            ExtensionKind::Metadata => {
                if let Some(m) = ext::parse_payload::<ext::Metadata>(bytes) {
                    let program = m
                        .command_line
                        .first()
                        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string());
                    self.sink.record(Record::Process(Process {
                        id: self.process,
                        pid: m.pid,
                        name: program.unwrap_or_default(),
                        host: m.host,
                        job_id: m.distributed.job_id,
                        rank: Some(m.distributed.rank),
                        local_rank: Some(m.distributed.local_rank),
                        world_size: Some(m.distributed.world_size),
                    }));
                }
            }
            ExtensionKind::OpNames => {
                for (k, v) in ext::parse_payload::<OpNames>(bytes)
                    .unwrap_or_default()
                    .names
                {
                    if let Ok(k) = k.parse() {
                        self.op_names.insert(k, v);
                    }
                }
            }
            ExtensionKind::TensorInfo => {
                if let Some(info) = ext::parse_payload::<TensorInfo>(bytes) {
                    self.infos.insert(info.name.clone(), info);
                }
            }
            ExtensionKind::BackendNames => {
                for b in ext::parse_payload::<BackendNames>(bytes)
                    .unwrap_or_default()
                    .backends
                {
                    self.backends.insert(b.ptr, b.name);
                }
            }
            ExtensionKind::SpanBegin => {
                let span = ext::parse_payload::<ext::SpanBoundary>(bytes).unwrap_or_default();
                let args = span
                    .n_tokens
                    .map(|n| vec![("n_tokens".to_string(), Arg::UInt(n as u64))])
                    .unwrap_or_default();
                self.open(
                    e.thread_id,
                    Kind::Call,
                    0,
                    span.name,
                    "llama",
                    e.timestamp_ns,
                    args,
                );
            }
            ExtensionKind::SpanEnd => self.close(e.thread_id, Kind::Call, 0, e.timestamp_ns, 0, ""),
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        tid: u32,
        kind: Kind,
        tensor: u64,
        name: String,
        category: &str,
        ts: u64,
        args: Vec<(String, Arg)>,
    ) {
        let id = self.ids.span();
        let t = self.thread(tid);
        t.stack.open(id, name, category.into(), ts, args);
        t.kinds.push((kind, tensor));
    }

    fn close(&mut self, tid: u32, kind: Kind, tensor: u64, ts: u64, offset: u64, name: &str) {
        let t = self.thread(tid);
        let lane = t.lane;
        let matches = |k: &(Kind, u64)| k.0 == kind && (kind != Kind::Op || k.1 == tensor);
        let warning = match t.kinds.last() {
            Some(top) if matches(top) => None,
            _ => match t.kinds.iter().rposition(matches) {
                // Crossing pairs: close the right begin, and say so.
                Some(i) => {
                    let crossed = t.stack.depth() - 1 - i;
                    Some(format!(
                        "{name}: {kind:?} end at byte offset {offset} (tensor {tensor:#x}) crosses {crossed} span(s) begun after its begin; paired with its own begin"
                    ))
                }
                None => {
                    self.sink.record(Record::Warning(format!(
                        "{name}: {kind:?} end at byte offset {offset} has no begin on thread {tid}; ignored"
                    )));
                    return;
                }
            },
        };
        // Spans begun after a crossed one stay open; the crossed one is closed on its own.
        let i = t.kinds.iter().rposition(matches).expect("found above");
        t.kinds.remove(i);
        let span = t.stack.close_at(i, lane, ts);
        if let Some(w) = warning {
            self.sink.record(Record::Warning(w));
        }
        if let Some(span) = span {
            self.sink.record(Record::Span(span));
        }
    }

    fn counter(&mut self, buft: String, ts: u64) {
        let value = self.live.get(&buft).copied().unwrap_or(0) as f64;
        self.sink
            .record(Record::Counter(crate::telemetry::CounterSample {
                process: self.process,
                name: format!("live bytes {buft}"),
                time_ns: ts,
                value,
            }));
    }

    fn finish(&mut self, name: &str) {
        let end = self.last_ns;
        let mut open = 0;
        for t in self.threads.values_mut() {
            while let Some(mut span) = t.stack.close(t.lane, end) {
                span.args.push(("unfinished".into(), Arg::UInt(1)));
                open += 1;
                self.sink.record(Record::Span(span));
            }
            t.kinds.clear();
        }
        if open > 0 {
            self.sink.record(Record::Warning(format!(
                "{name}: {open} span(s) begun and never ended; closed at the last timestamp and marked unfinished"
            )));
        }
    }
}
