//! Progress of long reads: bytes read of the inputs' total, rate and time left, on stderr when it
//! is a terminal and `--quiet` was not given; nothing on a pipe, in a file or for small inputs.

use std::path::{Path, PathBuf};

use ggml_viz_reader::telemetry::{Ids, ImportError, RecordSink, import_path_reporting};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::timeline::InputOpts;

/// Inputs smaller than this in all are read without a bar (it would only flicker).
const WORTH_A_BAR: u64 = 32 << 20;

/// Bytes of `paths` read so far, shown as a bar.
pub struct Reading {
    bar: ProgressBar,
    /// Bytes of the inputs finished before the current one.
    done: u64,
}

impl Reading {
    /// A bar for reading `paths` `passes` times (hidden when it should not show).
    pub fn new(paths: &[PathBuf], passes: u64, quiet: bool) -> Reading {
        let total: u64 = paths.iter().map(|p| len(p)).sum::<u64>() * passes;
        let target = if quiet || total < WORTH_A_BAR {
            ProgressDrawTarget::hidden()
        } else {
            // Hidden by indicatif itself when stderr is not a terminal.
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target).with_style(
            ProgressStyle::with_template(
                "ggml-viz: {msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
            )
            .expect("a valid template"),
        );
        Reading { bar, done: 0 }
    }

    /// Imports `path` into `sink`, moving the bar as it is read.
    pub fn import<S: RecordSink>(
        &mut self,
        path: &Path,
        opts: &InputOpts,
        ids: &mut Ids,
        sink: &mut S,
    ) -> Result<(), ImportError> {
        self.bar.set_message(
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        );
        let (bar, done) = (&self.bar, self.done);
        let result =
            import_path_reporting(path, opts.format, opts.layout, ids, sink, &mut |read| {
                bar.set_position(done + read)
            });
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

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
