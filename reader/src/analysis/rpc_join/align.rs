//! Merging a job's traces: each server's records moved onto its client's clock, and each joined
//! command's two spans given one flow id.

use crate::telemetry::ProcessId;
use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use super::model::{ClockOffset, RpcAnalysis};
use super::parts::RpcParts;
use crate::telemetry::rpc_spans::{CATEGORY, CONNECTION, FLOW, INDEX, PART};
use crate::telemetry::{Arg, Record, RecordSink, Span};

/// What merging does to one input's records: its clock shift (a server's offset) and the flow
/// ids of its joined RPC spans, by (connection, index, served).
#[derive(Clone, Debug, Default)]
pub struct Alignment {
    /// The server's offset onto its client's clock (none: the input's own clock).
    pub clock: Option<ClockOffset>,
    /// Its part in the job (`ggml-rpc server at 10.0.0.2:50052`, `ggml-rpc client of …`),
    /// added to its process's name.
    pub role: Option<String>,
    flows: HashMap<(u32, u32, bool), u64>,
}

impl RpcAnalysis {
    /// Per input (`input_of` maps a process to its input; `inputs` of them): each server's
    /// input shifted onto its client's clock (when `clocks` is set) and every joined
    /// command's two spans given one flow id.
    pub fn alignments(
        &self,
        parts: &RpcParts,
        inputs: usize,
        input_of: impl Fn(ProcessId) -> Option<usize>,
        clocks: bool,
    ) -> Vec<Alignment> {
        let mut out = vec![Alignment::default(); inputs];
        if clocks {
            for o in &self.offsets {
                if let Some(a) = input_of(o.server_process).and_then(|i| out.get_mut(i))
                    && !o.kept_own_clock
                {
                    a.clock = Some(o.clone());
                }
            }
        }
        let mut endpoints: BTreeMap<usize, (bool, Vec<String>)> = BTreeMap::new();
        for link in &self.links {
            let endpoint = link.endpoint.clone().unwrap_or_else(|| "?".into());
            for (process, server) in [(link.client_process, false), (link.server_process, true)] {
                if let Some(i) = input_of(process) {
                    let (is_server, list) = endpoints.entry(i).or_insert((server, Vec::new()));
                    *is_server = server;
                    if !list.contains(&endpoint) {
                        list.push(endpoint.clone());
                    }
                }
            }
        }
        for (i, (server, list)) in endpoints {
            if let Some(a) = out.get_mut(i) {
                let role = if server {
                    "ggml-rpc server at"
                } else {
                    "ggml-rpc client of"
                };
                a.role = Some(format!("{role} {}", list.join(", ")));
            }
        }
        for (n, j) in self.joined.iter().enumerate() {
            let link = &self.links[j.link];
            let id = n as u64 + 1;
            let ends = [
                (link.client_process, link.client_connection, false),
                (link.server_process, link.server_connection, true),
            ];
            for (process, connection, served) in ends {
                if let Some(a) = input_of(process).and_then(|i| out.get_mut(i)) {
                    a.flows
                        .insert((connection, parts.part(j.request).index, served), id);
                }
            }
        }
        out
    }
}

/// A sink that hands records on with an [`Alignment`] applied: times shifted (never below 0),
/// flow ids added to joined RPC spans.
pub struct Aligned<'a, S: RecordSink> {
    pub inner: &'a mut S,
    pub alignment: &'a Alignment,
    flow_key: Option<crate::telemetry::Text>,
}

impl<'a, S: RecordSink> Aligned<'a, S> {
    pub fn new(inner: &'a mut S, alignment: &'a Alignment) -> Self {
        Aligned {
            inner,
            alignment,
            flow_key: None,
        }
    }

    fn shift(&self, t: u64) -> u64 {
        (self.alignment.clock.as_ref()).map_or(t, |clock| clock.on_client_clock(t))
    }
}

impl<S: RecordSink> RecordSink for Aligned<'_, S> {
    fn span(&mut self, span: &Span) {
        let mut span = span.clone();
        span.start_ns = self.shift(span.start_ns);
        span.end_ns = self.shift(span.end_ns);
        if &*span.category == CATEGORY {
            let arg = |key: &str| {
                span.args
                    .iter()
                    .find(|(k, _)| &**k == key)
                    .map(|(_, v)| v.clone())
            };
            let (part, connection, index) = (arg(PART), arg(CONNECTION), arg(INDEX));
            if let (Some(Arg::Str(part)), Some(Arg::UInt(c)), Some(Arg::UInt(i))) =
                (part, connection, index)
                && matches!(&*part, "request" | "serve")
                && let Some(&id) =
                    self.alignment
                        .flows
                        .get(&(c as u32, i as u32, &*part == "serve"))
            {
                let key = self.flow_key.get_or_insert_with(|| FLOW.into()).clone();
                span.args = span
                    .args
                    .iter()
                    .cloned()
                    .chain([(key, Arg::UInt(id))])
                    .collect();
            }
        }
        self.inner.span(&span);
    }

    fn record(&mut self, record: Record) {
        let record = match record {
            Record::Counter(mut c) => {
                c.time_ns = self.shift(c.time_ns);
                Record::Counter(c)
            }
            Record::Instant(mut i) => {
                i.time_ns = self.shift(i.time_ns);
                Record::Instant(i)
            }
            Record::Buffer(mut b) => {
                b.time_ns = self.shift(b.time_ns);
                Record::Buffer(b)
            }
            Record::Process(mut p) => {
                if let Some(role) = &self.alignment.role {
                    p.name = format!("{} ({role})", p.name);
                }
                Record::Process(p)
            }
            other => other,
        };
        self.inner.record(record);
    }
}
