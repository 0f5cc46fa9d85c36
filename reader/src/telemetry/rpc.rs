//! ggml-rpc across hosts: the traces of a client and its servers joined command by command,
//! each server's clock offset from the client's estimated from the commands that were answered,
//! and a table per command.
//!
//! The hook records each command's parts as spans of category [`CATEGORY`] named by the command
//! (`GRAPH_COMPUTE`): on the client its request and its answer, on the server its serving of it
//! and, inside, its answer. Both ends number a connection's commands from its HELLO, so a
//! client's connection and a server's join when their commands agree one for one (command and
//! bytes); the endpoint decides between servers that saw the same commands.
//!
//! Clocks: for a command that was answered, the server began serving it after the client began
//! sending it, and began answering before the client had the answer's last byte. With `θ` the
//! offset to add to a server's times to put them on the client's clock, each such command bounds
//! `θ` from both sides (`request.start − serve.start ≤ θ ≤ answer.end − server answer.start`),
//! and a command without an answer from below; the estimate is the middle of the intersection of
//! all the bounds, its uncertainty half the width.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use crate::telemetry::{Arg, Process, Record, RecordSink, Span};

/// The category of the hook's RPC spans.
pub const CATEGORY: &str = "rpc";
/// Argument keys of an RPC span.
pub const PART: &str = "rpc_part";
pub const CONNECTION: &str = "connection";
pub const INDEX: &str = "index";
pub const ENDPOINT: &str = "endpoint";
pub const SENT: &str = "sent";
pub const RECEIVED: &str = "received";

/// Which part of a command a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    Request,
    /// The client's answer; in [`analyse`]'s results also a server's (inside its serve span).
    Answer,
    Serve,
    /// A server's answer, as [`analyse`] tells it apart.
    ServerAnswer,
}

/// One part of one command.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandPart {
    pub process: u32,
    pub part: Part,
    pub command: String,
    pub connection: u32,
    pub index: u32,
    pub endpoint: Option<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub sent: u64,
    pub received: u64,
}

/// A sink that keeps the processes and the RPC parts of an import (everything else passes by).
#[derive(Debug, Default)]
pub struct RpcParts {
    pub processes: Vec<Process>,
    pub parts: Vec<CommandPart>,
    /// `llama_decode` spans (process, start, end): the tokens of the per-token breakdown.
    pub decodes: Vec<(u32, u64, u64)>,
    /// Graph computes on backends other than ggml-rpc's (process, start, end): a process's
    /// own compute.
    pub local_computes: Vec<(u32, u64, u64)>,
    lanes: HashMap<u32, u32>,
    pub warnings: Vec<String>,
}

impl RecordSink for RpcParts {
    fn span(&mut self, span: &Span) {
        let process = self.lanes.get(&span.lane).copied().unwrap_or(0);
        let interval = (process, span.start_ns, span.end_ns);
        if &*span.category == CATEGORY {
            if let Some(part) = command_part(process, span) {
                self.parts.push(part);
            }
        } else if &*span.name == "llama_decode" {
            self.decodes.push(interval);
        } else if &*span.category == "graph"
            && span
                .args
                .iter()
                .any(|(k, v)| &**k == "backend" && matches!(v, Arg::Str(b) if !b.contains("RPC")))
        {
            self.local_computes.push(interval);
        }
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => self.processes.push(p),
            Record::Lane(l) => {
                self.lanes.insert(l.id, l.process);
            }
            Record::Warning(w) => self.warnings.push(w),
            _ => {}
        }
    }
}

