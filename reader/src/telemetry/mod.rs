//! The common telemetry model every import lands in. It knows no producer and no consumer.
//!
//! An importer (`crate::import`) turns its input into a stream handed to a [`RecordSink`]: spans
//! lent as they close (with their parent, depth and self time already known), and [`Record`]s:
//! processes and lanes (threads, devices, NCCL proxy lanes) as they are met, counter samples,
//! instants, backend buffers made and freed, and warnings. Exporters (`crate::export`) and aggregations (`crate::Summary`, the
//! RPC join) are sinks, so nothing needs the whole input in memory; [`Collected`] keeps
//! everything, for tests and small inputs. [`rpc_spans`]: what the spans of ggml-rpc commands
//! carry.

pub mod rpc_spans;
mod text;

pub use text::{ByAddress, Text, Texts};

use std::fmt;
use std::rc::Rc;

/// A typed argument of a span.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(Text),
}

/// A span's arguments: shared by the spans of one tensor, one graph, one call.
pub type Args = Rc<[(Text, Arg)]>;

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Int(v) => write!(f, "{v}"),
            Arg::UInt(v) => write!(f, "{v}"),
            Arg::Float(v) => write!(f, "{v}"),
            Arg::Str(v) => f.write_str(v),
        }
    }
}

/// A process's id in the model: unique across the inputs of one run. Its number is what the
/// exports write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ProcessId(pub u32);

/// A lane's id in the model: unique across the inputs of one run. Its number is what the exports
/// write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct LaneId(pub u32);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Who produced the data: one process of one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub id: ProcessId,
    pub pid: u32,
    pub name: String,
    pub host: String,
    pub job_id: Option<String>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
}

impl Process {
    /// What a viewer calls it: `llama-simple (pid 42) on host-a rank 1`.
    pub fn label(&self) -> String {
        let mut name = if self.name.is_empty() {
            format!("process {}", self.id)
        } else {
            self.name.clone()
        };
        if self.pid != 0 {
            name.push_str(&format!(" (pid {})", self.pid));
        }
        if !self.host.is_empty() {
            name.push_str(&format!(" on {}", self.host));
        }
        if let Some(rank) = self.rank.filter(|_| self.world_size.is_some_and(|w| w > 1)) {
            name.push_str(&format!(" rank {rank}"));
        }
        name
    }
}

/// Where spans line up: a thread, a device queue, a proxy lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    pub id: LaneId,
    pub process: ProcessId,
    /// The OS thread id where there is one.
    pub tid: Option<u64>,
    pub name: String,
}

/// A span, delivered when it closes.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// Unique within one import.
    pub id: u64,
    pub parent: Option<u64>,
    pub depth: u32,
    pub lane: LaneId,
    pub name: Text,
    pub category: Text,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Duration minus the duration of its children.
    pub self_ns: u64,
    pub args: Args,
}

impl Span {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// The argument `key`, if the span has it.
    pub fn arg(&self, key: &str) -> Option<&Arg> {
        self.args.iter().find(|(k, _)| &**k == key).map(|(_, v)| v)
    }

    /// The argument `key` as an unsigned count (tokens, bytes), if it is one.
    pub fn arg_uint(&self, key: &str) -> Option<u64> {
        match self.arg(key) {
            Some(Arg::UInt(n)) => Some(*n),
            _ => None,
        }
    }
}

/// One value of a counter (live bytes of a buffer type, memory of a device).
#[derive(Clone, Debug, PartialEq)]
pub struct CounterSample {
    pub process: ProcessId,
    pub name: String,
    pub time_ns: u64,
    pub value: f64,
}

/// A moment on a lane (a thread starting or ending).
#[derive(Clone, Debug, PartialEq)]
pub struct Instant {
    pub lane: LaneId,
    pub name: String,
    pub time_ns: u64,
}

/// A backend buffer made or freed (a trace recorded with memory tracking).
#[derive(Clone, Debug, PartialEq)]
pub struct BufferEvent {
    pub process: ProcessId,
    pub time_ns: u64,
    /// Made (`true`) or freed.
    pub made: bool,
    /// The buffer's handle.
    pub buffer: u64,
    /// Its bytes (freed: as many as it was made with).
    pub size: u64,
    /// Its buffer type (`CPU`, `Vulkan0`) and base address, as the event said them.
    pub buffer_type: String,
    pub base: String,
}

