//! Reading the inputs of the telemetry commands (`summary`, `diff`, `export`, `report`, `rpc`):
//! the options they all take ([`InputOpts`]), and [`Reading`], which imports each input in turn,
//! putting a ggml-rpc job's traces on its client's clock (a first pass over their commands), with
//! the bytes read shown on a bar; and a trace's nodes read as a stream ([`read_nodes`]), for `ops`
//! and `diff --ops`.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use clap::Args;
use ggml_viz_reader::rpc_join::{Aligned, Alignment, ClockOffset, RpcParts, analyse};
use ggml_viz_reader::telemetry::{Ids, ProcessId, RecordSink};
use ggml_viz_reader::{
    Damage, Format, ImportError, Layout, OpCollector, RecordTap, RecordView, detect,
    import_path_reporting,
};
use ggml_viz_reader::{GroupBy, NodeTimes, OpAnalysis, OpGroups, OpSample, PhaseOps, Summary};
use indicatif::ProgressBar;

use crate::input::progress::{bar, file_name, len, stream_bar};
use crate::input::{Input, ReadStop, parse_layout};
use crate::say::Failure;
use crate::say::fmt_ns;

/// Options every telemetry command takes.
#[derive(Args)]
pub struct InputOpts {
    /// Force the input format instead of recognising it by content.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<Format>,
    /// GGMLVIZ event layout instead of detecting it.
    #[arg(long, value_parser = parse_layout)]
    pub layout: Option<Layout>,
    /// No progress bar (one shows on a terminal while large inputs are read).
    #[arg(short, long)]
    pub quiet: bool,
    /// Keep each input's own clock. By default the traces of a ggml-rpc job (its client's and
    /// its servers', from several hosts) are put on the client's clock, each server's offset
    /// estimated from the commands it answered (see `ggml-viz rpc`).
    #[arg(long)]
    pub no_clock_align: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    s.parse()
}

impl InputOpts {
    /// Before any output: every input opens and is of a format these commands read (by its
    /// first bytes, unless `--format` says which), and of `only` where given. A wrong file (a
    /// model, a report, a README) fails the command at once, with nothing printed or written;
    /// damage further in is found by reading, after what came before it was delivered.
    pub fn check(&self, paths: &[PathBuf], only: Option<Format>) -> Result<(), Failure> {
        for path in paths {
            let format = match self.format {
                Some(format) => File::open(path)
                    .map(|_| format)
                    .map_err(|e| format!("cannot read {}: {e}", path.display())),
                None => detect(path).map_err(|e| e.0),
            }
            .map_err(Failure::Data)?;
            if let Some(only) = only.filter(|&only| only != format) {
                return Err(Failure::Data(format!(
                    "{} is {format}: this takes {only} only",
                    path.display()
                )));
            }
        }
        Ok(())
    }
}

/// Bytes of `paths` read so far, shown as a bar; and how each input is merged into the others.
pub struct Reading {
    bar: ProgressBar,
    /// Bytes of the inputs finished before the current one.
    done: u64,
    /// The inputs and, when they are a ggml-rpc job's traces, each one's alignment (see
    /// [`Reading::new`]).
    paths: Vec<PathBuf>,
    alignments: Vec<Alignment>,
}

impl Reading {
    /// A bar for reading `paths` `passes` times (hidden when it should not show). Several
    /// inputs are first read once more for their ggml-rpc commands: where a client's and its
    /// servers' traces are among them, each server's times are put on the client's clock
    /// (unless `--no-clock-align`) and each joined command's spans get a flow id.
    pub fn new(paths: &[PathBuf], passes: u64, opts: &InputOpts) -> Reading {
        Reading::with_prepass(paths, passes, opts, paths.len() > 1)
    }

    /// For reading each input as it is, on its own clock (`rpc`, which measures the clocks).
    pub fn unaligned(paths: &[PathBuf], opts: &InputOpts) -> Reading {
        Reading::with_prepass(paths, 1, opts, false)
    }

    fn with_prepass(paths: &[PathBuf], passes: u64, opts: &InputOpts, prepass: bool) -> Reading {
        let total: u64 = paths.iter().map(|p| len(p)).sum::<u64>() * (passes + u64::from(prepass));
        let bar = bar(total, opts.quiet);
        let mut reading = Reading {
            bar,
            done: 0,
            paths: paths.to_vec(),
            alignments: Vec::new(),
        };
        if prepass {
            reading.align(opts);
        }
        reading
    }