fn command_part(process: u32, span: &Span) -> Option<CommandPart> {
    let arg = |key: &str| span.args.iter().find(|(k, _)| &**k == key).map(|(_, v)| v);
    let uint = |key: &str| match arg(key) {
        Some(Arg::UInt(n)) => *n,
        _ => 0,
    };
    let part = match arg(PART) {
        Some(Arg::Str(p)) => match &**p {
            "request" => Part::Request,
            "answer" => Part::Answer,
            "serve" => Part::Serve,
            _ => return None,
        },
        _ => return None,
    };
    Some(CommandPart {
        process,
        part,
        command: span.name.to_string(),
        connection: uint(CONNECTION) as u32,
        index: uint(INDEX) as u32,
        endpoint: match arg(ENDPOINT) {
            Some(Arg::Str(e)) => Some(e.to_string()),
            _ => None,
        },
        start_ns: span.start_ns,
        end_ns: span.end_ns,
        sent: uint(SENT),
        received: uint(RECEIVED),
    })
}

/// One connection as one end saw it.
#[derive(Clone, Debug, Default)]
struct Connection {
    process: u32,
    id: u32,
    endpoint: Option<String>,
    /// By index: request (client) or serve (server), and the answer.
    commands: BTreeMap<u32, (Option<CommandPart>, Option<CommandPart>)>,
}

impl Connection {
    /// The command and request bytes per index: what both ends must agree on.
    fn signature(&self, client: bool) -> Vec<(u32, &str, u64)> {
        self.commands
            .iter()
            .filter_map(|(&i, (main, _))| {
                let m = main.as_ref()?;
                Some((
                    i,
                    m.command.as_str(),
                    if client { m.sent } else { m.received },
                ))
            })
            .collect()
    }
}

/// A client's connection joined to the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub client_process: u32,
    pub client_connection: u32,
    pub server_process: u32,
    pub server_connection: u32,
    pub endpoint: Option<String>,
    /// Commands joined.
    pub commands: usize,
}

/// A server's clock against the client's.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockOffset {
    pub server_process: u32,
    /// Add to the server's times to put them on the client's clock: the estimate, and the
    /// interval the commands allow (`lower ≤ θ ≤ upper`; `upper` is `None` when no command was
    /// answered).
    pub offset_ns: i64,
    pub lower_ns: i64,
    pub upper_ns: Option<i64>,
    /// Commands that gave bounds.
    pub commands: usize,
}

impl ClockOffset {
    /// Half the width of the interval: how far the estimate can be from the truth.
    pub fn uncertainty_ns(&self) -> Option<i64> {
        self.upper_ns.map(|u| (u - self.lower_ns).max(0) / 2)
    }
}

/// A joined command: the client's request (and answer) with the server's serving of it.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinedCommand {
    pub link: usize,
    pub request: CommandPart,
    pub answer: Option<CommandPart>,
    pub serve: CommandPart,
    pub server_answer: Option<CommandPart>,
}

/// Per command name over every client connection: count, bytes, time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandRow {
    pub count: u64,
    pub sent: u64,
    pub received: u64,
    /// Client time: its requests, and its answers (waiting included).
    pub request_ns: u64,
    pub answer_ns: u64,
}

impl CommandRow {
    /// Bytes moved per second of client time.
    pub fn mb_per_s(&self) -> f64 {
        let ns = self.request_ns + self.answer_ns;
        if ns == 0 {
            0.0
        } else {
            (self.sent + self.received) as f64 / ns as f64 * 1e3
        }
    }
}

/// Where one token's time went, on the client's clock. A token runs from the start of one
/// `llama_decode` to the start of the next (a decode returns once its graphs are sent, before
/// the servers have computed them; the last token ends with its decode or the client's last
/// command). Each nanosecond is counted once, in this order of precedence: a server computing a
/// graph the client sent (by server), the client computing on its own backends, the client
/// sending or awaiting a command (transfer), else idle (the host's own work: sampling,
/// building the next batch). The four add up to the token's duration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenTime {
    pub client_process: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// (server process, ns).
    pub servers: Vec<(u32, u64)>,
    pub client_compute_ns: u64,
    pub transfer_ns: u64,
    pub idle_ns: u64,
}

