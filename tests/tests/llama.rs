//! The hook preloaded into real llama.cpp (`llama-simple`) on a tiny generated model.

use std::path::Path;
use std::process::Command;

use ggml_viz_e2e::*;
use ggml_viz_reader::format::{EventType, Payload};

/// Graph-only mode (no op timing): the scheduler, backend and CPU computes nest as ggml makes them.
#[test]
fn llama_simple_prints_the_same_text_and_records_one_graph_per_batch() {
    let dir = scratch("llama-simple");
    let trace = dir.join("trace.ggmlviz");
    let plain = run(llama_simple(12));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let traced = run(with_hook(
        llama_simple(12),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_TIMING", "0"),
        ],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "the hook changed the program's output"
    );
    assert!(
        !text(&traced.stderr).contains("ggml-viz:"),
        "unexpected message: {}",
        text(&traced.stderr)
    );

    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    let outermost = check_nesting(&events);
    let batches = decoded_batches(&text(&traced.stderr));
    assert_eq!(
        stats.graph_computes, batches,
        "one outermost graph compute per llama_decode"
    );
    assert!(
        outermost
            .iter()
            .all(|l| l == "ggml_backend_sched_graph_compute_async CPU"),
        "{outermost:?}"
    );
    // Inside each: the scheduler's split on the CPU backend, and the CPU backend's ggml_graph_compute.
    let sched = graphs_of(&events, "ggml_backend_sched_graph_compute_async");
    let backend = graphs_of(&events, "ggml_backend_graph_compute_async");
    let cpu = graphs_of(&events, "ggml_graph_compute");
    assert_eq!(
        (sched.len() as u64, backend.len() as u64, cpu.len() as u64),
        (batches, batches, batches)
    );
    for ((s, b), c) in sched.iter().zip(&backend).zip(&cpu) {
        assert!(
            s.0 > 0 && b.0 > 0 && b.0 <= s.0,
            "n_nodes: scheduler {s:?}, split {b:?}"
        );
        assert_eq!(c.0, b.0, "the CPU backend computes the split it was given");
        assert!(
            c.1 >= 1,
            "ggml_graph_compute records the cplan's thread count"
        );
    }
    let meta = stats.metadata.expect("metadata record");
    assert_eq!(meta.ggml_version.as_deref(), Some("0.25.3"));
    assert!(meta.command_line[0].ends_with("llama-simple"));
    assert_eq!(stats.counters.map(|c| c.lost()), Some(0));
}

#[test]
fn the_capture_window_skips_and_limits_graph_computes() {
    let dir = scratch("window");
    let trace = dir.join("trace.ggmlviz");
    let out = run(with_hook(
        llama_simple(10),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_SKIP_GRAPHS", "2"),
            ("GGML_VIZ_MAX_GRAPHS", "3"),
        ],
    ));
    assert!(out.status.success());
    let (events, _, stats) = read_trace(&trace);
    check_nesting(&events);
    assert!(decoded_batches(&text(&out.stderr)) >= 5);
    assert_eq!(stats.graph_computes, 3);
}

#[test]
fn unwritable_output_is_said_once_and_the_program_runs_untraced() {
    let plain = run(llama_simple(6));
    let traced = run(with_hook(
        llama_simple(6),
        &[("GGML_VIZ_OUTPUT", "/nonexistent/dir/trace.ggmlviz")],
    ));
    assert_eq!(traced.status.code(), plain.status.code());
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    let ours = hook_lines(&traced.stderr);
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(
        ours[0].contains("/nonexistent/dir/trace.ggmlviz") && ours[0].contains("untraced"),
        "{}",
        ours[0]
    );
}

