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
//!
//! Cost: linear in the commands (a day of serving is millions). What is held: each command part
//! in 48 bytes ([`CommandPart`], its command name interned), and per joined command four indices
//! into them; the per-token breakdown ([`RpcAnalysis::tokens`]) is worked out only when asked
//! for, in one sweep per client.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::telemetry::{Arg, Process, Record, RecordSink, Span, Text};

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
    /// The client sends the command.
    Request,
    /// An answer: the client's reading it, or (on a connection the process served) the server's
    /// writing it, inside its serve span.
    Answer,
    /// The server serves the command.
    Serve,
}

/// A command name, interned in its [`RpcParts`] ([`RpcParts::command_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommandId(u16);

/// One part of one command.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommandPart {
    pub process: u32,
    pub connection: u32,
    pub index: u32,
    pub command: CommandId,
    pub part: Part,
    pub start_ns: u64,
    pub end_ns: u64,
    pub sent: u64,
    pub received: u64,
}

/// An index into [`RpcParts::parts`].
pub type PartIndex = u32;

/// A sink that keeps the processes and the RPC parts of an import (everything else passes by).
#[derive(Debug, Default)]
pub struct RpcParts {
    pub processes: Vec<Process>,
    pub parts: Vec<CommandPart>,
    /// Each connection's far end as first named: (process, connection) → `host:port`.
    pub endpoints: HashMap<(u32, u32), String>,
    /// `llama_decode` spans (process, start, end): the tokens of the per-token breakdown.
    pub decodes: Vec<(u32, u64, u64)>,
    /// Graph computes on backends other than ggml-rpc's (process, start, end): a process's
    /// own compute.
    pub local_computes: Vec<(u32, u64, u64)>,
    lanes: HashMap<u32, u32>,
    command_names: Vec<Text>,
    command_ids: HashMap<Text, CommandId>,
    pub warnings: Vec<String>,
}

/// Command names past this many distinct ones share the last (a GGMLVIZ trace has at most 256).
const COMMAND_NAMES: usize = u16::MAX as usize;

impl RpcParts {
    /// The interned id of command `name`.
    pub fn command_id(&mut self, name: &Text) -> CommandId {
        if let Some(&id) = self.command_ids.get(name) {
            return id;
        }
        if self.command_names.len() == COMMAND_NAMES {
            return CommandId(COMMAND_NAMES as u16 - 1);
        }
        let id = CommandId(self.command_names.len() as u16);
        self.command_names.push(name.clone());
        self.command_ids.insert(name.clone(), id);
        id
    }

    pub fn command_name(&self, id: CommandId) -> &str {
        self.command_names.get(usize::from(id.0)).map_or("?", |n| n)
    }

    pub fn part(&self, index: PartIndex) -> &CommandPart {
        &self.parts[index as usize]
    }

    fn is_graph_compute(&self, id: CommandId) -> bool {
        matches!(self.command_name(id), "GRAPH_COMPUTE" | "GRAPH_RECOMPUTE")
    }
}

impl RecordSink for RpcParts {
    fn span(&mut self, span: &Span) {
        let process = self.lanes.get(&span.lane).copied().unwrap_or(0);
        let interval = (process, span.start_ns, span.end_ns);
        if &*span.category == CATEGORY {
            self.command_part(process, span);
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

impl RpcParts {
    /// Keeps the command part an RPC span describes (a span without a known part is none).
    fn command_part(&mut self, process: u32, span: &Span) {
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
                _ => return,
            },
            _ => return,
        };
        let connection = uint(CONNECTION) as u32;
        if let Some(Arg::Str(e)) = arg(ENDPOINT) {
            self.endpoints
                .entry((process, connection))
                .or_insert_with(|| e.to_string());
        }
        let command = self.command_id(&span.name);
        self.parts.push(CommandPart {
            process,
            connection,
            index: uint(INDEX) as u32,
            command,
            part,
            start_ns: span.start_ns,
            end_ns: span.end_ns,
            sent: uint(SENT),
            received: uint(RECEIVED),
        });
    }
}

/// No part.
const NONE: PartIndex = PartIndex::MAX;

/// What both ends of a connection must agree on: (index, command, request bytes) per command.
type Signature = Vec<(u32, CommandId, u64)>;

/// One connection as one end saw it.
#[derive(Clone, Debug, Default)]
struct Connection {
    process: u32,
    id: u32,
    /// By command index, ascending: (index, request or serve, answer), [`NONE`] where absent.
    commands: Vec<(u32, PartIndex, PartIndex)>,
}

impl Connection {
    /// Files part `n` under its command.
    fn add(&mut self, index: u32, n: PartIndex, answer: bool) {
        let slot = match self.commands.last_mut() {
            Some(last) if last.0 == index => last,
            _ => {
                self.commands.push((index, NONE, NONE));
                self.commands.last_mut().expect("just pushed")
            }
        };
        if answer { slot.2 = n } else { slot.1 = n }
    }