/// Total length of the union of `intervals` clipped to `[lo, hi)`, after merging them into
/// `covered` (kept sorted and disjoint).
fn cover(
    covered: &mut Vec<(u64, u64)>,
    intervals: impl Iterator<Item = (u64, u64)>,
    lo: u64,
    hi: u64,
) -> u64 {
    let before: u64 = covered.iter().map(|(a, b)| b - a).sum();
    covered.extend(
        intervals
            .map(|(a, b)| (a.max(lo), b.min(hi)))
            .filter(|(a, b)| a < b),
    );
    covered.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(covered.len());
    for &(a, b) in covered.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    *covered = merged;
    covered.iter().map(|(a, b)| b - a).sum::<u64>() - before
}

/// Everything joined.
#[derive(Clone, Debug, Default)]
pub struct RpcAnalysis {
    pub links: Vec<Link>,
    pub joined: Vec<JoinedCommand>,
    pub offsets: Vec<ClockOffset>,
    pub commands: BTreeMap<String, CommandRow>,
    /// Client connections no server trace joined (their server was not traced, or its trace
    /// is incomplete).
    pub unjoined_client_connections: usize,
    /// Per token of each client (its `llama_decode` spans).
    pub tokens: Vec<TokenTime>,
    /// Each graph compute sent (GRAPH_COMPUTE, GRAPH_RECOMPUTE: no answer of their own), from
    /// its request's start to the end of the next answer on its connection, which waited for
    /// it: (index into `joined`, ns).
    pub computes_answered: Vec<(usize, u64)>,
}

impl RpcAnalysis {
    pub fn offset_of(&self, server_process: u32) -> Option<&ClockOffset> {
        self.offsets
            .iter()
            .find(|o| o.server_process == server_process)
    }
}

