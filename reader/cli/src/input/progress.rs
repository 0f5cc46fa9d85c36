//! Progress bars of long reads: bytes read of the inputs' total, rate and time left, on stderr when it
//! is a terminal and `--quiet` was not given; nothing on a pipe, in a file or for small inputs.

use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Inputs smaller than this in all are read without a bar (it would only flicker).
const WORTH_A_BAR: u64 = 32 << 20;

/// A bar over `total` bytes: hidden when `quiet`, for inputs under [`WORTH_A_BAR`], and (by
/// indicatif itself) when stderr is not a terminal.
pub fn bar(total: u64, quiet: bool) -> ProgressBar {
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
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The size of the file at `path` (0 when it has none: standard input, a pipe).
pub fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
