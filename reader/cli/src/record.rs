//! `ggml-viz record`: run a command with the hook preloaded, then summarize its trace.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::view::{Stop, WriterGone};

use clap::Args;
use ggml_viz_config::{CONFIG_FILE_ENV, Config, OVERRIDES_ENV, Sources};
use ggml_viz_reader::{DurationSummary, TraceFile, TraceStats};
use serde_json::{Map, Value};

use crate::say::Failure;
use crate::say::fmt_ns;

/// File name of the hook library, and the variable that makes the dynamic loader load it first.
#[cfg(target_os = "macos")]
const HOOK_FILE: &str = "libggml_viz_hook.dylib";
#[cfg(target_os = "macos")]
const PRELOAD_VAR: &str = "DYLD_INSERT_LIBRARIES";
#[cfg(windows)]
const HOOK_FILE: &str = "ggml_viz_hook.dll";
#[cfg(not(any(target_os = "macos", windows)))]
const HOOK_FILE: &str = "libggml_viz_hook.so";
#[cfg(not(any(target_os = "macos", windows)))]
const PRELOAD_VAR: &str = "LD_PRELOAD";

/// Run a GGML program with the hook preloaded and summarize the trace it leaves.
///
/// The flags reach the hook with top precedence (over the JSON config file and GGML_VIZ_*
/// variables, through GGML_VIZ_OVERRIDES). The program's output is left alone; the summary goes
/// to stderr. The exit status is the program's own (2 when the trace could not be written:
/// then the program is not run).
///
/// The hook library is looked for with --hook, then GGML_VIZ_HOOK, then next to this executable
/// and in ../lib beside it (where scripts/install.sh puts it).
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz record -- llama-simple -m model.gguf -n 32 \"Hello\"\n  ggml-viz record --op-timing off --memory -- llama-bench -m model.gguf\n  ggml-viz record -o decode.ggmlviz --skip-graphs 1 --max-graphs 100 -- llama-bench -m model.gguf"
)]
pub struct RecordArgs {
    /// Trace file to write (%p: the pid, %h: the host name). Default: the configured output, else trace.ggmlviz.
    #[arg(short, long)]
    output: Option<String>,
    /// JSON configuration file (the seed's format); outranks GGML_VIZ_* variables.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Events recorded at most; later ones are counted as lost.
    #[arg(long)]
    max_events: Option<u64>,
    /// Events per thread ring (a power of two).
    #[arg(long)]
    buffer_size: Option<u64>,
    /// Milliseconds between flushes to the file.
    #[arg(long)]
    flush_interval_ms: Option<u64>,
    /// Graph computes to skip before recording (warm-up).
    #[arg(long)]
    skip_graphs: Option<u64>,
    /// Graph computes to record after the skipped ones.
    #[arg(long)]
    max_graphs: Option<u64>,
    /// How nodes are timed: auto (threads on the CPU, the device's own timestamps on a Vulkan
    /// GPU), threads, sched (the eval callback: a sync per node), or off (graphs only).
    #[arg(long, value_name = "MODE")]
    op_timing: Option<String>,
    /// Time the nodes of one graph compute in N (the others run as with op timing off).
    #[arg(long, value_name = "N")]
    op_sample: Option<u64>,
    /// Record backend buffers (weights, KV cache, compute buffers) as they come and go.
    #[arg(long)]
    memory: bool,
    /// Event layout to write: packed (the spec's) or padded (the C++ tool's).
    #[arg(long)]
    layout: Option<String>,
    /// Have the hook say more on stderr (where each call site goes).
    #[arg(long)]
    verbose: bool,
    /// Path of libggml_viz_hook.so.
    #[arg(long)]
    hook: Option<PathBuf>,
    /// Show a live view of the trace while the program runs (see `ggml-viz live --help`). On a
    /// terminal the program's output goes to OUTPUT.log and its stdin is closed, so that the
    /// view owns the screen and the keyboard.
    #[arg(long)]
    live: bool,
    #[command(flatten)]
    view: crate::view::ViewOpts,
    /// The command to run, after `--`.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

impl RecordArgs {
    fn overrides(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        put("output", self.output.clone().map(Value::from));
        put("max_events", self.max_events.map(Value::from));
        put("buffer_size", self.buffer_size.map(Value::from));
        put("flush_interval_ms", self.flush_interval_ms.map(Value::from));
        put("skip_graphs", self.skip_graphs.map(Value::from));
        put("max_graphs", self.max_graphs.map(Value::from));
        put("layout", self.layout.clone().map(Value::from));
        put("op_timing", self.op_timing.clone().map(Value::from));
        put("op_sample", self.op_sample.map(Value::from));
        put("memory_tracking", self.memory.then_some(Value::Bool(true)));
        put("verbose", self.verbose.then_some(Value::Bool(true)));
        m
    }
}

fn find_hook(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = explicit {
        return path
            .exists()
            .then(|| path.to_path_buf())
            .ok_or_else(|| format!("--hook {}: no such file", path.display()));
    }
    if let Some(path) = std::env::var_os("GGML_VIZ_HOOK") {
        let path = PathBuf::from(path);
        return path
            .exists()
            .then_some(path.clone())
            .ok_or_else(|| format!("GGML_VIZ_HOOK={}: no such file", path.display()));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(HOOK_FILE), dir.join("../lib").join(HOOK_FILE)];
    candidates.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        format!(
            "cannot find {HOOK_FILE} next to {} or in ../lib: build it with `cargo build --release -p ggml-viz-hook`, \
             install with scripts/install.sh, or pass --hook PATH",
            exe.display()
        )
    })
}

