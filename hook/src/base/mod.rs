//! The bottom layer: what the recording core and the front ends both stand on, knowing neither.
//! Nothing here imports `record` or `intercept` (a test in `tests/hook.rs` checks it).
//!
//! - [`entry`]: the wrapped entry points, by number and C name;
//! - [`os`], [`clock`]: per-OS thread ids, clocks, file locks, exit and fork handlers; ticks and
//!   their conversion to epoch nanoseconds;
//! - [`ring`]: the per-thread single-producer ring of raw events;
//! - `objects` (Linux): the loaded objects, and their files' symbol tables;
//! - [`names`]: interned backend, scheduler, buffer-type and thread names;
//! - [`ggml`]: the ggml functions we call ourselves, looked up at run time; [`tensor`]: what we
//!   read of a `struct ggml_tensor`;
//! - [`metadata`]: the trace's first record (process, host, settings, rank);
//! - [`say`]: the one way to speak on stderr; [`contained`]: the one way to run our own code;
//! - [`fault`]: failures made on purpose, for the tests.

pub mod clock;
pub mod entry;
pub mod fault;
pub mod ggml;
pub mod metadata;
pub mod names;
#[cfg(target_os = "linux")]
pub mod objects;
pub mod os;
pub mod ring;
pub mod tensor;

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
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

thread_local! {
    /// How deep this thread is in [`contained`] code.
    static CONTAINED: Cell<u32> = const { Cell::new(0) };
}

/// Runs our own code. A panic in it is caught (one that left an `extern "C"` function would
/// abort the host) and said as one `ggml-viz:` line, once, instead of Rust's panic message; the
/// host's own panics still go to the panic hook the host had.
pub fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let host = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINED.try_with(|d| d.get() > 0).unwrap_or(false) {
                static SAID: AtomicBool = AtomicBool::new(false);
                let at = info
                    .location()
                    .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
                say_once(
                    &SAID,
                    format_args!(
                        "our own code failed{at}; the program runs on, and what such calls would \
                         have recorded is lost"
                    ),
                );
            } else {
                host(info)
            }
        }));
    });
    let _ = CONTAINED.try_with(|d| d.set(d.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f)).ok();
    let _ = CONTAINED.try_with(|d| d.set(d.get().saturating_sub(1)));
    result
}
