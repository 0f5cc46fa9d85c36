//! `rpc`: a ggml-rpc job's traces (the client's and its servers') joined command by command:
//! which client connection each server served, each server's clock offset from the client's,
//! and per command what it moved and what it cost the client.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use ggml_viz_reader::Format;
use ggml_viz_reader::rpc_join::{PartIndex, RpcAnalysis, RpcParts, TokenTime, analyse};
use ggml_viz_reader::telemetry::{Ids, ProcessId};

use crate::input::reading::say_warnings;
use crate::input::reading::{InputOpts, Reading, clock_sentence};
use crate::say::Failure;
use crate::say::fmt_ns;

/// Join the traces of a ggml-rpc client and its servers: connections, clocks, commands.
///
/// Connections, clock offsets and a
/// table per command (count, bytes, client time, MB/s). Record each process with the hook
/// (`ggml-viz record`), on every host, then give all the traces here.
#[derive(Args)]
#[command(
    after_help = "Example:\n  ggml-viz rpc client.ggmlviz host-a.ggmlviz host-b.ggmlviz\n\n\
        Offsets are what to add to a server's times to put them on the client's clock, \
        with half the width of the interval the answered commands allow."
)]
pub struct RpcArgs {
    /// The traces: the client's and its servers', in any order.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the analysis as JSON instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    input: InputOpts,
}

pub fn run(args: RpcArgs) -> Result<(), Failure> {
    args.input.check(&args.files, Some(Format::Ggmlviz))?;
    let mut parts = RpcParts::default();
    let mut reading = Reading::unaligned(&args.files, &args.input);
    let mut ids = Ids::default();
    let result = args
        .files
        .iter()
        .try_for_each(|path| reading.import(path, &args.input, &mut ids, &mut parts))
        .map_err(|e| Failure::Data(e.0));
    drop(reading);
    say_warnings(&parts.warnings);
    if parts.parts.is_empty() {
        result?;
        return Err(Failure::Usage(
            "no ggml-rpc commands in these traces (record the client and the servers with the \
             hook on Linux x86-64)"
                .into(),
        ));
    }
    let analysis = analyse(&parts);
    let tokens = analysis.tokens(&parts);
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{}", to_json(&parts, &analysis, &tokens))?;
    } else {
        write_tables(&mut out, &parts, &analysis, &tokens)?;
    }
    out.flush()?;
    result
}

fn process_name(parts: &RpcParts, id: ProcessId) -> String {
    parts
        .processes
        .iter()
        .find(|p| p.id == id)
        .map_or_else(|| format!("process {id}"), |p| p.label())
}

fn write_tables(
    out: &mut impl Write,
    parts: &RpcParts,
    a: &RpcAnalysis,
    tokens: &[TokenTime],
) -> io::Result<()> {
    writeln!(out, "connections joined: {}", a.links.len())?;
    for l in &a.links {
        writeln!(
            out,
            "  {} connection {} -> {} ({}) connection {}: {} commands",
            process_name(parts, l.client_process),
            l.client_connection,
            l.endpoint.as_deref().unwrap_or("?"),
            process_name(parts, l.server_process),
            l.server_connection,
            l.commands
        )?;
    }
    if a.unjoined_client_connections > 0 {
        writeln!(
            out,
            "  {} client connection(s) joined to no server trace (server not traced?)",
            a.unjoined_client_connections
        )?;
    }
    writeln!(out, "clock offsets (add to the server's times):")?;
    for o in &a.offsets {
        writeln!(
            out,
            "  {}: {} ({} commands)",
            process_name(parts, o.server_process),
            clock_sentence(o),
            o.commands
        )?;
    }
    write_tokens(out, parts, tokens)?;
    if !a.computes_answered.is_empty() {
        let mut ns: Vec<u64> = a.computes_answered.iter().map(|&(_, ns)| ns).collect();
        ns.sort_unstable();
        writeln!(
            out,
            "graph computes, sent to answered ({}): p50 {}, p99 {}, max {}",
            ns.len(),
            fmt_ns(ns[ns.len() / 2] as f64),
            fmt_ns(ns[(ns.len() * 99 / 100).min(ns.len() - 1)] as f64),
            fmt_ns(ns[ns.len() - 1] as f64)
        )?;
    }
    writeln!(
        out,
        "{:<20} {:>8} {:>12} {:>12} {:>11} {:>11} {:>9}",
        "command", "count", "sent", "received", "request", "answer", "MB/s"
    )?;
    let mut rows: Vec<_> = a.commands.iter().collect();
    rows.sort_by_key(|(_, r)| std::cmp::Reverse(r.request_ns + r.answer_ns));
    for (name, r) in rows {
        writeln!(
            out,
            "{:<20} {:>8} {:>12} {:>12} {:>11} {:>11} {:>9.1}",
            name,
            r.count,
            r.sent,
            r.received,
            fmt_ns(r.request_ns as f64),
            fmt_ns(r.answer_ns as f64),
            r.mb_per_s()
        )?;
    }
    Ok(())
}

