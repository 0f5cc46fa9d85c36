//! CoMMA's NCCL JSON export into the telemetry model.
//!
//! One compact JSON object per line (or a JSON array of them), `ts`/`dur` in microseconds since
//! the epoch, one file per process. COLL, P2P and GROUP records become spans of their rank's
//! process. A collective's `dur` is its enqueue time; when `child_dur` is there its execution is
//! shown beside it, on an execution lane, from `child_start_ts` (else the earliest proxy op).
//! Proxy ops of one collective overlap, so each gets its own lane per peer and direction, and
//! their steps (which overlap too) sub-lanes of it: no nesting the data does not have. Top-level
//! PROXY lines (proxy ops another process ran for this rank, PXN) join their rank.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::telemetry::{Arg, Clock, Ids, Lane, Process, Record, RecordSink, Span, Text};
use crate::telemetry::{LaneId, ProcessId};

struct Importer<'s, S: RecordSink> {
    sink: &'s mut S,
    ids: &'s mut Ids,
    /// By rank (or pid when there is no rank): our process id.
    processes: HashMap<(bool, i64), ProcessId>,
    /// By process and lane name: lane id and, for step lanes, where each sub-lane is free again.
    lanes: HashMap<(ProcessId, String), LaneId>,
    step_lanes: HashMap<(ProcessId, String), Vec<u64>>,
}

fn us(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_f64)
        .filter(|f| *f >= 0.0)
        .map(|f| (f * 1000.0).round() as u64)
}

/// Imports CoMMA records from `text`. An unreadable record is an error naming its line.
pub fn import<S: RecordSink>(
    text: &str,
    name: &str,
    ids: &mut Ids,
    sink: &mut S,
) -> Result<(), String> {
    let records: Vec<(usize, Value)> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i + 1, v))
            .collect(),
        _ => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map(|v| (i + 1, v))
                    .map_err(|e| format!("{name}: line {}: {e}", i + 1))
            })
            .collect::<Result<_, _>>()?,
    };
    sink.record(Record::Clock(Clock::Epoch));
    let mut imp = Importer {
        sink,
        ids,
        processes: HashMap::new(),
        lanes: HashMap::new(),
        step_lanes: HashMap::new(),
    };
    for (line, record) in records {
        let Value::Object(r) = record else {
            return Err(format!("{name}: line {line}: not a JSON object"));
        };
        imp.record(&r)
            .map_err(|e| format!("{name}: line {line}: {e}"))?;
    }
    Ok(())
}

