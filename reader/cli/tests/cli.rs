//! The `ggml-viz` binary: the `dump --to jsonl` contract, exit statuses, and messages.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ggml_viz_reader::format::{Event, Layout, Payload};
use serde_json::Value;

fn ggml_viz(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ggml-viz"))
        .args(args)
        .output()
        .unwrap()
}

/// A file of this test binary's own, in Cargo's scratch directory for integration tests (under
/// `target/`: overwritten by the next run, never left in the system's temporary directory).
fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// An op event of op type 29 (`type_code` 2 begins it, 3 ends it), unlabelled.
fn op(type_code: u8, ts: u64, thread_id: u32, tensor_ptr: u64, backend_ptr: u64) -> Event<'static> {
    Event {
        type_code,
        timestamp_ns: ts,
        thread_id,
        payload: Payload::Op {
            tensor_ptr,
            op_type: 29,
            op_size: 0,
            backend_ptr,
        },
        label: None,
    }
}

fn jsonl(out: &Output) -> Vec<serde_json::Map<String, Value>> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| match serde_json::from_str(line).unwrap() {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        })
        .collect()
}

fn keys(obj: &serde_json::Map<String, Value>) -> Vec<&str> {
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

fn assert_no_panic_text(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
}

/// Events with extreme values in every field, one of each kind the contract names.
fn extreme_events() -> Vec<Event<'static>> {
    let max = u64::MAX;
    vec![
        Event {
            type_code: 0,
            timestamp_ns: max,
            thread_id: u32::MAX,
            payload: Payload::Graph {
                graph_ptr: max,
                n_nodes: u32::MAX,
                n_threads: 3,
                backend_ptr: max - 1,
            },
            label: Some(Cow::Borrowed(b"graph \xff label")),
        },
        Event {
            type_code: 3,
            timestamp_ns: 1,
            thread_id: 2,
            payload: Payload::Op {
                tensor_ptr: max,
                op_type: 27,
                op_size: max,
                backend_ptr: 0,
            },
            label: None,
        },
        Event {
            type_code: 4,
            timestamp_ns: 2,
            thread_id: 2,
            payload: Payload::Memory {
                ptr: max,
                size: 1 << 63,
            },
            label: None,
        },
        Event {
            type_code: 6,
            timestamp_ns: 3,
            thread_id: 2,
            payload: Payload::Thread {
                object_ptr: 1,
                thread_index: 0,
                n_threads: 2,
                value: 5,
            },
            label: None,
        },
        Event {
            type_code: 200,
            timestamp_ns: 4,
            thread_id: 2,
            payload: Payload::Unknown { raw: [0; 32] },
            label: Some(Cow::Borrowed(b"x")),
        },
    ]
}

