//! `diff`: two runs side by side, per event name or (with `--ops`) per phase and op type.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use ggml_viz_reader::Format;
use ggml_viz_reader::telemetry::Text;
use ggml_viz_reader::{MIN_GRAPHS, PhaseOps, compare_runs};

use crate::input::reading::{InputOpts, say_warnings, summarize};
use crate::say::Failure;
use crate::say::fmt_ns;

/// Two runs side by side: what changed, per event name or (with --ops) per op type.
///
/// Per event name, count and total time of each and the change; with --ops, per phase
/// (prefill, generation) and op type, each run's nodes and their wall time as `ggml-viz ops` has
/// them, and the change of their time per graph compute with its 95 % interval: within noise
/// where the interval holds 0.
///
/// Counted as `summary` counts them: with threads-mode op timing an op's count and time are its
/// threads' shares (compare runs at the same thread count). With --ops, the interval of one
/// recording a side holds the spread from token to token only; give several recordings of each
/// command (`A1 A2 --vs B1 B2`) to put in the spread from one run to the next.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz diff before.ggmlviz after.ggmlviz\n  ggml-viz diff --ops f16.ggmlviz q4_0.ggmlviz\n  ggml-viz diff --ops f16-1.ggmlviz f16-2.ggmlviz --vs q4-1.ggmlviz q4-2.ggmlviz"
)]
pub struct DiffArgs {
    /// The baseline, then the run to compare with it; with --vs, the baseline's recordings.
    #[arg(required = true, num_args = 1..)]
    runs: Vec<PathBuf>,
    /// With --ops: the recordings to compare with the baseline's (several of one command).
    #[arg(long, num_args = 1.., requires = "ops")]
    vs: Vec<PathBuf>,
    /// Compare the op types' nodes (GGMLVIZ traces with op timings), per phase: count, wall
    /// time and time per graph compute, as `ggml-viz ops` has them, with each change's interval.
    #[arg(long)]
    ops: bool,
    #[command(flatten)]
    input: InputOpts,
}

impl DiffArgs {
    /// The two sides: the runs before --vs and after it, or the first and second run.
    fn sides(&self) -> Result<(&[PathBuf], &[PathBuf]), Failure> {
        match (self.runs.as_slice(), self.vs.as_slice()) {
            (runs, []) if runs.len() == 2 => Ok((&runs[..1], &runs[1..])),
            (runs, vs) if !vs.is_empty() => Ok((runs, vs)),
            _ => Err(Failure::Usage(
                "give two runs (A B), or with --ops a side's recordings each (A1 A2 --vs B1 B2)"
                    .into(),
            )),
        }
    }
}

pub fn diff(args: DiffArgs) -> Result<(), Failure> {
    if args.ops {
        return diff_ops(&args);
    }
    let (a_path, b_path) = match args.sides()? {
        ([a], [b]) => (a.clone(), b.clone()),
        _ => unreachable!("--vs requires --ops"),
    };
    args.input.check(&[a_path.clone(), b_path.clone()], None)?;
    let (a, ra) = summarize(std::slice::from_ref(&a_path), &args.input);
    let (b, rb) = summarize(std::slice::from_ref(&b_path), &args.input);
    say_warnings(&a.warnings);
    say_warnings(&b.warnings);
    let mut names: Vec<&Text> = a.rows().chain(b.rows()).map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    names.sort_by_key(|n| {
        std::cmp::Reverse(
            a.row(n)
                .map_or(0, |r| r.total_ns)
                .max(b.row(n).map_or(0, |r| r.total_ns)),
        )
    });
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "A: {}  (wall {})",
        a_path.display(),
        fmt_ns(a.wall_ns() as f64)
    )?;
    writeln!(
        out,
        "B: {}  (wall {})",
        b_path.display(),
        fmt_ns(b.wall_ns() as f64)
    )?;
    writeln!(
        out,
        "{:<40} {:>8} {:>8} {:>11} {:>11} {:>9}",
        "name", "count A", "count B", "total A", "total B", "change"
    )?;
    for name in names {
        let (ra_, rb_) = (a.row(name), b.row(name));
        let (ta, tb) = (ra_.map_or(0, |r| r.total_ns), rb_.map_or(0, |r| r.total_ns));
        writeln!(
            out,
            "{:<40} {:>8} {:>8} {:>11} {:>11} {:>9}",
            name,
            ra_.map_or(0, |r| r.count),
            rb_.map_or(0, |r| r.count),
            fmt_ns(ta as f64),
            fmt_ns(tb as f64),
            change(ta as f64, tb as f64)
        )?;
    }
    out.flush()?;
    ra.and(rb)
}

