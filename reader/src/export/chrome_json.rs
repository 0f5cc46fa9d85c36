//! Chrome trace JSON (Perfetto's legacy JSON input, chrome://tracing), written as the records
//! arrive. Perfetto's own protobuf format is [`super::perfetto`].
//!
//! - `pid` and `tid` are integers (Perfetto turns string pids into 0): our process and lane ids;
//!   `M` metadata events name them (program, pid, host and rank; thread names).
//! - Spans are `X` events, counters `C` events, instants (threads starting and ending) `i`.
//! - `ts` and `dur` are microseconds as doubles. Epoch-based values would lose the nanoseconds
//!   (and make nested spans seem to overlap), so timestamps are relative to an origin: the first
//!   timestamp seen, rounded down to a whole second, written in `metadata.ggml_viz.origin_ns`.
//!   Inputs with a relative clock keep their own zero and are flagged in the metadata.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::{Map, Value, json};

use crate::telemetry::rpc_spans as rpc;
use crate::telemetry::{Arg, Clock, Lane, Process, Record, RecordSink, Span};
use crate::telemetry::{LaneId, ProcessId};

pub struct ChromeJsonWriter<W: Write> {
    out: W,
    origin_ns: Option<u64>,
    first: bool,
    processes: BTreeMap<ProcessId, Process>,
    lanes: BTreeMap<LaneId, Lane>,
    clocks: Vec<Clock>,
    warnings: Vec<String>,
    /// The first write error; later writes are skipped.
    error: Option<io::Error>,
    events: u64,
}

impl<W: Write> ChromeJsonWriter<W> {
    pub fn new(mut out: W) -> ChromeJsonWriter<W> {
        let error = out.write_all(b"{\"traceEvents\":[\n").err();
        ChromeJsonWriter {
            out,
            origin_ns: None,
            first: true,
            processes: BTreeMap::new(),
            lanes: BTreeMap::new(),
            clocks: Vec::new(),
            warnings: Vec::new(),
            error,
            events: 0,
        }
    }

    fn us(&mut self, ns: u64) -> f64 {
        let origin = *self.origin_ns.get_or_insert(ns - ns % 1_000_000_000);
        (ns as i128 - origin as i128) as f64 / 1000.0
    }

    fn emit(&mut self, event: Value) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b",\n" };
        self.first = false;
        self.events += 1;
        let result = self
            .out
            .write_all(sep)
            .and_then(|()| serde_json::to_writer(&mut self.out, &event).map_err(io::Error::from));
        self.error = result.err();
    }

    /// A complete event (`X`) for `s`.
    fn complete(&mut self, s: &Span) {
        let ts = self.us(s.start_ns);
        let dur = s.duration_ns() as f64 / 1000.0;
        let pid = self.lanes.get(&s.lane).map_or(0, |l| l.process.0);
        let mut args = Map::new();
        for (k, v) in s.args.iter() {
            args.insert(k.to_string(), arg_json(v));
        }
        let flow = args.get(rpc::FLOW).cloned().map(|id| {
            let served = args.get(rpc::PART).and_then(Value::as_str) == Some("serve");
            (id, if served { "f" } else { "s" })
        });
        self.emit(json!({
            "ph": "X", "name": s.name, "cat": s.category, "pid": pid, "tid": s.lane,
            "ts": ts, "dur": dur, "args": args,
        }));
        // A joined ggml-rpc command: a flow from the client's request to the server's serving.
        if let Some((id, phase)) = flow {
            self.emit(json!({
                "ph": phase, "bp": "e", "id": id, "name": "rpc", "cat": rpc::CATEGORY,
                "pid": pid, "tid": s.lane, "ts": ts,
            }));
        }
    }

    /// Writes the metadata events and closes the JSON; returns the writer and events written.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        let processes: Vec<Process> = self.processes.values().cloned().collect();
        for p in processes {
            let name = p.label();
            self.emit(json!({"ph": "M", "name": "process_name", "pid": p.id, "tid": 0, "args": {"name": name}}));
            if let Some(rank) = p.rank {
                self.emit(json!({"ph": "M", "name": "process_sort_index", "pid": p.id, "tid": 0, "args": {"sort_index": rank}}));
            }
        }
        let lanes: Vec<Lane> = self.lanes.values().cloned().collect();
        for l in lanes {
            self.emit(json!({"ph": "M", "name": "thread_name", "pid": l.process, "tid": l.id, "args": {"name": l.name}}));
        }
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        let clock = if self.clocks.contains(&Clock::Relative) {
            "relative"
        } else {
            "epoch"
        };
        let metadata = json!({"ggml_viz": {
            "origin_ns": self.origin_ns.unwrap_or(0),
            "clock": clock,
            "warnings": self.warnings,
        }});
        write!(
            self.out,
            "\n],\"displayTimeUnit\":\"ns\",\"metadata\":{metadata}}}\n"
        )?;
        self.out.flush()?;
        Ok((self.out, self.events))
    }
}

fn arg_json(a: &Arg) -> Value {
    match a {
        Arg::Int(v) => json!(v),
        Arg::UInt(v) => json!(v),
        Arg::Float(v) => json!(v),
        Arg::Str(v) => json!(v),
    }
}

impl<W: Write> RecordSink for ChromeJsonWriter<W> {
    fn span(&mut self, span: &Span) {
        self.complete(span);
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => {
                self.processes.insert(p.id, p);
            }
            Record::Lane(l) => {
                self.lanes.insert(l.id, l);
            }
            Record::Counter(c) => {
                let ts = self.us(c.time_ns);
                self.emit(json!({"ph": "C", "name": c.name, "pid": c.process, "tid": 0, "ts": ts, "args": {"bytes": c.value}}));
            }
            Record::Instant(i) => {
                let ts = self.us(i.time_ns);
                let pid = self.lanes.get(&i.lane).map_or(0, |l| l.process.0);
                self.emit(json!({"ph": "i", "s": "t", "name": i.name, "pid": pid, "tid": i.lane, "ts": ts}));
            }
            Record::Warning(w) => self.warnings.push(w),
            Record::Clock(c) => self.clocks.push(c),
            // Drawn as the live-bytes counters that come with them.
            Record::Buffer(_) => {}
        }
    }
}
