//! `report`: one self-contained HTML page of one or more inputs (no network, everything
//! inlined) with a zoomable timeline, time per op type / tensor / backend, per-token latency and
//! live bytes. [`data`] computes what the page shows from the telemetry model, [`page`] writes it.

mod data;
mod page;
mod series;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use ggml_viz_reader::TraceStats;
use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::telemetry::{Format, detect};

use crate::Failure;
use crate::input::Input;
use crate::progress::Reading;
use crate::timeline::InputOpts;
use data::{ReportBuilder, SpanCount};
use page::write_html;

/// Write one HTML file that opens offline (everything inlined, no network): a zoomable timeline
/// per thread with op spans under their graphs, time per op type / tensor / backend, per-call
/// latency (prefill and generation apart) and live bytes per buffer type.
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

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

pub fn run(args: ReportArgs) -> Result<(), Failure> {
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

    // Pass 1: how many spans, to choose what the timeline draws; the origin of time.
    let mut reading = Reading::new(&args.files, 2, &args.input);
    let mut count = SpanCount::default();
    let mut ids = Ids::default();
    let mut items = Vec::new();
    for path in &args.files {
        let before = count.items;
        // Failures are reported by pass 2, which sees the same input.
        let _ = reading.import(path, &args.input, &mut ids, &mut count);
        items.push(count.items - before);
    }
    let origin = if count.first_ns == u64::MAX {
        0
    } else {
        count.first_ns
    };

    // Pass 2: the page's data.
    let mut builder = ReportBuilder::new(title, names.clone(), origin, count.op_stride());
    let mut ids = Ids::default();
    let mut failure = None;
    for ((path, name), items) in args.files.iter().zip(&names).zip(items) {
        let imported = reading.import(path, &args.input, &mut ids, &mut builder);
        let format = args.input.format.map_or_else(|| detect(path).ok(), Some);
        if format == Some(Format::Ggmlviz) {
            let (stats, damage) = trace_stats(path, name, args.input.layout)?;
            if let Some(note) = stats
                .metadata
                .as_ref()
                .and_then(|m| ggml_viz_reader::op_timing_note(&m.settings))
            {
                builder.add_op_timing(note);
            }
            builder.add_input_totals(
                stats.events(),
                stats.counters.map_or(0, |c| c.lost()),
                damage,
            );
        } else {
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

/// Events and drops as `info` counts them, and the damage that ended the read, described as
/// the importer describes it.
fn trace_stats(
    path: &PathBuf,
    name: &str,
    layout: Option<ggml_viz_reader::Layout>,
) -> Result<(TraceStats, Option<String>), Failure> {
    let input = Input::open(path, layout).map_err(Failure::Data)?;
    let mut stats = TraceStats::default();
    let (stop, _) = input.for_each(layout, |event| {
        stats.add(&event);
        Ok(())
    })?;
    stats.finish();
    Ok((stats, stop.map(|s| s.describe(name))))
}
