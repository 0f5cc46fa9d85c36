//! `summary`, `diff` and `export`: the commands that read inputs into the telemetry model.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use ggml_viz_reader::OpCollector;
use ggml_viz_reader::TraceFile;
use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::telemetry::export::parquet::ParquetWriter;
use ggml_viz_reader::telemetry::export::summary::{NodeTimes, Row, Summary, csv_cell};
use ggml_viz_reader::telemetry::export::telemetry_v2;
use ggml_viz_reader::telemetry::{ChromeJsonWriter, PerfettoWriter};
use ggml_viz_reader::telemetry::{Format, RecordSink, Text};
use ggml_viz_reader::{MIN_GRAPHS, PhaseOps, compare_runs};

use crate::Failure;
use crate::figures::fmt_ns;
use crate::reading::{InputOpts, Reading};

/// Imports every input into `sink`; warnings go to stderr. The first corrupt input fails the
/// command, after everything before the damage was delivered.
fn import_all<S: RecordSink>(
    paths: &[PathBuf],
    opts: &InputOpts,
    sink: &mut S,
) -> Result<(), Failure> {
    let mut ids = Ids::default();
    let mut reading = Reading::new(paths, 1, opts);
    paths
        .iter()
        .try_for_each(|path| reading.import(path, opts, &mut ids, sink))
        .map_err(|e| Failure::Data(e.0))
}

/// [`import_all`] into a [`Summary`], whose op types count nodes where the inputs timed them
/// (each node's wall time, as `ggml-viz ops`, `diff --ops` and the report have it; not each
/// thread's share of it).
fn summarize(paths: &[PathBuf], opts: &InputOpts) -> (Summary, Result<(), Failure>) {
    let mut summary = Summary::default();
    let mut ids = Ids::default();
    let mut reading = Reading::new(paths, 1, opts);
    let mut nodes: std::collections::HashMap<String, NodeTimes> = Default::default();
    let mut result = Ok(());
    for path in paths {
        let mut collector = OpCollector::streaming();
        let mut add = |o: &ggml_viz_reader::OpSample| {
            nodes
                .entry(o.op.to_string())
                .or_default()
                .add(o.duration_ns);
        };
        let imported = reading.import_watching(path, opts, &mut ids, &mut summary, &mut |e| {
            if let Ok(record) = e {
                collector.push(Ok(&record.event()));
                collector.take_ready().for_each(|o| add(&o));
            }
        });
        collector.finish_each(|_, o| add(&o));
        if let Err(e) = imported {
            result = Err(Failure::Data(e.0));
            break;
        }
    }
    drop(reading);
    summary.use_nodes(&nodes);
    (summary, result)
}

pub fn say_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("ggml-viz: warning: {w}");
    }
}

/// Time per event name over one or more inputs (GGMLVIZ traces, GE logs).
///
/// Count, total, self, mean, min, p50, p99, max, share and thread time. Nested spans of the same
/// name count once: a 20 µs span containing two 10 µs spans of its own name is 2 spans, 20 µs.
/// `total` is the wall time the name's spans cover; mean, min, p50, p99 and max are over the
/// counted spans. An op type whose nodes a trace timed counts nodes, each node's wall time (its
/// first thread's start to its last one's end), as `ops`, `diff --ops` and the report do; its
/// thread time is every thread's share summed. `share` is the row's part of all rows' self
/// time: the shares add up to 100 %.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz summary trace.ggmlviz\n  ggml-viz summary --csv ge.log > ge.csv"
)]
pub struct SummaryArgs {
    /// Inputs, recognised by content.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write CSV to stdout (units in the column names) instead of a table.
    #[arg(long)]
    csv: bool,
    #[command(flatten)]
    input: InputOpts,
}

pub fn summary(args: SummaryArgs) -> Result<(), Failure> {
    args.input.check(&args.files, None)?;
    let (s, result) = summarize(&args.files, &args.input);
    say_warnings(&s.warnings);
    let mut out = io::stdout().lock();
    if args.csv {
        write_csv(&mut out, &s)?;
    } else {
        write_table(&mut out, &s)?;
    }
    out.flush()?;
    result
}

/// `row`'s part of all rows' self time (`all_self`), in percent.
fn share(row: &Row, all_self: u64) -> f64 {
    if all_self == 0 {
        0.0
    } else {
        100.0 * row.self_ns as f64 / all_self as f64
    }
}

