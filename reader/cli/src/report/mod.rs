//! `report`: one self-contained HTML page of one or more inputs (no network, everything
//! inlined) with a zoomable timeline, time per op type / tensor / backend, per-token latency,
//! a batching server's sequences and live bytes. [`data`] computes what the page shows from the telemetry model, [`page`] writes it.

mod data;
mod page;
mod sampling;
mod series;
mod slots;
mod tables;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::{Damage, OpCollector, RecordView, TraceStats, timing_cost};
use ggml_viz_reader::{Format, RecordTap, detect};

use crate::input::reading::{InputOpts, Reading};
use crate::say::Failure;
use crate::say::timing_cost_sentence;
use data::ReportBuilder;
use page::write_html;
use tables::OpRows;

/// Write one HTML report that opens offline: timeline, time per op, latency, memory.
///
/// Everything is inlined (no network): a zoomable timeline
/// per thread with op spans under their graphs, time per op type / tensor / backend (of a trace
/// with op timings: per node, as `ggml-viz ops` counts them, with the threads' time, imbalance
/// and wait), per-call
/// latency (prefill and generation apart), a batching server's sequences (requests and tokens per
/// slot) and live bytes per buffer type.
///
/// Large traces are drawn in part (every graph, the ops of a uniform sample of graphs; the page
/// says so); the tables and charts count everything.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz report trace.ggmlviz -o report.html\n  ggml-viz report rank0.ggmlviz rank1.ggmlviz -o job.html --title \"job 42\""
)]
pub struct ReportArgs {
    /// Inputs (GGMLVIZ traces, GE logs, TelemetryEvent v2, CoMMA), recognised by content.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The HTML file to write (default: the first input's name with .html, in the current
    /// directory).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Title of the page (default: the inputs' file names).
    #[arg(long)]
    title: Option<String>,
    #[command(flatten)]
    input: InputOpts,
}

/// What a report counts of a GGMLVIZ input beside the page's data, from the same read: the
/// counts `info` shows, the nodes `ops` shows (each counted once known: memory does not grow
/// with the trace), and the damage that ended the read.
struct InputTap<'a> {
    name: &'a str,
    stats: TraceStats,
    damage: Option<String>,
    collector: OpCollector,
    nodes: OpRows,
}

impl RecordTap for InputTap<'_> {
    fn record(&mut self, record: RecordView<'_>) {
        let event = record.event();
        self.stats.add(&event);
        self.collector.push(Ok(&event));
        let nodes = &mut self.nodes;
        self.collector.take_ready().for_each(|o| nodes.add_node(&o));
    }

    fn damage(&mut self, damage: &Damage) {
        // Described as the importer describes it (the page lists it once).
        self.damage = Some(format!("{}: {damage}", self.name));
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

pub fn run(args: ReportArgs) -> Result<(), Failure> {
    args.input.check(&args.files, None)?;
    let output = args.output.clone().unwrap_or_else(|| {
        let stem = args.files[0]
            .file_stem()
            .map_or("report".into(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("{stem}.html"))
    });
    let names: Vec<String> = args.files.iter().map(|p| p.display().to_string()).collect();
    let title = args.title.clone().unwrap_or_else(|| {
        args.files
            .iter()
            .map(|p| file_name(p))
            .collect::<Vec<_>>()
            .join(", ")
    });

    // One pass over each input: the page's data, and for traces the counts `info` shows and
    // the nodes `ops` shows (each counted once known: memory does not grow with the trace).
    let mut reading = Reading::new(&args.files, 1, &args.input);
    let mut builder = ReportBuilder::new(title, names.clone());
    let mut ids = Ids::default();
    let mut failure = None;
    for (path, name) in args.files.iter().zip(&names) {
        let items = builder.items;
        let mut tap = InputTap {
            name,
            stats: TraceStats::default(),
            damage: None,
            collector: OpCollector::streaming(),
            nodes: OpRows::default(),
        };
        let imported = reading.import_tapped(path, &args.input, &mut ids, &mut builder, &mut tap);
        let InputTap {
            mut stats,
            damage,
            collector,
            mut nodes,
            ..
        } = tap;
        let analysis = collector.finish_each(|_, o| nodes.add_node(&o));
        if let Some(c) = timing_cost(&analysis.graph_computes) {
            builder.add_timing_cost(format!(
                "{name}: op timing's own cost: {}",
                timing_cost_sentence(&c)
            ));
        }
        builder.end_input(nodes);
        if analysis.late_shares > 0 {
            builder.warn(format!(
                "{name}: {} thread share(s) of nodes came in the trace long after their graph \
                 compute ended (more than two ring drains); each is counted as a node of its own",
                analysis.late_shares
            ));
        }
        let format = args.input.format.map_or_else(|| detect(path).ok(), Some);
        if format == Some(Format::Ggmlviz) {
            stats.finish();
            if let Some(note) = stats.oversubscription_note() {
                builder.warn(format!("{name}: {note}"));
            }
            if let Some(note) = stats
                .metadata
                .as_ref()
                .and_then(ggml_viz_reader::op_timing_note)
            {
                builder.add_op_timing(note);
            }
            builder.add_memory_by_use(name, stats.memory.by_role());
            builder.add_input_totals(
                stats.events(),
                stats.counters.map_or(0, |c| c.lost()),
                damage,
            );
        } else {
            let items = builder.items - items;
            builder.add_input_totals(items, 0, imported.as_ref().err().map(|e| e.0.clone()));
        }
        if let Err(e) = imported {
            failure.get_or_insert(Failure::Data(e.0));
        }
    }
    drop(reading);
    let data = builder.finish();

    let file = File::create(&output)
        .map_err(|e| Failure::Data(format!("cannot write {}: {e}", output.display())))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    write_html(&mut out, &data)?;
    out.flush()?;
    let size = std::fs::metadata(&output).map_or(0, |m| m.len());
    eprintln!(
        "ggml-viz: wrote {} ({:.1} MB; timeline: {} of {} spans; {} graph computes, {} ops)",
        output.display(),
        size as f64 / 1e6,
        data.sampling.drawn_spans,
        data.sampling.total_spans,
        data.summary.graphs,
        data.summary.ops
    );
    for w in data.summary.damage.iter().chain(&data.summary.warnings) {
        eprintln!("ggml-viz: warning: {w}");
    }
    failure.map_or(Ok(()), Err)
}