/// Joins and measures what `parts` holds.
pub fn analyse(parts: &RpcParts) -> RpcAnalysis {
    let mut clients: BTreeMap<(u32, u32), Connection> = BTreeMap::new();
    let mut servers: BTreeMap<(u32, u32), Connection> = BTreeMap::new();
    let mut commands: BTreeMap<String, CommandRow> = BTreeMap::new();
    // An answer on a connection that was served is the server's.
    let served: rustc_hash::FxHashSet<(u32, u32)> = parts
        .parts
        .iter()
        .filter(|p| p.part == Part::Serve)
        .map(|p| (p.process, p.connection))
        .collect();
    for p in &parts.parts {
        let mut p = p.clone();
        if p.part == Part::Answer && served.contains(&(p.process, p.connection)) {
            p.part = Part::ServerAnswer;
        }
        let side = match p.part {
            Part::Request | Part::Answer => &mut clients,
            Part::Serve | Part::ServerAnswer => &mut servers,
        };
        let conn = side.entry((p.process, p.connection)).or_default();
        conn.process = p.process;
        conn.id = p.connection;
        if conn.endpoint.is_none() {
            conn.endpoint.clone_from(&p.endpoint);
        }
        let slot = conn.commands.entry(p.index).or_default();
        let is_client = matches!(p.part, Part::Request | Part::Answer);
        if is_client {
            let row = commands.entry(p.command.clone()).or_default();
            if p.part == Part::Request {
                row.count += 1;
                row.sent += p.sent;
                row.request_ns += p.end_ns.saturating_sub(p.start_ns);
            } else {
                row.received += p.received;
                row.answer_ns += p.end_ns.saturating_sub(p.start_ns);
            }
        }
        match p.part {
            Part::Request | Part::Serve => slot.0 = Some(p),
            Part::Answer | Part::ServerAnswer => slot.1 = Some(p),
        }
    }

    let mut analysis = RpcAnalysis {
        commands,
        ..RpcAnalysis::default()
    };
    let mut taken: Vec<(u32, u32)> = Vec::new();
    let server_signatures: Vec<_> = servers.values().map(|s| s.signature(false)).collect();
    for client in clients.values() {
        let signature = client.signature(true);
        let port = |e: &Option<String>| {
            e.as_deref()
                .and_then(|e| e.rsplit(':').next())
                .map(str::to_owned)
        };
        let candidates = servers
            .iter()
            .zip(&server_signatures)
            .filter(|((key, _), theirs)| !taken.contains(key) && **theirs == signature)
            .map(|(server, _)| server);
        // The same endpoint, else the same port, else the first (in time order) that agrees.
        let chosen = candidates
            .min_by_key(|(_, s)| {
                (
                    s.endpoint != client.endpoint,
                    port(&s.endpoint) != port(&client.endpoint),
                    s.commands
                        .values()
                        .next()
                        .and_then(|c| c.0.as_ref())
                        .map_or(0, |c| c.start_ns),
                )
            })
            .map(|(key, s)| (*key, s));
        let Some((key, server)) = chosen else {
            analysis.unjoined_client_connections += 1;
            continue;
        };
        taken.push(key);
        let link = analysis.links.len();
        analysis.links.push(Link {
            client_process: client.process,
            client_connection: client.id,
            server_process: server.process,
            server_connection: server.id,
            endpoint: client.endpoint.clone(),
            commands: signature.len(),
        });
        for (index, (request, answer)) in &client.commands {
            let (Some(request), Some((Some(serve), server_answer))) =
                (request, server.commands.get(index))
            else {
                continue;
            };
            analysis.joined.push(JoinedCommand {
                link,
                request: request.clone(),
                answer: answer.clone(),
                serve: serve.clone(),
                server_answer: server_answer.clone(),
            });
        }
    }

    // Offsets, per server process, from every joined command of its links.
    let mut bounds: BTreeMap<u32, (i64, Option<i64>, usize)> = BTreeMap::new();
    for j in &analysis.joined {
        let server = analysis.links[j.link].server_process;
        let b = bounds.entry(server).or_insert((i64::MIN, None, 0));
        b.0 = b.0.max(j.request.start_ns as i64 - j.serve.start_ns as i64);
        if let (Some(answer), Some(server_answer)) = (&j.answer, &j.server_answer) {
            let upper = answer.end_ns as i64 - server_answer.start_ns as i64;
            b.1 = Some(b.1.map_or(upper, |u: i64| u.min(upper)));
        }
        b.2 += 1;
    }
    let offsets: Vec<ClockOffset> = bounds
        .into_iter()
        .map(|(server_process, (lower, upper, commands))| ClockOffset {
            server_process,
            offset_ns: upper.map_or(lower, |u| lower + (u - lower) / 2),
            lower_ns: lower,
            upper_ns: upper,
            commands,
        })
        .collect();
    analysis.offsets = offsets;
    for (n, j) in analysis.joined.iter().enumerate() {
        if !matches!(
            j.request.command.as_str(),
            "GRAPH_COMPUTE" | "GRAPH_RECOMPUTE"
        ) {
            continue;
        }
        let answered = analysis.joined[n + 1..]
            .iter()
            .take_while(|k| k.link == j.link)
            .find_map(|k| k.answer.as_ref());
        if let Some(answer) = answered {
            let ns = answer.end_ns.saturating_sub(j.request.start_ns);
            analysis.computes_answered.push((n, ns));
        }
    }
    analysis.tokens = tokens(parts, &analysis);
    analysis
}