#[test]
fn jsonl_has_exactly_the_contract_keys_and_exact_u64_values() {
    for layout in [Layout::Packed, Layout::Padded] {
        let (bytes, _) = common::encode(&extreme_events(), layout);
        let path = temp_file(&format!("extreme-{layout}.ggmlviz"), &bytes);
        let out = ggml_viz(&[
            "dump",
            "--format",
            "jsonl",
            "--layout",
            layout.name(),
            path.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = jsonl(&out);
        assert_eq!(lines.len(), 5);
        let base = ["label", "thread_id", "timestamp_ns", "type", "type_code"];
        let with = |extra: &[&'static str]| {
            let mut k: Vec<&str> = base.iter().chain(extra).copied().collect();
            k.sort_unstable();
            k
        };
        assert_eq!(
            keys(&lines[0]),
            with(&["backend_ptr", "graph_ptr", "n_nodes", "n_threads"])
        );
        assert_eq!(
            keys(&lines[1]),
            with(&["backend_ptr", "op_size", "op_type", "tensor_ptr"])
        );
        assert_eq!(keys(&lines[2]), with(&["ptr", "size"]));
        assert_eq!(
            keys(&lines[3]),
            with(&["n_threads", "object_ptr", "thread_index", "value"])
        );
        assert_eq!(keys(&lines[4]), with(&[]));

        assert_eq!(lines[0]["type"], "graph_compute_begin");
        assert_eq!(lines[0]["timestamp_ns"].as_u64(), Some(u64::MAX));
        assert_eq!(lines[0]["graph_ptr"].as_u64(), Some(u64::MAX));
        assert_eq!(lines[0]["backend_ptr"].as_u64(), Some(u64::MAX - 1));
        assert_eq!(lines[0]["thread_id"].as_u64(), Some(u32::MAX as u64));
        assert_eq!(lines[0]["label"], "graph \u{fffd} label");
        assert_eq!(lines[1]["type"], "op_compute_end");
        assert_eq!(lines[1]["op_size"].as_u64(), Some(u64::MAX));
        assert_eq!(lines[1]["label"], Value::Null);
        assert_eq!(lines[2]["type"], "tensor_alloc");
        assert_eq!(lines[2]["size"].as_u64(), Some(1 << 63));
        assert_eq!(lines[3]["type"], "barrier_wait");
        let wait =
            ["object_ptr", "thread_index", "n_threads", "value"].map(|k| lines[3][k].as_u64());
        assert_eq!(wait, [Some(1), Some(0), Some(2), Some(5)]);
        assert_eq!(lines[4]["type"], "unknown");
        assert_eq!(lines[4]["type_code"], 200);
    }
}

#[test]
fn the_cpp_sample_dumps_sixty_events_and_info_names_the_layout() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/samples/ggml-viz/test_trace.ggmlviz");
    let out = ggml_viz(&["dump", "--to", "jsonl", sample.to_str().unwrap()]);
    assert!(out.status.success());
    // `--format`, its name before it became `--to` (the input's format everywhere else), still
    // gives the same, for the scripts that used it; the help names `--to` only.
    let old = ggml_viz(&["dump", "--format", "jsonl", sample.to_str().unwrap()]);
    assert_eq!(old.stdout, out.stdout);
    let help = String::from_utf8(ggml_viz(&["dump", "--help"]).stdout).unwrap();
    assert!(
        help.contains("--to <") && !help.contains("--format"),
        "{help}"
    );
    let lines = jsonl(&out);
    assert_eq!(lines.len(), 60);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["type"] == "op_compute_begin")
            .count(),
        20
    );
    let info = ggml_viz(&["info", sample.to_str().unwrap()]);
    let text = String::from_utf8(info.stdout).unwrap();
    assert!(text.contains("layout:          padded"), "{text}");
    assert!(text.contains("graph computes:  10"), "{text}");
}

