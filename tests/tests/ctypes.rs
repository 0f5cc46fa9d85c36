//! ggml loaded `RTLD_LOCAL` through Python ctypes (as Python bindings load it): traced all the
//! same, with fork, kill -9, many threads on tiny rings, two copies of ggml in one process (one of
//! them global, or neither), and a host environment that is not UTF-8.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ggml_viz_e2e::*;
use ggml_viz_reader::Event;
use ggml_viz_reader::format::EventType;

#[test]
fn an_rtld_local_ggml_is_traced_with_exact_nodes_and_threads() {
    let trace = scratch("rtld-local").join("t.ggmlviz");
    let args = ["--nodes", "5", "--repeat", "3", "--threads", "2"];
    let (_, _, events) = traced_like_plain(&[&llama_bin()], &args, &trace, |_| {}, |_| {});
    check_nesting(&events);
}

/// The fixture on the ggml copies in `libdirs`, run plain and then traced into `trace` (each
/// command adjusted first): both succeed and print the same, and the trace is whole, its graph
/// computes those the program printed (Python's own call binds inside the library; the inner
/// `ggml_graph_compute` goes through the PLT). The plain run, the traced run, the trace's events.
fn traced_like_plain(
    libdirs: &[&Path],
    args: &[&str],
    trace: &Path,
    adjust_plain: impl FnOnce(&mut Command),
    adjust_traced: impl FnOnce(&mut Command),
) -> (Output, Output, Vec<Event<'static>>) {
    let mut plain = fixture_cmd(libdirs, args);
    adjust_plain(&mut plain);
    let plain = run(plain);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let mut traced = with_hook(
        fixture_cmd(libdirs, args),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    );
    adjust_traced(&mut traced);
    let traced = run(traced);
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "results changed under the hook"
    );
    let (events, damage, _) = read_trace(trace);
    assert_eq!(damage, None);
    assert_eq!(
        graphs_of(&events, "ggml_graph_compute"),
        fixture_graphs(&text(&plain.stdout))
    );
    (plain, traced, events)
}

/// Says where calls go (`GGML_VIZ_VERBOSE`).
fn verbose(cmd: &mut Command) {
    cmd.env("GGML_VIZ_VERBOSE", "1");
}

