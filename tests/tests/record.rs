//! `ggml-viz record`: the README's main job.

use std::process::Command;

use ggml_viz_e2e::*;

fn record(args: &[&str], program: &[&str]) -> Command {
    let mut cmd = Command::new(ggml_viz());
    cmd.arg("record").args(args).arg("--").args(program);
    cmd
}

fn simple_args(n: &str) -> Vec<String> {
    let bin = llama_bin().join("llama-simple");
    vec![
        bin.to_str().unwrap().into(),
        "-m".into(),
        tiny_model().to_str().unwrap().into(),
        "-n".into(),
        n.into(),
        "hello".into(),
    ]
}

#[test]
fn record_runs_llama_simple_and_summarizes_its_trace() {
    let dir = scratch("record");
    let trace = dir.join("r.ggmlviz");
    let program = simple_args("9");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let plain = run({
        let mut c = Command::new(program[0]);
        c.args(&program[1..]);
        c
    });
    let out = run(record(&["-o", trace.to_str().unwrap()], &program));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "ggml-viz: {} graph computes, graph time mean",
            stats.graph_computes
        )),
        "{stderr}"
    );
    assert!(stats.graph_computes >= 9);
    assert!(stderr.contains("0 lost"), "{stderr}");
}

#[test]
fn flags_outrank_the_config_file_which_outranks_the_environment() {
    let dir = scratch("precedence");
    let config = dir.join("c.json");
    std::fs::write(&config, r#"{"instrumentation": {"max_graphs": 2}}"#).unwrap();
    let program = simple_args("8");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let graphs = |extra: &[&str], name: &str| {
        let trace = dir.join(name);
        let mut args = vec!["-o", trace.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut cmd = record(&args, &program);
        cmd.env("GGML_VIZ_MAX_GRAPHS", "1");
        let out = run(cmd);
        assert!(out.status.success(), "{}", text(&out.stderr));
        read_trace(&trace).2.graph_computes
    };
    assert_eq!(graphs(&[], "env.ggmlviz"), 1);
    assert_eq!(
        graphs(&["--config", config.to_str().unwrap()], "file.ggmlviz"),
        2
    );
    assert_eq!(
        graphs(
            &["--config", config.to_str().unwrap(), "--max-graphs", "3"],
            "flag.ggmlviz"
        ),
        3
    );
}

#[test]
fn record_returns_the_programs_status_and_says_when_there_is_no_trace() {
    let dir = scratch("record-status");
    let trace = dir.join("none.ggmlviz");
    let out = run(record(
        &["-o", trace.to_str().unwrap()],
        &["sh", "-c", "exit 7"],
    ));
    assert_eq!(out.status.code(), Some(7));
    assert!(
        text(&out.stderr).contains("no trace at"),
        "{}",
        text(&out.stderr)
    );
    assert!(!trace.exists());
}

#[test]
fn a_bad_flag_fails_before_the_program_runs() {
    let dir = scratch("record-bad");
    let marker = dir.join("ran");
    let out = run(record(
        &["--buffer-size", "1000"],
        &["touch", marker.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("buffer_size"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !marker.exists(),
        "the program must not run with a bad configuration"
    );
}

/// An output the hook cannot write (no such directory, a directory, a FIFO) is refused before the
/// program runs, with one line and exit status 2 (the program once ran untraced, with two
/// contradicting lines, and `record` exited 0).
#[test]
fn an_unwritable_output_fails_before_the_program_runs() {
    let dir = scratch("record-output");
    let fifo = dir.join("fifo.ggmlviz");
    mkfifo(&fifo);
    let missing = dir.join("nodir").join("x.ggmlviz");
    for (output, why) in [
        (missing.as_path(), "does not exist"),
        (dir.as_path(), "not a regular file"),
        (fifo.as_path(), "not a regular file"),
    ] {
        let marker = dir.join("ran");
        let out = run(record(
            &["-o", output.to_str().unwrap()],
            &["touch", marker.to_str().unwrap()],
        ));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(why) && stderr.contains("not run"),
            "{stderr}"
        );
        assert!(!marker.exists(), "{}: the program ran", output.display());
    }
}

/// More threads than the process has CPUs: `record`'s summary, `info`, `ops`, the report and
/// `live` say so, with both counts (the threads llama-bench was told to use, the CPUs this
/// test's own process may run on); at as many threads as CPUs none of them does.
#[test]
fn more_threads_than_cpus_is_said_with_both_counts() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let dir = scratch("oversubscribed");
    let bench = llama_bin().join("llama-bench");
    let model = tiny_model();
    for threads in [cpus + 2, cpus] {
        let trace = dir.join(format!("t{threads}.ggmlviz"));
        let t = threads.to_string();
        let program = [
            bench.to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "-t",
            &t,
            "-p",
            "0",
            "-n",
            "2",
            "-r",
            "1",
        ];
        let out = run(record(&["-o", trace.to_str().unwrap()], &program));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let info = cli(|c| c.arg("info").arg(&trace));
        let ops = cli(|c| c.arg("ops").arg(&trace));
        let html = dir.join(format!("t{threads}.html"));
        let report = cli(|c| c.arg("report").arg(&trace).arg("-o").arg(&html));
        assert!(report.status.success(), "{}", text(&report.stderr));
        let live = cli(|c| c.args(["live", "--plain"]).arg(&trace));
        assert!(live.status.success(), "{}", text(&live.stderr));
        let said = format!("ran {threads} threads on {cpus} CPUs");
        for (what, output) in [
            ("record", text(&out.stderr)),
            ("info", text(&info.stdout)),
            ("ops", text(&ops.stdout)),
            ("report", std::fs::read_to_string(&html).unwrap()),
            ("live", text(&live.stderr)),
        ] {
            assert_eq!(
                output.contains(&said),
                threads > cpus,
                "{what} at {threads} threads on {cpus} CPUs:\n{output}"
            );
        }
    }
}

/// `record` says when it overwrites a trace (it once did so silently), and not otherwise.
#[test]
fn record_says_it_overwrites_a_trace() {
    let dir = scratch("record-overwrite");
    let trace = dir.join("again.ggmlviz");
    let program = simple_args("2");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let said = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stderr).contains("exists and will be overwritten")
    };
    let first = run(record(&["-o", trace.to_str().unwrap()], &program));
    assert!(!said(&first));
    let second = run(record(&["-o", trace.to_str().unwrap()], &program));
    assert!(said(&second));
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert!(stats.graph_computes >= 2);
}

/// `record` has flags for its main settings, which reach the hook (they once had none:
/// `GGML_VIZ_*` variables only), and says to put `--` before a program given without it.
#[test]
fn record_flags_set_op_timing_sampling_and_memory() {
    let dir = scratch("record-flags");
    let program = simple_args("4");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let traced = |flags: &[&str], name: &str| {
        let trace = dir.join(name);
        let mut args = vec!["-o", trace.to_str().unwrap()];
        args.extend_from_slice(flags);
        let out = run(record(&args, &program));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let (events, damage, stats) = read_trace(&trace);
        assert_eq!(damage, None);
        (events, stats)
    };
    let (_, stats) = traced(&["--op-timing", "off"], "off.ggmlviz");
    assert_eq!(stats.ops, 0);
    let setting = |stats: &ggml_viz_reader::TraceStats, key: &str| {
        stats.metadata.as_ref().unwrap().settings[key].clone()
    };
    assert_eq!(setting(&stats, "op_timing_mode"), "off");
    let (events, stats) = traced(&["--op-sample", "2", "--memory"], "mem.ggmlviz");
    assert_eq!(setting(&stats, "op_sample"), 2);
    assert_eq!(setting(&stats, "memory_tracking"), true);
    assert!(stats.ops > 0);
    assert!(
        events
            .iter()
            .any(|e| e.event_type() == Some(ggml_viz_reader::EventType::TensorAlloc))
    );

    let out = run({
        let mut c = Command::new(ggml_viz());
        c.args(["record", "ls"]);
        c
    });
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("put `--` before the program"),
        "{}",
        text(&out.stderr)
    );
}

