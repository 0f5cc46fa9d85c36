//! ggml-rpc across hosts: the traces of a client and its servers joined command by command,
//! each server's clock offset from the client's estimated from the commands that were answered,
//! and a table per command.
//!
//! The hook records each command's parts as spans of category
//! [`CATEGORY`](crate::telemetry::rpc_spans::CATEGORY) named by the command
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

mod align;
mod clocks;
mod join;
mod model;
mod parts;
mod tokens;

pub use align::{Aligned, Alignment};
pub use join::analyse;
pub use model::{ClockOffset, CommandRow, Drift, JoinedCommand, Link, RpcAnalysis, TokenTime};
pub use parts::{CommandId, CommandPart, Part, PartIndex, RpcParts};

#[cfg(test)]
mod tests;
