//! Helpers shared by the end-to-end tests in `tests/tests/`: where the built hook, the CLI and
//! llama.cpp are, a tiny model, scratch directories, and trace checks.
//!
//! The tests need `cargo build --release --workspace` first and `GGML_VIZ_LLAMA_BUILD` pointing at
//! a llama.cpp build; `scripts/test.sh` does both.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use ggml_viz_reader::format::ext::{self, TensorInfo};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};
use ggml_viz_reader::{Damage, Event, TraceFile, TraceStats};

/// `target/release` (or whichever profile built this test).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release --workspace` first (scripts/test.sh does)",
        path.display()
    );
    path
}

pub fn hook() -> PathBuf {
    built("libggml_viz_hook.so")
}

pub fn ggml_viz() -> PathBuf {
    built("ggml-viz")
}

/// The `bin/` directory of the llama.cpp build (binaries and shared ggml libraries).
pub fn llama_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_BUILD")
        .expect("GGML_VIZ_LLAMA_BUILD is not set: run the tests through scripts/test.sh, which builds llama.cpp");
    let bin = PathBuf::from(build).join("bin");
    assert!(
        bin.join("llama-simple").exists(),
        "no llama-simple in {}",
        bin.display()
    );
    bin
}

/// The `bin/` directory of the llama.cpp build with ggml linked into the executables
/// (`scripts/setup-llama.sh static`).
pub fn llama_static_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_STATIC_BUILD").expect(
        "GGML_VIZ_LLAMA_STATIC_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of libggml-cpu built with ggml's own thread pool instead of OpenMP
/// (`scripts/setup-llama.sh threadpool`): first on `LD_LIBRARY_PATH`, [`llama_bin`]'s programs
/// run on it.
pub fn llama_threadpool_lib() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_THREADPOOL_BUILD").expect(
        "GGML_VIZ_LLAMA_THREADPOOL_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of the llama.cpp build whose CPU backend is a module loaded with
/// `dlopen(RTLD_LOCAL)` (`GGML_BACKEND_DL=ON`, `scripts/setup-llama.sh dl`).
pub fn llama_dl_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_DL_BUILD").expect(
        "GGML_VIZ_LLAMA_DL_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of llama.cpp built on ggml-vulkan (`scripts/setup-llama.sh vulkan`),
/// whose programs the tests run on Mesa's lavapipe.
pub fn llama_vulkan_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_VULKAN_BUILD").expect(
        "GGML_VIZ_LLAMA_VULKAN_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// Runs the model generator `script` (a Python fixture) with `args`: the files it writes, then
/// its options.
fn generate(script: &str, args: &[&OsStr]) {
    let out = Command::new("python3")
        .arg(fixture(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The whisper.cpp build (scripts/setup-whisper.sh): `bin/whisper-cli` and its shared libraries.
pub fn whisper_build() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_WHISPER_BUILD").expect(
        "GGML_VIZ_WHISPER_BUILD is not set: run the tests through scripts/test.sh, which builds whisper.cpp",
    );
    let build = PathBuf::from(build);
    assert!(
        build.join("bin/whisper-cli").exists(),
        "no whisper-cli in {}",
        build.display()
    );
    build
}

/// The tiny random-weight whisper model and the WAV file it transcribes, generated once per test
/// process (tests/fixtures/make_tiny_whisper.py).
pub fn tiny_whisper() -> (PathBuf, PathBuf) {
    static MODEL: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = scratch("whisper-model");
            let (model, audio) = (dir.join("tiny-whisper.bin"), dir.join("tones.wav"));
            generate(
                "make_tiny_whisper.py",
                &[model.as_os_str(), audio.as_os_str()],
            );
            (model, audio)
        })
        .clone()
}