/// The CUPTI capture starts at a CUDA backend's graph compute only: in a CPU run nothing of it
/// happens, even where CUPTI could be loaded (CI's wheel on the library path): no file, no line,
/// the same text.
#[test]
fn a_cupti_capture_waits_for_a_cuda_backend() {
    let dir = scratch("cupti-capture");
    let capture = dir.join("capture.jsonl");
    let trace = dir.join("t.ggmlviz");
    let library_path = std::env::var("GGML_VIZ_CUDA_WHEELS")
        .map(|w| format!("{w}/lib"))
        .unwrap_or_default();
    let plain = run(llama_simple(4));
    let traced = run(with_hook(
        llama_simple(4),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_CUPTI_CAPTURE", capture.to_str().unwrap()),
            ("LD_LIBRARY_PATH", &library_path),
        ],
    ));
    assert!(traced.status.success());
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    assert_eq!(hook_lines(&traced.stderr), Vec::<String>::new());
    assert!(trace.exists(), "the trace is written");
    assert!(!capture.exists(), "no capture without a CUDA backend");
}

#[test]
fn a_bad_setting_is_named_and_the_program_runs_untraced() {
    let dir = scratch("bad-setting");
    let traced = run(with_hook(
        llama_simple(4),
        &[
            ("GGML_VIZ_OUTPUT", dir.join("t.ggmlviz").to_str().unwrap()),
            ("GGML_VIZ_BUFFER_SIZE", "1000"),
        ],
    ));
    assert!(traced.status.success());
    let stderr = text(&traced.stderr);
    assert!(
        stderr.contains(
            "ggml-viz: setting `buffer_size` from environment variable GGML_VIZ_BUFFER_SIZE"
        ),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no trace is written"
    );
}

#[test]
fn processes_that_never_call_ggml_are_untouched() {
    let dir = scratch("inert");
    let settings = [(
        "GGML_VIZ_OUTPUT",
        dir.join("t-%p.ggmlviz").to_str().unwrap().to_string(),
    )];
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Threads of the shell itself, output and exit status, with and without the hook.
    let script = "echo out; echo err >&2; ls /proc/$$/task | wc -l; exit 3";
    let sh = || {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    };
    let plain = run(sh());
    let traced = run(with_hook(sh(), &settings));
    assert_eq!(traced.status.code(), Some(3));
    assert_eq!(
        (traced.stdout.clone(), traced.stderr.clone()),
        (plain.stdout, plain.stderr)
    );
    let t = run(with_hook(Command::new("true"), &settings));
    assert!(t.status.success() && t.stdout.is_empty() && t.stderr.is_empty());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no file for processes that never call ggml"
    );
}

#[test]
fn the_trace_is_private_and_a_planted_symlink_is_refused() {
    let dir = scratch("symlink");
    let trace = dir.join("t.ggmlviz");
    let out = run(with_hook(
        llama_simple(2),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(out.status.success());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&trace).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let planted = dir.join("planted.ggmlviz");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let plain = run(llama_simple(2));
    let out = run(with_hook(
        llama_simple(2),
        &[("GGML_VIZ_OUTPUT", planted.to_str().unwrap())],
    ));
    assert_eq!(
        text(&out.stdout),
        text(&plain.stdout),
        "the program runs on untraced"
    );
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "the symlink's target is untouched"
    );
    assert!(
        text(&out.stderr).contains("cannot write the trace"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_file_size_limit_stops_tracing_not_the_program() {
    // Past RLIMIT_FSIZE a write raises SIGXFSZ, which kills a process by default: the hook must
    // take EFBIG instead, say so once, and let the program finish.
    let dir = scratch("fsize");
    let trace = dir.join("t.ggmlviz");
    let plain = run(llama_simple(8));
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -f 8; exec \"$@\"", "sh"])
        .arg(llama_bin().join("llama-simple"));
    cmd.arg("-m")
        .arg(tiny_model())
        .args(["-n", "8", "hello world"]);
    let out = run(with_hook(
        cmd,
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    let ours = hook_lines(&out.stderr);
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(
        ours[0].contains("File too large") && ours[0].contains("the program runs on"),
        "{}",
        ours[0]
    );
    let (_, damage, stats) = read_trace(&trace);
    assert!(damage.is_none_or(|d| d.is_truncation()));
    assert!(stats.metadata.is_some());
}

#[test]
fn memcheck_finds_nothing_in_a_traced_llama_simple() {
    // Everything on: op timing, memory and thread tracking. Valgrind's own error count is the
    // verdict (helgrind/DRD are not used: libgomp and our lock-free ring give them false
    // positives; the ring is model-checked with loom instead).
    let dir = scratch("memcheck");
    let trace = dir.join("t.ggmlviz");
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--trace-children=yes",
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
    ]);
    cmd.arg("env")
        .arg(format!("LD_PRELOAD={}", hook().display()))
        .arg(format!("GGML_VIZ_OUTPUT={}", trace.display()));
    cmd.args(["GGML_VIZ_MEMORY_TRACKING=1", "GGML_VIZ_THREAD_TRACKING=1"]);
    cmd.arg(llama_bin().join("llama-simple"))
        .arg("-m")
        .arg(tiny_model())
        .args(["-n", "4", "hello"]);
    let out = cmd
        .output()
        .expect("valgrind is installed by scripts/test.sh");
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "memcheck reported errors:\n{stderr}"
    );
    assert!(stderr.contains("ERROR SUMMARY: 0 errors"), "{stderr}");
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert!(stats.graph_computes >= 4 && stats.ops > 0);
}

