//! `ggml-viz live` and `record --live`: following traces the hook is writing, in plain-line mode
//! and in a real terminal (tmux), ending when the writer is killed or the program exits.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ggml_viz_e2e::*;

/// The events count of each plain line (`| events N (…)`).
fn events_of(line: &str) -> Option<u64> {
    line.split("| events ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The totals of the line the view ends with: (events, graph computes).
fn ended_totals(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ggml-viz: live view ended:"))
        .unwrap_or_else(|| panic!("no end line in:\n{stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let before = |w: &str| {
        let i = words
            .iter()
            .position(|x| x.trim_end_matches(',') == w)
            .unwrap();
        words[i - 1].parse::<u64>().unwrap()
    };
    (before("events"), before("graph"))
}

/// `ggml-viz live --plain` on `trace`, refreshing every `interval` seconds, its output piped.
fn plain_view(trace: &std::path::Path, interval: &str) -> std::process::Child {
    Command::new(ggml_viz())
        .args(["live", "--plain", "--interval", interval])
        .arg(trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What an ended view said on stderr.
fn stderr_of(view: &mut std::process::Child) -> String {
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut view.stderr.take().unwrap(), &mut stderr).unwrap();
    stderr
}

#[test]
fn plain_lines_follow_a_growing_trace_and_end_when_the_writer_is_killed() {
    let dir = scratch("live-plain");
    let trace = dir.join("t.ggmlviz");
    let mut view = plain_view(&trace, "0.3");
    // The view starts first and waits for the file.
    std::thread::sleep(Duration::from_millis(300));
    let mut writer = spawn_forever(&llama_bin(), &trace, "20");
    let mut lines = BufReader::new(view.stdout.take().unwrap()).lines();
    let mut counts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while counts.len() < 4 && Instant::now() < deadline {
        let line = lines.next().expect("the view ended early").unwrap();
        if let Some(n) = events_of(&line) {
            counts.push(n);
        }
    }
    assert!(counts.len() >= 4, "{counts:?}");
    assert!(
        counts.windows(2).all(|w| w[0] < w[1]),
        "events did not grow line by line while the writer ran: {counts:?}"
    );
    // Killed mid-record: the view notices the writer is gone and ends by itself.
    writer.kill().unwrap();
    writer.wait().unwrap();
    let killed = Instant::now();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = view.wait().unwrap();
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "the view took {:?} to notice",
        killed.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{rest:?}");
    let stderr = stderr_of(&mut view);
    // Everything complete in the file was seen, once.
    let (_, damage, stats) = read_trace(&trace);
    assert!(
        damage.as_ref().is_none_or(|d| d.is_truncation()),
        "{damage:?}"
    );
    let (events, graphs) = ended_totals(&stderr);
    assert_eq!(events, stats.events(), "{stderr}");
    assert_eq!(graphs, stats.graph_computes, "{stderr}");
    if let Some(d) = damage {
        assert!(
            stderr.contains("stopped in the middle of a record"),
            "{d} not reported:\n{stderr}"
        );
    }
}

#[test]
fn in_a_terminal_the_screen_refreshes_and_q_quits() {
    refresh_then_quit_with("q", "quit");
}

#[test]
fn in_a_terminal_ctrl_c_quits_cleanly() {
    refresh_then_quit_with("C-c", "ctrl-c");
}

/// Runs the view in a tmux terminal on a growing trace, checks that the screen refreshes with
/// growing counts, quits with `key`, and checks the exit status and the terminal's settings.
fn refresh_then_quit_with(key: &str, name: &str) {
    let dir = scratch(&format!("live-tmux-{name}"));
    let trace = dir.join("t.ggmlviz");
    let mut writer = spawn_forever(&llama_bin(), &trace, "20");
    let socket = dir.join("tmux.sock");
    let socket = socket.to_str().unwrap();
    let done = dir.join("done");
    // stty -g before and after: the terminal's mode is given back. The shell ignores SIGINT so
    // that it outlives a Ctrl-C to write them down (the view sets its own handler).
    let script = format!(
        "trap '' INT; stty -g > {d}/before; {viz} live --interval 0.3 {t}; echo $? > {d}/status; stty -g > {d}/after; echo >> {done}; sleep 60",
        d = dir.display(),
        viz = ggml_viz().display(),
        t = trace.display(),
        done = done.display()
    );
    tmux_session(socket, 150, 30, &script);
    let screen = |_: ()| tmux(&["-S", socket, "capture-pane", "-p"]);
    let graphs_on = |s: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with("graph computes"))?;
        line.split_whitespace()
            .nth(2)?
            .replace(',', "")
            .parse()
            .ok()
    };
    let end = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < end && seen.len() < 3 {
        let s = screen(());
        if let Some(g) = graphs_on(&s)
            && seen.last() != Some(&g)
        {
            seen.push(g);
        }
        std::thread::sleep(Duration::from_millis(350));
    }
    let last_screen = screen(());
    assert!(
        seen.len() >= 3 && seen.windows(2).all(|w| w[0] < w[1]),
        "the screen did not refresh with growing counts: {seen:?}\n{last_screen}"
    );
    assert!(last_screen.contains("[following]"), "{last_screen}");
    assert!(last_screen.contains("q or Ctrl-C to quit"), "{last_screen}");
    tmux(&["-S", socket, "send-keys", key]);
    wait_for_file(&done, Duration::from_secs(5));
    let after_quit = screen(());
    tmux(&["-S", socket, "kill-server"]);
    writer.kill().unwrap();
    writer.wait().unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("status")).unwrap().trim(),
        "0"
    );
    assert!(after_quit.contains("live view ended: quit"), "{after_quit}");
    assert_eq!(
        std::fs::read_to_string(dir.join("before")).unwrap(),
        std::fs::read_to_string(dir.join("after")).unwrap(),
        "the terminal's settings were not restored"
    );
}