impl<S: RecordSink> Importer<'_, S> {
    fn process(&mut self, r: &Map<String, Value>) -> ProcessId {
        let rank = r.get("rank").and_then(Value::as_i64);
        let key = match rank {
            Some(rank) => (true, rank),
            None => (false, r.get("pid").and_then(Value::as_i64).unwrap_or(-1)),
        };
        if let Some(&id) = self.processes.get(&key) {
            return id;
        }
        let id = self.ids.process();
        let pid = r.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
        let label = match rank {
            Some(rank) => format!("NCCL rank {rank}"),
            None => format!("NCCL pid {pid}"),
        };
        self.sink.record(Record::Process(Process {
            id,
            pid,
            name: label,
            rank: rank.map(|r| r as u32),
            ..Process::default()
        }));
        self.processes.insert(key, id);
        id
    }

    fn lane(&mut self, process: ProcessId, name: String) -> LaneId {
        if let Some(&id) = self.lanes.get(&(process, name.clone())) {
            return id;
        }
        let id = self.ids.lane();
        self.sink.record(Record::Lane(Lane {
            id,
            process,
            tid: None,
            name: name.clone(),
        }));
        self.lanes.insert((process, name), id);
        id
    }

    fn span(
        &mut self,
        lane: LaneId,
        name: &str,
        category: &str,
        start: u64,
        end: u64,
        args: Vec<(Text, Arg)>,
    ) -> u64 {
        self.ids.next_span += 1;
        let id = self.ids.next_span;
        self.sink.span(&Span {
            id,
            parent: None,
            depth: 0,
            lane,
            name: name.into(),
            category: category.into(),
            start_ns: start,
            end_ns: end.max(start),
            self_ns: end.saturating_sub(start),
            args: args.into(),
        });
        id
    }

    fn record(&mut self, r: &Map<String, Value>) -> Result<(), String> {
        let cat = r
            .get("cat")
            .and_then(Value::as_str)
            .ok_or("no `cat`")?
            .to_string();
        let process = self.process(r);
        if cat == "PROXY" {
            return self.proxy_op(process, r);
        }
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(&cat)
            .to_string();
        let start = us(r.get("ts")).ok_or("no valid `ts`")?;
        let end = start.saturating_add(us(r.get("dur")).unwrap_or(0));
        let mut args = Vec::new();
        if let Some(size) = r
            .get("args")
            .and_then(|a| a.get("size"))
            .and_then(Value::as_u64)
        {
            args.push(("size".into(), Arg::UInt(size)));
        }
        for key in ["comm_hash", "algo", "proto"] {
            if let Some(v) = r.get(key).and_then(Value::as_str) {
                args.push((key.into(), Arg::Str(v.into())));
            }
        }
        for key in ["seq_num", "peer", "n_max_channel"] {
            if let Some(v) = r.get(key).and_then(Value::as_i64) {
                args.push((key.into(), Arg::Int(v)));
            }
        }
        let lane_name = match cat.as_str() {
            "COLL" => "collectives (enqueue)".to_string(),
            "P2P" => "point-to-point".to_string(),
            "GROUP" => "groups".to_string(),
            other => other.to_lowercase(),
        };
        let lane = self.lane(process, lane_name);
        self.span(lane, &name, &cat, start, end, args.clone());
        let proxyops: Vec<&Map<String, Value>> = r
            .get("proxyops")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_object).collect())
            .unwrap_or_default();
        if let Some(child_dur) = us(r.get("child_dur")) {
            let exec_start = us(r.get("child_start_ts"))
                .or_else(|| proxyops.iter().filter_map(|p| us(p.get("ts"))).min())
                .unwrap_or(start);
            let lane = self.lane(process, format!("{} (execution)", lane_name_of(&cat)));
            self.span(
                lane,
                &format!("{name} (execution)"),
                &cat,
                exec_start,
                exec_start.saturating_add(child_dur),
                args,
            );
        }
        for p in proxyops {
            self.proxy_op(process, p)?;
        }
        Ok(())
    }

    fn proxy_op(&mut self, process: ProcessId, p: &Map<String, Value>) -> Result<(), String> {
        let start = us(p.get("ts")).ok_or("proxy op without a valid `ts`")?;
        let end = start.saturating_add(us(p.get("dur")).unwrap_or(0));
        let peer = p.get("peer").and_then(Value::as_i64).unwrap_or(-1);
        let direction = if p.get("is_send").and_then(Value::as_bool).unwrap_or(false) {
            "send"
        } else {
            "recv"
        };
        let lane_name = format!("proxy peer {peer} {direction}");
        let lane = self.lane(process, lane_name.clone());
        let mut args = vec![("peer".into(), Arg::Int(peer))];
        for key in ["chunk_size", "n_steps"] {
            if let Some(v) = p.get(key).and_then(Value::as_i64) {
                args.push((key.into(), Arg::Int(v)));
            }
        }
        let name = p
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("ProxyOp")
            .to_string();
        // Steps overlap one another: each goes to the first sub-lane free at its start.
        let steps = p
            .get("steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for step in steps.iter().filter_map(Value::as_object) {
            let (Some(s), Some(e)) = (us(step.get("start_time")), us(step.get("end_time"))) else {
                continue;
            };
            let free = self
                .step_lanes
                .entry((process, lane_name.clone()))
                .or_default();
            let slot = free
                .iter()
                .position(|&until| until <= s)
                .unwrap_or_else(|| {
                    free.push(0);
                    free.len() - 1
                });
            free[slot] = e;
            let step_lane = self.lane(process, format!("{lane_name} steps #{}", slot + 1));
            let mut step_args = Vec::new();
            if let Some(size) = step.get("size").and_then(Value::as_i64) {
                step_args.push(("size".into(), Arg::Int(size)));
            }
            let number = step.get("step").and_then(Value::as_i64).unwrap_or(0);
            self.span(
                step_lane,
                &format!("step {number}"),
                "PROXY_STEP",
                s,
                e,
                step_args,
            );
        }
        self.span(lane, &name, "PROXY", start, end, args);
        Ok(())
    }
}

fn lane_name_of(cat: &str) -> &'static str {
    match cat {
        "COLL" => "collectives",
        "P2P" => "point-to-point",
        _ => "groups",
    }
}
