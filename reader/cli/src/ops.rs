//! `ggml-viz ops`: where the time goes inside the graphs, op by op.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use ggml_viz_reader::Layout;
use ggml_viz_reader::csv_cell;
use ggml_viz_reader::timing_cost;
use ggml_viz_reader::{
    GroupBy, OpAnalysis, OpGroups, OpSample, Phase, ThreadTotals, oversubscription_note,
};

use crate::input::parse_layout;
use crate::say::Failure;
use crate::say::{fmt_ns, timing_cost_sentence};

/// Per-op timings: where the time of the graph computes went, per op, name, backend or layer.
///
/// Count, total, mean/p50/p99 time (p50 and p99 within 1 %), GFLOP/s
/// (MUL_MAT, MUL_MAT_ID) and GB/s (bytes moved per second: the sources read, weights included,
/// and the result written) per op type, tensor name, backend or layer, and the share of graph
/// time spent in ops. With llama_decode spans in the trace, prefill
/// (multi-token batches) and generation (single tokens) are shown separately.
///
/// Op timings exist when the hook ran with op timing on (GGML_VIZ_OP_TIMING=auto, the
/// default). On the CPU backend (`threads` mode) every worker thread's share of every node is
/// recorded as the run computed it: a node's time is then its wall time (first thread's start
/// to last thread's end), and the table adds the threads' summed time, the imbalance (of the
/// time the threads that had work spent in the node, the share they waited for the slowest)
/// and the share of the threads' time spent waiting at barriers (inside the op, at the barriers
/// ggml's ops have, such as mul_mat's, and after it); `--by thread` shows each thread's time in
/// nodes (and how much of it went to waits at barriers inside ops) and in waits between nodes.
/// Where the graph computes ran more threads than the process had CPUs, a note says so: each
/// barrier then waits for a thread that waits for a core (with OpenMP, in time between nodes;
/// with ggml's own thread pool, whose threads spin, inside longer nodes).
/// Elsewhere (`sched` mode) each node is computed and synchronized on its own
/// by the scheduler's eval callback, which adds a synchronization per node and disables
/// ggml's op fusion.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz ops trace.ggmlviz\n  ggml-viz ops --by layer --top 5 trace.ggmlviz\n  ggml-viz ops --by name trace.ggmlviz\n  ggml-viz ops --by thread trace.ggmlviz\n  ggml-viz ops --csv trace.ggmlviz > ops.csv"
)]
pub struct OpsArgs {
    /// Trace file, or - for standard input.
    file: PathBuf,
    /// Group by op type, tensor name and op (`Qcur-0 (MUL_MAT)`: one name can be several
    /// nodes), backend, layer (llama.cpp's `<name>-<layer>`), kernel (a GPU node's Vulkan
    /// pipelines), or worker thread.
    #[arg(long, value_enum, default_value_t = By::Op)]
    by: By,
    /// Show the N groups with the most time (0: all).
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Read with this event layout instead of detecting it.
    #[arg(long, value_parser = parse_layout)]
    layout: Option<Layout>,
    /// Write CSV instead of the tables, for a spreadsheet or a script: a row per phase and group
    /// (every group: --top does not apply), times in nanoseconds, imbalance and wait as fractions;
    /// with --by thread, a row per thread.
    #[arg(long)]
    csv: bool,
    /// No progress bar (one shows on a terminal while a large trace is read).
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum By {
    Op,
    Name,
    Backend,
    Layer,
    /// The kernels a GPU node ran (Vulkan pipelines), where the trace knows them.
    Kernel,
    Thread,
}

/// The nodes as `ops` shows them, grouped as they come: all of them and per phase.
struct Tables {
    all: OpGroups,
    prefill: OpGroups,
    generation: OpGroups,
    /// Whether a node was computed by more than one thread (threads-mode op timing).
    threaded: bool,
}

impl Tables {
    fn new(by: GroupBy) -> Tables {
        Tables {
            all: OpGroups::new(by),
            prefill: OpGroups::new(by),
            generation: OpGroups::new(by),
            threaded: false,
        }
    }

    fn add(&mut self, o: &OpSample) {
        self.threaded |= o.threads > 1;
        match o.phase {
            Some(Phase::Prefill) => self.prefill.add(o),
            Some(Phase::Generation) => self.generation.add(o),
            None => {}
        }
        self.all.add(o);
    }

