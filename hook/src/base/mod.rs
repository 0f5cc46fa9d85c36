//! The bottom layer: what the recording core and the front ends both stand on, knowing neither.
//! Nothing here imports `record` or `intercept` (a test in `tests/hook.rs` checks it).
//!
//! - [`entry`]: the wrapped entry points, by number and C name;
//! - [`os`], [`clock`]: per-OS thread ids, clocks, file locks, exit and fork handlers; ticks and
//!   their conversion to epoch nanoseconds;
//! - [`ring`]: the per-thread single-producer ring of raw events;
//! - [`names`]: interned backend, scheduler, buffer-type and thread names;
//! - [`ggml`]: the ggml functions we call ourselves, looked up at run time; [`tensor`]: what we
//!   read of a `struct ggml_tensor`;
//! - [`metadata`]: the trace's first record (process, host, settings, rank);
//! - [`say`]: the one way to speak on stderr.

pub mod clock;
pub mod entry;
pub mod ggml;
pub mod metadata;
pub mod names;
pub mod os;
pub mod ring;
pub mod tensor;

use std::sync::atomic::AtomicBool;

/// `verbose` of the configuration in force: say more on stderr (where each call site goes).
pub static VERBOSE: AtomicBool = AtomicBool::new(false);

/// One line on stderr, with the `ggml-viz:` prefix. Never panics (stderr may be closed).
pub fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "ggml-viz: {msg}");
}

/// [`say`], the first time `said` is passed (a static of the call site's own).
pub fn say_once(said: &AtomicBool, msg: std::fmt::Arguments<'_>) {
    if !said.swap(true, std::sync::atomic::Ordering::Relaxed) {
        say(msg);
    }
}
