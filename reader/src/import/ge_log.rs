//! Ascend GE profiling logs (the ada-pa tool's input) into the telemetry model.
//!
//! Lines are `<ts_ns> <tid> <[node]|UNKNOWN(n)> <[event]> <Start|End>`, in segments between
//! `…dump start…` and `Profiling dump end`, not in time order. Start and End pair per thread, node
//! and event; spans nest by time on their thread, except `[Compute]` events, which belong to the
//! device lane. Lines that do not parse are counted and reported with their line numbers.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use crate::telemetry::{Arg, Clock, Ids, Lane, Process, Record, RecordSink, SpanStack, clock_of};
use crate::telemetry::{LaneId, ProcessId};

/// Whether `first_line` looks like a GE profiling log.
pub fn looks_like(first_line: &str) -> bool {
    first_line.starts_with("Profiler version") || parse_line(first_line).is_some()
}

struct Line<'a> {
    ts: u64,
    tid: u64,
    node: &'a str,
    event: &'a str,
    start: bool,
}

fn parse_line(line: &str) -> Option<Line<'_>> {
    let mut w = line.split_whitespace();
    let ts = w.next()?.parse().ok()?;
    let tid = w.next()?.parse().ok()?;
    let node = w.next()?;
    let event = w.next()?;
    let start = match w.next()? {
        "Start" => true,
        "End" => false,
        _ => return None,
    };
    if w.next().is_some() || !event.starts_with('[') || !event.ends_with(']') {
        return None;
    }
    let node = node
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(node);
    Some(Line {
        ts,
        tid,
        node,
        event: &event[1..event.len() - 1],
        start,
    })
}

/// A paired event, before nesting.
struct Interval {
    lane_key: Option<u64>,
    start: u64,
    end: u64,
    event: String,
    node: String,
}

/// Reads a GE log from `input`; `name` names the process. Errors are only I/O errors: bad lines
/// are warnings.
pub fn import<S: RecordSink>(
    input: impl BufRead,
    name: &str,
    ids: &mut Ids,
    sink: &mut S,
) -> std::io::Result<()> {
    let process = ids.process();
    sink.record(Record::Process(Process {
        id: process,
        name: name.into(),
        ..Process::default()
    }));
    let mut lanes: HashMap<Option<u64>, LaneId> = HashMap::new();
    let mut open: HashMap<(u64, String, String), Vec<u64>> = HashMap::new();
    let mut segment: Vec<Interval> = Vec::new();
    let mut bad: Vec<usize> = Vec::new();
    let mut unmatched = 0u64;
    let mut clock_said = false;
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("Profiler version") {
            continue;
        }
        if trimmed.starts_with("Profiling dump end") {
            unmatched += open.values().map(|v| v.len() as u64).sum::<u64>();
            open.clear();
            flush(&mut segment, &mut lanes, process, ids, sink);
            continue;
        }
        let Some(l) = parse_line(trimmed) else {
            bad.push(i + 1);
            continue;
        };
        if !clock_said {
            clock_said = true;
            sink.record(Record::Clock(clock_of(l.ts)));
        }
        let key = (l.tid, l.node.to_string(), l.event.to_string());
        if l.start {
            open.entry(key).or_default().push(l.ts);
        } else if let Some(start) = open.get_mut(&key).and_then(Vec::pop) {
            let lane_key = (l.event != "Compute").then_some(l.tid);
            segment.push(Interval {
                lane_key,
                start,
                end: l.ts,
                event: l.event.into(),
                node: l.node.into(),
            });
        } else {
            unmatched += 1;
        }
    }
    unmatched += open.values().map(|v| v.len() as u64).sum::<u64>();
    flush(&mut segment, &mut lanes, process, ids, sink);
    if !bad.is_empty() {
        let first: Vec<String> = bad.iter().take(5).map(usize::to_string).collect();
        sink.record(Record::Warning(format!(
            "{name}: {} line(s) do not parse as `<ts> <tid> <node> <[event]> <Start|End>` (lines {}{})",
            bad.len(),
            first.join(", "),
            if bad.len() > 5 { ", …" } else { "" }
        )));
    }
    if unmatched > 0 {
        sink.record(Record::Warning(format!(
            "{name}: {unmatched} Start/End line(s) without their pair"
        )));
    }
    if !clock_said {
        sink.record(Record::Clock(Clock::Epoch));
    }
    Ok(())
}

/// Nests one segment's intervals by time on each lane and hands them to the sink.
fn flush<S: RecordSink>(
    segment: &mut Vec<Interval>,
    lanes: &mut HashMap<Option<u64>, LaneId>,
    process: ProcessId,
    ids: &mut Ids,
    sink: &mut S,
) {
    let mut by_lane: BTreeMap<Option<u64>, Vec<Interval>> = BTreeMap::new();
    for i in segment.drain(..) {
        by_lane.entry(i.lane_key).or_default().push(i);
    }
    for (key, mut intervals) in by_lane {
        let lane = *lanes.entry(key).or_insert_with(|| {
            let id = ids.lane();
            let name = key.map_or_else(|| "device".to_string(), |tid| format!("thread {tid}"));
            sink.record(Record::Lane(Lane {
                id,
                process,
                tid: key,
                name,
            }));
            id
        });
        intervals.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut stack = SpanStack::default();
        let mut ends: Vec<u64> = Vec::new();
        for i in intervals {
            while ends.last().is_some_and(|&end| end <= i.start) {
                let end = ends.pop().expect("checked");
                if let Some(s) = stack.close(lane, end) {
                    sink.span(&s);
                }
            }
            ids.next_span += 1;
            // A span that outlives its enclosing one is cut at the enclosing end.
            let end = ends.last().map_or(i.end, |&outer| i.end.min(outer));
            let args = if i.node.starts_with("UNKNOWN") {
                Default::default()
            } else {
                vec![("node".into(), Arg::Str(i.node.into()))].into()
            };
            stack.open(ids.next_span, i.event.into(), "ge".into(), i.start, args);
            ends.push(end);
        }
        while let Some(end) = ends.pop() {
            if let Some(s) = stack.close(lane, end) {
                sink.span(&s);
            }
        }
    }
}