/// The per-token breakdown of every client's decodes.
fn tokens(parts: &RpcParts, a: &RpcAnalysis) -> Vec<TokenTime> {
    let on_client_clock = |server: u32, t: u64| {
        t.saturating_add_signed(a.offset_of(server).map_or(0, |o| o.offset_ns))
    };
    let clients: Vec<u32> = a.links.iter().map(|l| l.client_process).collect();
    let mut servers: Vec<u32> = a.links.iter().map(|l| l.server_process).collect();
    servers.sort_unstable();
    servers.dedup();
    let server_computes = |server: u32| {
        a.joined
            .iter()
            .filter(move |j| a.links[j.link].server_process == server)
            .filter(|j| {
                matches!(
                    j.serve.command.as_str(),
                    "GRAPH_COMPUTE" | "GRAPH_RECOMPUTE"
                )
            })
            .map(move |j| {
                (
                    on_client_clock(server, j.serve.start_ns),
                    on_client_clock(server, j.serve.end_ns),
                )
            })
    };
    // A token runs from one decode's start to the next one's: a decode returns once its
    // graphs are sent, before the servers have computed them. The last runs to the end of its
    // decode or of the client's last command, whichever is later.
    let mut decodes: Vec<(u32, u64, u64)> = parts
        .decodes
        .iter()
        .copied()
        .filter(|(process, ..)| clients.contains(process))
        .collect();
    decodes.sort_unstable();
    let windows: Vec<(u32, u64, u64)> = decodes
        .iter()
        .enumerate()
        .map(|(i, &(client, start, end))| match decodes.get(i + 1) {
            Some(&(next, next_start, _)) if next == client => (client, start, next_start),
            _ => {
                let last = parts
                    .parts
                    .iter()
                    .filter(|p| p.process == client && p.start_ns >= start)
                    .map(|p| p.end_ns)
                    .max()
                    .unwrap_or(end);
                (client, start, end.max(last))
            }
        })
        .collect();
    windows
        .into_iter()
        .map(|(client, lo, hi)| {
            let mut covered = Vec::new();
            let servers = servers
                .iter()
                .map(|&s| (s, cover(&mut covered, server_computes(s), lo, hi)))
                .collect();
            let own = parts
                .local_computes
                .iter()
                .filter(|(p, ..)| *p == client)
                .map(|&(_, a, b)| (a, b));
            let client_compute_ns = cover(&mut covered, own, lo, hi);
            let moving = parts
                .parts
                .iter()
                .filter(|p| p.process == client && matches!(p.part, Part::Request | Part::Answer))
                .map(|p| (p.start_ns, p.end_ns));
            let transfer_ns = cover(&mut covered, moving, lo, hi);
            let busy: u64 = covered.iter().map(|(a, b)| b - a).sum();
            TokenTime {
                client_process: client,
                start_ns: lo,
                end_ns: hi,
                servers,
                client_compute_ns,
                transfer_ns,
                idle_ns: (hi - lo).saturating_sub(busy),
            }
        })
        .collect()
}

/// The argument that ties a client's request to the server's serving of it: the same number on
/// both spans (exporters draw it as a flow).
pub const FLOW: &str = "flow_id";