    /// Puts the commands in index order, one entry per index (parts arrive as their spans end:
    /// a server's answer before its serve span, so nearly in order already).
    fn settle(&mut self) {
        if self.commands.is_sorted_by_key(|c| c.0)
            && self.commands.windows(2).all(|w| w[0].0 != w[1].0)
        {
            return;
        }
        self.commands.sort_by_key(|c| c.0);
        let mut merged: Vec<(u32, PartIndex, PartIndex)> = Vec::with_capacity(self.commands.len());
        for &(index, main, answer) in &self.commands {
            match merged.last_mut() {
                Some(last) if last.0 == index => {
                    if main != NONE {
                        last.1 = main;
                    }
                    if answer != NONE {
                        last.2 = answer;
                    }
                }
                _ => merged.push((index, main, answer)),
            }
        }
        self.commands = merged;
    }

    fn command(&self, index: u32) -> Option<(PartIndex, PartIndex)> {
        let at = self.commands.binary_search_by_key(&index, |c| c.0).ok()?;
        let (_, main, answer) = self.commands[at];
        Some((main, answer))
    }

    /// The command and request bytes per index: what both ends must agree on.
    fn signature(&self, parts: &RpcParts, client: bool) -> Signature {
        (self.commands.iter())
            .filter(|c| c.1 != NONE)
            .map(|&(i, main, _)| {
                let m = parts.part(main);
                (i, m.command, if client { m.sent } else { m.received })
            })
            .collect()
    }

    /// When its first command began.
    fn first_start(&self, parts: &RpcParts) -> u64 {
        (self.commands.iter())
            .find(|c| c.1 != NONE)
            .map_or(0, |c| parts.part(c.1).start_ns)
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
    /// Add to the server's times to put them on the client's clock (with `drift`: at its
    /// reference time; 0 when `kept_own_clock`).
    pub offset_ns: i64,
    /// What the commands allow for one constant offset: `lower ≤ θ ≤ upper` (`upper` is `None`
    /// when no command was answered). `lower > upper` when none fits: the server's clock drifted
    /// against the client's over a long run, or a connection was joined to the wrong server.
    pub lower_ns: i64,
    pub upper_ns: Option<i64>,
    /// Commands that gave bounds.
    pub commands: usize,
    /// Where no constant offset fits but a line does: the offset changes with time.
    pub drift: Option<Drift>,
    /// Half the width of the interval the commands allow around the estimate (`None`: no
    /// command was answered, unbounded above).
    pub uncertainty: Option<i64>,
    /// Neither a constant offset nor a line fits the commands: the server's times are left on
    /// its own clock.
    pub kept_own_clock: bool,
}

/// An offset that changes with time: `offset_ns + slope × (t − reference_ns)` at client time `t`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drift {
    pub reference_ns: u64,
    /// Nanoseconds of offset per nanosecond of the client's clock (−1e-4: the server's clock
    /// gains 100 µs a second on the client's).
    pub slope: f64,
}

impl ClockOffset {
    /// Half the width of the interval: how far the estimate can be from the truth.
    pub fn uncertainty_ns(&self) -> Option<i64> {
        self.uncertainty
    }

    /// By how much the commands' bounds on one constant offset contradict each other.
    pub fn disagreement_ns(&self) -> Option<i64> {
        let upper = self.upper_ns?;
        (self.lower_ns > upper).then(|| self.lower_ns.saturating_sub(upper))
    }

    /// The offset at client time `t`.
    pub fn at(&self, t: u64) -> i64 {
        match self.drift {
            Some(d) => {
                let since = t as f64 - d.reference_ns as f64;
                self.offset_ns.saturating_add((d.slope * since) as i64)
            }
            None => self.offset_ns,
        }
    }

