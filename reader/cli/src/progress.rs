//! Progress of long reads: bytes read of the inputs' total, rate and time left, on stderr when it
//! is a terminal and `--quiet` was not given; nothing on a pipe, in a file or for small inputs.

use std::path::{Path, PathBuf};

use ggml_viz_reader::telemetry::rpc::{Aligned, Alignment, RpcParts, analyse};
use ggml_viz_reader::telemetry::{Ids, ImportError, RecordSink, import_path_reporting};
use ggml_viz_reader::{Damage, RecordView};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::timeline::InputOpts;

/// Inputs smaller than this in all are read without a bar (it would only flicker).
const WORTH_A_BAR: u64 = 32 << 20;

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
            let _ = self.read(&path, opts, &mut ids, &mut parts, &mut |_| {});
            input_of.resize(parts.processes.len(), i);
        }
        if parts.parts.is_empty() {
            return;
        }
        let analysis = analyse(&parts);
        let process_input = |process: u32| {
            parts
                .processes
                .iter()
                .position(|p| p.id == process)
                .and_then(|n| input_of.get(n).copied())
        };
        self.alignments =
            analysis.alignments(self.paths.len(), process_input, !opts.no_clock_align);
        for (path, a) in self.paths.iter().zip(&self.alignments) {
            if a.shift_ns != 0 {
                self.bar.suspend(|| {
                    eprintln!(
                        "ggml-viz: {}: times moved by {:+} ns onto its ggml-rpc client's clock \
                         (--no-clock-align keeps them)",
                        path.display(),
                        a.shift_ns
                    )
                });
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
        self.import_watching(path, opts, ids, sink, &mut |_| {})
    }

    /// [`Reading::import`], handing `events` each GGMLVIZ event as it is decoded and the damage
    /// that ended the read.
    pub fn import_watching<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
        events: &mut impl FnMut(Result<RecordView<'_>, &Damage>),
    ) -> Result<(), ImportError> {
        let alignment = self
            .paths
            .iter()
            .position(|p| p == path)
            .and_then(|i| self.alignments.get(i).cloned());
        match alignment {
            Some(a) => self.read(path, opts, ids, &mut Aligned::new(sink, &a), events),
            None => self.read(path, opts, ids, sink, events),
        }
    }

    fn read<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
        events: &mut impl FnMut(Result<RecordView<'_>, &Damage>),
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
            events,
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

/// A bar over `total` bytes: hidden when `quiet`, for inputs under [`WORTH_A_BAR`], and (by
/// indicatif itself) when stderr is not a terminal.
fn bar(total: u64, quiet: bool) -> ProgressBar {
    let target = if quiet || total < WORTH_A_BAR {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    ProgressBar::with_draw_target(Some(total), target).with_style(
        ProgressStyle::with_template(
            "ggml-viz: {msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        )
        .expect("a valid template"),
    )
}

/// A bar for reading `path` once as it comes (standard input, `-`, has no size: none), named
/// for it.
pub fn stream_bar(path: &Path, quiet: bool) -> ProgressBar {
    let bar = bar(if path == Path::new("-") { 0 } else { len(path) }, quiet);
    bar.set_message(file_name(path));
    bar
}

/// What a bar calls the input at `path`: its file name.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