#[test]
fn record_live_follows_llama_and_ends_with_the_program() {
    let dir = scratch("record-live");
    let trace = dir.join("r.ggmlviz");
    let simple = llama_bin().join("llama-simple");
    let program = |c: &mut Command| {
        c.arg(&simple)
            .arg("-m")
            .arg(tiny_model())
            .args(["-n", "16", "hello"]);
    };
    let plain = run({
        let mut c = Command::new(&simple);
        c.arg("-m").arg(tiny_model()).args(["-n", "16", "hello"]);
        c
    });
    let out = cli(|c| {
        // A window longer than any run: the end line's top ops cover the whole trace.
        c.args([
            "record",
            "--live",
            "--interval",
            "0.2",
            "--window",
            "3600",
            "-o",
        ])
        .arg(&trace)
        .arg("--")
        .env("GGML_VIZ_OP_TIMING", "1");
        program(c);
        c
    });
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Not a terminal: the program's stdout is its own, the view's lines go to stderr.
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    assert!(
        stderr.contains("live view ended: the program exited with status 0"),
        "{stderr}"
    );
    // MUL_MAT is more than half of this program's node time (55-59 %, idle machine); among
    // the three named, not necessarily first: a share that a loaded machine preempts for tens
    // of milliseconds can put another op ahead (seen once in a full run on the 2 cores).
    let top_ops = stderr
        .split("top ops ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    assert!(top_ops.contains("MUL_MAT"), "{stderr}");
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert_eq!(
        ended_totals(&stderr),
        (stats.events(), stats.graph_computes)
    );
    // llama-simple runs ggml's default 4 threads: threads-mode op timing, each worker thread's
    // share of a node an op event. The view counts nodes as `info` does, and its top ops are
    // the nodes' wall time, as `ggml-viz ops` has it: the end line's three shares are those of
    // `ops --csv`'s totals over both phases (before, the view summed the shares' own time:
    // MUL_MAT 84.4 % of a demo trace where `ops` and the report said 57.3 %). Within 0.3
    // points: the line prints one decimal, and a share the view read after its graph compute's
    // nodes were joined would count as a node of its own.
    assert!(
        stats.nodes < stats.ops,
        "not a threads-mode trace: {stats:?}"
    );
    assert!(
        stderr.contains(&format!("{} ops ({} op spans)", stats.nodes, stats.ops)),
        "{stderr}"
    );
    let mut totals: Vec<(String, f64)> = ops_csv_totals(&trace)
        .into_iter()
        .map(|(group, (_, ns))| (group, ns as f64))
        .collect();
    let all: f64 = totals.iter().map(|(_, t)| t).sum();
    totals.sort_by(|a, b| b.1.total_cmp(&a.1));
    let shown = stderr
        .split("top ops ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no top ops in {stderr}"));
    let shown: Vec<(&str, f64)> = shown
        .split(", ")
        .map(|o| {
            let (name, pct) = o.rsplit_once(' ').unwrap();
            (name, pct.trim_end_matches('%').parse().unwrap())
        })
        .collect();
    assert_eq!(shown.len(), 3, "{stderr}");
    for ((name, pct), (group, total)) in shown.iter().zip(&totals) {
        assert_eq!(name, group, "{stderr}\nops: {totals:?}");
        let expected = 100.0 * total / all;
        assert!(
            (pct - expected).abs() <= 0.3,
            "{name}: the view says {pct} %, ops {expected:.2} %\n{stderr}"
        );
    }
}

