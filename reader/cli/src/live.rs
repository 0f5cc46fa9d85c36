//! `live`: the live view ([`crate::view`]) of a trace another process is writing.

use std::path::PathBuf;

use clap::Args;
use ggml_viz_reader::Layout;

use crate::input::parse_layout;
use crate::say::Failure;
use crate::view::{ViewOpts, WriterGone, watch};

/// Follow a trace while a program writes it, refreshed about once a second.
///
/// Graphs/s, the latest graph time and its rolling
/// p50/p99, the top ops by time over the last seconds (their nodes' wall time, as `ggml-viz ops`
/// has it), events and drops, refreshed about once a second.
///
/// Quits on `q` or Ctrl-C (Ctrl-C only on Windows), and by itself when the writer is done (the hook holds a lock on its
/// trace while the program runs). On a terminal the screen is redrawn; otherwise (a pipe, a file,
/// or --plain) one line is printed per refresh. Never reads a byte twice: it keeps up with a
/// writer making millions of events a second.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz live trace.ggmlviz\n  ggml-viz live --window 30 --plain trace.ggmlviz >> progress.log\n  ggml-viz record --live -- llama-cli -m model.gguf -p \"Hello\" -n 256"
)]
pub struct LiveArgs {
    /// The trace to follow (it may not exist yet).
    file: PathBuf,
    #[command(flatten)]
    view: ViewOpts,
    /// Event layout instead of detecting it.
    #[arg(long, value_parser = parse_layout)]
    layout: Option<Layout>,
}

pub fn run(args: LiveArgs) -> Result<(), Failure> {
    watch(&args.file, &args.view, args.layout, WriterGone::Unlocked).map(|_| ())
}
