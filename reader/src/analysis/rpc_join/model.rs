//! What the analysis finds: links between connections, joined commands, clock offsets, the
//! commands' table, the per-token breakdown.

use crate::telemetry::ProcessId;
use std::collections::BTreeMap;

use super::parts::PartIndex;

/// A client's connection joined to the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub client_process: ProcessId,
    pub client_connection: u32,
    pub server_process: ProcessId,
    pub server_connection: u32,
    pub endpoint: Option<String>,
    /// Commands joined.
    pub commands: usize,
}

/// A server's clock against the client's.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockOffset {
    pub server_process: ProcessId,
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
/// its answer), as indices into [`RpcParts::parts`](super::RpcParts::parts).
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
    pub client_process: ProcessId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// (server process, ns).
    pub servers: Vec<(ProcessId, u64)>,
    pub client_compute_ns: u64,
    pub transfer_ns: u64,
    pub idle_ns: u64,
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
    pub fn offset_of(&self, server_process: ProcessId) -> Option<&ClockOffset> {
        self.offsets
            .iter()
            .find(|o| o.server_process == server_process)
    }
}
