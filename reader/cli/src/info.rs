//! `ggml-viz info`: what a trace holds, in one screen.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use ggml_viz_reader::format::{EventType, ExtensionKind};
use ggml_viz_reader::{BufferRole, DurationSummary, Layout, OpCollector, TraceStats, timing_cost};

use crate::input::Input;
use crate::input::parse_layout;
use crate::say::Failure;
use crate::say::{MIB, fmt_ns, timing_cost_sentence};

/// Summarize a trace: what it holds and who wrote it.
///
/// Layout, events per type, time span, threads, graph computes, ops, labels,
/// damage, and what the writer's extension records say (process, settings, lost events).
///
/// A graph compute is an outermost graph begin/end pair on its thread; pairs nested inside it
/// (scheduler splits, backend calls) are counted as its sub-graphs.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz info trace.ggmlviz\n  ggml-viz info --layout padded old_cpp_tool_trace.ggmlviz"
)]
pub struct InfoArgs {
    /// Trace file, or - for standard input.
    file: PathBuf,
    /// Read with this event layout instead of detecting it (packed: the spec's; padded: the C++ tool's).
    #[arg(long, value_parser = parse_layout)]
    layout: Option<Layout>,
}

pub fn run(args: InfoArgs) -> Result<(), Failure> {
    let input = Input::open(&args.file, args.layout).map_err(Failure::Data)?;
    let mut stats = TraceStats::default();
    // Where op timing left some graph computes untimed (sampling, a capture window), the nodes
    // are joined too, for what timing cost the run: only then (the join is the slower pass).
    let mut sampled: Option<OpCollector> = None;
    let mut looked = false;
    let (stop, layout) = input.for_each(args.layout, |event| {
        stats.add(&event);
        if !looked && let Some(m) = &stats.metadata {
            looked = true;
            if ggml_viz_reader::leaves_graphs_untimed(m) {
                sampled = Some(OpCollector::streaming());
            }
        }
        if let Some(c) = &mut sampled {
            c.push(Ok(&event));
            c.take_ready().for_each(drop);
        }
        Ok(())
    })?;
    stats.finish();
    let cost = sampled.and_then(|c| timing_cost(&c.finish_each(|_, _| {}).graph_computes));

    let mut out = io::stdout().lock();
    let name = input.name();
    match &input {
        Input::File(f) => writeln!(out, "file:            {name} ({} bytes)", f.bytes().len())?,
        Input::Stdin | Input::Stream(..) => writeln!(out, "file:            {name}")?,
    }
    match layout {
        Some(choice) => writeln!(out, "layout:          {choice}")?,
        None => writeln!(out, "layout:          undecided (no records)")?,
    }
    write_counts(&mut out, &stats)?;
    write_timing(&mut out, &stats)?;
    write_extensions(&mut out, &stats)?;
    if let Some(c) = cost {
        writeln!(out, "op timing cost:  {}", timing_cost_sentence(&c))?;
    }
    match &stop {
        None => writeln!(out, "damage:          none")?,
        Some(stop) => writeln!(
            out,
            "damage:          {}",
            stop.describe(&name)
                .trim_start_matches(&format!("{name}: "))
        )?,
    }
    out.flush()?;
    match stop {
        Some(stop) if stop.is_warning() => {
            eprintln!("ggml-viz: warning: {}", stop.describe(&name));
            Ok(())
        }
        Some(stop) => Err(Failure::Data(stop.describe(&name))),
        None => Ok(()),
    }
}

fn write_counts(out: &mut impl Write, stats: &TraceStats) -> io::Result<()> {
    writeln!(out, "events:          {}", stats.events())?;
    for ty in EventType::ALL {
        let n = stats.count(ty);
        if n > 0 {
            writeln!(out, "  {:<22} {n}", ty.name())?;
        }
    }
    for (code, n) in stats.unknown_codes() {
        writeln!(out, "  {:<22} {n}", format!("unknown type {code}"))?;
    }
    for (kind, n) in &stats.extensions {
        writeln!(out, "  {:<22} {n}", format!("ext:{}", kind.name()))?;
    }
    writeln!(out, "labels:          {}", stats.labels)
}

