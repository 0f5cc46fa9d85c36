//! A trace's life in this process: started by the first call (configuration, output file,
//! metadata record, flusher thread, exit and fork handlers), flushed by the flusher, closed at
//! exit, forgotten in a child after `fork` (which starts its own on its next call), stopped for
//! good when the output fails.
//!
//! The front end hands in what the session cannot know by itself ([`Setup`]: the configuration
//! and the ggml version), as heaptrack's `heaptrack_init` receives its arguments.

use std::fs::File;
use std::io;
use std::panic::catch_unwind;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Once, OnceLock, PoisonError};
use std::time::Duration;

use ggml_viz_config::{Config, ConfigError, OpTiming};
use ggml_viz_format::Layout;
use ggml_viz_format::ext::Setting;

use super::recorder::{self, OpMode, Recorder};
use super::writer::TraceWriter;
use crate::base::{VERBOSE, clock, contained, metadata, os, say};

const UNSTARTED: u8 = 0;
const STARTING: u8 = 1;
const ACTIVE: u8 = 2;

/// Whether a front end times some backend's nodes on its device in this process: a graph with
/// nodes off the CPU is then not timed with the scheduler's eval callback under `auto`.
static DEVICE_TIMING: AtomicBool = AtomicBool::new(false);

/// Says that a front end times a device's nodes from now on.
pub fn device_timing_on() {
    DEVICE_TIMING.store(true, Ordering::Relaxed);
}

/// Whether a front end times a device's nodes (see [`device_timing_on`]).
pub fn device_timing() -> bool {
    DEVICE_TIMING.load(Ordering::Relaxed)
}

/// Disabled, misconfigured, or the output failed: every call goes straight through.
const INERT: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNSTARTED);
static RECORDER: AtomicPtr<Recorder> = AtomicPtr::new(std::ptr::null_mut());

/// What starting a trace needs from the front end.
pub struct Setup {
    pub config: Result<Config, ConfigError>,
    /// The version of the ggml that calls go to, for the metadata record.
    pub ggml_version: Option<String>,
    /// Whether the CPU backend's per-op functions and `ggml_barrier` reach the front end's
    /// wrappers (threads-mode op timing); `Err` says why not.
    pub cpu_functions: Result<(), String>,
    /// Called once the op-timing mode is chosen, when ops will be timed (`true`: per thread, on
    /// ggml's worker threads), before tracing starts: the front end's one-time work that the
    /// first timed graph compute would otherwise do inside its span.
    pub prepare_op_timing: fn(per_thread: bool),
    /// Called at exit before the last flush: the front end hands over what it still holds (a
    /// device's last node, kept until the next read says whether it goes on).
    pub before_last_flush: fn(),
}

/// The started recorder's [`Setup::before_last_flush`].
static BEFORE_LAST_FLUSH: OnceLock<fn()> = OnceLock::new();

/// Whether tracing has started (or is starting, or was refused) in this process: every wrapped
/// call asks, so that only the first goes on to [`start_once`].
#[inline]
pub fn started() -> bool {
    STATE.load(Ordering::Acquire) != UNSTARTED
}

/// Starts tracing if this is the first call of the process (or of a child since its fork);
/// `setup` runs only then. A failure is said once on stderr and leaves the program untraced.
pub fn start_once(setup: impl FnOnce() -> Setup) {
    if STATE.load(Ordering::Acquire) != UNSTARTED
        || STATE
            .compare_exchange(UNSTARTED, STARTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    let state = match start(setup()) {
        Some(recorder) => {
            let recorder: &'static Recorder = Box::leak(recorder);
            RECORDER.store(
                recorder as *const Recorder as *mut Recorder,
                Ordering::Release,
            );
            spawn_flusher(recorder);
            ACTIVE
        }
        None => INERT,
    };
    STATE.store(state, Ordering::Release);
}

/// How long a call that arrives while another thread starts the recorder waits for it (start-up
/// takes about a millisecond: configuration, opening the file, the metadata record).
const START_WAIT: Duration = Duration::from_millis(200);

/// The recorder, for a call that would record `events` events. `None`: do not trace this call.
/// A call that arrives while another thread is starting the recorder (once per process, and
/// once in a child after `fork`) waits for it; past [`START_WAIT`] (a start-up stuck on a slow
/// file system) it is not traced and its events are counted as missed.
pub(super) fn current(events: u64) -> Option<&'static Recorder> {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => active(),
        STARTING => {
            let deadline = std::time::Instant::now() + START_WAIT;
            while STATE.load(Ordering::Acquire) == STARTING {
                if std::time::Instant::now() > deadline {
                    recorder::count_missed_while_starting(events);
                    return None;
                }
                std::thread::yield_now();
            }
            active()
        }
        _ => None,
    }
}