/// ggml linked into llama-simple itself (`-DBUILD_SHARED_LIBS=OFF`): there is no dynamic symbol to
/// interpose, so the hook patches the executable's own functions at start-up (inline hooks).
#[test]
fn statically_linked_ggml_is_traced_through_inline_hooks() {
    let bin = llama_static_bin();
    let deps = ldd(&bin.join("llama-simple"));
    assert!(!deps.contains("ggml"), "llama-simple is not static: {deps}");
    let dir = scratch("llama-static");
    let trace = dir.join("trace.ggmlviz");
    let plain = run(llama_simple_in(&bin, 10));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let traced = run(with_hook(
        llama_simple_in(&bin, 10),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_TIMING", "1"),
            ("GGML_VIZ_VERBOSE", "1"),
        ],
    ));
    let stderr = text(&traced.stderr);
    assert!(traced.status.success(), "{stderr}");
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "the hook changed the output"
    );
    assert!(
        stderr.contains("ggml_backend_sched_graph_compute_async called from")
            && stderr.contains("goes to the executable's own (inline hook)"),
        "{stderr}"
    );
    // The executable's own per-op functions are hooked inline too: `auto` times per thread.
    assert!(
        stderr.contains("op timing: threads: GGML_VIZ_OP_TIMING=auto"),
        "{stderr}"
    );
    // Every entry point and per-op function llama-simple defines is patched: the executable's
    // symbol table says which.
    let (entries, per_op) = static_wrapped_functions(&bin.join("llama-simple"));
    assert!(entries >= 8, "llama-simple defines {entries} entry points");
    assert!(
        per_op >= 100,
        "llama-simple defines {per_op} per-op functions"
    );
    assert!(
        stderr.contains(&format!(
            "ggml is linked into the executable: {entries} of its entry points and {per_op} of \
             its per-op functions hooked inline"
        )),
        "{stderr}"
    );

    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    check_nesting(&events);
    assert_eq!(stats.graph_computes, decoded_batches(&stderr));
    // Each worker thread's shares of the nodes (threads-mode pairs name no backend), MUL_MAT
    // among them.
    let ops = stats.op_type_counts();
    assert!(
        ops.iter().any(|(name, n)| name == "MUL_MAT" && *n > 0),
        "{ops:?}"
    );
    let op_threads: std::collections::HashSet<u32> = events
        .iter()
        .filter_map(|e| match (e.event_type(), e.payload) {
            (Some(EventType::OpComputeBegin), Payload::Op { backend_ptr: 0, .. }) => {
                Some(e.thread_id)
            }
            _ => None,
        })
        .collect();
    assert!(
        op_threads.len() >= 2 && stats.ops_with_backend == 0,
        "shares on {op_threads:?}, {} eval-callback ops",
        stats.ops_with_backend
    );
    let spans = ggml_viz_reader::format::ExtensionKind::SpanBegin;
    assert_eq!(
        stats.extensions.get(&spans).copied().unwrap_or(0),
        decoded_batches(&stderr),
        "one llama_decode span per decode"
    );
}