/// Where the tokens' time went, summed over each client's decodes.
fn write_tokens(out: &mut impl Write, parts: &RpcParts, all: &[TokenTime]) -> io::Result<()> {
    let mut clients: Vec<ProcessId> = all.iter().map(|t| t.client_process).collect();
    clients.dedup();
    for client in clients {
        let tokens: Vec<_> = all.iter().filter(|t| t.client_process == client).collect();
        let total: u64 = tokens.iter().map(|t| t.end_ns - t.start_ns).sum();
        let share = |ns: u64| 100.0 * ns as f64 / total.max(1) as f64;
        writeln!(
            out,
            "per token, {} decodes of {} ({} in all):",
            tokens.len(),
            process_name(parts, client),
            fmt_ns(total as f64)
        )?;
        let mut rows: Vec<(String, u64)> = Vec::new();
        if let Some(first) = tokens.first() {
            for (i, (server, _)) in first.servers.iter().enumerate() {
                let ns = tokens.iter().map(|t| t.servers[i].1).sum();
                rows.push((format!("compute on {}", process_name(parts, *server)), ns));
            }
        }
        rows.push((
            "compute on the client".into(),
            tokens.iter().map(|t| t.client_compute_ns).sum(),
        ));
        rows.push((
            "sending and awaiting commands".into(),
            tokens.iter().map(|t| t.transfer_ns).sum(),
        ));
        rows.push(("idle".into(), tokens.iter().map(|t| t.idle_ns).sum()));
        for (what, ns) in rows {
            writeln!(
                out,
                "  {:<64} {:>11} {:>6.1}%",
                what,
                fmt_ns(ns as f64),
                share(ns)
            )?;
        }
    }
    Ok(())
}

fn to_json(parts: &RpcParts, a: &RpcAnalysis, tokens: &[TokenTime]) -> serde_json::Value {
    use serde_json::json;
    let part = |n: PartIndex| {
        let p = parts.part(n);
        json!({"process": p.process, "command": parts.command_name(p.command), "connection": p.connection,
               "index": p.index, "start_ns": p.start_ns, "end_ns": p.end_ns,
               "sent": p.sent, "received": p.received})
    };
    json!({
        "processes": parts.processes.iter().map(|p| json!({
            "id": p.id, "pid": p.pid, "name": p.name, "host": p.host})).collect::<Vec<_>>(),
        "links": a.links.iter().map(|l| json!({
            "client_process": l.client_process, "client_connection": l.client_connection,
            "server_process": l.server_process, "server_connection": l.server_connection,
            "endpoint": l.endpoint, "commands": l.commands})).collect::<Vec<_>>(),
        "unjoined_client_connections": a.unjoined_client_connections,
        "offsets": a.offsets.iter().map(|o| json!({
            "server_process": o.server_process, "offset_ns": o.offset_ns,
            "lower_ns": o.lower_ns, "upper_ns": o.upper_ns, "commands": o.commands,
            "uncertainty_ns": o.uncertainty_ns(), "disagreement_ns": o.disagreement_ns(),
            "drift": o.drift.map(|d| json!({"reference_ns": d.reference_ns, "slope": d.slope})),
            "kept_own_clock": o.kept_own_clock}))
            .collect::<Vec<_>>(),
        "commands": a.commands.iter().map(|(name, r)| (name.clone(), json!({
            "count": r.count, "sent": r.sent, "received": r.received,
            "request_ns": r.request_ns, "answer_ns": r.answer_ns}))).collect::<serde_json::Map<_, _>>(),
        "computes_answered": a.computes_answered.iter().map(|&(joined, ns)| json!({
            "joined": joined, "ns": ns})).collect::<Vec<_>>(),
        "tokens": tokens.iter().map(|t| json!({
            "client_process": t.client_process, "start_ns": t.start_ns, "end_ns": t.end_ns,
            "servers": t.servers.iter().map(|(p, ns)| json!({"process": p, "compute_ns": ns}))
                .collect::<Vec<_>>(),
            "client_compute_ns": t.client_compute_ns, "transfer_ns": t.transfer_ns,
            "idle_ns": t.idle_ns})).collect::<Vec<_>>(),
        "joined": a.joined.iter().map(|j| json!({
            "link": j.link, "request": part(j.request),
            "answer": j.answer.map(part), "serve": part(j.serve),
            "server_answer": j.server_answer.map(part)})).collect::<Vec<_>>(),
    })
}