/// What timestamps mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Nanoseconds since the Unix epoch: comparable across inputs.
    Epoch,
    /// Nanoseconds from some start only this input knows (a monotonic clock).
    Relative,
}

/// Everything an importer produces besides spans (lent to [`RecordSink::span`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Process(Process),
    Lane(Lane),
    Counter(CounterSample),
    Instant(Instant),
    Buffer(BufferEvent),
    /// Something the user should know: bad lines, unmatched or crossing pairs, clock problems.
    Warning(String),
    Clock(Clock),
}

/// Receives an import.
pub trait RecordSink {
    /// A span as it closes, lent: a sink that keeps it clones it. (An importer may lend the same
    /// value again with other times: nothing is allocated or reference-counted per span.)
    fn span(&mut self, span: &Span);
    /// Everything else.
    fn record(&mut self, record: Record);
}

/// A sink that keeps everything.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub processes: Vec<Process>,
    pub lanes: Vec<Lane>,
    pub spans: Vec<Span>,
    pub counters: Vec<CounterSample>,
    pub instants: Vec<Instant>,
    pub buffers: Vec<BufferEvent>,
    pub warnings: Vec<String>,
    pub clock: Option<Clock>,
}

impl RecordSink for Collected {
    fn span(&mut self, span: &Span) {
        self.spans.push(span.clone());
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => self.processes.push(p),
            Record::Lane(l) => self.lanes.push(l),
            Record::Counter(c) => self.counters.push(c),
            Record::Instant(i) => self.instants.push(i),
            Record::Buffer(b) => self.buffers.push(b),
            Record::Warning(w) => self.warnings.push(w),
            Record::Clock(c) => self.clock = Some(c),
        }
    }
}

/// What a span is called: its name, category and arguments.
#[derive(Clone, Debug)]
pub struct Naming {
    pub name: Text,
    pub category: Text,
    pub args: Args,
}

/// Open spans of one lane, for importers that see begins and ends: assigns parents and depths,
/// and self time (duration minus children) at close. `N` is what an open span carries besides
/// its id and start: its [`Naming`], or an importer's own handle to it.
#[derive(Debug)]
pub struct SpanStack<N = Naming> {
    open: Vec<OpenSpan<N>>,
}

impl<N> Default for SpanStack<N> {
    fn default() -> Self {
        SpanStack { open: Vec::new() }
    }
}

#[derive(Debug)]
pub struct OpenSpan<N> {
    pub id: u64,
    pub start_ns: u64,
    children_ns: u64,
    pub naming: N,
}

/// A span its stack closed: where it sat and when, and what it carried.
#[derive(Debug)]
pub struct Closed<N> {
    pub place: SpanPlace,
    pub naming: N,
}

/// Where a closed span sat in its lane's stack, and when it was.
#[derive(Clone, Copy, Debug)]
pub struct SpanPlace {
    pub id: u64,
    pub parent: Option<u64>,
    pub depth: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub self_ns: u64,
}

impl SpanPlace {
    /// Writes this place, on `lane`, into `span` (all but what it is called).
    #[inline]
    pub fn write(&self, lane: LaneId, span: &mut Span) {
        span.id = self.id;
        span.parent = self.parent;
        span.depth = self.depth;
        span.lane = lane;
        span.start_ns = self.start_ns;
        span.end_ns = self.end_ns;
        span.self_ns = self.self_ns;
    }
}

impl Closed<Naming> {
    /// The span, on `lane`.
    pub fn into_span(self, lane: LaneId) -> Span {
        let (
            p,
            Naming {
                name,
                category,
                args,
            },
        ) = (self.place, self.naming);
        Span {
            id: p.id,
            parent: p.parent,
            depth: p.depth,
            lane,
            name,
            category,
            start_ns: p.start_ns,
            end_ns: p.end_ns,
            self_ns: p.self_ns,
            args,
        }
    }
}