#[test]
fn a_corrupt_trace_ends_the_view_with_the_byte_offset() {
    let dir = scratch("live-corrupt");
    let trace = dir.join("bad.ggmlviz");
    let mut bytes = Vec::new();
    ggml_viz_reader::format::encode_header(&mut bytes);
    let at = bytes.len();
    bytes.extend_from_slice(&[0xff; 64]); // has_label 0xff: no record starts like this
    std::fs::write(&trace, &bytes).unwrap();
    let out = cli(|c| c.args(["live", "--plain"]).arg(&trace));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("byte offset {at}")), "{stderr}");
}

/// `live FILE` on a file nothing writes yet says that it waits, and how to start a recording
/// (it once waited without a word).
#[test]
fn live_on_a_missing_file_says_how_to_start_a_recording() {
    let dir = scratch("live-missing");
    let trace = dir.join("later.ggmlviz");
    let mut child = plain_view(&trace, "0.2");
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("waiting for"), "{said}");
    assert!(
        said.contains(&format!(
            "ggml-viz record -o {} -- PROGRAM",
            trace.display()
        )),
        "{said}"
    );
}

/// A writer creates its trace and only then locks it (the hook and `synthesize` alike): `live
/// FILE` that finds the file in between, empty and unlocked, waits for the writer instead of
/// ending at once with nothing read (bench/run.py's live view once saw 0 of 4,000,118 events).
#[test]
fn live_waits_for_the_writer_of_an_empty_unlocked_file() {
    let dir = scratch("live-created");
    let trace = dir.join("t.ggmlviz");
    let written = dir.join("written.ggmlviz");
    synthesize(&written, 5_000);
    let bytes = std::fs::read(&written).unwrap();
    let expected = read_trace(&written).2.events();
    std::fs::File::create(&trace).unwrap(); // created, not yet locked
    let mut view = plain_view(&trace, "0.2");
    std::thread::sleep(Duration::from_millis(1000));
    let early = view.try_wait().unwrap();
    if early.is_some() {
        let stderr = stderr_of(&mut view);
        panic!("the view ended before the writer locked the file ({early:?}):\n{stderr}");
    }
    // The writer now locks its file, writes the trace and finishes.
    {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&trace)
            .unwrap();
        file.lock().unwrap();
        std::io::Write::write_all(&mut &file, &bytes).unwrap();
    }
    // Unlocked again: the view reads to the end and stops within a few polls.
    let deadline = Instant::now() + Duration::from_secs(10);
    while view.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if view.try_wait().unwrap().is_none() {
        view.kill().unwrap();
        panic!("the view did not end within 10 s of the writer's end");
    }
    let status = view.wait().unwrap();
    let stderr = stderr_of(&mut view);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(ended_totals(&stderr).0, expected, "{stderr}");
}