fn write_table(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(out, "wall time: {}", fmt_ns(s.wall_ns() as f64))?;
    if s.rows().any(|(_, r)| r.shares.is_some()) {
        writeln!(
            out,
            "op types count nodes (each node's wall time, as `ops` has it); thread time: every \
             thread's spans of the name, summed"
        )?;
    }
    writeln!(
        out,
        "{:<40} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>11}",
        "name",
        "count",
        "total",
        "self",
        "mean",
        "min",
        "p50",
        "p99",
        "max",
        "share",
        "thread time"
    )?;
    let all_self = s.self_ns_total();
    for (name, r) in s.sorted() {
        writeln!(
            out,
            "{:<40} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6.1}% {:>11}",
            name,
            r.count,
            fmt_ns(r.total_ns as f64),
            fmt_ns(r.self_ns as f64),
            fmt_ns(r.mean_ns()),
            fmt_ns(r.min_ns() as f64),
            fmt_ns(r.durations.quantile(0.5) as f64),
            fmt_ns(r.durations.quantile(0.99) as f64),
            fmt_ns(r.max_ns() as f64),
            share(r, all_self),
            fmt_ns(r.thread_ns() as f64)
        )?;
    }
    Ok(())
}

fn write_csv(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(
        out,
        "name,count,total_us,self_us,mean_us,min_us,p50_us,p99_us,max_us,share_percent,spans,thread_us"
    )?;
    let us = |ns: f64| ns / 1000.0;
    let all_self = s.self_ns_total();
    for (name, r) in s.sorted() {
        writeln!(
            out,
            "{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{:.3}",
            csv_cell(name),
            r.count,
            us(r.total_ns as f64),
            us(r.self_ns as f64),
            us(r.mean_ns()),
            us(r.min_ns() as f64),
            us(r.durations.quantile(0.5) as f64),
            us(r.durations.quantile(0.99) as f64),
            us(r.max_ns() as f64),
            share(r, all_self),
            r.spans(),
            us(r.thread_ns() as f64)
        )?;
    }
    Ok(())
}

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
                crate::ops::op_totals(path, args.input.layout, args.input.quiet)?;
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

#[derive(Clone, Copy, ValueEnum)]
enum Target {
    /// Perfetto's own protobuf format (TrackEvent, deflated unless --no-compress), for
    /// ui.perfetto.dev and its trace processor: many times smaller than the JSON, nanoseconds
    /// kept whole.
    Perfetto,
    /// Chrome trace JSON (Perfetto's legacy input; chrome://tracing).
    ChromeJson,
    /// Parquet tables (spans, counters, instants, processes) under the directory given with -o,
    /// one file per input each: query them with DuckDB, Spark, pandas.
    Parquet,
    /// TelemetryEvent v2 records (a JSON list) of a GGMLVIZ trace's backend buffers (recorded
    /// with GGML_VIZ_MEMORY_TRACKING=1), collector `ggml_viz.hook`.
    TelemetryV2,
}

/// Convert inputs (GGMLVIZ traces, GE logs) into one timeline for another tool.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz export --to perfetto trace.ggmlviz -o trace.pftrace\n  ggml-viz export --to perfetto --no-compress trace.ggmlviz -o plain.pftrace\n  ggml-viz export --to perfetto rank0.ggmlviz rank1.ggmlviz -o job.pftrace\n  ggml-viz export --to chrome-json trace.ggmlviz -o trace.json\n  ggml-viz export --to parquet host-*.ggmlviz -o dataset/\n  duckdb -c \"SELECT op, count(*), sum(duration_ns) FROM 'dataset/spans/*.parquet' WHERE op IS NOT NULL GROUP BY op\""
)]
pub struct ExportArgs {
    /// Output format.
    #[arg(long, value_enum)]
    to: Target,
    /// Inputs, recognised by content; several make one timeline.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output file (default: standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// With --to perfetto: write the packets as they are, not deflated into Perfetto's
    /// `compressed_packets` (which its UI and trace processor inflate as they read), for a reader
    /// that cannot inflate them. Several times larger.
    #[arg(long)]
    no_compress: bool,
    #[command(flatten)]
    input: InputOpts,
}

