//! Reading what was recorded: raw events and their checks, the telemetry model, the CLI's
//! CSV, Perfetto's own decoding.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use ggml_viz_reader::format::ext::{self, TensorInfo};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};
use ggml_viz_reader::{Damage, Event, TraceFile, TraceStats};

use crate::places::fixture;
use crate::process::{run, text};
use crate::programs::cli;

/// Every event of a trace, its damage and its stats.
pub fn read_trace(path: &Path) -> (Vec<Event<'static>>, Option<Damage>, TraceStats) {
    let trace = TraceFile::open(path, None)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut events = Vec::new();
    let mut damage = None;
    for item in trace.events() {
        match item {
            Ok(e) => events.push(e.into_owned()),
            Err(d) => damage = Some(d),
        }
    }
    let stats = TraceStats::collect(
        events
            .iter()
            .cloned()
            .map(Ok)
            .chain(damage.clone().map(Err)),
    );
    (events, damage, stats)
}

/// Graph events pair up properly nested on every thread (same graph and label at both ends) and
/// every thread's timestamps never go back. Returns the outermost pairs' labels, in order.
pub fn check_nesting(events: &[Event<'_>]) -> Vec<String> {
    let mut open: HashMap<u32, Vec<&Event<'_>>> = HashMap::new();
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut outermost = Vec::new();
    for e in events.iter().filter(|e| e.event_type().is_some()) {
        if let Some(prev) = last.insert(e.thread_id, e.timestamp_ns) {
            assert!(
                e.timestamp_ns >= prev,
                "time went back on thread {}",
                e.thread_id
            );
        }
        let stack = open.entry(e.thread_id).or_default();
        match e.event_type() {
            Some(EventType::GraphComputeBegin) => {
                if stack.is_empty() {
                    outermost.push(e.label_str().unwrap_or_default().into_owned());
                }
                stack.push(e);
            }
            Some(EventType::GraphComputeEnd) => {
                let begin = stack
                    .pop()
                    .unwrap_or_else(|| panic!("graph end without begin: {e:?}"));
                assert_eq!(begin.payload, e.payload, "begin and end differ");
                assert_eq!(begin.label, e.label);
            }
            _ => {}
        }
    }
    for (tid, stack) in open {
        assert!(
            stack.is_empty(),
            "thread {tid} has {} graph(s) never ended",
            stack.len()
        );
    }
    outermost
}

/// `(n_nodes, n_threads)` of every graph begin event whose label starts with `entry`.
pub fn graphs_of(events: &[Event<'_>], entry: &str) -> Vec<(u32, u32)> {
    events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .filter(|e| {
            e.label_str()
                .is_some_and(|l| l.split(' ').next() == Some(entry))
        })
        .map(|e| match e.payload {
            Payload::Graph {
                n_nodes, n_threads, ..
            } => (n_nodes, n_threads),
            _ => unreachable!(),
        })
        .collect()
}

/// The `graph n_nodes=K threads=T result=X` lines the ctypes fixture prints.
pub fn fixture_graphs(stdout: &str) -> Vec<(u32, u32)> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("graph n_nodes="))
        .map(|(_, rest)| {
            let mut words = rest.split(' ');
            let n: u32 = words.next().unwrap().parse().unwrap();
            let t: u32 = words
                .next()
                .unwrap()
                .trim_start_matches("threads=")
                .parse()
                .unwrap();
            (n, t)
        })
        .collect()
}

/// The sizes of the trace's buffer allocations (`TENSOR_ALLOC`), in order.
pub fn alloc_sizes(events: &[Event<'_>]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match (e.event_type(), e.payload) {
            (Some(EventType::TensorAlloc), Payload::Memory { size, .. }) => Some(size),
            _ => None,
        })
        .collect()
}

/// Every op begin follows an info for its label and op type, and no info repeats the last one of
/// its name and op (a reader keeps the latest of each: FORMAT.md); one name has nodes of several
/// ops (llama.cpp's `Qcur-0`: a MUL_MAT, then the ROPE after it), whose infos are each written
/// once per shape.
pub fn check_tensor_infos(events: &[Event<'_>]) {
    let mut known: HashMap<(String, Option<u32>), TensorInfo> = HashMap::new();
    let mut begins = 0;
    for e in events {
        match (e.event_type(), e.payload) {
            (None, Payload::Extension(x)) if x.kind == ExtensionKind::TensorInfo => {
                let label = e.label.as_deref().unwrap_or_default();
                let info: TensorInfo = ext::parse_payload(label).expect("our payload parses");
                if let Some(before) = known.insert((info.name.clone(), info.op_type), info.clone())
                {
                    assert_ne!(
                        before, info,
                        "written again with no other info of its name and op between"
                    );
                }
            }
            (Some(EventType::OpComputeBegin), Payload::Op { op_type, .. }) => {
                let label = e.label_str().expect("op events carry their tensor's name");
                assert!(
                    known.contains_key(&(label.to_string(), Some(op_type))),
                    "no info for {label} (op {op_type}) before its op event"
                );
                begins += 1;
            }
            _ => {}
        }
    }
    assert!(begins > 100, "{begins} op begins");
    let ops_of_qcur = known.keys().filter(|(name, _)| name == "Qcur-0").count();
    assert!(
        ops_of_qcur >= 2,
        "Qcur-0 is a MUL_MAT and a ROPE: {:?}",
        known.keys()
    );
}

/// Everything the telemetry importer makes of `trace` (spans, lanes, processes, …).
pub fn collected(trace: &Path) -> ggml_viz_reader::telemetry::Collected {
    let mut c = ggml_viz_reader::telemetry::Collected::default();
    ggml_viz_reader::import_path(
        trace,
        None,
        None,
        &mut ggml_viz_reader::telemetry::Ids::default(),
        &mut c,
    )
    .unwrap();
    c
}

/// Per group of `ops --csv` of `trace`, its nodes and their wall time, summed over the phases.
pub fn ops_csv_totals(trace: &Path) -> HashMap<String, (u64, u64)> {
    let csv = cli(|c| c.args(["ops", "--csv"]).arg(trace));
    assert!(csv.status.success(), "{}", text(&csv.stderr));
    let mut totals: HashMap<String, (u64, u64)> = HashMap::new();
    for row in text(&csv.stdout).lines().skip(1) {
        let cols: Vec<&str> = row.split(',').collect();
        let t = totals.entry(cols[1].to_string()).or_default();
        t.0 += cols[2].parse::<u64>().unwrap();
        t.1 += cols[3].parse::<u64>().unwrap();
    }
    totals
}

/// What Perfetto's own classes read in a protobuf trace (`check_perfetto.py`).
pub fn decode_perfetto(proto: &Path) -> serde_json::Value {
    let decoded = run({
        let mut c = Command::new("python3");
        c.arg(fixture("check_perfetto.py")).arg(proto);
        c
    });
    assert!(decoded.status.success(), "{}", text(&decoded.stderr));
    serde_json::from_slice(&decoded.stdout).unwrap()
}

/// The fields of one CSV line (RFC 4180: a field in double quotes may hold commas, and `""` for
/// a quote).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}