    /// Server time `t` on the client's clock.
    pub fn on_client_clock(&self, t: u64) -> u64 {
        t.saturating_add_signed(self.at(t.saturating_add_signed(self.offset_ns)))
    }
}

/// A joined command: the client's request (and answer) with the server's serving of it (and
/// its answer), as indices into [`RpcParts::parts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinedCommand {
    pub link: usize,
    pub request: PartIndex,
    pub answer: Option<PartIndex>,
    pub serve: PartIndex,
    pub server_answer: Option<PartIndex>,
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

/// Intervals sorted by start, handed out window by window for windows that move forward: each
/// window gets those that overlap it. Each interval is taken in once and dropped once, so a
/// sweep costs the intervals plus their overlaps with the windows.
struct Sweep {
    sorted: Vec<(u64, u64)>,
    next: usize,
    active: Vec<(u64, u64)>,
}

impl Sweep {
    fn new(mut intervals: Vec<(u64, u64)>) -> Sweep {
        intervals.sort_unstable();
        Sweep {
            sorted: intervals,
            next: 0,
            active: Vec::new(),
        }
    }

    /// The intervals that overlap `[lo, hi)` (`lo` never below an earlier window's).
    fn window(&mut self, lo: u64, hi: u64) -> &[(u64, u64)] {
        self.active.retain(|&(_, end)| end > lo);
        while let Some(&(start, end)) = self.sorted.get(self.next) {
            if start >= hi {
                break;
            }
            if end > lo {
                self.active.push((start, end));
            }
            self.next += 1;
        }
        &self.active
    }
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
    // An answer on a connection that was served is the server's.
    let served: HashSet<(u32, u32)> = (parts.parts.iter())
        .filter(|p| p.part == Part::Serve)
        .map(|p| (p.process, p.connection))
        .collect();
    let mut clients: BTreeMap<(u32, u32), Connection> = BTreeMap::new();
    let mut servers: BTreeMap<(u32, u32), Connection> = BTreeMap::new();
    let mut rows: BTreeMap<CommandId, CommandRow> = BTreeMap::new();
    for (n, p) in parts.parts.iter().enumerate() {
        let key = (p.process, p.connection);
        let on_server = p.part == Part::Serve || served.contains(&key);
        let side = if on_server {
            &mut servers
        } else {
            &mut clients
        };
        let conn = side.entry(key).or_insert_with(|| Connection {
            process: p.process,
            id: p.connection,
            commands: Vec::new(),
        });
        conn.add(p.index, n as PartIndex, p.part == Part::Answer);
        if !on_server {
            let row = rows.entry(p.command).or_default();
            let ns = p.end_ns.saturating_sub(p.start_ns);
            if p.part == Part::Request {
                row.count += 1;
                row.sent = row.sent.saturating_add(p.sent);
                row.request_ns = row.request_ns.saturating_add(ns);
            } else {
                row.received = row.received.saturating_add(p.received);
                row.answer_ns = row.answer_ns.saturating_add(ns);
            }
        }
    }
    for conn in clients.values_mut().chain(servers.values_mut()) {
        conn.settle();
    }
    let mut analysis = RpcAnalysis {
        commands: (rows.into_iter())
            .map(|(id, row)| (parts.command_name(id).to_string(), row))
            .collect(),
        ..RpcAnalysis::default()
    };
    join(parts, &clients, &servers, &mut analysis);
    analysis.offsets = offsets(parts, &analysis);
    analysis.computes_answered = computes_answered(parts, &analysis.joined);
    analysis
}

/// Joins each client connection to the server connection that saw the same commands.
fn join(
    parts: &RpcParts,
    clients: &BTreeMap<(u32, u32), Connection>,
    servers: &BTreeMap<(u32, u32), Connection>,
    analysis: &mut RpcAnalysis,
) {
    let mut by_signature: HashMap<Signature, Vec<(u32, u32)>> = HashMap::default();
    for (key, server) in servers {
        by_signature
            .entry(server.signature(parts, false))
            .or_default()
            .push(*key);
    }
    let endpoint = |c: &Connection| parts.endpoints.get(&(c.process, c.id));
    fn port(endpoint: Option<&String>) -> Option<&str> {
        endpoint.and_then(|e| e.rsplit(':').next())
    }
    let mut taken: HashSet<(u32, u32)> = HashSet::default();
    for client in clients.values() {
        let signature = client.signature(parts, true);
        let client_endpoint = endpoint(client);
        // The same endpoint, else the same port, else the first (in time order) that agrees.
        let chosen = (by_signature.get(&signature).into_iter().flatten())
            .filter(|key| !taken.contains(*key))
            .map(|key| (*key, &servers[key]))
            .min_by_key(|(_, s)| {
                (
                    endpoint(s) != client_endpoint,
                    port(endpoint(s)) != port(client_endpoint),
                    s.first_start(parts),
                )
            });
        let Some((key, server)) = chosen else {
            analysis.unjoined_client_connections += 1;
            continue;
        };
        taken.insert(key);
        let link = analysis.links.len();
        analysis.links.push(Link {
            client_process: client.process,
            client_connection: client.id,
            server_process: server.process,
            server_connection: server.id,
            endpoint: client_endpoint.cloned(),
            commands: signature.len(),
        });
        let present = |n: PartIndex| (n != NONE).then_some(n);
        for &(index, request, answer) in &client.commands {
            let Some((serve, server_answer)) = server.command(index) else {
                continue;
            };
            if request == NONE || serve == NONE {
                continue;
            }
            analysis.joined.push(JoinedCommand {
                link,
                request,
                answer: present(answer),
                serve,
                server_answer: present(server_answer),
            });
        }
    }
}

/// A command's bounds on a server's offset: (client time, lower, upper if answered).
type Bound = (u64, i64, Option<i64>);

/// The bounds joined command `j` puts on its server's offset.
fn bound(parts: &RpcParts, j: &JoinedCommand) -> Bound {
    let signed = |t: u64| t.min(i64::MAX as u64) as i64;
    let (request, serve) = (parts.part(j.request), parts.part(j.serve));
    let lower = signed(request.start_ns).saturating_sub(signed(serve.start_ns));
    let upper = j
        .answer
        .zip(j.server_answer)
        .map(|(answer, server_answer)| {
            signed(parts.part(answer).end_ns)
                .saturating_sub(signed(parts.part(server_answer).start_ns))
        });
    (request.start_ns, lower, upper)
}

/// Offsets, per server process, from every joined command of its links: one constant offset
/// where the bounds allow one, else a line (drift), else none.
fn offsets(parts: &RpcParts, analysis: &RpcAnalysis) -> Vec<ClockOffset> {
    let server_of = |j: &JoinedCommand| analysis.links[j.link].server_process;
    let mut bounds: BTreeMap<u32, (i64, Option<i64>, usize)> = BTreeMap::new();
    for j in &analysis.joined {
        let b = bounds.entry(server_of(j)).or_insert((i64::MIN, None, 0));
        let (_, lower, upper) = bound(parts, j);
        b.0 = b.0.max(lower);
        if let Some(upper) = upper {
            b.1 = Some(b.1.map_or(upper, |u: i64| u.min(upper)));
        }
        b.2 += 1;
    }
    (bounds.into_iter())
        .map(|(server_process, (lower, upper, commands))| {
            let mut offset = ClockOffset {
                server_process,
                offset_ns: upper
                    .map_or(lower, |u| lower.saturating_add(u.saturating_sub(lower) / 2)),
                lower_ns: lower,
                upper_ns: upper,
                commands,
                drift: None,
                uncertainty: upper.map(|u| u.saturating_sub(lower).max(0) / 2),
                kept_own_clock: false,
            };
            if offset.disagreement_ns().is_some() {
                let all: Vec<Bound> = (analysis.joined.iter())
                    .filter(|j| server_of(j) == server_process)
                    .map(|j| bound(parts, j))
                    .collect();
                match fit_line(&all) {
                    Some((drift, intercept, half_width)) => {
                        offset.offset_ns = intercept;
                        offset.drift = Some(drift);
                        offset.uncertainty = Some(half_width);
                    }
                    None => {
                        offset.offset_ns = 0;
                        offset.uncertainty = None;
                        offset.kept_own_clock = true;
                    }
                }
            }
            offset
        })
        .collect()
}

/// Drifts considered: up to a millisecond a second either way (quartz clocks drift by tens of
/// microseconds a second).
const MAX_SLOPE: f64 = 1e-3;

/// A line through the bounds where no constant offset fits them. For a slope `b`, the
/// intercepts every command allows form an interval, whose width is a concave function of `b`
/// (a minimum of lines less a maximum of lines): its widest point is found by golden-section
/// search, and the line is its middle. `None` when even the widest is empty (a misjoined
/// connection, or a clock that jumped): no line fits.
fn fit_line(bounds: &[Bound]) -> Option<(Drift, i64, i64)> {
    let reference_ns = bounds.iter().map(|b| b.0).min()?;
    let since = |t: u64| (t - reference_ns) as f64;
    // The intercepts slope `b` allows: (lowest, highest).
    let allowed = |b: f64| {
        let (mut lowest, mut highest) = (f64::NEG_INFINITY, f64::INFINITY);
        for &(t, l, u) in bounds {
            let along = b * since(t);
            lowest = lowest.max(l as f64 - along);
            if let Some(u) = u {
                highest = highest.min(u as f64 - along);
            }
        }
        (lowest, highest)
    };
    let width = |b: f64| {
        let (lowest, highest) = allowed(b);
        highest - lowest
    };
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let (mut lo, mut hi) = (-MAX_SLOPE, MAX_SLOPE);
    let (mut x1, mut x2) = (hi - ratio * (hi - lo), lo + ratio * (hi - lo));
    let (mut w1, mut w2) = (width(x1), width(x2));
    // 80 steps shrink the bracket by 0.618^80 ≈ 2e-17: far below a nanosecond over any run.
    for _ in 0..80 {
        if w1 < w2 {
            lo = x1;
            (x1, w1) = (x2, w2);
            x2 = lo + ratio * (hi - lo);
            w2 = width(x2);
        } else {
            hi = x2;
            (x2, w2) = (x1, w1);
            x1 = hi - ratio * (hi - lo);
            w1 = width(x1);
        }
    }
    let slope = (lo + hi) / 2.0;
    let (lowest, highest) = allowed(slope);
    if !(lowest <= highest && highest.is_finite()) {
        return None;
    }
    let intercept = ((lowest + highest) / 2.0) as i64;
    let half_width = ((highest - lowest) / 2.0) as i64;
    Some((
        Drift {
            reference_ns,
            slope,
        },
        intercept,
        half_width,
    ))
}

/// Each graph compute's time from its request's start to the end of the next answer on its
/// connection: one backward pass, remembering the next answer of the link.
fn computes_answered(parts: &RpcParts, joined: &[JoinedCommand]) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut next_answer: Option<(usize, u64)> = None;
    for (n, j) in joined.iter().enumerate().rev() {
        if next_answer.is_some_and(|(link, _)| link != j.link) {
            next_answer = None;
        }
        let request = parts.part(j.request);
        if parts.is_graph_compute(request.command)
            && let Some((_, end)) = next_answer
        {
            out.push((n, end.saturating_sub(request.start_ns)));
        }
        if let Some(answer) = j.answer {
            next_answer = Some((j.link, parts.part(answer).end_ns));
        }
    }
    out.reverse();
    out
}