#[test]
fn after_fork_the_child_writes_its_own_file_and_the_parents_is_untouched() {
    let dir = scratch("fork");
    let bin = llama_bin();
    let out = run(with_hook(
        fixture_cmd(&[&bin], &["--nodes", "3", "--repeat", "2", "--fork"]),
        &[(
            "GGML_VIZ_OUTPUT",
            dir.join("t-%p.ggmlviz").to_str().unwrap(),
        )],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("child exit=0"), "{stdout}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    let mut computes: Vec<(u32, u64)> = files
        .iter()
        .map(|f| {
            let (events, damage, stats) = read_trace(f);
            assert_eq!(damage, None, "{}", f.display());
            check_nesting(&events);
            (stats.metadata.unwrap().pid, stats.graph_computes)
        })
        .collect();
    computes.sort_by_key(|c| c.1);
    // Parent: 2 before the fork + 2 after. Child: 3 of its own and none of the parent's.
    assert_eq!(computes.iter().map(|c| c.1).collect::<Vec<_>>(), [3, 4]);
    assert_ne!(computes[0].0, computes[1].0);
}

#[test]
fn kill_9_at_random_moments_always_leaves_a_readable_file() {
    let bin = llama_bin();
    let mut checked = 0;
    for (round, delay_ms) in [0u64, 7, 23, 61, 140].into_iter().enumerate() {
        let dir = scratch(&format!("kill9-{round}"));
        let trace = dir.join("t.ggmlviz");
        let mut child = spawn_forever(&bin, &trace, "5");
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        // Killed after its first graph: the hook had started, so every round has a trace.
        let (_, damage, stats) = read_trace(&trace);
        assert!(
            damage.as_ref().is_none_or(|d| d.is_truncation()),
            "kill after {delay_ms} ms: {damage:?}"
        );
        assert!(stats.metadata.is_some(), "kill after {delay_ms} ms");
        assert!(stats.unmatched_graph_ends == 0, "kill after {delay_ms} ms");
        checked += 1;
    }
    assert_eq!(checked, 5, "every round read a trace");
}

#[test]
fn a_fork_storm_gives_every_child_its_own_complete_file() {
    let dir = scratch("fork-storm");
    let bin = llama_bin();
    let (children, repeat) = (12, 5);
    let out = run(with_hook(
        fixture_cmd(
            &[&bin],
            &[
                "--nodes",
                "2",
                "--repeat",
                &repeat.to_string(),
                "--fork-storm",
                &children.to_string(),
            ],
        ),
        &[(
            "GGML_VIZ_OUTPUT",
            dir.join("t-%p.ggmlviz").to_str().unwrap(),
        )],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("children exit={:?}", vec![0; children])),
        "{}",
        text(&out.stdout)
    );
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // The parent computed `repeat` graphs before forking; each child its own `repeat`.
    assert_eq!(files.len(), children + 1, "{files:?}");
    let mut pids = std::collections::BTreeSet::new();
    let mut graphs: Vec<u64> = Vec::new();
    for f in &files {
        let (events, damage, stats) = read_trace(f);
        assert_eq!(damage, None, "{}", f.display());
        check_nesting(&events);
        assert!(pids.insert(stats.metadata.unwrap().pid));
        graphs.push(stats.graph_computes);
    }
    assert!(graphs.iter().all(|&g| g == repeat as u64), "{graphs:?}");
}

#[test]
fn kill_9_leaves_a_file_that_reads_cleanly_up_to_a_truncated_tail() {
    let dir = scratch("kill9");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let mut child = spawn_forever(&bin, &trace, "20");
    let start = Instant::now();
    // Wait until a few flushes have written graph events, then kill without warning.
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let len = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
        if len > 20_000 || start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (events, damage, stats) = read_trace(&trace);
    assert!(
        damage.as_ref().is_none_or(|d| d.is_truncation()),
        "{damage:?}"
    );
    assert!(
        stats.count(EventType::GraphComputeBegin) > 50,
        "{} graph begins",
        stats.count(EventType::GraphComputeBegin)
    );
    assert!(stats.metadata.is_some());
    // Only the last graph may be left open by the kill.
    assert!(stats.unmatched_graph_begins <= 1 && stats.unmatched_graph_ends == 0);
    assert!(events.len() > 100);
}

/// The fixture with `nodes` nodes per graph computing `repeat` graphs on each of `threads`
/// threads at once.
fn parallel_fixture(bin: &Path, nodes: u32, repeat: usize, threads: usize) -> Command {
    fixture_cmd(
        &[bin],
        &[
            "--nodes",
            &nodes.to_string(),
            "--repeat",
            &repeat.to_string(),
            "--parallel",
            &threads.to_string(),
        ],
    )
}

#[test]
fn sixty_four_threads_on_tiny_rings_count_every_drop_exactly() {
    let dir = scratch("threads");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let (threads, repeat) = (64, 20);
    let out = run(with_hook(
        parallel_fixture(&bin, 2, repeat, threads),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_BUFFER_SIZE", "4"),
            ("GGML_VIZ_FLUSH_INTERVAL", "50"),
            // Graph events only, so that what was produced is known exactly.
            ("GGML_VIZ_OP_TIMING", "off"),
        ],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fixture_graphs(&text(&out.stdout)).len(), threads * repeat);
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    // Python calls ggml_graph_compute_with_ctx inside the library (untraced); its inner
    // ggml_graph_compute, through the PLT, records one pair.
    let produced = (threads * repeat * 2) as u64;
    let recorded =
        stats.count(EventType::GraphComputeBegin) + stats.count(EventType::GraphComputeEnd);
    let counters = stats.counters.expect("counters record");
    assert_eq!(recorded + counters.lost(), produced);
    assert!(
        counters.dropped_ring_full > 0,
        "a 4-event ring under 32 threads should drop"
    );
    assert!(
        text(&out.stderr).contains("event(s) were not recorded"),
        "{}",
        text(&out.stderr)
    );
}

/// A graph compute is in the trace whole or not at all: with rings far too small for a graph's
/// op shares and barrier waits, op events are dropped (and counted), but every graph compute's
/// begin has its end and every op share both edges, on their thread.
#[test]
fn tiny_rings_drop_op_events_but_keep_graph_computes_whole() {
    let trace = scratch("whole-graphs").join("t.ggmlviz");
    let graphs = 20;
    let out = run(with_hook(
        fixture_cmd(
            &[&llama_bin()],
            &[
                "--nodes",
                "200",
                "--repeat",
                &graphs.to_string(),
                "--threads",
                "2",
            ],
        ),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_BUFFER_SIZE", "64"),
            ("GGML_VIZ_OP_TIMING", "threads"),
        ],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fixture_graphs(&text(&out.stdout)).len(), graphs);
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    let counters = stats.counters.expect("counters record");
    // Each graph makes 200 nodes' shares and waits on each of two threads: a 64-event ring
    // overflows within one.
    assert!(
        counters.dropped_ring_full > 0,
        "nothing was dropped: {counters:?}"
    );
    check_nesting(&events);
    let begins = stats.count(EventType::GraphComputeBegin);
    assert!(
        (1..=graphs as u64).contains(&begins),
        "{begins} graph computes of {graphs}"
    );
    assert_eq!(
        stats.count(EventType::OpComputeBegin),
        stats.count(EventType::OpComputeEnd)
    );
}

/// The event cap refuses whole graph computes: a compute's begin goes in only with room under
/// the cap for its end, so 7 events hold 3 computes (6 events), and the other 7 computes' 14
/// events are counted as over the cap.
#[test]
fn the_event_cap_counts_what_it_refuses() {
    let dir = scratch("cap");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let (graphs, cap) = (10, 7);
    let out = run(with_hook(
        fixture_cmd(&[&bin], &["--nodes", "2", "--repeat", &graphs.to_string()]),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_MAX_EVENTS", &cap.to_string()),
            ("GGML_VIZ_OP_TIMING", "off"),
        ],
    ));
    assert!(out.status.success());
    let (events, _, stats) = read_trace(&trace);
    check_nesting(&events);
    let recorded =
        stats.count(EventType::GraphComputeBegin) + stats.count(EventType::GraphComputeEnd);
    let whole = cap / 2 * 2;
    assert_eq!(recorded, whole);
    assert_eq!(stats.counters.unwrap().over_max_events, 2 * graphs - whole);
}

/// Copies this build's ggml libraries into `dir` under names of their own (as wheel repair tools
/// do), so that two copies can be loaded side by side.
fn private_copy(dir: &Path, tag: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let bin = llama_bin();
    let base = format!("libggml-base-{tag}.so");
    let cpu = format!("libggml-cpu-{tag}.so");
    std::fs::copy(bin.join("libggml-base.so"), dir.join(&base)).unwrap();
    std::fs::copy(bin.join("libggml-cpu.so"), dir.join(&cpu)).unwrap();
    let patch = |args: &[&str]| {
        let out = Command::new("patchelf")
            .args(args)
            .output()
            .expect("patchelf is installed by scripts/test.sh");
        assert!(
            out.status.success(),
            "patchelf {args:?}: {}",
            text(&out.stderr)
        );
    };
    let base_path = dir.join(&base);
    let cpu_path = dir.join(&cpu);
    patch(&["--set-soname", &base, base_path.to_str().unwrap()]);
    patch(&[
        "--replace-needed",
        "libggml-base.so.0",
        &base,
        "--set-rpath",
        "$ORIGIN",
        cpu_path.to_str().unwrap(),
    ]);
}

#[test]
fn two_copies_of_ggml_each_get_their_own_calls() {
    let dir = scratch("two-copies");
    let (a, b) = (dir.join("a"), dir.join("b"));
    private_copy(&a, "a");
    private_copy(&b, "b");
    let trace = dir.join("t.ggmlviz");
    let args = ["--nodes", "3", "--repeat", "2"];
    // Copy a computes 3-node graphs, copy b 5-node graphs.
    let (plain, traced, _) = traced_like_plain(&[&a, &b], &args, &trace, |_| {}, verbose);
    assert_eq!(
        fixture_graphs(&text(&plain.stdout))
            .iter()
            .map(|g| g.0)
            .collect::<Vec<_>>(),
        [3, 3, 5, 5]
    );
    let stderr = text(&traced.stderr);
    for tag in ["a", "b"] {
        let own = format!("libggml-cpu-{tag}.so");
        let line = format!(
            "ggml_graph_compute called from {} goes to {}",
            dir.join(tag).join(&own).display(),
            dir.join(tag).join(&own).display()
        );
        assert!(stderr.contains(&line), "expected `{line}` in:\n{stderr}");
    }
}

/// What the hook says of a run of the fixture on the registry's ggml with one more environment
/// variable, `key=value` (the run traced as the plain one: [`traced_like_plain`]).
fn hook_says_with(name: &str, key: &[u8], value: &[u8]) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    let trace = scratch(name).join("t.ggmlviz");
    let args = ["--nodes", "3", "--repeat", "2"];
    let (_, traced, _) = traced_like_plain(
        &[&llama_bin()],
        &args,
        &trace,
        |_| {},
        |cmd| {
            cmd.env(
                std::ffi::OsStr::from_bytes(key),
                std::ffi::OsStr::from_bytes(value),
            );
        },
    );
    hook_lines(&traced.stderr)
}

