//! Joining: each client connection to the server connection that saw the same commands, then
//! the clocks and the graph computes' times from the joined commands.

use crate::telemetry::ProcessId;
use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::clocks::offsets;
use super::model::{CommandRow, JoinedCommand, Link, RpcAnalysis};
use super::parts::{CommandId, Part, PartIndex, RpcParts};

/// No part.
const NONE: PartIndex = PartIndex::MAX;

/// What both ends of a connection must agree on: (index, command, request bytes) per command.
type Signature = Vec<(u32, CommandId, u64)>;

/// One connection as one end saw it.
#[derive(Clone, Debug, Default)]
struct Connection {
    process: ProcessId,
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

/// Joins and measures what `parts` holds.
pub fn analyse(parts: &RpcParts) -> RpcAnalysis {
    // An answer on a connection that was served is the server's.
    let served: HashSet<(ProcessId, u32)> = (parts.parts.iter())
        .filter(|p| p.part == Part::Serve)
        .map(|p| (p.process, p.connection))
        .collect();
    let mut clients: BTreeMap<(ProcessId, u32), Connection> = BTreeMap::new();
    let mut servers: BTreeMap<(ProcessId, u32), Connection> = BTreeMap::new();
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
    clients: &BTreeMap<(ProcessId, u32), Connection>,
    servers: &BTreeMap<(ProcessId, u32), Connection>,
    analysis: &mut RpcAnalysis,
) {
    let mut by_signature: HashMap<Signature, Vec<(ProcessId, u32)>> = HashMap::default();
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
    let mut taken: HashSet<(ProcessId, u32)> = HashSet::default();
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