/// What `ldd` says of an executable or library: the shared objects it loads.
pub fn ldd(path: &Path) -> String {
    let out = run({
        let mut c = Command::new("ldd");
        c.arg(path);
        c
    });
    text(&out.stdout)
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// `attempt`'s result, run again (at most `tries` times in all) until `whole` accepts it: for
/// llama.cpp programs whose logger thread may not have written their last lines when they exit
/// (llama.cpp #22142). The last result is returned either way: the caller asserts it whole.
pub fn until_whole<T>(tries: u32, mut attempt: impl FnMut() -> T, whole: impl Fn(&T) -> bool) -> T {
    let mut result = attempt();
    for _ in 1..tries {
        if whole(&result) {
            break;
        }
        result = attempt();
    }
    result
}

/// Prefix of the scratch directories, followed by the test process's id.
const SCRATCH: &str = "ggml-viz-e2e-";

/// A fresh, empty directory for one test. Those of earlier test processes that have ended are
/// removed on the first call (a test leaves its files for a failure to be looked at, until the
/// next run).
pub fn scratch(name: &str) -> PathBuf {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(remove_ended_scratch);
    let dir = std::env::temp_dir().join(format!("{SCRATCH}{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the scratch directories of test processes no longer running (`/proc/<pid>` gone).
fn remove_ended_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // Where there is no /proc (not Linux), nothing is known to have ended.
        let ended = cfg!(target_os = "linux") && !Path::new(&format!("/proc/{pid}")).exists();
        if pid != std::process::id() && ended {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The tiny random-weight llama model, generated once per test process.
pub fn tiny_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-llama.gguf", &[])
}

/// The tiny model with a mixture of 4 experts, 2 used per token, in place of each feed-forward
/// block (its experts' products are MUL_MAT_ID nodes).
pub fn tiny_moe_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-moe.gguf", &["--n-expert", "4"])
}

/// The tiny model with its vocabulary padded to 272 tokens, as converters pad real models':
/// quantized, its output projection (the graph's last node) can be repacked for the CPU, whose
/// kernels take rows in groups of 8.
pub fn tiny_padded_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-padded.gguf", &["--pad-vocab", "8"])
}

/// `make_tiny_llama.py` with `options`, into `file` in a scratch directory of its own, once per
/// test process (`model` holds it).
fn tiny_variant(model: &OnceLock<PathBuf>, file: &str, options: &[&str]) -> PathBuf {
    model
        .get_or_init(|| {
            let path = scratch(file).join(file);
            let mut args = vec![path.as_os_str()];
            args.extend(options.iter().map(OsStr::new));
            generate("make_tiny_llama.py", &args);
            path
        })
        .clone()
}

/// `llama-simple -n N "hello world"` on the tiny model, from the llama.cpp build in `bin`.
pub fn llama_simple_in(bin: &Path, n_predict: u32) -> Command {
    let mut cmd = Command::new(bin.join("llama-simple"));
    cmd.arg("-m")
        .arg(tiny_model())
        .args(["-n", &n_predict.to_string(), "hello world"]);
    cmd
}

/// `llama-simple` of the shared-library build (see [`llama_simple_in`]).
pub fn llama_simple(n_predict: u32) -> Command {
    llama_simple_in(&llama_bin(), n_predict)
}

/// `llama-simple` traced into `trace` with `GGML_VIZ_*` `settings`, which must succeed.
pub fn trace_llama_simple(trace: &Path, n_predict: u32, settings: &[(&str, &str)]) -> Output {
    let mut all = vec![("GGML_VIZ_OUTPUT", trace.to_str().unwrap())];
    all.extend_from_slice(settings);
    let out = run(with_hook(llama_simple(n_predict), &all));
    assert!(out.status.success(), "{}", text(&out.stderr));
    out
}

/// `cmd` with the hook preloaded and the given `GGML_VIZ_*` settings.
pub fn with_hook(mut cmd: Command, settings: &[(&str, &str)]) -> Command {
    cmd.env("LD_PRELOAD", hook());
    for (k, v) in settings {
        cmd.env(k, v);
    }
    cmd
}

pub fn run(mut cmd: Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs the `ggml-viz` CLI with the arguments `args` gives it: `cli(|c| c.arg("info").arg(&trace))`.
pub fn cli(args: impl FnOnce(&mut Command) -> &mut Command) -> Output {
    let mut c = Command::new(ggml_viz());
    args(&mut c);
    run(c)
}

/// The lines the hook said on stderr (its `ggml-viz:` prefix).
pub fn hook_lines(stderr: &[u8]) -> Vec<String> {
    text(stderr)
        .lines()
        .filter(|l| l.starts_with("ggml-viz:"))
        .map(str::to_string)
        .collect()
}

/// The N of "decoded N tokens" that llama-simple reports on stderr: one decode call each.
pub fn decoded_batches(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.split("decoded ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no 'decoded N tokens' in:\n{stderr}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every event of a trace, its damage and its stats.
pub fn read_trace(path: &Path) -> (Vec<Event<'static>>, Option<Damage>, TraceStats) {
    let trace = TraceFile::open(path, None)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut events = Vec::new();
    let mut damage = None;
    for item in trace.events() {
        match item {
            Ok(e) => events.push(e.into_owned()),
            Err(d) => damage = Some(d),
        }
    }
    let stats = TraceStats::collect(
        events
            .iter()
            .cloned()
            .map(Ok)
            .chain(damage.clone().map(Err)),
    );
    (events, damage, stats)
}

/// Graph events pair up properly nested on every thread (same graph and label at both ends) and
/// every thread's timestamps never go back. Returns the outermost pairs' labels, in order.
pub fn check_nesting(events: &[Event<'_>]) -> Vec<String> {
    let mut open: HashMap<u32, Vec<&Event<'_>>> = HashMap::new();
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut outermost = Vec::new();
    for e in events.iter().filter(|e| e.event_type().is_some()) {
        if let Some(prev) = last.insert(e.thread_id, e.timestamp_ns) {
            assert!(
                e.timestamp_ns >= prev,
                "time went back on thread {}",
                e.thread_id
            );
        }
        let stack = open.entry(e.thread_id).or_default();
        match e.event_type() {
            Some(EventType::GraphComputeBegin) => {
                if stack.is_empty() {
                    outermost.push(e.label_str().unwrap_or_default().into_owned());
                }
                stack.push(e);
            }
            Some(EventType::GraphComputeEnd) => {
                let begin = stack
                    .pop()
                    .unwrap_or_else(|| panic!("graph end without begin: {e:?}"));
                assert_eq!(begin.payload, e.payload, "begin and end differ");
                assert_eq!(begin.label, e.label);
            }
            _ => {}
        }
    }
    for (tid, stack) in open {
        assert!(
            stack.is_empty(),
            "thread {tid} has {} graph(s) never ended",
            stack.len()
        );
    }
    outermost
}

/// `(n_nodes, n_threads)` of every graph begin event whose label starts with `entry`.
pub fn graphs_of(events: &[Event<'_>], entry: &str) -> Vec<(u32, u32)> {
    events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .filter(|e| {
            e.label_str()
                .is_some_and(|l| l.split(' ').next() == Some(entry))
        })
        .map(|e| match e.payload {
            Payload::Graph {
                n_nodes, n_threads, ..
            } => (n_nodes, n_threads),
            _ => unreachable!(),
        })
        .collect()
}

/// The `graph n_nodes=K threads=T result=X` lines the ctypes fixture prints.
pub fn fixture_graphs(stdout: &str) -> Vec<(u32, u32)> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("graph n_nodes="))
        .map(|(_, rest)| {
            let mut words = rest.split(' ');
            let n: u32 = words.next().unwrap().parse().unwrap();
            let t: u32 = words
                .next()
                .unwrap()
                .trim_start_matches("threads=")
                .parse()
                .unwrap();
            (n, t)
        })
        .collect()
}

/// The ctypes fixture (`tests/fixtures/ggml_ctypes.py`) with ggml from `libdirs`.
pub fn fixture_cmd(libdirs: &[&Path], args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(fixture("ggml_ctypes.py")).args(libdirs).args(args);
    cmd
}

/// The fixture computing graphs until killed, traced into `trace` with `flush_ms` between flushes.
/// Returns once it has computed its first graph (so the hook has started and the trace exists).
pub fn spawn_forever(bin: &Path, trace: &Path, flush_ms: &str) -> std::process::Child {
    let mut child = with_hook(
        fixture_cmd(&[bin], &["--nodes", "2", "--forever"]),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_FLUSH_INTERVAL", flush_ms),
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let computed = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .any(|line| line == "computed");
    assert!(computed, "the fixture ended before computing a graph");
    child
}

/// The sizes of the trace's buffer allocations (`TENSOR_ALLOC`), in order.
pub fn alloc_sizes(events: &[Event<'_>]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match (e.event_type(), e.payload) {
            (Some(EventType::TensorAlloc), Payload::Memory { size, .. }) => Some(size),
            _ => None,
        })
        .collect()
}

/// Every op begin follows an info for its label and op type, and no info repeats the last one of
/// its name and op (a reader keeps the latest of each: FORMAT.md); one name has nodes of several
/// ops (llama.cpp's `Qcur-0`: a MUL_MAT, then the ROPE after it), whose infos are each written
/// once per shape.
pub fn check_tensor_infos(events: &[Event<'_>]) {
    let mut known: HashMap<(String, Option<u32>), TensorInfo> = HashMap::new();
    let mut begins = 0;
    for e in events {
        match (e.event_type(), e.payload) {
            (None, Payload::Extension(x)) if x.kind == ExtensionKind::TensorInfo => {
                let label = e.label.as_deref().unwrap_or_default();
                let info: TensorInfo = ext::parse_payload(label).expect("our payload parses");
                if let Some(before) = known.insert((info.name.clone(), info.op_type), info.clone())
                {
                    assert_ne!(
                        before, info,
                        "written again with no other info of its name and op between"
                    );
                }
            }
            (Some(EventType::OpComputeBegin), Payload::Op { op_type, .. }) => {
                let label = e.label_str().expect("op events carry their tensor's name");
                assert!(
                    known.contains_key(&(label.to_string(), Some(op_type))),
                    "no info for {label} (op {op_type}) before its op event"
                );
                begins += 1;
            }
            _ => {}
        }
    }
    assert!(begins > 100, "{begins} op begins");
    let ops_of_qcur = known.keys().filter(|(name, _)| name == "Qcur-0").count();
    assert!(
        ops_of_qcur >= 2,
        "Qcur-0 is a MUL_MAT and a ROPE: {:?}",
        known.keys()
    );
}

/// `tmux` with `args`, its stdout; it must succeed (a screen read from a server that is gone
/// would be empty, and prove nothing of what it lacks).
pub fn tmux(args: &[&str]) -> String {
    let o = run({
        let mut c = Command::new("tmux");
        c.args(args);
        c
    });
    assert!(
        o.status.success(),
        "tmux {args:?}: {}",
        text(&o.stderr).trim()
    );
    text(&o.stdout)
}

/// A tmux server at `socket` running `sh -c script` in a detached terminal of `cols` x `rows`.
pub fn tmux_session(socket: &str, cols: u32, rows: u32, script: &str) {
    let (cols, rows) = (cols.to_string(), rows.to_string());
    tmux(&[
        "-S",
        socket,
        "new-session",
        "-d",
        "-x",
        &cols,
        "-y",
        &rows,
        "sh",
        "-c",
        script,
    ]);
}

/// Waits for `path` to hold a complete line; its text.
pub fn wait_for_file(path: &Path, timeout: std::time::Duration) -> String {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{} did not appear", path.display());
}

/// Everything the telemetry importer makes of `trace` (spans, lanes, processes, …).
pub fn collected(trace: &Path) -> ggml_viz_reader::telemetry::Collected {
    let mut c = ggml_viz_reader::telemetry::Collected::default();
    ggml_viz_reader::telemetry::import_path(
        trace,
        None,
        None,
        &mut ggml_viz_reader::telemetry::Ids::default(),
        &mut c,
    )
    .unwrap();
    c
}

/// A synthetic trace of `events` events at `path` (the workspace's `synthesize` example).
pub fn synthesize(path: &Path, events: u64) {
    let out = run({
        let mut c = Command::new(built("examples/synthesize"));
        c.arg(path).arg(events.to_string());
        c
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A synthetic ggml-rpc job (the workspace's `synthesize_rpc` example): a client's trace and
/// its server's, `tokens` long, with the example's `extra` options.
pub fn synthesize_rpc(client: &Path, server: &Path, tokens: u32, extra: &[&str]) {
    let out = run({
        let mut c = Command::new(built("examples/synthesize_rpc"));
        c.arg(client)
            .arg(server)
            .arg(tokens.to_string())
            .args(extra);
        c
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Per group of `ops --csv` of `trace`, its nodes and their wall time, summed over the phases.
pub fn ops_csv_totals(trace: &Path) -> HashMap<String, (u64, u64)> {
    let csv = cli(|c| c.args(["ops", "--csv"]).arg(trace));
    assert!(csv.status.success(), "{}", text(&csv.stderr));
    let mut totals: HashMap<String, (u64, u64)> = HashMap::new();
    for row in text(&csv.stdout).lines().skip(1) {
        let cols: Vec<&str> = row.split(',').collect();
        let t = totals.entry(cols[1].to_string()).or_default();
        t.0 += cols[2].parse::<u64>().unwrap();
        t.1 += cols[3].parse::<u64>().unwrap();
    }
    totals
}

/// What Perfetto's own classes read in a protobuf trace (`check_perfetto.py`).
pub fn decode_perfetto(proto: &Path) -> serde_json::Value {
    let decoded = run({
        let mut c = Command::new("python3");
        c.arg(fixture("check_perfetto.py")).arg(proto);
        c
    });
    assert!(decoded.status.success(), "{}", text(&decoded.stderr));
    serde_json::from_slice(&decoded.stdout).unwrap()
}

/// The fields of one CSV line (RFC 4180: a field in double quotes may hold commas, and `""` for
/// a quote).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// A FIFO at `path` (`mkfifo`).
pub fn mkfifo(path: &Path) {
    let made = run({
        let mut c = Command::new("mkfifo");
        c.arg(path);
        c
    });
    assert!(made.status.success(), "{}", text(&made.stderr));
}

/// Runs `cmd` to its end, its output captured; one still running after `limit` is killed and
/// fails the test (`what` says what it hung on): a hang guard, not a timing.
pub fn run_within(mut cmd: Command, limit: std::time::Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running after {limit:?}: {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