/// The recorder if one is active.
pub fn active() -> Option<&'static Recorder> {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return None;
    }
    let r = RECORDER.load(Ordering::Acquire);
    // SAFETY: a non-null RECORDER is a leaked, never freed Recorder, published (Release) before
    // the state became ACTIVE.
    (!r.is_null()).then(|| unsafe { &*r })
}

/// Whether no call of this process (or of this child since its fork) will be timed per thread
/// from now on: tracing stopped for good, or ops are timed another way or not at all (a mode
/// that never becomes threads). For per-thread op timing's front end (Linux x86-64).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn thread_ops_never() -> bool {
    match STATE.load(Ordering::Acquire) {
        INERT => true,
        ACTIVE => active().is_some_and(|r| r.op_mode() != OpMode::Threads),
        _ => false,
    }
}

/// The last flush, as at exit: what a test of the recording core calls to end its trace.
pub fn finish() {
    at_exit();
}

fn start(setup: Setup) -> Option<Box<Recorder>> {
    clock::init();
    let config = match setup.config {
        Ok(config) => config,
        Err(err) => {
            say(format_args!("{err}; the program runs untraced"));
            return None;
        }
    };
    VERBOSE.store(config.verbose, Ordering::Relaxed);
    if config.disable {
        if config.verbose {
            say(format_args!("disabled by configuration"));
        }
        return None;
    }
    let layout: Layout = config.layout.parse().unwrap_or(Layout::Packed);
    let (file, path) = match open_output(&config.output) {
        Ok(opened) => opened,
        Err((path, err)) => {
            say(format_args!(
                "cannot write the trace to {path}: {err}; the program runs untraced"
            ));
            return None;
        }
    };
    let descriptor = os::descriptor(&file);
    let (op_mode, why) = OpMode::choose(config.op_timing, &setup.cpu_functions);
    if op_mode != OpMode::Off {
        (setup.prepare_op_timing)(op_mode == OpMode::Threads);
        let _ = BEFORE_LAST_FLUSH.set(setup.before_last_flush);
    }
    if config.verbose || (op_mode == OpMode::Sched && config.op_timing == OpTiming::Threads) {
        say(format_args!("op timing: {}: {why}", op_mode.name()));
    }
    let mut metadata = metadata::collect(&config, setup.ggml_version, (op_mode.name(), &why));
    // A GPU whose device the front end already times (it was created before the first graph
    // compute, as ggml's backends are): how its nodes are timed, beside the CPU's mode.
    if op_mode != OpMode::Off && config.op_timing != OpTiming::Sched && device_timing() {
        metadata.set(
            Setting::GpuOpTiming,
            "each node's own timestamps on the device (a Vulkan layer at ggml-vulkan's node \
             labels), on a lane per device queue; nothing of the run changed",
        );
    }
    let writer = match TraceWriter::create(file, path, layout, &config, &metadata) {
        Ok(writer) => writer,
        Err((path, err)) => {
            say(format_args!(
                "cannot write the trace to {}: {err}; the program runs untraced",
                path.display()
            ));
            return None;
        }
    };
    if config.verbose {
        say(format_args!("tracing to {}", writer.path().display()));
    }
    let recorder = Box::new(Recorder::new(config, op_mode, writer, descriptor));
    install_process_handlers();
    Some(recorder)
}

/// Spawns the flusher of the recorder just made active.
fn spawn_flusher(recorder: &'static Recorder) {
    let interval = Duration::from_millis(recorder.config.flush_interval_ms);
    let spawned = std::thread::Builder::new()
        .name("ggml-viz-flush".into())
        .spawn(move || {
            let _ = recorder.flusher.set(std::thread::current());
            // A quarter ring's events or more in one pass: they come faster than the interval,
            // and a ring may have passed half full again while it was drained (its producer
            // then says nothing more): the next pass starts at once.
            let streaming = (recorder.config.buffer_size as usize / 4).max(1);
            let mut drained = 0;
            loop {
                if drained < streaming {
                    // Woken early by a producer whose ring became half full.
                    std::thread::park_timeout(interval);
                }
                let mut writer = recorder
                    .writer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if writer.is_closed() {
                    return;
                }
                drained = contained(|| flush(recorder, &mut writer)).unwrap_or(0);
                drop(writer);
                // Not in the last flush at exit, where nothing will be written any more.
                contained(|| recorder.populate_rings_ahead());
            }
        });
    if let Err(err) = spawned {
        say(format_args!(
            "cannot start the flusher thread ({err}); events are written at exit only"
        ));
    }
}