/// Runs the command; the returned code is the program's exit status.
pub fn run(args: RecordArgs) -> Result<u8, Failure> {
    let hook = find_hook(args.hook.as_deref()).map_err(Failure::Usage)?;
    let mut overrides = args.overrides();
    // The effective configuration, checked here so that a bad flag fails before the program runs.
    let mut sources = Sources::from_process_env();
    if let Some(file) = &args.config {
        sources.config_file = Some(file.clone());
    }
    sources.overrides = overrides.clone();
    let mut config = Config::load(&sources).map_err(|e| Failure::Usage(e.to_string()))?;
    if !overrides.contains_key("output")
        && !sources.env.contains_key("GGML_VIZ_OUTPUT")
        && config.output == Config::default().output
    {
        // A fixed name by default, so that the summary finds it whatever pid the program gets.
        config.output = "trace.ggmlviz".into();
        overrides.insert("output".into(), config.output.clone().into());
    }
    // The program's pid is not known yet: where %p is in the file's name, any pid tells whether
    // its directory takes a new file.
    check_output(Path::new(&expand(&config.output, std::process::id()))).map_err(|e| {
        Failure::Output(std::io::Error::new(
            e.kind(),
            format!("{e}; the program was not run"),
        ))
    })?;
    // As `perf record` does: a trace already there is said to be overwritten (where the name
    // has no %p, which makes it the program's own).
    let existing = PathBuf::from(expand(&config.output, std::process::id()));
    if !config.output.contains("%p") && existing.is_file() {
        eprintln!(
            "ggml-viz: {} exists and will be overwritten",
            existing.display()
        );
    }
    // The host's memory bandwidth, for the ops' share of it (unless given): ~0.2 s, before the
    // program starts, so that nothing of it runs beside the program.
    if config.memory_bandwidth_mb_s == 0 {
        overrides.insert(
            "memory_bandwidth_mb_s".into(),
            memory_bandwidth_mb_s().into(),
        );
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env(OVERRIDES_ENV, Value::Object(overrides).to_string());
    if let Some(file) = &args.config {
        cmd.env(CONFIG_FILE_ENV, file);
    }
    // Nodes on a Vulkan device are timed by the hook's Vulkan layer, unless ops are not timed
    // or the eval callback is asked for.
    #[cfg(target_os = "linux")]
    let _layer = (!matches!(
        config.op_timing,
        ggml_viz_config::OpTiming::Off | ggml_viz_config::OpTiming::Sched
    ))
    .then(|| crate::vulkan_layer::enable(&mut cmd, &hook))
    .flatten();
    let live = args.live && args.view.interactive();
    let log = PathBuf::from(format!(
        "{}.log",
        expand(&config.output, std::process::id())
    ));
    if live {
        let file = open_log(&log).map_err(|e| {
            Failure::Usage(format!(
                "cannot write the program's output to {}: {e}",
                log.display()
            ))
        })?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().map_err(Failure::Output)?)
            .stderr(file);
    }
    let started = std::time::SystemTime::now();
    let mut child = start(&mut cmd, &hook).map_err(|e| {
        Failure::Usage(format!(
            "cannot run {}: {e}",
            args.command[0].to_string_lossy()
        ))
    })?;
    let path = PathBuf::from(expand(&config.output, child.id()));
    if args.live {
        let mut exited = || {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|s| format!("the program exited with status {}", exit_code(s)))
        };
        let stop = crate::view::watch(
            &path,
            &args.view,
            None,
            WriterGone::Exited(started, &mut exited),
        );
        if live {
            eprintln!("ggml-viz: the program's output is in {}", log.display());
        }
        if let Ok(Stop::Quit) = stop {
            eprintln!("ggml-viz: waiting for the program to exit (Ctrl-C stops it)");
        }
        if let Err(Failure::Data(msg)) = stop {
            eprintln!("ggml-viz: warning: {msg}");
        }
    }
    let status = ignoring_interrupts(|| child.wait())
        .map_err(|e| Failure::Data(format!("waiting for the program failed: {e}")))?;
    summarize(&path, started);
    Ok(exit_code(status))
}

/// The program's output log of `record --live`: not through a symlink (its name is
/// predictable), readable by its owner only.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path)
}