/// An environment variable of the host's that is not UTF-8 (a file name in Latin-1, say) is none
/// of the hook's business: the run is traced as any other, and the hook says nothing.
#[test]
fn a_host_environment_that_is_not_utf8_is_traced_all_the_same() {
    assert_eq!(
        hook_says_with("env-not-utf8", b"SOME_PATH", b"/srv/caf\xe9"),
        Vec::<String>::new()
    );
}

/// A setting's variable mistyped is ignored, and the hook says so once, naming the setting.
#[test]
fn a_mistyped_setting_is_named_once() {
    assert_eq!(
        hook_says_with("mistyped", b"GGML_VIZ_FLUSH_INTERVAL_MS", b"5"),
        [
            "ggml-viz: GGML_VIZ_FLUSH_INTERVAL_MS is not a setting and is ignored (did you mean \
             GGML_VIZ_FLUSH_INTERVAL?)"
        ]
    );
}

/// A copy of ggml loaded `RTLD_GLOBAL` and a second one `RTLD_LOCAL`: the dynamic loader looks in
/// the global scope first for every object, so without the hook the second copy's own call of
/// `ggml_graph_compute` binds to the first copy's (what `LD_DEBUG=bindings` says of the plain
/// run). With the hook in between, the call must still go there, and the program print the same.
#[test]
fn a_call_goes_where_the_loader_binds_it_without_the_hook() {
    let dir = scratch("global-and-local");
    let (a, b) = (dir.join("a"), dir.join("b"));
    private_copy(&a, "a");
    private_copy(&b, "b");
    let trace = dir.join("t.ggmlviz");
    let args = ["--nodes", "3", "--repeat", "2", "--global-first"];
    let (plain, traced, _) = traced_like_plain(
        &[&a, &b],
        &args,
        &trace,
        |cmd| {
            cmd.env("LD_DEBUG", "bindings");
        },
        verbose,
    );
    let (cpu_a, cpu_b) = (a.join("libggml-cpu-a.so"), b.join("libggml-cpu-b.so"));
    let bound = |from: &Path, to: &Path| {
        text(&plain.stderr).lines().any(|l| {
            l.contains(&format!("binding file {} ", from.display()))
                && l.contains(&format!(" to {} ", to.display()))
                && l.ends_with("symbol `ggml_graph_compute'")
        })
    };
    assert!(
        bound(&cpu_b, &cpu_a) && !bound(&cpu_b, &cpu_b),
        "the loader bound copy b's ggml_graph_compute elsewhere than to copy a's:\n{}",
        text(&plain.stderr)
            .lines()
            .filter(|l| l.contains("ggml_graph_compute"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let line = format!(
        "ggml_graph_compute called from {} goes to {}",
        cpu_b.display(),
        cpu_a.display()
    );
    assert!(
        text(&traced.stderr).contains(&line),
        "expected `{line}` in:\n{}",
        text(&traced.stderr)
    );
}

#[test]
fn without_pid_in_the_path_a_forked_child_leaves_the_parents_file_alone() {
    let dir = scratch("fork-no-pid");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let out = run(with_hook(
        fixture_cmd(&[&bin], &["--nodes", "3", "--repeat", "2", "--fork"]),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("is being written by another live process"))
        .collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    check_nesting(&events);
    assert_eq!(
        stats.graph_computes, 4,
        "the parent's file holds the parent's graphs only"
    );
    let child_file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p != &trace)
        .expect("the child writes PATH.PID");
    let (_, _, child) = read_trace(&child_file);
    assert_eq!(child.graph_computes, 3);
    assert!(
        child_file
            .to_str()
            .unwrap()
            .ends_with(&format!(".{}", child.metadata.unwrap().pid))
    );
}

#[test]
fn a_trace_being_written_is_read_not_mapped_and_a_removed_directory_harms_nobody() {
    let dir = scratch("live");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let child = with_hook(
        fixture_cmd(&[&bin], &["--nodes", "2", "--repeat", "20000"]),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_FLUSH_INTERVAL", "10"),
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let start = Instant::now();
    while std::fs::metadata(&trace).map_or(0, |m| m.len()) < 5000
        && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The writer holds its lock: `info` streams the growing file and sees a consistent prefix.
    let info = cli(|c| c.arg("info").arg(&trace));
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(text(&info.stdout).contains("graph computes:"));
    let file_line = text(&info.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        !file_line.ends_with("bytes)"),
        "a live trace must be streamed, not mapped: {file_line}"
    );
    // Remove the output directory under the running program: it carries on.
    std::fs::remove_dir_all(&dir).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fixture_graphs(&text(&out.stdout)).len(), 20000);
}

/// A ring larger than the configuration allows (2^30 and 2^32 events would be 48 and 192 GiB per
/// thread) is refused with one line; the program computes the same results, untraced.
#[test]
fn a_huge_buffer_size_is_refused_and_the_program_runs_untraced() {
    let dir = scratch("huge-ring");
    let bin = llama_bin();
    let args = ["--nodes", "3", "--repeat", "2"];
    let plain = run(fixture_cmd(&[&bin], &args));
    for size in ["1073741824", "4294967296"] {
        let trace = dir.join(format!("{size}.ggmlviz"));
        let traced = run(with_hook(
            fixture_cmd(&[&bin], &args),
            &[
                ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
                ("GGML_VIZ_BUFFER_SIZE", size),
            ],
        ));
        assert!(traced.status.success(), "{size}: {:?}", traced.status);
        assert_eq!(text(&traced.stdout), text(&plain.stdout), "{size}");
        let lines = hook_lines(&traced.stderr);
        assert_eq!(lines.len(), 1, "{size}: {lines:?}");
        assert!(
            lines[0].contains("GGML_VIZ_BUFFER_SIZE") && lines[0].contains("runs untraced"),
            "{lines:?}"
        );
        assert!(!trace.exists(), "{size}: no trace when untraced");
    }
}

/// A ring the configuration allows but the process cannot get (its address space is limited
/// below the ring's 768 MiB): one line, tracing stops, the program runs on with the same results.
#[test]
fn a_ring_that_cannot_be_allocated_stops_tracing_not_the_program() {
    let dir = scratch("ring-alloc-fails");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let args = ["--nodes", "3", "--repeat", "2"];
    let limited = |cmd: Command| {
        // `ulimit -v` in KiB: 600 MB is plenty for Python and ggml, not for the ring.
        let mut sh = Command::new("bash");
        sh.args(["-c", "ulimit -v 600000 && exec \"$@\"", "--"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        sh
    };
    let plain = run(limited(fixture_cmd(&[&bin], &args)));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let traced = run(with_hook(
        limited(fixture_cmd(&[&bin], &args)),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_BUFFER_SIZE", "16777216"),
        ],
    ));
    assert!(
        traced.status.success(),
        "{:?}: {}",
        traced.status,
        text(&traced.stderr)
    );
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    let lines = hook_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("cannot allocate a ring of 16777216 events"),
        "{lines:?}"
    );
}

/// A program that forks a child which only sleeps, then exits: its trace is finished and must
/// not look locked (being written) while the child lives. The lock is checked with util-linux's
/// `flock`, not with our reader.
#[test]
fn a_sleeping_child_does_not_keep_its_parents_finished_trace_locked() {
    let dir = scratch("fork-sleeper");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let out = run(with_hook(
        fixture_cmd(
            &[&bin],
            &["--nodes", "2", "--repeat", "3", "--fork-sleeper", "30"],
        ),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let child: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sleeper "))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child pid: {stdout}"));
    let child_alive = || Path::new(&format!("/proc/{child}")).exists();
    assert!(
        child_alive(),
        "the child must still be sleeping for this to check anything"
    );
    let lock = run({
        let mut c = Command::new("flock");
        c.args(["--nonblock", "--shared"]).arg(&trace).arg("true");
        c
    });
    let still_alive = child_alive();
    kill(child);
    assert!(still_alive, "the child ended before the lock was checked");
    assert!(
        lock.status.success(),
        "the finished trace is still locked while the child lives: {}",
        text(&lock.stderr)
    );
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert_eq!(stats.graph_computes, 3);
}

/// Ends the sleeping child (with `kill`: the tests link no libc bindings).
fn kill(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

/// Sixteen threads make their first ggml call at the same moment, into the hook's start-up: the
/// calls that arrive while another thread starts the recorder wait for it instead of being lost
/// (before: hundreds of events lost "while tracing started", and threads missing).
#[test]
fn calls_that_arrive_during_start_up_are_recorded() {
    let dir = scratch("start-up");
    let trace = dir.join("t.ggmlviz");
    let bin = llama_bin();
    let (threads, repeat) = (16, 500);
    let out = run(with_hook(
        parallel_fixture(&bin, 1, repeat, threads),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_TIMING", "0"),
        ],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(hook_lines(&out.stderr), Vec::<String>::new());
    let computed = text(&out.stdout).lines().count();
    assert_eq!(computed, threads * repeat);
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert_eq!(stats.counters.unwrap().lost(), 0);
    assert_eq!(stats.threads.len(), threads);
    assert_eq!(stats.graph_computes, computed as u64);
}