/// Drains the rings into the trace: how many events; a failed write stops tracing for good.
fn flush(recorder: &Recorder, writer: &mut TraceWriter) -> usize {
    writer.flush(recorder.drain()).unwrap_or_else(|err| {
        stop_after_write_error(writer, err);
        0
    })
}

fn stop_after_write_error(writer: &TraceWriter, err: io::Error) {
    stop(format_args!(
        "writing the trace to {} failed: {err}; tracing stops, the program runs on",
        writer.path().display()
    ));
}

/// Stops tracing for good, saying why (once: only the call that stops it speaks); calls go
/// straight through from now on, and nothing more is written.
pub(super) fn stop(why: std::fmt::Arguments<'_>) {
    if STATE.swap(INERT, Ordering::AcqRel) == ACTIVE {
        say(why);
    }
}

/// `%p` becomes the pid, `%h` the host name, `%%` a percent sign.
fn expand_path(template: &str) -> String {
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('%', Some('p')) => out.push_str(&std::process::id().to_string()),
            ('%', Some('h')) => out.push_str(&os::host_name()),
            ('%', Some('%')) => out.push('%'),
            _ => {
                out.push(c);
                continue;
            }
        }
        chars.next();
    }
    out
}

/// Opens the trace for writing. A file that another live process is tracing into (it holds the
/// lock on it) is left alone: we write `PATH.PID` instead, and say so.
fn open_output(template: &str) -> Result<(File, PathBuf), (String, io::Error)> {
    let path = PathBuf::from(expand_path(template));
    let fail = |path: &PathBuf, err| (path.display().to_string(), err);
    let file = os::open_locked(&path).map_err(|err| fail(&path, err))?;
    if let Some(file) = file {
        return Ok((file, path));
    }
    let alternative = PathBuf::from(format!("{}.{}", path.display(), std::process::id()));
    say(format_args!(
        "{} is being written by another live process; writing {} instead",
        path.display(),
        alternative.display()
    ));
    match os::open_locked(&alternative) {
        Ok(Some(file)) => Ok((file, alternative)),
        Ok(None) => Err(fail(
            &alternative,
            io::Error::new(io::ErrorKind::WouldBlock, "locked by another process"),
        )),
        Err(err) => Err(fail(&alternative, err)),
    }
}

fn install_process_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| os::install_process_handlers(at_exit, after_fork_in_child));
}

extern "C" fn at_exit() {
    contained(|| {
        let Some(recorder) = active() else {
            return;
        };
        if let Some(hand_over) = BEFORE_LAST_FLUSH.get() {
            hand_over();
        }
        // The flusher holds the lock for a flush at most (milliseconds). On Windows the exit
        // handlers run after the process's other threads were stopped, possibly the flusher
        // inside a flush: then the lock is never released, and waiting would hang the exit.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let mut writer = match recorder.writer.try_lock() {
                Ok(writer) => writer,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return say(format_args!(
                        "the writer was stopped in the middle of a flush; the trace ends before the program did"
                    ));
                }
            };
            if let Err(err) = writer.close(recorder.drain(), recorder.config.memory_tracking) {
                stop_after_write_error(&writer, err);
            }
            return;
        }
    });
}

/// In a child after `fork`: forget the parent's recorder and close the child's copy of its trace
/// file (else the parent's finished trace looks locked, still being written, while the child
/// lives); the child starts its own on its next call (threads see that theirs is stale by its
/// generation). Runs in the forking thread, the only thread of the child.
extern "C" fn after_fork_in_child() {
    // Not `contained`: its first use installs a panic hook, which takes a lock another thread of
    // the parent may have held at the fork.
    let _ = catch_unwind(|| {
        let parent = RECORDER.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !parent.is_null() {
            // SAFETY: a non-null RECORDER is a leaked, never freed Recorder; only its
            // immutable descriptor is read (its locks may be held by threads the child lacks).
            os::close_in_child(unsafe { &*parent }.trace_descriptor);
        }
        STATE.store(UNSTARTED, Ordering::Release);
        recorder::forget_missed_while_starting();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_patterns_expand() {
        let pid = std::process::id().to_string();
        assert_eq!(expand_path("t-%p.ggmlviz"), format!("t-{pid}.ggmlviz"));
        assert_eq!(expand_path("100%%-%h"), format!("100%-{}", os::host_name()));
        assert_eq!(expand_path("plain%"), "plain%");
    }
}