impl RpcAnalysis {
    /// The per-token breakdown of every client's decodes, in one sweep per client.
    pub fn tokens(&self, parts: &RpcParts) -> Vec<TokenTime> {
        let offsets: HashMap<u32, &ClockOffset> = (self.offsets.iter())
            .map(|o| (o.server_process, o))
            .collect();
        let on_client_clock =
            |server: u32, t: u64| offsets.get(&server).map_or(t, |o| o.on_client_clock(t));
        let mut clients: Vec<u32> = self.links.iter().map(|l| l.client_process).collect();
        clients.sort_unstable();
        clients.dedup();
        let mut servers: Vec<u32> = self.links.iter().map(|l| l.server_process).collect();
        servers.sort_unstable();
        servers.dedup();
        // Each server's graph computes on the client's clock.
        let mut computes: HashMap<u32, Vec<(u64, u64)>> = HashMap::default();
        for j in &self.joined {
            let serve = parts.part(j.serve);
            if parts.is_graph_compute(serve.command) {
                let server = self.links[j.link].server_process;
                computes.entry(server).or_default().push((
                    on_client_clock(server, serve.start_ns),
                    on_client_clock(server, serve.end_ns),
                ));
            }
        }
        let mut decodes: Vec<(u32, u64, u64)> = (parts.decodes.iter().copied())
            .filter(|(process, ..)| clients.binary_search(process).is_ok())
            .collect();
        decodes.sort_unstable();
        let mut out = Vec::with_capacity(decodes.len());
        for client in clients {
            let first = decodes.partition_point(|d| d.0 < client);
            let last = decodes.partition_point(|d| d.0 <= client);
            let Some(&(_, final_start, final_end)) = decodes[first..last].last() else {
                continue;
            };
            let own_parts = || (parts.parts.iter()).filter(move |p| p.process == client);
            // A token runs from one decode's start to the next one's: a decode returns once its
            // graphs are sent, before the servers have computed them. The last runs to the end
            // of its decode or of the client's last command, whichever is later.
            let final_hi = (own_parts())
                .filter(|p| p.start_ns >= final_start)
                .map(|p| p.end_ns)
                .max()
                .unwrap_or(final_end)
                .max(final_end);
            let mut server_sweeps: Vec<(u32, Sweep)> = (servers.iter())
                .map(|&s| (s, Sweep::new(computes.get(&s).cloned().unwrap_or_default())))
                .collect();
            let mut own_sweep = Sweep::new(
                (parts.local_computes.iter())
                    .filter(|(p, ..)| *p == client)
                    .map(|&(_, a, b)| (a, b))
                    .collect(),
            );
            let moving = own_parts().filter(|p| p.part != Part::Serve);
            let mut moving_sweep = Sweep::new(moving.map(|p| (p.start_ns, p.end_ns)).collect());
            let windows = decodes[first..last]
                .iter()
                .enumerate()
                .map(
                    |(i, &(_, start, _))| match decodes[first..last].get(i + 1) {
                        Some(&(_, next_start, _)) => (start, next_start),
                        None => (start, final_hi),
                    },
                );
            for (lo, hi) in windows {
                let mut covered = Vec::new();
                let servers = (server_sweeps.iter_mut())
                    .map(|(s, sweep)| {
                        (
                            *s,
                            cover(&mut covered, sweep.window(lo, hi).iter().copied(), lo, hi),
                        )
                    })
                    .collect();
                let client_compute_ns = cover(
                    &mut covered,
                    own_sweep.window(lo, hi).iter().copied(),
                    lo,
                    hi,
                );
                let transfer_ns = cover(
                    &mut covered,
                    moving_sweep.window(lo, hi).iter().copied(),
                    lo,
                    hi,
                );
                let busy: u64 = covered.iter().map(|(a, b)| b - a).sum();
                out.push(TokenTime {
                    client_process: client,
                    start_ns: lo,
                    end_ns: hi,
                    servers,
                    client_compute_ns,
                    transfer_ns,
                    idle_ns: hi.saturating_sub(lo).saturating_sub(busy),
                });
            }
        }
        out
    }
}