    /// The tables to show: prefill and generation apart where the trace has llama_decode spans
    /// (a phase without ops, such as `llama-bench -p 0`'s prefill, has none), else all nodes in
    /// one (`None`).
    fn shown(&self) -> Vec<(Option<Phase>, &OpGroups)> {
        let phases = [
            (Some(Phase::Prefill), &self.prefill),
            (Some(Phase::Generation), &self.generation),
        ];
        if phases.iter().any(|(_, groups)| !groups.is_empty()) {
            phases
                .into_iter()
                .filter(|(_, groups)| !groups.is_empty())
                .collect()
        } else if self.all.is_empty() {
            Vec::new()
        } else {
            vec![(None, &self.all)]
        }
    }
}

pub fn run(args: OpsArgs) -> Result<(), Failure> {
    let by = match args.by {
        By::Op => GroupBy::Op,
        By::Name => GroupBy::Name,
        By::Backend => GroupBy::Backend,
        By::Layer => GroupBy::Layer,
        By::Kernel => GroupBy::Kernel,
        By::Thread => GroupBy::Op,
    };
    let mut tables = Tables::new(by);
    let read =
        crate::input::reading::read_nodes(&args.file, args.layout, args.quiet, |o| tables.add(o))?;
    let analysis = &read.analysis;
    let mut out = io::stdout().lock();
    match (args.csv, args.by) {
        (true, By::Thread) => write_threads_csv(&mut out, analysis)?,
        (true, _) => write_csv(&mut out, &tables)?,
        (false, By::Thread) => {
            write_header(&mut out, analysis, &tables)?;
            write_threads(&mut out, analysis)?;
        }
        (false, _) => {
            write_header(&mut out, analysis, &tables)?;
            for (phase, groups) in tables.shown() {
                match phase {
                    Some(phase) => writeln!(out, "\n{} ({} ops)", phase.name(), groups.nodes())?,
                    None => writeln!(out)?,
                }
                write_table(&mut out, groups, args.top, tables.threaded)?;
                if let Some(bandwidth) = analysis.memory_bandwidth {
                    write_memory_share(&mut out, groups, bandwidth)?;
                }
            }
        }
    }
    out.flush()?;
    read.outcome()
}

fn write_header(out: &mut impl Write, a: &OpAnalysis, t: &Tables) -> io::Result<()> {
    if let Some(note) = &a.timing_note {
        writeln!(out, "op timing: {note}")?;
    }
    if t.all.is_empty() {
        return writeln!(out, "no op timings in this trace");
    }
    let op_ns = t.all.total_ns();
    let share = if a.timed_graph_ns > 0 {
        100.0 * op_ns as f64 / a.timed_graph_ns as f64
    } else {
        0.0
    };
    if a.devices.is_empty() {
        writeln!(
            out,
            "{} ops, {} in ops = {share:.1} % of the {} of graph computes they ran in",
            t.all.nodes(),
            fmt_ns(op_ns as f64),
            fmt_ns(a.timed_graph_ns as f64)
        )?;
    } else {
        // A GPU's nodes run after the graph compute that launched them has returned.
        writeln!(
            out,
            "{} ops, {} in ops (a GPU's nodes run after their graph compute returned: its share \
             of the time is on its own line)",
            t.all.nodes(),
            fmt_ns(op_ns as f64)
        )?;
    }
    if let Some(c) = timing_cost(&a.graph_computes) {
        writeln!(out, "op timing's own cost: {}", timing_cost_sentence(&c))?;
    }
    if t.threaded {
        let sum = |of: fn(&ThreadTotals) -> u64| {
            a.threads.iter().fold(0u64, |t, w| t.saturating_add(of(w)))
        };
        writeln!(
            out,
            "{} threads: {} in their shares of nodes ({} of it waiting at barriers inside ops), \
             {} waiting at barriers between nodes",
            a.threads.len(),
            fmt_ns(t.all.thread_ns() as f64),
            fmt_ns(sum(|w| w.inner_wait_ns) as f64),
            fmt_ns(sum(|w| w.wait_ns) as f64)
        )?;
    }
    for d in &a.devices {
        let per = |ns: u64| fmt_ns(ns as f64 / d.computes.max(1) as f64);
        writeln!(
            out,
            "{}: busy {:.1} % of its {} graph computes (each from its begin to the next's); idle \
             per compute: {} before its first node (launch), {} between nodes, {} after its last \
             (waiting for the CPU)",
            d.backend,
            100.0 * d.busy_share(),
            d.computes,
            per(d.idle_before_ns),
            per(d.idle_between_ns),
            per(d.idle_after_ns)
        )?;
    }
    if let Some(note) = oversubscription_note(a.graph_threads, a.n_cpus) {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

/// `--by thread`: each thread's shares of nodes and barrier waits.
fn write_threads(out: &mut impl Write, a: &OpAnalysis) -> io::Result<()> {
    writeln!(
        out,
        "\n{:<10} {:>8} {:>11} {:>11} {:>8} {:>11} {:>7}",
        "thread", "shares", "in shares", "inner wait", "waits", "waiting", "wait %"
    )?;
    for t in &a.threads {
        let total = t.share_ns.saturating_add(t.wait_ns);
        let wait_share = if total > 0 {
            100.0 * t.wait_ns as f64 / total as f64
        } else {
            0.0
        };
        writeln!(
            out,
            "{:<10} {:>8} {:>11} {:>11} {:>8} {:>11} {:>6.1}%",
            t.thread_id,
            t.shares,
            fmt_ns(t.share_ns as f64),
            fmt_ns(t.inner_wait_ns as f64),
            t.waits,
            fmt_ns(t.wait_ns as f64),
            wait_share
        )?;
    }
    Ok(())
}

fn write_table(
    out: &mut impl Write,
    groups: &OpGroups,
    top: usize,
    threaded: bool,
) -> io::Result<()> {
    let total = groups.total_ns();
    let rows = groups.rows();
    let shown = if top == 0 {
        rows.len()
    } else {
        top.min(rows.len())
    };
    write!(
        out,
        "{:<28} {:>7} {:>11} {:>7} {:>10} {:>10} {:>10} {:>9} {:>8}",
        "group", "count", "total", "share", "mean", "p50", "p99", "GFLOP/s", "GB/s"
    )?;
    if threaded {
        write!(out, " {:>11} {:>6} {:>6}", "thread time", "imbal", "wait")?;
    }
    writeln!(out)?;
    for g in &rows[..shown] {
        let share = if total > 0 {
            100.0 * g.total_ns as f64 / total as f64
        } else {
            0.0
        };
        let gflops = g
            .flops_per_s
            .map_or_else(|| "-".into(), |f| format!("{:.2}", f / 1e9));
        write!(
            out,
            "{:<28} {:>7} {:>11} {:>6.1}% {:>10} {:>10} {:>10} {:>9} {:>8.2}",
            truncate(&g.key, 28),
            g.count,
            fmt_ns(g.total_ns as f64),
            share,
            fmt_ns(g.durations.mean_ns),
            fmt_ns(g.durations.p50_ns as f64),
            fmt_ns(g.durations.p99_ns as f64),
            gflops,
            g.bytes_per_s / 1e9
        )?;
        if threaded {
            write!(
                out,
                " {:>11} {:>5.1}% {:>5.1}%",
                fmt_ns(g.thread_ns as f64),
                100.0 * g.imbalance,
                100.0 * g.wait_share
            )?;
        }
        writeln!(out)?;
    }
    if shown < rows.len() {
        writeln!(out, "… {} more (use --top 0 for all)", rows.len() - shown)?;
    }
    Ok(())
}

/// The op types that move the most bytes a second, as shares of the host's memory bandwidth
/// (`bandwidth`, bytes/s): over 100 %, the bytes came from a cache, not from memory.
fn write_memory_share(out: &mut impl Write, groups: &OpGroups, bandwidth: f64) -> io::Result<()> {
    let mut rows: Vec<_> = (groups.rows().into_iter())
        .filter(|g| g.bytes_per_s > 0.0)
        .collect();
    rows.sort_by(|a, b| b.bytes_per_s.total_cmp(&a.bytes_per_s));
    let shares: Vec<String> = (rows.iter().take(4))
        .map(|g| {
            let share = 100.0 * g.bytes_per_s / bandwidth;
            if share > 100.0 {
                format!(
                    "{} {share:.0} % (faster than memory: its bytes came from a cache)",
                    g.key
                )
            } else {
                format!("{} {share:.0} %", g.key)
            }
        })
        .collect();
    if shares.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "of this host's memory bandwidth ({:.1} GB/s, measured by `ggml-viz record`), the bytes \
         the nodes moved each second: {}",
        bandwidth / 1e9,
        shares.join(", ")
    )
}

/// The tables as CSV: a row per phase (`all` without llama_decode spans) and group, every group.
fn write_csv(out: &mut impl Write, tables: &Tables) -> io::Result<()> {
    writeln!(
        out,
        "phase,group,count,total_ns,mean_ns,p50_ns,p99_ns,max_ns,gflop_per_s,gb_per_s,thread_ns,\
         imbalance,wait_share"
    )?;
    for (phase, groups) in tables.shown() {
        for g in groups.rows() {
            let d = &g.durations;
            writeln!(
                out,
                "{},{},{},{},{:.1},{},{},{},{},{:.6},{},{:.6},{:.6}",
                phase.map_or("all", Phase::name),
                csv_cell(&g.key),
                g.count,
                g.total_ns,
                d.mean_ns,
                d.p50_ns,
                d.p99_ns,
                d.max_ns,
                g.flops_per_s
                    .map_or_else(String::new, |f| format!("{:.3}", f / 1e9)),
                g.bytes_per_s / 1e9,
                g.thread_ns,
                g.imbalance,
                g.wait_share
            )?;
        }
    }
    Ok(())
}

/// `--by thread` as CSV: a row per thread.
fn write_threads_csv(out: &mut impl Write, a: &OpAnalysis) -> io::Result<()> {
    writeln!(
        out,
        "thread,shares,share_ns,inner_waits,inner_wait_ns,waits,wait_ns"
    )?;
    for t in &a.threads {
        writeln!(
            out,
            "{},{},{},{},{},{},{}",
            t.thread_id, t.shares, t.share_ns, t.inner_waits, t.inner_wait_ns, t.waits, t.wait_ns
        )?;
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}