    /// Reads every input for its RPC commands and works out each one's alignment.
    fn align(&mut self, opts: &InputOpts) {
        let mut parts = RpcParts::default();
        let mut ids = Ids::default();
        let mut input_of = Vec::new();
        for i in 0..self.paths.len() {
            let path = self.paths[i].clone();
            // Failures are reported by the real pass, which reads the same input.
            let _ = self.read(&path, opts, &mut ids, &mut parts, &mut ());
            input_of.resize(parts.processes.len(), i);
        }
        if parts.parts.is_empty() {
            return;
        }
        let analysis = analyse(&parts);
        let process_input = |process: ProcessId| {
            parts
                .processes
                .iter()
                .position(|p| p.id == process)
                .and_then(|n| input_of.get(n).copied())
        };
        self.alignments = analysis.alignments(
            &parts,
            self.paths.len(),
            process_input,
            !opts.no_clock_align,
        );
        for (path, a) in self.paths.iter().zip(&self.alignments) {
            if let Some(clock) = &a.clock
                && (clock.offset_ns != 0 || clock.drift.is_some())
            {
                self.bar.suspend(|| {
                    eprintln!(
                        "ggml-viz: {}: times moved by {} onto its ggml-rpc client's clock \
                         (--no-clock-align keeps them)",
                        path.display(),
                        clock_sentence(clock)
                    )
                });
            }
        }
        for o in analysis.offsets.iter().filter(|o| o.kept_own_clock) {
            if let Some(path) = process_input(o.server_process).and_then(|i| self.paths.get(i)) {
                self.bar
                    .suspend(|| eprintln!("ggml-viz: {}: {}", path.display(), clock_sentence(o)));
            }
        }
    }

    /// Imports `path` into `sink`, aligned with the other inputs, moving the bar as it is read.
    pub fn import<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
    ) -> Result<(), ImportError> {
        self.import_tapped(path, opts, ids, sink, &mut ())
    }

    /// [`Reading::import`], with `tap` reading a GGMLVIZ trace's records beside the importer
    /// (the trace read once).
    pub fn import_tapped<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
        tap: &mut impl RecordTap,
    ) -> Result<(), ImportError> {
        let alignment = self
            .paths
            .iter()
            .position(|p| p == path)
            .and_then(|i| self.alignments.get(i).cloned());
        match alignment {
            Some(a) => self.read(path, opts, ids, &mut Aligned::new(sink, &a), tap),
            None => self.read(path, opts, ids, sink, tap),
        }
    }

    fn read<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
        tap: &mut impl RecordTap,
    ) -> Result<(), ImportError> {
        self.bar.set_message(file_name(path));
        let (bar, done) = (&self.bar, self.done);
        let result = import_path_reporting(
            path,
            opts.format,
            opts.layout,
            ids,
            sink,
            &mut |read| bar.set_position(done + read),
            tap,
        );
        self.done += len(path);
        self.bar.set_position(self.done);
        result
    }
}

impl Drop for Reading {
    /// Takes the bar off the terminal, whatever ended the reading.
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// A server's clock offset in words: the estimate and its uncertainty; its drift, where one
/// offset could not fit the whole run; or why there is none.
pub fn clock_sentence(o: &ClockOffset) -> String {
    let signed = |ns: i64| {
        let sign = if ns < 0 { "-" } else { "+" };
        format!("{sign}{}", fmt_ns(ns.unsigned_abs() as f64))
    };
    let spread = |o: &ClockOffset| {
        o.uncertainty_ns().map_or_else(
            || "unbounded above".to_string(),
            |u| format!("± {}", fmt_ns(u as f64)),
        )
    };
    let disagreement = o.disagreement_ns().unwrap_or(0) as f64;
    match o.drift {
        _ if o.kept_own_clock => format!(
            "no clock offset: its commands' bounds disagree by {} and no steady drift fits them \
             (a connection joined to the wrong server, or a clock that jumped); its times stay on \
             its own clock",
            fmt_ns(disagreement)
        ),
        Some(d) => format!(
            "{} at its first command, drifting {:+.1} µs a second ({}; one offset cannot fit \
             the run: its bounds disagree by {})",
            signed(o.offset_ns),
            d.slope * 1e6,
            spread(o),
            fmt_ns(disagreement)
        ),
        None => format!("{} {}", signed(o.offset_ns), spread(o)),
    }
}

/// Imports every input into `sink`; warnings go to stderr. The first corrupt input fails the
/// command, after everything before the damage was delivered.
pub fn import_all<S: RecordSink>(
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

/// The nodes of a trace's op events as the importer reads them: each op type's node wall times
/// (what [`summarize`] counts an op type by).
struct NodeTap<'a> {
    collector: OpCollector,
    nodes: &'a mut HashMap<String, NodeTimes>,
}

impl NodeTap<'_> {
    fn add(nodes: &mut HashMap<String, NodeTimes>, node: &ggml_viz_reader::OpSample) {
        nodes
            .entry(node.op.to_string())
            .or_default()
            .add(node.duration_ns);
    }

