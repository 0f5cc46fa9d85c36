//! The bottom layer: what the recording core and the front ends both stand on, knowing neither.
//! Nothing here imports `record` or `intercept` (a test in `tests/hook.rs` checks it).
//!
//! - [`entry`]: the wrapped entry points, by number and C name;
//! - `heap` (Linux): the library's own heap, apart from the host's `malloc`;
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
#[cfg(target_os = "linux")]
pub mod heap;
pub mod metadata;
pub mod names;
#[cfg(target_os = "linux")]
pub mod objects;
pub mod os;
pub mod ring;
pub mod tensor;

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

/// Runs our own code. A panic in it is caught (one that left an `extern "C"` function would
/// abort the host) and said as one `ggml-viz:` line, once, instead of Rust's panic message. The
/// panic hook set here is our copy of std's (a cdylib links its own): a Rust host's panics go to
/// its own hook, never to this one. Where this crate is linked into a Rust program of ours (its
/// tests and benchmarks), panics raised in their own files still get the hook they had.
///
/// Inlined: in a call that records (a share's begin, a barrier's wait) it is a check of one flag
/// and a landing pad, not a frame of its own.
#[inline(always)]
pub fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    if !PANIC_HOOK.is_completed() {
        set_panic_hook();
    }
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Set once, by the first [`contained`] call.
static PANIC_HOOK: Once = Once::new();

/// [`contained`]'s panic hook, set the first time.
#[cold]
#[inline(never)]
fn set_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let file = info.location().map_or("", |l| l.file());
            if ["tests/", "benches/"]
                .iter()
                .any(|d| file.starts_with(d) || file.contains(&format!("/{d}")))
            {
                return before(info);
            }
            static SAID: AtomicBool = AtomicBool::new(false);
            let at = info
                .location()
                .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
            let what = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            say_once(
                &SAID,
                format_args!(
                    "our own code failed{at} ({what}); the program runs on, and what such calls \
                     would have recorded is lost"
                ),
            );
        }));
    });
}
