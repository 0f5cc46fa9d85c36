//! `libggml_viz_hook.so`: preloaded into an unmodified GGML program (`LD_PRELOAD`), it records
//! every graph compute as GGMLVIZ v1, and changes nothing else.
//!
//! The data path, one module per arrow:
//! - [`exports`]: the exported ggml entry points. Each finds the real function ([`resolve`]),
//!   stamps a begin event, calls the real function exactly once, stamps an end event.
//! - [`capture`]: the producer side: per-thread rings ([`ring`]), the event cap, the capture
//!   window, the counters of what could not be recorded. Never blocks, never allocates once a
//!   thread's ring exists.
//! - [`sink`]: the flusher thread: drains the rings into the trace file, encoded by the reader
//!   crate's `format` module; writes the metadata and counters records; flushes at exit.
//!
//! Nothing starts until the first interposed call: a process that never calls ggml (a shell, a
//! compiler that inherited `LD_PRELOAD`) gets no thread, no file and no output. A failure (bad
//! setting, unwritable output) is said once on stderr and the program runs on untraced.

pub mod capture;
pub mod clock;
pub mod exports;
pub mod ggml;
#[cfg(any(target_os = "linux", windows))]
pub mod inline;
pub mod metadata;
pub mod names;
pub mod ops;
pub mod os;
/// Finding the real function behind a wrapper: by the caller's scope on Linux, from dyld's
/// interpose table on macOS, from the inline hooks put on ggml's DLLs on Windows.
#[cfg(target_os = "linux")]
pub mod resolve;
#[cfg(target_os = "macos")]
#[path = "interpose.rs"]
pub mod resolve;
#[cfg(windows)]
#[path = "windows.rs"]
pub mod resolve;
pub mod resolved;
pub mod ring;
pub mod sink;
pub mod spans;
#[cfg(target_os = "linux")]
pub mod static_ggml;

/// `verbose` of the configuration in force: say more on stderr (where each call site goes).
pub(crate) static VERBOSE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// One line on stderr, with the `ggml-viz:` prefix. Never panics (stderr may be closed).
pub(crate) fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "ggml-viz: {msg}");
}