pub fn export(args: ExportArgs) -> Result<(), Failure> {
    if args.no_compress && !matches!(args.to, Target::Perfetto) {
        return Err(Failure::Usage(
            "--no-compress applies to --to perfetto only".into(),
        ));
    }
    let only = matches!(args.to, Target::TelemetryV2).then_some(Format::Ggmlviz);
    args.input.check(&args.files, only)?;
    if let Target::Parquet = args.to {
        return parquet(&args);
    }
    if args.output.is_none() && matches!(args.to, Target::Perfetto) && io::stdout().is_terminal() {
        return Err(Failure::Usage(
            "--to perfetto writes binary, which a terminal cannot show: give a file with \
             -o FILE.pftrace, or pipe it"
                .into(),
        ));
    }
    let out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(
            File::create(path)
                .map_err(|e| Failure::Data(format!("cannot write {}: {e}", path.display())))?,
        ),
        None => Box::new(io::stdout().lock()),
    };
    let (result, events) = match args.to {
        Target::Perfetto => {
            let out = BufWriter::with_capacity(1 << 16, out);
            let writer = if args.no_compress {
                PerfettoWriter::new(out)
            } else {
                PerfettoWriter::compressed(out)
            };
            export_with(&args, writer, |w| Ok(w.finish()?.1))?
        }
        Target::ChromeJson => {
            let out = BufWriter::with_capacity(1 << 16, out);
            export_with(&args, ChromeJsonWriter::new(out), |w| Ok(w.finish()?.1))?
        }
        Target::TelemetryV2 => telemetry_v2(&args, BufWriter::new(out))?,
        Target::Parquet => unreachable!("written above"),
    };
    if let Some(path) = &args.output {
        let unit = if matches!(args.to, Target::Perfetto) {
            "packets"
        } else {
            "events"
        };
        eprintln!("ggml-viz: wrote {events} {unit} to {}", display(path));
    }
    result
}

/// Every input imported into `sink`, then `finish`ed: the import's result and what was written.
fn export_with<S: RecordSink>(
    args: &ExportArgs,
    mut sink: S,
    finish: impl FnOnce(S) -> io::Result<u64>,
) -> Result<(Result<(), Failure>, u64), Failure> {
    let result = import_all(&args.files, &args.input, &mut sink);
    Ok((result, finish(sink)?))
}

/// Each input into its own files of the dataset directory: `DIR/<table>/<input>.parquet`.
fn parquet(args: &ExportArgs) -> Result<(), Failure> {
    let dir = args.output.as_ref().ok_or_else(|| {
        Failure::Usage("--to parquet writes a directory: give it with -o DIR".into())
    })?;
    let mut ids = Ids::default();
    let mut stems: Vec<String> = Vec::new();
    let mut rows = 0;
    let mut reading = Reading::new(&args.files, 1, &args.input);
    for path in &args.files {
        // Each input's own name, made unique within this export.
        let base = path
            .file_stem()
            .map_or_else(|| "input".into(), |s| s.to_string_lossy().into_owned());
        let mut stem = base.clone();
        let mut n = 1;
        while stems.contains(&stem) {
            n += 1;
            stem = format!("{base}-{n}");
        }
        stems.push(stem.clone());
        let mut writer = ParquetWriter::create(dir, &stem)
            .map_err(|e| Failure::Data(format!("cannot write under {}: {e}", dir.display())))?;
        let result = reading
            .import(path, &args.input, &mut ids, &mut writer)
            .map_err(|e| Failure::Data(e.0));
        rows += writer.finish()?;
        result?;
    }
    drop(reading);
    eprintln!(
        "ggml-viz: wrote {rows} rows for {} input(s) under {}",
        stems.len(),
        display(dir)
    );
    Ok(())
}

/// Every input's buffer events as v2 records, in one JSON list.
fn telemetry_v2(
    args: &ExportArgs,
    mut out: impl Write,
) -> Result<(Result<(), Failure>, u64), Failure> {
    let mut records = Vec::new();
    let mut result = Ok(());
    for path in &args.files {
        let trace = TraceFile::open(path, args.input.layout)
            .map_err(|e| Failure::Data(format!("cannot open {}: {e}", path.display())))?;
        let (mut events, damage) = telemetry_v2::from_ggmlviz(trace.bytes(), trace.layout().layout);
        if events.is_empty() {
            eprintln!(
                "ggml-viz: warning: {}: no buffer events (record with GGML_VIZ_MEMORY_TRACKING=1)",
                path.display()
            );
        }
        records.append(&mut events);
        match damage {
            Some(d) if d.is_truncation() => eprintln!("ggml-viz: warning: {}: {d}", path.display()),
            Some(d) => result = Err(Failure::Data(format!("{}: {d}", path.display()))),
            None => {}
        }
    }
    serde_json::to_writer_pretty(&mut out, &records).map_err(io::Error::from)?;
    writeln!(out)?;
    out.flush()?;
    Ok((result, records.len() as u64))
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