/// How many of the entry points and of the per-op functions the hook wraps (the ggml names the
/// built hook exports, by `nm -D`) the executable at `path` defines (by `nm`): read from the two
/// binaries, not from the hook's code.
fn static_wrapped_functions(path: &Path) -> (usize, usize) {
    let symbols = |args: &[&str], file: &Path| -> Vec<String> {
        let mut c = Command::new("nm");
        c.args(args).arg(file);
        let out = run(c);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && matches!(f[1], "T" | "t")).then(|| f[2].to_string())
            })
            .collect()
    };
    let per_op = |s: &str| {
        s.starts_with("ggml_compute_forward_")
            || matches!(s, "ggml_barrier" | "ggml_cpu_extra_compute_forward")
    };
    let wrapped = symbols(&["-D", "--defined-only"], &hook());
    assert!(wrapped.len() >= 100, "the hook exports {wrapped:?}");
    let defined: std::collections::HashSet<String> =
        symbols(&["--defined-only"], path).into_iter().collect();
    let count = |of_kind: bool| {
        wrapped
            .iter()
            .filter(|w| per_op(w) == of_kind && defined.contains(*w))
            .count()
    };
    (count(false), count(true))
}

/// A static executable whose symbol table lacks `ggml_barrier` (`objcopy --strip-symbol`): its
/// per-op functions cannot all be reached, so `auto` falls back to the scheduler's eval callback
/// and says why; the output is unchanged and the ops are the callback's (they name a backend).
#[test]
fn a_static_executable_without_ggml_barrier_in_its_symbols_falls_back_to_sched() {
    let dir = scratch("llama-static-no-barrier");
    let exe = dir.join("llama-simple");
    let out = run({
        let mut c = Command::new("objcopy");
        c.arg("--strip-symbol=ggml_barrier")
            .arg(llama_static_bin().join("llama-simple"))
            .arg(&exe);
        c
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plain = run(llama_simple_in(&dir, 6));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = dir.join("t.ggmlviz");
    let traced = run(with_hook(
        llama_simple_in(&dir, 6),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_TIMING", "auto"),
            ("GGML_VIZ_VERBOSE", "1"),
        ],
    ));
    let stderr = text(&traced.stderr);
    assert!(traced.status.success(), "{stderr}");
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    assert!(
        stderr.contains(
            "op timing: sched: GGML_VIZ_OP_TIMING=auto: no loaded library exports ggml_barrier \
             and the executable has none of its own to hook"
        ),
        "{stderr}"
    );
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert!(
        stats.ops > 0 && stats.ops_with_backend == stats.ops,
        "{} ops, {} through the eval callback",
        stats.ops,
        stats.ops_with_backend
    );
}

/// Tracing disabled through the configuration — any spelling it accepts, or its JSON file —
/// leaves a static executable's functions unpatched: its calls never reach the hook, which
/// therefore says nothing at all, even verbose (a patched executable's first call would start
/// the session, and it would say "disabled by configuration"), and writes no trace.
#[test]
fn a_static_executable_is_not_patched_when_the_configuration_disables_tracing() {
    let bin = llama_static_bin();
    let dir = scratch("llama-static-disabled");
    let file = dir.join("config.json");
    std::fs::write(&file, r#"{"instrumentation": {"disable": true}}"#).unwrap();
    let trace = dir.join("never-written.ggmlviz");
    let plain = run(llama_simple_in(&bin, 4));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let file = file.to_str().unwrap();
    for disabled in [
        &[("GGML_VIZ_DISABLE", "yes")][..],
        &[("GGML_VIZ_DISABLE", "on")],
        &[("GGML_VIZ_DISABLE", "1")],
        &[("GGML_VIZ_CONFIG", file)],
    ] {
        let mut settings = vec![
            ("GGML_VIZ_VERBOSE", "1"),
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
        ];
        settings.extend_from_slice(disabled);
        let out = run(with_hook(llama_simple_in(&bin, 4), &settings));
        assert!(out.status.success(), "{disabled:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{disabled:?}");
        assert_eq!(
            hook_lines(&out.stderr),
            Vec::<String>::new(),
            "{disabled:?}"
        );
        assert!(!trace.exists(), "{disabled:?}: a trace was written");
    }
    // The same run, enabled: patched and traced (so the checks above can fail).
    let out = run(with_hook(
        llama_simple_in(&bin, 4),
        &[
            ("GGML_VIZ_VERBOSE", "1"),
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
        ],
    ));
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("hooked inline"));
    assert!(trace.exists());
}

/// When our resolver fails (`GGML_VIZ_FAULT=resolve` makes it panic at every call it is asked),
/// every call still reaches ggml: llama-simple prints what it prints without us — dynamically
/// linked with per-thread op timing (the entry points and the CPU backend's per-op functions)
/// and statically linked (the inline hooks) — and the hook says one line instead of Rust's panic
/// messages (before: the wrappers returned -1 or did nothing, and the program failed).
#[test]
fn a_failing_resolver_still_sends_every_call_to_ggml() {
    let dir = scratch("fault-resolve");
    for (bin, timing) in [(llama_bin(), "threads"), (llama_static_bin(), "auto")] {
        let plain = run(llama_simple_in(&bin, 8));
        assert!(plain.status.success(), "{}", text(&plain.stderr));
        let traced = run(with_hook(
            llama_simple_in(&bin, 8),
            &[
                ("GGML_VIZ_OUTPUT", dir.join("t.ggmlviz").to_str().unwrap()),
                ("GGML_VIZ_OP_TIMING", timing),
                ("GGML_VIZ_FAULT", "resolve"),
            ],
        ));
        let stderr = text(&traced.stderr);
        assert!(traced.status.success(), "{}: {stderr}", bin.display());
        assert_eq!(
            text(&traced.stdout),
            text(&plain.stdout),
            "{}: the output changed",
            bin.display()
        );
        let failed: Vec<String> = hook_lines(&traced.stderr)
            .into_iter()
            .filter(|l| l.contains("our own code failed"))
            .collect();
        assert_eq!(failed.len(), 1, "{}: {stderr}", bin.display());
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The size of `symbol` in the symbol table of `file`, as binutils' `nm -S` reads it.
fn nm_size(file: &Path, symbol: &str) -> u64 {
    let out = run({
        let mut nm = Command::new("nm");
        nm.arg("-S").arg(file);
        nm
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == symbol).then(|| u64::from_str_radix(f[1], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no {symbol} in nm -S {}", file.display()))
}

/// `ggml_op_name` is only asked about ops this ggml defines: the hook takes the op count from
/// the size of the `GGML_OP_NAME` table in the symbol table of the file that defines
/// `ggml_op_name` (the shared library, or a static executable), and from its version when the
/// library is stripped; `verbose` says which. Expected: `nm -S`'s size of that table over 8
/// (before: any op below 128 was looked up, while this ggml has 101). With op timing on (each
/// mode here), it is read as tracing starts, before the trace is opened ("tracing to"), not by
/// the first graph compute's worker threads inside it (before: after).
#[test]
fn the_op_count_comes_from_the_op_name_table_or_the_version() {
    let dir = scratch("op-count");
    let shared = llama_bin().join("libggml-base.so.0");
    let ops = nm_size(&shared, "GGML_OP_NAME") / 8;
    let static_ops = nm_size(&llama_static_bin().join("llama-simple"), "GGML_OP_NAME") / 8;
    assert_eq!(ops, static_ops);
    // The same ggml with its symbol table stripped, found first on the library path.
    let stripped = dir.join("stripped");
    std::fs::create_dir_all(&stripped).unwrap();
    let copy = stripped.join("libggml-base.so.0");
    std::fs::copy(&shared, &copy).unwrap();
    let out = run({
        let mut strip = Command::new("strip");
        strip.arg("--strip-all").arg(&copy);
        strip
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The version, from the library's file name (libggml-base.so.0.25.3).
    let real = std::fs::canonicalize(&shared).unwrap();
    let version = real
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .trim_start_matches("libggml-base.so.")
        .to_string();
    for (bin, library_path, mode, said) in [
        (
            llama_bin(),
            None,
            "threads",
            format!("this ggml has {ops} ops (the size of its GGML_OP_NAME table)"),
        ),
        (
            llama_static_bin(),
            None,
            "sched",
            format!("this ggml has {ops} ops (the size of its GGML_OP_NAME table)"),
        ),
        (
            llama_bin(),
            Some(&stripped),
            "auto",
            format!("this ggml has {ops} ops (ggml {version})"),
        ),
    ] {
        let mut cmd = llama_simple_in(&bin, 4);
        if let Some(path) = library_path {
            cmd.env("LD_LIBRARY_PATH", path);
        }
        let out = run(with_hook(
            cmd,
            &[
                ("GGML_VIZ_OUTPUT", dir.join("t.ggmlviz").to_str().unwrap()),
                ("GGML_VIZ_OP_TIMING", mode),
                ("GGML_VIZ_VERBOSE", "1"),
            ],
        ));
        let lines = hook_lines(&out.stderr);
        assert!(out.status.success(), "{lines:?}");
        let counts: Vec<&String> = lines.iter().filter(|l| l.contains(" ops (")).collect();
        assert_eq!(counts.len(), 1, "{}: {lines:#?}", bin.display());
        assert!(counts[0].ends_with(&said), "{}: {counts:?}", bin.display());
        let at = |text: &str| lines.iter().position(|l| l.contains(text));
        assert!(
            at(" ops (") < at("tracing to "),
            "{} {mode}: {lines:#?}",
            bin.display()
        );
    }
}

/// The dynamic loader's search scope of `cmd`'s executable, as the loader itself prints it
/// (`LD_DEBUG=scopes`): the file names, in search order.
fn search_scope(mut cmd: Command) -> Vec<String> {
    cmd.env("LD_DEBUG", "scopes");
    let out = run(cmd);
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .skip_while(|l| !l.contains("object=") || !l.contains("[0]"))
        .find(|l| l.contains("scope 0:"))
        .unwrap_or_else(|| panic!("no main scope in the loader's output:\n{stderr}"));
    let names = line.split("scope 0:").nth(1).unwrap();
    names
        .split_whitespace()
        .map(|p| p.rsplit('/').next().unwrap().to_string())
        .collect()
}

/// Preloading the hook adds the hook to the search scope every symbol lookup walks, right after
/// the executable, and moves nothing else: before, the hook's dependency on the dynamic loader
/// (for `__tls_get_addr`) put the loader ahead of libllama, ggml and libm, one more object
/// visited by every lookup of theirs (0.3 M instructions on the tiny model).
#[test]
fn preloading_the_hook_adds_it_to_the_search_scope_and_moves_nothing_else() {
    let plain = search_scope(llama_simple(1));
    let hooked = search_scope(with_hook(llama_simple(1), &[("GGML_VIZ_DISABLE", "1")]));
    assert!(plain.len() > 5, "{plain:?}");
    assert!(plain.iter().any(|n| n.starts_with("ld-linux")), "{plain:?}");
    let mut expected = plain.clone();
    expected.insert(1, "libggml_viz_hook.so".into());
    assert_eq!(hooked, expected);
}

/// A FIFO (or anything but a regular file) at the output path: the hook refuses it with one line
/// and the program runs on untraced, its output unchanged (opening a FIFO for writing once
/// blocked the host's first ggml call forever, as a planted one in a shared directory would).
#[test]
fn a_fifo_as_the_output_is_refused_and_the_program_runs() {
    let dir = scratch("fifo-output");
    let fifo = dir.join("planted.ggmlviz");
    mkfifo(&fifo);
    let plain = run(llama_simple(4));
    for output in [fifo.clone(), dir.clone()] {
        let cmd = with_hook(
            llama_simple(4),
            &[("GGML_VIZ_OUTPUT", output.to_str().unwrap())],
        );
        let what = format!("llama-simple with {} as its output", output.display());
        let out = run_within(cmd, std::time::Duration::from_secs(60), &what);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout));
        let lines = hook_lines(&out.stderr);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("not a regular file"), "{lines:?}");
    }
}

/// `GGML_VIZ_CONFIG` naming a FIFO: a process without ggml (`true`, every child of a shell that
/// exported `LD_PRELOAD`) reads no configuration and runs as without the hook; a GGML program
/// refuses it with one line and runs on untraced. (Its read once blocked `true` in its
/// constructors forever.)
#[test]
fn a_fifo_as_the_config_file_blocks_nothing() {
    let dir = scratch("fifo-config");
    let fifo = dir.join("config.json");
    mkfifo(&fifo);
    let plain = run(llama_simple(3));
    let settings = [("GGML_VIZ_CONFIG", fifo.to_str().unwrap())];
    for (cmd, ggml) in [(Command::new("true"), false), (llama_simple(3), true)] {
        let what = format!("a FIFO as the configuration file (ggml: {ggml})");
        let out = run_within(
            with_hook(cmd, &settings),
            std::time::Duration::from_secs(60),
            &what,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = hook_lines(&out.stderr);
        if ggml {
            assert_eq!(text(&out.stdout), text(&plain.stdout));
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].contains("not a regular file"), "{lines:?}");
        } else {
            assert_eq!(lines, Vec::<String>::new());
        }
    }
}

/// A file already at the trace's path: one of ours (mode 0644) becomes the trace, readable by us
/// alone; another user's is refused with one line and the program runs on untraced. (The trace
/// once kept the mode and owner of whatever file was there.)
#[test]
fn a_trace_over_a_file_that_was_there_is_ours_alone() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = scratch("precreated");
    let ours = dir.join("ours.ggmlviz");
    std::fs::write(&ours, b"old").unwrap();
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o644)).unwrap();
    trace_llama_simple(&ours, 2, &[]);
    let meta = std::fs::metadata(&ours).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    let (_, damage, stats) = read_trace(&ours);
    assert_eq!(damage, None);
    assert!(stats.graph_computes >= 2);

    let theirs = dir.join("theirs.ggmlviz");
    std::fs::write(&theirs, b"not ours").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
    let chown = run({
        let mut c = Command::new("chown");
        c.arg("65534").arg(&theirs);
        c
    });
    assert!(chown.status.success(), "{}", text(&chown.stderr));
    let plain = run(llama_simple(2));
    let out = run(with_hook(
        llama_simple(2),
        &[("GGML_VIZ_OUTPUT", theirs.to_str().unwrap())],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    let lines = hook_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("owned by another user"), "{lines:?}");
    assert_eq!(std::fs::read(&theirs).unwrap(), b"not ours");
}

/// A llama.cpp user gives `summary` the program's own log (its stderr) instead of a trace: the
/// error says what the file looked like (its first line) and what to do (record the program);
/// other unrecognised files are described by their first line or first bytes.
#[test]
fn a_llama_log_given_as_a_trace_is_named_as_such() {
    let dir = scratch("llama-log");
    let out = run(llama_simple(4));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = dir.join("llama.log");
    std::fs::write(&log, &out.stderr).unwrap();
    let first_line = text(&out.stderr).lines().next().unwrap().trim().to_string();
    let said = cli(|c| c.arg("summary").arg(&log));
    assert_eq!(said.status.code(), Some(2));
    let err = text(&said.stderr);
    assert!(err.contains("llama.cpp's log output"), "{err}");
    assert!(
        err.contains(&first_line.chars().take(60).collect::<String>()),
        "{err}"
    );
    assert!(err.contains("ggml-viz record -- PROGRAM"), "{err}");

    let elf = cli(|c| c.arg("summary").arg(llama_bin().join("llama-simple")));
    assert!(
        text(&elf.stderr).contains("binary data beginning 7f 45 4c 46"),
        "{}",
        text(&elf.stderr)
    );
}
