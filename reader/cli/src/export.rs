//! `export`: inputs converted into one timeline for another tool (Perfetto, Chrome JSON,
//! Parquet, TelemetryEvent v2).

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use ggml_viz_reader::export::parquet::ParquetWriter;
use ggml_viz_reader::export::telemetry_v2::TelemetryV2Records;
use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::telemetry::RecordSink;
use ggml_viz_reader::{ChromeJsonWriter, Damage, Format, PerfettoWriter, RecordTap, RecordView};

use crate::input::reading::{InputOpts, Reading, import_all};
use crate::say::Failure;

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

/// Every input's buffer events as v2 records, in one JSON list; each input on its own clock. A
/// truncated input is warned about; another damaged one fails the command, after the records
/// before its damage (and the other inputs') are written.
fn telemetry_v2(
    args: &ExportArgs,
    mut out: impl Write,
) -> Result<(Result<(), Failure>, u64), Failure> {
    let mut sink = TelemetryV2Records::default();
    let mut ids = Ids::default();
    let mut reading = Reading::unaligned(&args.files, &args.input);
    let mut result = Ok(());
    for path in &args.files {
        let before = sink.records.len();
        let mut damage = DamageTap(None);
        let imported = reading.import_tapped(path, &args.input, &mut ids, &mut sink, &mut damage);
        if sink.records.len() == before {
            eprintln!(
                "ggml-viz: warning: {}: no buffer events (record with GGML_VIZ_MEMORY_TRACKING=1)",
                path.display()
            );
        }
        match (damage.0, imported) {
            (Some(d), _) if d.is_truncation() => {
                eprintln!("ggml-viz: warning: {}: {d}", path.display())
            }
            (Some(d), _) => result = Err(Failure::Data(format!("{}: {d}", path.display()))),
            (None, Err(e)) => result = Err(Failure::Data(e.0)),
            (None, Ok(())) => {}
        }
    }
    drop(reading);
    serde_json::to_writer_pretty(&mut out, &sink.records).map_err(io::Error::from)?;
    writeln!(out)?;
    out.flush()?;
    Ok((result, sink.records.len() as u64))
}

/// The damage that ended a trace's read, if any.
struct DamageTap(Option<Damage>);

impl RecordTap for DamageTap {
    fn record(&mut self, _: RecordView<'_>) {}

    fn damage(&mut self, damage: &Damage) {
        self.0 = Some(damage.clone());
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
