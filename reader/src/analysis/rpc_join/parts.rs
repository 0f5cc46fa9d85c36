//! The RPC spans of an import, kept compactly: each command part in 48 bytes, its command name
//! interned, each connection's endpoint once.

use rustc_hash::FxHashMap as HashMap;

use crate::telemetry::rpc_spans::{CATEGORY, CONNECTION, ENDPOINT, INDEX, PART, RECEIVED, SENT};
use crate::telemetry::{Arg, Process, Record, RecordSink, Span, Text};
use crate::telemetry::{LaneId, ProcessId};

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
    pub process: ProcessId,
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
    pub endpoints: HashMap<(ProcessId, u32), String>,
    /// `llama_decode` spans (process, start, end): the tokens of the per-token breakdown.
    pub decodes: Vec<(ProcessId, u64, u64)>,
    /// Graph computes on backends other than ggml-rpc's (process, start, end): a process's
    /// own compute.
    pub local_computes: Vec<(ProcessId, u64, u64)>,
    lanes: HashMap<LaneId, ProcessId>,
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

    pub(super) fn is_graph_compute(&self, id: CommandId) -> bool {
        matches!(self.command_name(id), "GRAPH_COMPUTE" | "GRAPH_RECOMPUTE")
    }
}

impl RecordSink for RpcParts {
    fn span(&mut self, span: &Span) {
        let process = self.lanes.get(&span.lane).copied().unwrap_or_default();
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
    fn command_part(&mut self, process: ProcessId, span: &Span) {
        let arg = |key: &str| span.arg(key);
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