/// What merging does to one input's records: its clock shift (a server's offset) and the flow
/// ids of its joined RPC spans, by (connection, index, served).
#[derive(Clone, Debug, Default)]
pub struct Alignment {
    pub shift_ns: i64,
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
        inputs: usize,
        input_of: impl Fn(u32) -> Option<usize>,
        clocks: bool,
    ) -> Vec<Alignment> {
        let mut out = vec![Alignment::default(); inputs];
        if clocks {
            for o in &self.offsets {
                if let Some(a) = input_of(o.server_process).and_then(|i| out.get_mut(i)) {
                    a.shift_ns = o.offset_ns;
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
                    a.flows.insert((connection, j.request.index, served), id);
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
        t.saturating_add_signed(self.alignment.shift_ns)
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

#[cfg(test)]
mod tests {
    use super::*;

    const SHIFT: i64 = 5_000_000;

    /// A command on both ends: the client sends at `at`; the request takes `out` ns to reach
    /// the server, whose clock is `shift` ahead; it answers (if `back` is given) after 2 µs,
    /// and the answer takes `back` ns to arrive.
    #[allow(clippy::too_many_arguments)]
    fn command(
        parts: &mut Vec<CommandPart>,
        (client, server): (u32, u32),
        shift: i64,
        index: u32,
        name: &str,
        bytes: u64,
        at: u64,
        out: u64,
        back: Option<u64>,
    ) {
        let part = |process, part, start_ns, end_ns, sent, received| CommandPart {
            process,
            part,
            command: name.into(),
            connection: 1,
            index,
            endpoint: None,
            start_ns,
            end_ns,
            sent,
            received,
        };
        let served = (at + out) as i64 + shift;
        parts.push(part(client, Part::Request, at, at + 1_000, bytes, 0));
        let end = served as u64 + 3_000;
        if let Some(back) = back {
            let answering = served as u64 + 2_000;
            parts.push(part(server, Part::Answer, answering, end, 12, 0));
            let arrives = (answering as i64 - shift) as u64 + back;
            parts.push(part(client, Part::Answer, at + 1_000, arrives, 0, 12));
        }
        parts.push(part(server, Part::Serve, served as u64, end, 0, bytes));
    }

    #[test]
    fn joins_by_commands_and_bounds_the_offset_from_both_sides() {
        let mut parts = RpcParts::default();
        let p = &mut parts.parts;
        // Client process 0 talks to server 1 (clock 5 ms ahead) ...
        command(
            p,
            (0, 1),
            SHIFT,
            0,
            "HELLO",
            33,
            1_000,
            10_000,
            Some(20_000),
        );
        command(
            p,
            (0, 1),
            SHIFT,
            1,
            "GRAPH_COMPUTE",
            1_814,
            100_000,
            4_000,
            None,
        );
        command(
            p,
            (0, 1),
            SHIFT,
            2,
            "GET_TENSOR",
            49,
            200_000,
            15_000,
            Some(6_000),
        );
        // ... and server 2 saw another graph: not the same connection.
        let mut other = Vec::new();
        command(
            &mut other,
            (9, 2),
            0,
            0,
            "HELLO",
            33,
            1_000,
            10_000,
            Some(10_000),
        );
        command(
            &mut other,
            (9, 2),
            0,
            1,
            "GRAPH_COMPUTE",
            2_000,
            100_000,
            10_000,
            None,
        );
        p.extend(other.into_iter().filter(|c| c.process == 2));
        let a = analyse(&parts);

        assert_eq!(a.links.len(), 1, "{:?}", a.links);
        assert_eq!(
            (a.links[0].client_process, a.links[0].server_process),
            (0, 1)
        );
        assert_eq!(a.joined.len(), 3);
        assert_eq!(a.unjoined_client_connections, 0);
        // Lower bounds: −shift − each request's way out (the tightest: 4 µs); upper bounds:
        // −shift + each answer's way back (the tightest: 6 µs).
        let o = a.offset_of(1).expect("an offset for server 1");
        assert_eq!(o.lower_ns, -SHIFT - 4_000);
        assert_eq!(o.upper_ns, Some(-SHIFT + 6_000));
        assert_eq!(o.offset_ns, -SHIFT + 1_000);
        assert_eq!(o.uncertainty_ns(), Some(5_000));
        assert_eq!(o.commands, 3);
        assert!(a.offset_of(2).is_none());

        // The client's table: counts and bytes per command, times from its spans.
        let hello = &a.commands["HELLO"];
        assert_eq!((hello.count, hello.sent, hello.received), (1, 33, 12));
        assert_eq!(hello.request_ns, 1_000);
        let compute = &a.commands["GRAPH_COMPUTE"];
        assert_eq!(
            (compute.count, compute.sent, compute.answer_ns),
            (1, 1_814, 0)
        );
    }

    #[test]
    fn a_client_connection_whose_server_was_not_traced_is_counted() {
        let mut parts = RpcParts::default();
        command(&mut parts.parts, (0, 1), 0, 0, "HELLO", 33, 0, 10, Some(10));
        parts.parts.retain(|c| c.process == 0);
        let a = analyse(&parts);
        assert!(a.links.is_empty());
        assert_eq!(a.unjoined_client_connections, 1);
        assert!(a.offsets.is_empty());
    }
}