/// Whether the hook can write a trace at `path`: its directory exists and takes new files, and
/// nothing but a regular file is there already (the hook replaces only those).
fn check_output(path: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let fail = |kind, why: String| Err(Error::new(kind, format!("{}: {why}", path.display())));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return fail(
                e.kind(),
                format!("directory {} does not exist", dir.display()),
            );
        }
        Err(e) => return fail(e.kind(), format!("{}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => {
            return fail(
                ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            );
        }
        Ok(_) => {}
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c_dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::new(ErrorKind::InvalidInput, "a NUL byte in the output path"))?;
        // SAFETY: `c_dir` is a NUL-terminated string that outlives the call; access() only reads it.
        if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let e = Error::last_os_error();
            return fail(
                e.kind(),
                format!("cannot create files in {} ({e})", dir.display()),
            );
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => fail(
            ErrorKind::AlreadyExists,
            "exists and is not a regular file".into(),
        ),
        _ => Ok(()),
    }
}

/// Starts the program with the dynamic loader loading the hook before its own libraries. macOS
/// strips `DYLD_*` variables from protected (SIP) binaries: see docs/platforms.md.
#[cfg(unix)]
fn start(cmd: &mut Command, hook: &Path) -> std::io::Result<std::process::Child> {
    let mut preload = hook.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os(PRELOAD_VAR).filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    cmd.env(PRELOAD_VAR, preload).spawn()
}

/// Starts the program suspended, loads the hook DLL into it, then lets it run (Windows has no
/// preload variable).
#[cfg(windows)]
fn start(cmd: &mut Command, hook: &Path) -> std::io::Result<std::process::Child> {
    crate::inject::start_injected(cmd, hook)
}

/// Ctrl-C goes to the program (same process group); we outlive it to write the summary.
fn ignoring_interrupts<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: setting and restoring the disposition of SIGINT; no handler code runs.
    let old = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let result = f();
    // SAFETY: restoring the disposition `signal` returned above, a valid one.
    unsafe { libc::signal(libc::SIGINT, old) };
    result
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    #[cfg(unix)]
    use std::os::unix::process::ExitStatusExt;
    #[cfg(unix)]
    let signal = status.signal();
    #[cfg(not(unix))]
    let signal: Option<i32> = None;
    match (status.code(), signal) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        _ => 1,
    }
}

/// The hook's `%p` and `%h` expansion, for the pid of the program we started.
fn expand(template: &str, pid: u32) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    template
        .replace("%%", "\u{0}")
        .replace("%p", &pid.to_string())
        .replace("%h", &host)
        .replace('\u{0}', "%")
}

fn summarize(path: &Path, started: std::time::SystemTime) {
    // A file from an earlier run is no trace of this one.
    let fresh = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= started);
    let trace = match TraceFile::open(path, None) {
        Ok(trace) if fresh => trace,
        _ => {
            eprintln!(
                "ggml-viz: no trace at {}: the program called no interposed ggml function (or tracing was off)",
                path.display()
            );
            return;
        }
    };
    let stats = TraceStats::collect(trace.events());
    eprintln!("ggml-viz: trace written to {}", path.display());
    eprint!("ggml-viz: {} graph computes", stats.graph_computes);
    match DurationSummary::of(&stats.graph_durations_ns) {
        Some(s) => eprintln!(
            ", graph time mean {} p50 {} p99 {}",
            fmt_ns(s.mean_ns),
            fmt_ns(s.p50_ns as f64),
            fmt_ns(s.p99_ns as f64)
        ),
        None => eprintln!(),
    }
    if let Some(note) = stats
        .metadata
        .as_ref()
        .and_then(ggml_viz_reader::op_timing_note)
    {
        eprintln!(
            "ggml-viz: op timing {note}; see `ggml-viz ops {}`",
            path.display()
        );
    }
    if stats.device_ops > 0 {
        eprintln!(
            "ggml-viz: {} nodes computed on a GPU, timed by the device itself (its own \
             timestamps), on a lane per device queue",
            stats.device_ops
        );
    }
    if let Some(note) = stats.oversubscription_note() {
        eprintln!("ggml-viz: note: {note}");
    }
    let lost = stats.counters.map_or(0, |c| c.lost());
    eprintln!(
        "ggml-viz: {} events on {} thread(s), {lost} lost",
        stats.events(),
        stats.threads.len()
    );
    if let Some(damage) = &stats.damage {
        eprintln!("ggml-viz: warning: {}: {damage}", path.display());
    }
    eprintln!("ggml-viz: more with `ggml-viz info {}`", path.display());
}

/// The host's memory bandwidth, MB/s: the best of three copies of 256 MiB (a STREAM-like copy:
/// bytes read and written, per second), the copy split over every CPU the process may use, as a
/// graph compute's threads split a node. Far larger than any cache, so it is memory's.
fn memory_bandwidth_mb_s() -> u64 {
    const BYTES: usize = 256 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let from = vec![1u8; BYTES];
    let mut to = vec![0u8; BYTES];
    let chunk = BYTES.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            for (dst, src) in to.chunks_mut(chunk).zip(from.chunks(chunk)) {
                s.spawn(move || dst.copy_from_slice(src));
            }
        });
        best = best.min(started.elapsed().as_secs_f64());
    }
    std::hint::black_box(&to);
    (2.0 * BYTES as f64 / best / 1e6) as u64
}