fn write_timing(out: &mut impl Write, stats: &TraceStats) -> io::Result<()> {
    if let (Some(first), Some(last)) = (stats.first_timestamp_ns, stats.last_timestamp_ns) {
        writeln!(
            out,
            "time span:       {} ({first} .. {last} ns)",
            fmt_ns((last - first) as f64)
        )?;
    }
    let ids: Vec<String> = stats.threads.iter().take(8).map(u32::to_string).collect();
    let more = if stats.threads.len() > 8 { ", …" } else { "" };
    writeln!(
        out,
        "threads:         {} ({}{more})",
        stats.threads.len(),
        ids.join(", ")
    )?;
    writeln!(
        out,
        "graph computes:  {} (sub-graphs inside them: {})",
        stats.graph_computes, stats.sub_graphs
    )?;
    if let Some(s) = DurationSummary::of(&stats.graph_durations_ns) {
        writeln!(
            out,
            "graph time:      mean {}  p50 {}  p99 {}  max {}",
            fmt_ns(s.mean_ns),
            fmt_ns(s.p50_ns as f64),
            fmt_ns(s.p99_ns as f64),
            fmt_ns(s.max_ns as f64)
        )?;
    }
    if stats.unmatched_graph_begins + stats.unmatched_graph_ends > 0 {
        writeln!(
            out,
            "unmatched:       {} graph begin(s) without end, {} end(s) without begin",
            stats.unmatched_graph_begins, stats.unmatched_graph_ends
        )?;
    }
    if stats.backwards_timestamps > 0 {
        writeln!(
            out,
            "clock:           {} event(s) earlier than their thread's previous one",
            stats.backwards_timestamps
        )?;
    }
    // Threads-mode op timing records each worker thread's share of a node as an op event of its
    // own: the nodes are the caller's (see `TraceStats::nodes`).
    let shares = stats
        .metadata
        .as_ref()
        .is_some_and(|m| ggml_viz_reader::op_timing_mode(m) == Some("threads"));
    let types = if shares && stats.nodes > 0 && stats.nodes < stats.ops {
        writeln!(
            out,
            "ops:             {} ({} op events: each worker thread's share of a node is one)",
            stats.nodes, stats.ops
        )?;
        stats.node_type_counts()
    } else {
        writeln!(out, "ops:             {}", stats.ops)?;
        stats.op_type_counts()
    };
    if !types.is_empty() {
        let shown: Vec<String> = types
            .iter()
            .take(8)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        let more = if types.len() > 8 {
            format!(", … ({} types; see `ggml-viz ops`)", types.len())
        } else {
            String::new()
        };
        writeln!(out, "op types:        {}{more}", shown.join(", "))?;
    }
    let m = &stats.memory;
    if m.allocs + m.frees > 0 {
        writeln!(
            out,
            "memory:          {} buffer(s) allocated ({} bytes, peak {} live), {} freed, {} bytes not freed{}",
            m.allocs,
            m.allocated_bytes,
            m.peak_live_bytes,
            m.frees,
            m.live_bytes,
            m.live_at_exit
                .map_or(String::new(), |n| format!(", {n} buffer(s) live at exit"))
        )?;
        let rows = m.by_role();
        if rows.iter().any(|r| r.role != BufferRole::Other) {
            writeln!(
                out,
                "memory by use:   {:<16} {:<12} {:>7} {:>12} {:>12}",
                "held", "buffer type", "buffers", "peak MiB", "at end MiB"
            )?;
            for r in rows {
                writeln!(
                    out,
                    "                 {:<16} {:<12} {:>7} {:>12.2} {:>12.2}",
                    r.role.name(),
                    r.buffer_type,
                    r.buffers,
                    r.peak_bytes as f64 / MIB,
                    r.end_bytes as f64 / MIB
                )?;
            }
        }
    }
    Ok(())
}

fn write_extensions(out: &mut impl Write, stats: &TraceStats) -> io::Result<()> {
    if let Some(m) = &stats.metadata {
        writeln!(out, "writer:          {}", m.writer)?;
        writeln!(
            out,
            "process:         pid {} on {}: {}",
            m.pid,
            m.host,
            m.command_line.join(" ")
        )?;
        writeln!(
            out,
            "machine:         {} CPU(s), {}",
            m.n_cpus,
            m.cpu_model.as_deref().unwrap_or("unknown CPU")
        )?;
        if let Some(note) = stats.oversubscription_note() {
            writeln!(out, "note:            {note}")?;
        }
        writeln!(
            out,
            "ggml version:    {}",
            m.ggml_version.as_deref().unwrap_or("unknown")
        )?;
        let d = &m.distributed;
        writeln!(
            out,
            "distributed:     rank {} (local {}) of {}, job {}",
            d.rank,
            d.local_rank,
            d.world_size,
            d.job_id.as_deref().unwrap_or("-")
        )?;
        if let Some(note) = ggml_viz_reader::op_timing_note(m) {
            writeln!(out, "op timing:       {note}")?;
            // `auto` times a graph with nodes on other backends than the CPU with the eval
            // callback: its op pairs name their backend, threads-mode ones do not.
            if ggml_viz_reader::op_timing_mode(m) == Some("threads") && stats.ops_with_backend > 0 {
                writeln!(
                    out,
                    "                 except {} ops of graphs with nodes on other backends than \
                     the CPU: each node computed and synchronized on its own by the eval callback",
                    stats.ops_with_backend
                )?;
            }
            if stats.device_ops > 0 {
                writeln!(
                    out,
                    "                 and {} nodes computed on a GPU, timed by the device itself \
                     (its own timestamps, nothing of the run changed), on a lane per device queue",
                    stats.device_ops
                )?;
            }
        }
        if !m.settings.is_empty() {
            let settings: Vec<String> =
                m.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            writeln!(out, "settings:        {}", settings.join(" "))?;
        }
    } else if !stats.extensions.contains_key(&ExtensionKind::Metadata) {
        writeln!(
            out,
            "writer:          unknown (no ggml-viz metadata record)"
        )?;
    }
    if let Some(c) = stats.counters {
        writeln!(
            out,
            "lost events:     {} ({} dropped with a full ring, {} over max_events, {} while tracing started)",
            c.lost(),
            c.dropped_ring_full,
            c.over_max_events,
            c.missed_while_starting
        )?;
        if c.incomplete() > 0 {
            writeln!(
                out,
                "incomplete:      {} event(s): {} without their object's name (name table full), {} op event(s) without tensor info (tensor table full)",
                c.incomplete(),
                c.unnamed,
                c.without_tensor_info
            )?;
        }
        if c.rpc_calls_unfollowed > 0 {
            writeln!(
                out,
                "ggml-rpc:        {} transport call(s) not followed (connection table busy or full): their commands are missing",
                c.rpc_calls_unfollowed
            )?;
        }
    }
    if stats.unreadable_extensions > 0 {
        writeln!(
            out,
            "extensions:      {} record(s) with an unreadable payload",
            stats.unreadable_extensions
        )?;
    }
    Ok(())
}