/// The change from `a` to `b`, as a signed percentage (`new` where `a` is 0).
fn change(a: f64, b: f64) -> String {
    if a == 0.0 {
        "new".to_string()
    } else {
        format!("{:+.1}%", 100.0 * (b - a) / a)
    }
}

/// `diff --ops`: per phase and op type, the nodes of each side, their wall time, and the change
/// of their time per graph compute with its 95 % interval.
fn diff_ops(args: &DiffArgs) -> Result<(), Failure> {
    let (side_a, side_b) = args.sides()?;
    let all: Vec<PathBuf> = side_a.iter().chain(side_b).cloned().collect();
    args.input.check(&all, Some(Format::Ggmlviz))?;
    let mut out = io::stdout().lock();
    let mut notes = Vec::new();
    let mut sides: Vec<Vec<PhaseOps>> = Vec::new();
    for (label, paths) in [("A", side_a), ("B", side_b)] {
        let mut runs = Vec::new();
        for path in paths {
            let (groups, phases, analysis) =
                crate::input::reading::op_totals(path, args.input.layout, args.input.quiet)?;
            writeln!(
                out,
                "{label}: {}  ({} ops, {} in ops)",
                path.display(),
                groups.nodes(),
                fmt_ns(groups.total_ns() as f64)
            )?;
            if groups.is_empty() {
                writeln!(out, "no op timings in {}", path.display())?;
                return Ok(());
            }
            let mode = analysis.timing_mode.unwrap_or_else(|| "unknown".into());
            notes.push((mode, analysis.timing_note));
            runs.push(phases);
        }
        sides.push(runs);
    }
    let mut modes: Vec<&str> = notes.iter().map(|(mode, _)| mode.as_str()).collect();
    let listed = modes.join(", ");
    modes.sort();
    modes.dedup();
    if modes.len() > 1 {
        writeln!(
            out,
            "note: the runs timed their ops differently ({listed}): compare runs of one mode \
             (sched synchronizes each node and turns op fusion off)"
        )?;
    } else if let Some((_, Some(note))) = notes.first() {
        writeln!(out, "op timing: {note}")?;
    }
    let spread = if side_a.len() > 1 && side_b.len() > 1 {
        "bootstrap over the recordings and their graphs: the spread from run to run included"
    } else {
        "bootstrap over graphs: the spread from token to token only; give several recordings a \
         side (A1 A2 --vs B1 B2) to include the spread from run to run"
    };
    writeln!(
        out,
        "per graph: each graph compute's node time of the op; change: of its mean per graph, with \
         its 95 % interval ({spread}); within noise where the interval holds 0"
    )?;
    let pct = |x: f64| format!("{:+.1}%", 100.0 * x);
    for phase in compare_runs(&sides[0], &sides[1]) {
        let name = phase.phase.map_or("outside llama_decode", |p| p.name());
        let (ga, gb) = phase.graphs;
        writeln!(out)?;
        if ga.min(gb) < MIN_GRAPHS {
            writeln!(
                out,
                "{name}: {ga} graph(s) in A, {gb} in B: too few to tell a change from noise"
            )?;
        } else {
            writeln!(out, "{name}: {ga} graphs in A, {gb} in B")?;
        }
        writeln!(
            out,
            "{:<24} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>8} {:>19}",
            "op",
            "nodes A",
            "nodes B",
            "total A",
            "total B",
            "per graph A",
            "per graph B",
            "change",
            "95 % interval"
        )?;
        for c in &phase.ops {
            let interval = c.interval.map_or_else(
                || "-".to_string(),
                |(lo, hi)| format!("{} .. {}", pct(lo), pct(hi)),
            );
            let line = format!(
                "{:<24} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>8} {:>19}  {}",
                c.op,
                c.nodes.0,
                c.nodes.1,
                fmt_ns(c.total_ns.0 as f64),
                fmt_ns(c.total_ns.1 as f64),
                fmt_ns(c.per_graph_ns.0),
                fmt_ns(c.per_graph_ns.1),
                c.change.map_or_else(|| "new".to_string(), pct),
                interval,
                c.verdict().unwrap_or("")
            );
            writeln!(out, "{}", line.trim_end())?;
        }
    }
    out.flush()?;
    Ok(())
}