impl<N> SpanStack<N> {
    pub fn depth(&self) -> usize {
        self.open.len()
    }

    pub fn top(&self) -> Option<&OpenSpan<N>> {
        self.open.last()
    }

    /// The open spans, outermost first.
    pub fn iter(&self) -> std::slice::Iter<'_, OpenSpan<N>> {
        self.open.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    #[inline]
    pub fn push(&mut self, id: u64, start_ns: u64, naming: N) {
        self.open.push(OpenSpan {
            id,
            start_ns,
            children_ns: 0,
            naming,
        });
    }

    /// Closes the innermost open span at `end_ns`.
    #[inline]
    pub fn pop(&mut self, end_ns: u64) -> Option<Closed<N>> {
        let s = self.open.pop()?;
        Some(self.closed(s, self.open.len(), end_ns))
    }

    /// Closes the open span at `index` (0: outermost) at `end_ns`. Below the top only for
    /// crossing pairs: the spans above it stay open.
    pub fn remove(&mut self, index: usize, end_ns: u64) -> Option<Closed<N>> {
        if index >= self.open.len() {
            return None;
        }
        let s = self.open.remove(index);
        Some(self.closed(s, index, end_ns))
    }

    /// `s`, taken from `index`, closed at `end_ns`: its time is added to its parent's children.
    #[inline]
    fn closed(&mut self, s: OpenSpan<N>, index: usize, end_ns: u64) -> Closed<N> {
        let end_ns = end_ns.max(s.start_ns);
        let duration = end_ns - s.start_ns;
        let parent = index.checked_sub(1).map(|p| &mut self.open[p]);
        let parent = parent.map(|p| {
            p.children_ns = p.children_ns.saturating_add(duration);
            p.id
        });
        let place = SpanPlace {
            id: s.id,
            parent,
            depth: index as u32,
            start_ns: s.start_ns,
            end_ns,
            self_ns: duration.saturating_sub(s.children_ns),
        };
        Closed {
            place,
            naming: s.naming,
        }
    }
}

impl SpanStack<Naming> {
    #[inline]
    pub fn open(&mut self, id: u64, name: Text, category: Text, start_ns: u64, args: Args) {
        let naming = Naming {
            name,
            category,
            args,
        };
        self.push(id, start_ns, naming);
    }

    /// Closes the innermost open span at `end_ns`.
    #[inline]
    pub fn close(&mut self, lane: LaneId, end_ns: u64) -> Option<Span> {
        self.pop(end_ns).map(|c| c.into_span(lane))
    }
}

/// Nanoseconds since the epoch are after 2001 (1e18); a clock that starts near zero (the C++
/// tool's monotonic clock: ~9.2e14, about 10 days) is not the epoch.
pub fn clock_of(first_timestamp_ns: u64) -> Clock {
    if first_timestamp_ns >= 1_000_000_000_000_000_000 {
        Clock::Epoch
    } else {
        Clock::Relative
    }
}

/// Ids already handed out, so that several inputs share one timeline without collisions.
#[derive(Debug, Default)]
pub struct Ids {
    pub next_process: u32,
    pub next_lane: u32,
    pub next_span: u64,
}

impl Ids {
    /// A new process's id.
    pub fn process(&mut self) -> ProcessId {
        self.next_process += 1;
        ProcessId(self.next_process)
    }
    /// A new lane's id.
    pub fn lane(&mut self) -> LaneId {
        self.next_lane += 1;
        LaneId(self.next_lane)
    }
    /// A new span's id.
    pub fn span(&mut self) -> u64 {
        self.next_span += 1;
        self.next_span
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LaneId;

    #[test]
    fn self_time_is_duration_minus_children() {
        let mut stack = SpanStack::default();
        stack.open(1, "graph".into(), "graph".into(), 0, Args::default());
        stack.open(2, "op".into(), "op".into(), 10, Args::default());
        let child = stack.close(LaneId(0), 40).unwrap();
        assert_eq!((child.parent, child.depth, child.self_ns), (Some(1), 1, 30));
        let parent = stack.close(LaneId(0), 100).unwrap();
        assert_eq!((parent.parent, parent.depth, parent.self_ns), (None, 0, 70));
    }
}