    fn finish(self) {
        let nodes = self.nodes;
        self.collector.finish_each(|_, o| Self::add(nodes, &o));
    }
}

impl RecordTap for NodeTap<'_> {
    fn record(&mut self, record: RecordView<'_>) {
        self.collector.push(Ok(&record.event()));
        let nodes = &mut *self.nodes;
        self.collector
            .take_ready()
            .for_each(|o| Self::add(nodes, &o));
    }

    fn damage(&mut self, _: &Damage) {}
}

/// [`import_all`] into a [`Summary`], whose op types count nodes where the inputs timed them
/// (each node's wall time, as `ggml-viz ops`, `diff --ops` and the report have it; not each
/// thread's share of it).
pub fn summarize(paths: &[PathBuf], opts: &InputOpts) -> (Summary, Result<(), Failure>) {
    let mut summary = Summary::default();
    let mut ids = Ids::default();
    let mut reading = Reading::new(paths, 1, opts);
    let mut nodes: HashMap<String, NodeTimes> = HashMap::new();
    let mut result = Ok(());
    for path in paths {
        let mut tap = NodeTap {
            collector: OpCollector::streaming(),
            nodes: &mut nodes,
        };
        let imported = reading.import_tapped(path, opts, &mut ids, &mut summary, &mut tap);
        tap.finish();
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

/// A trace read to its end (or to damage), its nodes handed out as they became known.
pub struct NodesRead {
    pub analysis: OpAnalysis,
    name: String,
    stop: Option<ReadStop>,
}

/// Reads the GGMLVIZ trace at `path` as a stream, each node handed to `each` once known: memory
/// does not grow with the trace.
pub fn read_nodes(
    path: &Path,
    layout: Option<Layout>,
    quiet: bool,
    mut each: impl FnMut(&OpSample),
) -> Result<NodesRead, Failure> {
    let input = Input::open_streamed(path).map_err(Failure::Data)?;
    let mut collector = OpCollector::streaming();
    let bar = stream_bar(path, quiet);
    let (stop, _) = input.for_each_showing(layout, &bar, |e| {
        collector.push(Ok(&e));
        collector.take_ready().for_each(|o| each(&o));
        Ok(())
    })?;
    Ok(NodesRead {
        analysis: collector.finish_each(|_, o| each(&o)),
        name: input.name(),
        stop,
    })
}

impl NodesRead {
    /// After what was read is shown: warnings said (a truncated tail, late shares), damage an
    /// error.
    pub fn outcome(&self) -> Result<(), Failure> {
        if self.analysis.late_shares > 0 {
            eprintln!(
                "ggml-viz: warning: {}: {} thread share(s) of nodes came in the trace long after \
                 their graph compute ended (more than two ring drains); each is counted as a \
                 node of its own",
                self.name, self.analysis.late_shares
            );
        }
        match &self.stop {
            Some(stop) if stop.is_warning() => {
                eprintln!("ggml-viz: warning: {}", stop.describe(&self.name));
                Ok(())
            }
            Some(stop @ ReadStop::Damage(_)) | Some(stop @ ReadStop::Io(_)) => {
                Err(Failure::Data(stop.describe(&self.name)))
            }
            _ => Ok(()),
        }
    }
}

/// The nodes of the trace at `path` grouped by op type as `ops` groups them, all phases
/// together, and the analysis (for `diff --ops`); warnings said, damage an error.
pub fn op_totals(
    path: &Path,
    layout: Option<Layout>,
    quiet: bool,
) -> Result<(OpGroups, PhaseOps, OpAnalysis), Failure> {
    let mut groups = OpGroups::new(GroupBy::Op);
    let mut phases = PhaseOps::default();
    let read = read_nodes(path, layout, quiet, |o| {
        groups.add(o);
        phases.add(o);
    })?;
    read.outcome()?;
    Ok((groups, phases, read.analysis))
}