#[test]
fn a_truncated_tail_is_a_warning_with_exit_zero() {
    let events = common::sample_trace(Layout::Packed);
    let (bytes, ends) = common::encode(&events, Layout::Packed);
    let cut = ends[3] + 5;
    let path = temp_file("truncated.ggmlviz", &bytes[..cut]);
    let out = ggml_viz(&["dump", "--to", "jsonl", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(jsonl(&out).len(), 4);
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert!(
        stderr.contains("warning") && stderr.contains(&format!("byte offset {}", ends[3])),
        "{stderr}"
    );
    assert!(stderr.contains(path.to_str().unwrap()), "{stderr}");
    assert_no_panic_text(&out);
}

#[test]
fn corruption_prints_what_was_read_then_fails_with_exit_two() {
    let events = common::sample_trace(Layout::Padded);
    let (mut bytes, ends) = common::encode(&events, Layout::Padded);
    bytes[ends[5] + Layout::Padded.fixed_len() - 1] = 9;
    let path = temp_file("corrupt.ggmlviz", &bytes);
    for cmd in ["dump", "info"] {
        let out = ggml_viz(&[cmd, path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let stderr = String::from_utf8(out.stderr.clone()).unwrap();
        assert!(
            stderr.contains(&format!("byte offset {}", ends[5])) && stderr.contains("corrupt"),
            "{stderr}"
        );
        assert_no_panic_text(&out);
    }
    let out = ggml_viz(&["dump", "--to", "jsonl", path.to_str().unwrap()]);
    assert_eq!(jsonl(&out).len(), 6);
}

#[test]
fn usage_errors_exit_one_and_missing_files_exit_two() {
    let out = ggml_viz(&["dump", "--layout", "sideways", "x.ggmlviz"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("packed"));
    let out = ggml_viz(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(1));
    let out = ggml_viz(&["info", "/nonexistent/trace.ggmlviz"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.ggmlviz"));
    assert_no_panic_text(&out);
    let out = ggml_viz(&["dump", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples"));
}

#[test]
fn stdin_reads_like_a_file() {
    let events = common::sample_trace(Layout::Padded);
    let (bytes, _) = common::encode(&events, Layout::Padded);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ggml-viz"))
        .args(["dump", "--to", "jsonl", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(jsonl(&out).len(), events.len());
}

#[test]
fn summary_csv_diff_and_export_work_on_real_files() {
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/samples");
    let acl = samples.join("ada-pa/pytorch_acl.log");
    let ns = samples.join("ada-pa/pytorch_ns.log");
    let out = ggml_viz(&["summary", "--csv", acl.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8(out.stdout).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "name,count,total_us,self_us,mean_us,min_us,p50_us,p99_us,max_us,share_percent,spans,\
             thread_us"
        )
    );
    assert!(
        csv.lines()
            .any(|l| l.starts_with("AclCompileAndExecute,3,85792.450,")),
        "{csv}"
    );

    let out = ggml_viz(&["diff", acl.to_str().unwrap(), ns.to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("Execute ") && l.trim_end().ends_with("new")),
        "{table}"
    );

    let json_path = temp_file("acl.json", b"");
    let out = ggml_viz(&[
        "export",
        "--to",
        "chrome-json",
        acl.to_str().unwrap(),
        ns.to_str().unwrap(),
        "-o",
        json_path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let json: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .count(),
        2,
        "two inputs, one timeline"
    );
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 19 + 249);

    let out = ggml_viz(&["summary", "/nonexistent.log"]);
    assert_eq!(out.status.code(), Some(2));
    let junk = temp_file("junk.bin", b"\x00\x01binary junk");
    let out = ggml_viz(&["summary", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("format not recognised"));
    assert_no_panic_text(&out);
}

#[test]
fn odd_inputs_get_clear_messages_and_documented_exit_codes() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-odd");
    std::fs::create_dir_all(&dir).unwrap();
    for cmd in ["info", "dump", "ops", "summary"] {
        // A device is streamed, not mapped: zeros are not a trace.
        let out = ggml_viz(&[cmd, "/dev/zero"]);
        assert_eq!(out.status.code(), Some(2), "{cmd} /dev/zero");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("/dev/zero"),
            "{cmd}"
        );
        assert_no_panic_text(&out);
        // A directory.
        let out = ggml_viz(&[cmd, dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{cmd} on a directory");
        assert_no_panic_text(&out);
    }
    // An empty file: the header was never written; a warning, not an error.
    let empty = dir.join("empty.ggmlviz");
    std::fs::write(&empty, b"").unwrap();
    let out = ggml_viz(&["info", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty: no GGMLVIZ header"));
    // A path that is not UTF-8.
    use std::os::unix::ffi::OsStrExt;
    let odd = dir.join(std::ffi::OsStr::from_bytes(b"trace-\xff\xfe.ggmlviz"));
    let (bytes, _) = common::encode(&common::sample_trace(Layout::Packed), Layout::Packed);
    std::fs::write(&odd, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ggml-viz"))
        .arg("info")
        .arg(&odd)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("graph computes:  3"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_file_truncated_while_mapped_is_an_error_not_a_crash() {
    // 600 000 records (~25 MB). `dump` maps the file and writes to a pipe nobody reads yet: it
    // blocks once the pipe is full, a few hundred records in, with the file mapped. Then the
    // file is cut to 1 KB and the pipe drained: the next mapped page it reads is gone.
    let events = common::sample_trace(Layout::Packed);
    let mut bytes = Vec::new();
    ggml_viz_reader::format::encode_header(&mut bytes);
    for _ in 0..40_000 {
        for e in &events {
            ggml_viz_reader::format::encode_event(&mut bytes, Layout::Packed, e);
        }
    }
    let path = temp_file("shrinking.ggmlviz", &bytes);
    let child = Command::new(env!("CARGO_BIN_EXE_ggml-viz"))
        .args(["dump", path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1024)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && stderr.contains("shrank"),
        "{:?} {stderr}",
        out.status
    );
    // It printed what it had read before the cut: more than the pipe held, less than all.
    let lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
    assert!(lines > 100 && lines < 600_000, "{lines} lines");
}

/// A threads-mode trace in which a graph with nodes on other backends than the CPU was timed
/// with the eval callback (its op pairs name their backend, the worker threads' do not): `info`
/// says how many ops were timed that way (before: it said "threads" of them all, as the H100
/// run of a CUDA llama-simple under `auto` showed).
#[test]
fn info_says_which_ops_of_a_threads_trace_the_eval_callback_timed() {
    use ggml_viz_reader::format::{ExtensionKind, encode_event, encode_header, ext};
    let mut bytes = Vec::new();
    encode_header(&mut bytes);
    let metadata = ext::Metadata {
        writer: "test".into(),
        settings: [("op_timing_mode".to_string(), Value::from("threads"))]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    ext::encode_extension(
        &mut bytes,
        Layout::Packed,
        ExtensionKind::Metadata,
        0,
        0,
        &metadata,
    );
    // Two ops on a worker thread (no backend), three through the eval callback (a backend),
    // inside the graph compute that calls it, as the callback runs (outside any graph compute,
    // an op naming a backend is a node a GPU timed on its queue's lane).
    let graph = |type_code, ts| Event {
        type_code,
        timestamp_ns: ts,
        thread_id: 1,
        payload: Payload::Graph {
            graph_ptr: 0x9000,
            n_nodes: 3,
            n_threads: 1,
            backend_ptr: 0,
        },
        label: None,
    };
    for (i, backend) in [0, 0, 0xb0, 0xb0, 0xb0].into_iter().enumerate() {
        let ts = 100 * i as u64;
        if i == 2 {
            encode_event(&mut bytes, Layout::Packed, &graph(0, ts - 10));
        }
        encode_event(
            &mut bytes,
            Layout::Packed,
            &op(2, ts, 1, 0x10 + backend, backend),
        );
        encode_event(
            &mut bytes,
            Layout::Packed,
            &op(3, ts + 50, 1, 0x10 + backend, backend),
        );
    }
    encode_event(&mut bytes, Layout::Packed, &graph(1, 460));
    let trace = temp_file("mixed-op-timing.ggmlviz", &bytes);
    let out = ggml_viz(&["info", trace.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("op timing:       threads:")
            && text.contains("except 3 ops of graphs with nodes on other backends than the CPU"),
        "{text}"
    );
}

/// A trace whose batches are all single tokens (`llama-bench -p 0`): `ops` shows the generation
/// table and no empty prefill table (before: a "prefill (0 ops)" title over a bare header).
#[test]
fn ops_leaves_out_a_phase_without_ops() {
    use ggml_viz_reader::format::ext::SpanBoundary;
    use ggml_viz_reader::format::{ExtensionKind, encode_event, encode_header, ext};
    let mut bytes = Vec::new();
    encode_header(&mut bytes);
    let span = |kind, ts| {
        let boundary = SpanBoundary {
            name: "llama_decode".into(),
            n_tokens: Some(1),
            ..Default::default()
        };
        let mut record = Vec::new();
        ext::encode_extension(&mut record, Layout::Packed, kind, ts, 1, &boundary);
        record
    };
    for step in 0..3u64 {
        let t = 1000 * step;
        bytes.extend(span(ExtensionKind::SpanBegin, t));
        encode_event(&mut bytes, Layout::Packed, &op(2, t + 10, 1, 0x10, 0));
        encode_event(&mut bytes, Layout::Packed, &op(3, t + 60, 1, 0x10, 0));
        bytes.extend(span(ExtensionKind::SpanEnd, t + 100));
    }
    let trace = temp_file("generation-only.ggmlviz", &bytes);
    let out = ggml_viz(&["ops", trace.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\ngeneration (3 ops)\n"), "{text}");
    assert!(!text.contains("prefill"), "{text}");
}

/// `ops --csv` and `ops --by thread --csv`: the numbers of a two-thread trace built here, worked
/// out by hand from its events.
#[test]
fn ops_csv_has_the_numbers_of_the_nodes_and_threads() {
    use ggml_viz_reader::format::ext::SpanBoundary;
    use ggml_viz_reader::format::{ExtensionKind, encode_event, encode_header, ext};
    let mut bytes = Vec::new();
    encode_header(&mut bytes);
    let prefill = SpanBoundary {
        name: "llama_decode".into(),
        n_tokens: Some(4),
        ..Default::default()
    };
    let graph = |type_code: u8, ts: u64| Event {
        type_code,
        timestamp_ns: ts,
        thread_id: 1,
        payload: Payload::Graph {
            graph_ptr: 0x100,
            n_nodes: 2,
            n_threads: 2,
            backend_ptr: 0,
        },
        label: Some(b"ggml_graph_compute"[..].into()),
    };
    // A wait is stamped at its end and says how long it was.
    let wait = |ts: u64, thread_id: u32, waited: u64| Event {
        type_code: 6,
        timestamp_ns: ts,
        thread_id,
        payload: Payload::Thread {
            object_ptr: 0,
            thread_index: thread_id - 1,
            n_threads: 2,
            value: waited,
        },
        label: Some(b"ggml_barrier"[..].into()),
    };
    ext::encode_extension(
        &mut bytes,
        Layout::Packed,
        ExtensionKind::SpanBegin,
        0,
        1,
        &prefill,
    );
    // Thread 1: node A 100..400 with a 30 ns wait inside, 50 after; node B 500..600, 100 after.
    for e in [
        graph(0, 10),
        op(2, 100, 1, 0xA0, 0),
        wait(150, 1, 30),
        op(3, 400, 1, 0xA0, 0),
        wait(450, 1, 50),
        op(2, 500, 1, 0xB0, 0),
        op(3, 600, 1, 0xB0, 0),
        wait(700, 1, 100),
        graph(1, 800),
        // Thread 2: A 120..410, B 510..590.
        op(2, 120, 2, 0xA0, 0),
        op(3, 410, 2, 0xA0, 0),
        op(2, 510, 2, 0xB0, 0),
        op(3, 590, 2, 0xB0, 0),
    ] {
        encode_event(&mut bytes, Layout::Packed, &e);
    }
    ext::encode_extension(
        &mut bytes,
        Layout::Packed,
        ExtensionKind::SpanEnd,
        900,
        1,
        &prefill,
    );
    let trace = temp_file("two-threads.ggmlviz", &bytes);
    let csv = |args: &[&str]| {
        let out = ggml_viz(&[&["ops", "--csv"], args, &[trace.to_str().unwrap()]].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = csv(&[]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let field = |name: &str| {
        let at = rows[0].iter().position(|h| *h == name).unwrap();
        rows[1][at]
    };
    assert_eq!(
        [
            field("phase"),
            field("group"),
            field("count"),
            field("total_ns")
        ],
        ["prefill", "op 29", "2", &(310 + 100).to_string()]
    );
    assert_eq!(field("max_ns"), "310");
    assert_eq!(field("thread_ns"), (300 + 290 + 100 + 80).to_string());
    let fraction = |name: &str| field(name).parse::<f64>().unwrap();
    // Idle: A's second thread 10 ns short of 300, B's 20 short of 100; of 2 x 300 + 2 x 100.
    assert!(
        (fraction("imbalance") - 30.0 / 800.0).abs() < 1e-6,
        "{table}"
    );
    // Waits inside (30) and after (150), of the threads' time (770) and the waits after.
    assert!(
        (fraction("wait_share") - 180.0 / 920.0).abs() < 1e-6,
        "{table}"
    );
    assert_eq!(
        csv(&["--by", "thread"]),
        "thread,shares,share_ns,inner_waits,inner_wait_ns,waits,wait_ns\n\
         1,2,400,1,30,2,150\n\
         2,2,370,0,0,0,0\n"
    );
}

/// A file that is no trace (a README, a model, a report given by mistake), or a GGMLVIZ file of
/// a version this reader does not know, fails every command before any output: exit 2, one
/// error line naming the file, nothing on stdout, no file written. Before, each command printed
/// its empty tables (or wrote an empty export or report) and only then the error.
#[test]
fn a_file_that_is_no_trace_fails_before_any_output() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-no-trace");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("README.md");
    std::fs::write(&text, b"# ggml-viz\n\nNot a trace.\n").unwrap();
    let mut version_2 = b"GGMLVIZ1".to_vec();
    version_2.extend_from_slice(&2u32.to_le_bytes());
    version_2.extend_from_slice(&[0; 64]);
    let newer = dir.join("newer.ggmlviz");
    std::fs::write(&newer, &version_2).unwrap();
    let [json, parquet, html] = ["out.json", "parquet", "out.html"]
        .map(|name| dir.join(name).to_str().unwrap().to_string());
    for (input, says) in [
        (&text, "format not recognised"),
        (&newer, "unsupported GGMLVIZ version 2"),
    ] {
        let input = input.to_str().unwrap();
        let commands: [&[&str]; 9] = [
            &["ops", input],
            &["info", input],
            &["dump", input],
            &["summary", input],
            &["diff", input, input],
            &["rpc", input],
            &["export", "--to", "chrome-json", input, "-o", &json],
            &["export", "--to", "parquet", input, "-o", &parquet],
            &["report", input, "-o", &html],
        ];
        for args in commands {
            let out = ggml_viz(args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{args:?}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert!(
                lines.len() == 1
                    && lines[0].starts_with("ggml-viz: error: ")
                    && lines[0].contains(input)
                    && lines[0].contains(says),
                "{args:?}: {stderr}"
            );
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "files written: {left:?}");

    // Another format our telemetry commands read is named, with where to take it.
    let ge_log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/samples/ada-pa/pytorch_acl.log");
    let ge_log = ge_log.to_str().unwrap();
    let out = ggml_viz(&["ops", ge_log]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("is a GE profiling log, not a GGMLVIZ trace (`ggml-viz summary`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ggml_viz(&["export", "--to", "telemetry-v2", ge_log]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("is a GE profiling log: this takes a GGMLVIZ trace only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--help` opens with what the tool is and examples (`record` among them), before the
/// commands, each summed up in one short line (some ran to paragraphs of 100 to 200 words).
#[test]
fn help_opens_with_examples_and_one_line_per_command() {
    let out = ggml_viz(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let examples = help.find("Examples:").expect("examples");
    let commands = help.find("Commands:").expect("commands");
    assert!(examples < commands, "{help}");
    assert!(
        help[examples..commands].contains("ggml-viz record -- "),
        "{help}"
    );
    let mut listed = 0;
    for line in help[commands..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
    {
        listed += 1;
        let summary = line
            .trim_start()
            .split_once(' ')
            .map_or("", |(_, s)| s.trim());
        assert!(!summary.is_empty() && summary.len() <= 100, "{line}");
    }
    assert!(listed >= 10, "{help}");
}