/// The metadata's settings of `trace`.
fn trace_settings(trace: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    let (events, _, _) = read_trace(trace);
    let metadata =
        (events.iter())
            .find_map(|e| match e.payload {
                ggml_viz_reader::format::Payload::Extension(x)
                    if x.kind == ggml_viz_reader::format::ExtensionKind::Metadata =>
                {
                    ggml_viz_reader::format::ext::parse_payload::<
                        ggml_viz_reader::format::ext::Metadata,
                    >(e.label.as_deref().unwrap_or_default())
                }
                _ => None,
            })
            .expect("a metadata record");
    metadata.settings
}

/// `record` measures the host's memory bandwidth before the program starts and keeps it in the
/// trace; `ops` gives the op types that move the most bytes a second as shares of it (the shares
/// by arithmetic on `ops --csv`'s GB/s); given a bandwidth (here 1 MB/s, far below what any op
/// moves), record measures nothing and ops says the bytes came from a cache rather than print a
/// share over 100 %.
#[test]
fn record_keeps_the_hosts_memory_bandwidth_and_ops_gives_shares_of_it() {
    let dir = scratch("bandwidth");
    let program = simple_args("8");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let trace = dir.join("t.ggmlviz");
    let out = run(record(&["-o", trace.to_str().unwrap()], &program));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mb_s = trace_settings(&trace)["memory_bandwidth_mb_s"]
        .as_u64()
        .unwrap();
    assert!(mb_s > 100, "{mb_s} MB/s");
    let ops = text(&cli(|c| c.arg("ops").arg(&trace)).stdout);
    let line = (ops.lines())
        .find(|l| l.starts_with("of this host's memory bandwidth"))
        .unwrap_or_else(|| panic!("{ops}"));
    assert!(
        line.contains(&format!("({:.1} GB/s,", mb_s as f64 / 1000.0)),
        "{line}"
    );
    // The prefill's table comes first: its op type moving the most bytes a second leads the line.
    let csv = text(&cli(|c| c.args(["ops", "--csv"]).arg(&trace)).stdout);
    let mut prefill: Vec<(String, f64)> = Vec::new();
    for row in csv.lines().skip(1) {
        let f: Vec<&str> = row.split(',').collect();
        if let ("prefill", Ok(gb_s)) = (f[0], f[9].parse::<f64>()) {
            prefill.push((f[1].to_string(), gb_s));
        }
    }
    let (op, gb_s) = prefill.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let expected = 100.0 * gb_s * 1000.0 / mb_s as f64;
    let shown: f64 = (line.split(": ").nth(1))
        .and_then(|rest| rest.strip_prefix(&format!("{op} ")))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}: {op} first"));
    assert!((shown - expected).abs() <= 1.0, "{line}: {expected}");

    let given = dir.join("given.ggmlviz");
    let mut cmd = record(&["-o", given.to_str().unwrap()], &program);
    cmd.env("GGML_VIZ_MEMORY_BANDWIDTH", "1");
    let out = run(cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(trace_settings(&given)["memory_bandwidth_mb_s"], 1);
    let ops = text(&cli(|c| c.arg("ops").arg(&given)).stdout);
    assert!(
        ops.contains("faster than memory: its bytes came from a cache"),
        "{ops}"
    );
}