/// The argument that ties a client's request to the server's serving of it: the same number on
/// both spans (exporters draw it as a flow).
pub const FLOW: &str = "flow_id";

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
        input_of: impl Fn(u32) -> Option<usize>,
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

    /// Numbers below `n`, the same every run from `seed` (xorshift).
    fn numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// A command on both ends: the client sends at `at`; the request takes `out` ns to reach
    /// the server, whose clock is `shift` ahead; it answers (if `back` is given) after 2 µs,
    /// and the answer takes `back` ns to arrive.
    #[allow(clippy::too_many_arguments)]
    fn command(
        parts: &mut RpcParts,
        (client, server): (u32, u32),
        shift: i64,
        index: u32,
        name: &str,
        bytes: u64,
        at: u64,
        out: u64,
        back: Option<u64>,
    ) {
        let command = parts.command_id(&name.into());
        let parts = &mut parts.parts;
        let part = |process, part, start_ns, end_ns, sent, received| CommandPart {
            process,
            part,
            command,
            connection: 1,
            index,
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
        let p = &mut parts;
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
        let mut other = RpcParts::default();
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
        for part in other.parts.into_iter().filter(|c| c.process == 2) {
            let command = parts.command_id(&other.command_names[usize::from(part.command.0)]);
            parts.parts.push(CommandPart { command, ..part });
        }
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
        command(&mut parts, (0, 1), 0, 0, "HELLO", 33, 0, 10, Some(10));
        parts.parts.retain(|c| c.process == 0);
        let a = analyse(&parts);
        assert!(a.links.is_empty());
        assert_eq!(a.unjoined_client_connections, 1);
        assert!(a.offsets.is_empty());
    }

    /// A long irregular job (uneven gaps, overlapping computes, commands left unanswered, decodes
    /// the servers have not finished before the next begins, the client's own computes): the
    /// sweep's per-token breakdown and the backward pass's graph-compute times equal those of
    /// the plain per-token scans they replaced, written out here.
    #[test]
    fn the_sweeps_give_what_plain_scans_give() {
        let mut parts = RpcParts::default();
        let mut random = numbers(0x2545_f491_4f6c_dd1d);
        let mut t = 1_000_000;
        let mut index = 0;
        for _ in 0..400 {
            parts.decodes.push((0, t, t + 5_000 + random(20_000)));
            if random(4) == 0 {
                parts
                    .local_computes
                    .push((0, t + random(3_000), t + 3_000 + random(60_000)));
            }
            for _ in 0..1 + random(3) {
                let name = ["GRAPH_COMPUTE", "SET_TENSOR", "GET_TENSOR"][random(3) as usize];
                let back = (random(3) != 0).then(|| 1_000 + random(5_000));
                command(
                    &mut parts,
                    (0, 1),
                    SHIFT,
                    index,
                    name,
                    64,
                    t,
                    500 + random(4_000),
                    back,
                );
                index += 1;
                t += 2_000 + random(40_000);
            }
            t += random(30_000);
        }
        let a = analyse(&parts);
        assert_eq!(a.joined.len(), index as usize);

        // Graph computes: the next answer on the link, scanned forward from each.
        let mut expected = Vec::new();
        for (n, j) in a.joined.iter().enumerate() {
            let request = parts.part(j.request);
            if !parts.is_graph_compute(request.command) {
                continue;
            }
            let answered = (a.joined[n + 1..].iter())
                .take_while(|k| k.link == j.link)
                .find_map(|k| k.answer);
            if let Some(answer) = answered {
                expected.push((n, parts.part(answer).end_ns - request.start_ns));
            }
        }
        assert!(expected.len() > 50, "{}", expected.len());
        assert_eq!(a.computes_answered, expected);

        // Tokens: every interval clipped to each window, in the order of precedence.
        let offset = a.offset_of(1).unwrap().offset_ns;
        let mut decodes = parts.decodes.clone();
        decodes.sort_unstable();
        let mut expected = Vec::new();
        for (i, &(_, lo, end)) in decodes.iter().enumerate() {
            let hi = match decodes.get(i + 1) {
                Some(next) => next.1,
                None => (parts.parts.iter())
                    .filter(|p| p.process == 0 && p.start_ns >= lo)
                    .map(|p| p.end_ns)
                    .max()
                    .unwrap_or(end)
                    .max(end),
            };
            let mut busy = vec![0u8; (hi - lo) as usize];
            let mut mark = |a: u64, b: u64, level: u8| {
                let mut ns = 0;
                for t in a.max(lo)..b.min(hi) {
                    let slot = &mut busy[(t - lo) as usize];
                    if *slot == 0 {
                        *slot = level;
                        ns += 1;
                    }
                }
                ns
            };
            let mut server_ns = 0;
            for j in &a.joined {
                let serve = parts.part(j.serve);
                if parts.is_graph_compute(serve.command) {
                    let on_client = |t: u64| t.saturating_add_signed(offset);
                    server_ns += mark(on_client(serve.start_ns), on_client(serve.end_ns), 1);
                }
            }
            let own = parts
                .local_computes
                .iter()
                .map(|&(_, a, b)| mark(a, b, 2))
                .sum();
            let moving = (parts.parts.iter())
                .filter(|p| p.process == 0)
                .map(|p| mark(p.start_ns, p.end_ns, 3))
                .sum();
            let idle = busy.iter().filter(|&&b| b == 0).count() as u64;
            expected.push(TokenTime {
                client_process: 0,
                start_ns: lo,
                end_ns: hi,
                servers: vec![(1, server_ns)],
                client_compute_ns: own,
                transfer_ns: moving,
                idle_ns: idle,
            });
        }
        let tokens = a.tokens(&parts);
        assert!(tokens.iter().filter(|t| t.client_compute_ns > 0).count() > 20);
        assert!(tokens.iter().filter(|t| t.servers[0].1 > 0).count() > 100);
        assert_eq!(tokens, expected);
    }

    /// A server whose clock gains 100 µs a second on the client's, over 200 s of commands
    /// answered within a millisecond: the 20 ms it drifts make the commands' bounds on one
    /// constant offset contradict each other, and the offset is then a line. Its slope is the
    /// drift, every command's bounds hold on it, and it puts server times on the client's clock
    /// within its stated uncertainty at the start and at the end.
    #[test]
    fn a_drifting_clock_gets_a_line() {
        let drift = 100e-6;
        let mut parts = RpcParts::default();
        let mut random = numbers(0x9e37_79b9_7f4a_7c15);
        let start = 1_000_000_000u64;
        let true_offset = |t: u64| -SHIFT - (drift * (t - start) as f64) as i64;
        for index in 0..2_000u32 {
            let at = start + u64::from(index) * 100_000_000;
            // The request arrives `out` later; the server's clock then reads `at + out − θ`.
            let (out, back) = (20_000 + random(400_000), 20_000 + random(400_000));
            let shift = -true_offset(at + out);
            command(
                &mut parts,
                (0, 1),
                shift,
                index,
                "GET_TENSOR",
                64,
                at,
                out,
                Some(back),
            );
        }
        let a = analyse(&parts);
        let o = a.offset_of(1).unwrap();
        let disagreement = o.disagreement_ns().expect("one constant offset cannot fit");
        assert!(disagreement > 10_000_000, "{disagreement}");
        assert!(!o.kept_own_clock);
        let d = o.drift.expect("a drift");
        assert!((d.slope + drift).abs() < 2e-6, "{}", d.slope);
        let uncertainty = o.uncertainty_ns().unwrap();
        assert!((0..500_000).contains(&uncertainty), "{uncertainty}");
        for j in &a.joined {
            let (t, lower, upper) = bound(&parts, j);
            let at = o.at(t);
            assert!(
                lower <= at + 1 && at <= upper.unwrap() + 1,
                "{lower} {at} {upper:?}"
            );
        }
        for t in [start, start + 199 * 1_000_000_000] {
            let error = (o.at(t) - true_offset(t)).abs();
            assert!(error <= uncertainty + 1, "{error} > {uncertainty} at {t}");
        }
    }

    /// Bounds that no line fits (two servers' commands filed under one connection, their clocks
    /// 40 ms apart): the server keeps its own clock (offset 0, nothing to align), and how much
    /// the bounds disagree is told.
    #[test]
    fn bounds_no_line_fits_keep_the_servers_own_clock() {
        let mut parts = RpcParts::default();
        for index in 0..400u32 {
            let shift = if index % 2 == 0 {
                SHIFT
            } else {
                SHIFT + 40_000_000
            };
            let at = 1_000_000 + u64::from(index) * 1_000_000;
            command(
                &mut parts,
                (0, 1),
                shift,
                index,
                "GET_TENSOR",
                64,
                at,
                50_000,
                Some(50_000),
            );
        }
        let a = analyse(&parts);
        let o = a.offset_of(1).unwrap();
        assert!(o.kept_own_clock);
        assert_eq!((o.offset_ns, o.drift, o.uncertainty_ns()), (0, None, None));
        // Lower bounds reach −SHIFT − 50 µs (the way out), upper ones come down to
        // −SHIFT − 40 ms + 50 µs (the way back).
        assert_eq!(o.disagreement_ns(), Some(40_000_000 - 100_000));
        let alignments = a.alignments(&parts, 2, |p| Some(p as usize), true);
        assert!(alignments[1].clock.is_none());
    }

    /// Times and bounds at the ends of their ranges (a hostile or corrupt trace) give bounds and
    /// an uncertainty, never an overflow.
    #[test]
    fn extreme_times_saturate() {
        let mut parts = RpcParts::default();
        command(&mut parts, (0, 1), 0, 0, "HELLO", 1, 0, 10, Some(10));
        let serve = parts
            .parts
            .iter_mut()
            .find(|p| p.part == Part::Serve)
            .unwrap();
        serve.start_ns = u64::MAX;
        let client_answer = (parts.parts.iter_mut())
            .find(|p| p.part == Part::Answer && p.process == 0)
            .unwrap();
        client_answer.end_ns = u64::MAX;
        let a = analyse(&parts);
        let o = a.offset_of(1).unwrap();
        assert_eq!(o.lower_ns, -i64::MAX);
        assert_eq!(o.upper_ns, Some(i64::MAX - 2_010)); // less the server answer's start
        assert_eq!(o.uncertainty_ns(), Some(i64::MAX / 2));
        let _ = a.tokens(&parts);
    }
}
