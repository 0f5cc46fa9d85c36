//! The programs the tests trace: llama-simple and the fixtures, with the hook preloaded, and
//! the CLI and the synthetic-trace examples.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::places::{built, fixture, ggml_viz, hook, llama_bin, tiny_model};
use crate::process::{run, text};

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

/// The buffer sizes llama.cpp prints while it loads (`load_tensors: CPU_Mapped model buffer size
/// = 0.45 MiB`, `llama_kv_cache: CPU KV buffer size = …`, `… compute buffer size = …`, `… output
/// buffer size = …`), as the words our memory table uses: (`weights` / `KV cache` / `compute` /
/// `other`, buffer type) to the printed MiB, text as printed. Each (kind, type) is printed once.
pub fn llama_buffer_sizes(stderr: &str) -> std::collections::BTreeMap<(String, String), String> {
    let mut sizes = std::collections::BTreeMap::new();
    for line in stderr.lines() {
        let Some((left, right)) = line.split_once(" buffer size = ") else {
            continue;
        };
        let mut words = left.split_whitespace().rev();
        let (Some(kind), Some(buffer_type)) = (words.next(), words.next()) else {
            continue;
        };
        let held = match kind {
            "model" => "weights",
            "KV" => "KV cache",
            "compute" => "compute",
            "output" => "other",
            _ => continue,
        };
        let mib = right.trim().trim_end_matches("MiB").trim().to_string();
        let key = (held.to_string(), buffer_type.to_string());
        assert!(sizes.insert(key, mib).is_none(), "printed twice: {line}");
    }
    sizes
}

/// The ctypes fixture (`tests/fixtures/ggml_ctypes.py`) with ggml from `libdirs`.
pub fn fixture_cmd(libdirs: &[&Path], args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(fixture("ggml_ctypes.py")).args(libdirs).args(args);
    cmd
}

/// A child process that is killed and reaped when dropped: a test that fails before it stops
/// its fixture leaves nothing running (a fixture computing forever would hold the CPUs, and the
/// output pipe of whatever ran the tests, after the test binary has ended).
pub struct KilledOnDrop(pub std::process::Child);

impl std::ops::Deref for KilledOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KilledOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        // Already reaped by the test (the usual case): nothing is signalled.
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The fixture computing graphs until killed, traced into `trace` with `flush_ms` between flushes.
/// Returns once it has computed its first graph (so the hook has started and the trace exists);
/// killed when dropped.
pub fn spawn_forever(bin: &Path, trace: &Path, flush_ms: &str) -> KilledOnDrop {
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
    let child = KilledOnDrop(child);
    assert!(computed, "the fixture ended before computing a graph");
    child
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
