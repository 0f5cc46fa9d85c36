//! `ggml-viz report`: the page is driven in headless Chromium (tests/fixtures/check_report.py,
//! Selenium + Debian's chromium-driver), on a real llama.cpp trace, on a trace whose labels are
//! markup, and on a million-event trace. Screenshots land in `target/test-artifacts/`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ggml_viz_e2e::*;
use ggml_viz_reader::format::ext::{self, TensorInfo};
use ggml_viz_reader::format::{self, Event, EventType, ExtensionKind, Layout, Payload};
use serde_json::Value;

fn artifacts() -> PathBuf {
    let dir = target_dir().parent().unwrap().join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn report(inputs: &[&Path], out: &Path) -> String {
    let o = cli(|c| c.arg("report").args(inputs).arg("-o").arg(out));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    text(&o.stderr)
}

/// The data a written report's page carries (its `ggml-viz-data` script), parsed.
pub(crate) fn page_data(page: &Path) -> Value {
    let html = std::fs::read_to_string(page).unwrap();
    html.split_once(r#"id="ggml-viz-data">"#)
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map(|(json, _)| serde_json::from_str(json).unwrap())
        .expect("the page's data")
}

/// Runs the browser check; returns what it measured.
pub(crate) fn check_in_browser(page: &Path, screenshot: &str, extra: &[&str]) -> Value {
    let shot = artifacts().join(screenshot);
    let o = run({
        let mut c = Command::new("python3");
        c.arg(fixture("check_report.py"))
            .arg(page)
            .arg(&shot)
            .args(extra);
        c
    });
    assert!(
        o.status.success(),
        "browser check failed:\n{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    eprintln!("screenshot: {}", shot.display());
    serde_json::from_str(text(&o.stdout).trim()).unwrap()
}

fn card(result: &Value, key: &str) -> String {
    result["cards"][key].as_str().unwrap().replace(',', "")
}

#[test]
fn report_of_a_real_llama_trace_works_in_chromium() {
    let dir = scratch("report-llama");
    let trace = dir.join("llama.ggmlviz");
    let simple = llama_bin().join("llama-simple");
    let o = run(with_hook(
        {
            let mut c = Command::new(&simple);
            c.arg("-m").arg(tiny_model()).args(["-n", "12", "hello"]);
            c
        },
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_TIMING", "1"),
            ("GGML_VIZ_MEMORY_TRACKING", "1"),
        ],
    ));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let printed = llama_buffer_sizes(&text(&o.stderr));
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    // Threads-mode op timing: each worker thread, the one that called the graph computes among
    // them, computes a share of every node. The nodes are that thread's op begins, and each
    // thread with any has as many.
    let caller = events
        .iter()
        .find(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap()
        .thread_id;
    let mut begins: HashMap<u32, u64> = HashMap::new();
    for e in &events {
        if e.event_type() == Some(EventType::OpComputeBegin) {
            *begins.entry(e.thread_id).or_default() += 1;
        }
    }
    let nodes = begins[&caller];
    assert!(
        begins.len() >= 2 && begins.values().all(|&n| n == nodes),
        "{begins:?}"
    );
    assert_eq!(stats.ops, nodes * begins.len() as u64);
    // `info` counts nodes too, and says how many op events they are.
    let o = cli(|c| c.arg("info").arg(&trace));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let info = text(&o.stdout);
    assert!(
        info.contains(&format!(
            "ops:             {nodes} ({} op events",
            stats.ops
        )),
        "{info}"
    );

    // Memory by what each buffer held, as llama.cpp printed the sizes (MiB, two decimals): in
    // `info` and the report alike.
    assert!(
        ["weights", "KV cache", "compute"]
            .iter()
            .all(|held| printed.keys().any(|(h, _)| h == held)),
        "{printed:?}"
    );
    let in_info: std::collections::BTreeMap<(String, String), String> = info
        .lines()
        .skip_while(|l| !l.starts_with("memory by use:"))
        .skip(1)
        .take_while(|l| l.starts_with("                 "))
        .map(|l| {
            // held (one or two words), type, buffers, peak MiB, at end MiB
            let words: Vec<&str> = l.split_whitespace().collect();
            let n = words.len();
            let key = (words[..n - 4].join(" "), words[n - 4].to_string());
            (key, words[n - 2].to_string())
        })
        .collect();
    assert_eq!(in_info, printed, "{info}");

    let page = dir.join("llama.html");
    let said = report(&[&trace], &page);
    let data = page_data(&page);
    let in_report: std::collections::BTreeMap<(String, String), String> = data["memory_by_use"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let key = (
                r["held"].as_str().unwrap().to_string(),
                r["buffer_type"].as_str().unwrap().to_string(),
            );
            let peak = r["peak_bytes"].as_f64().unwrap() / 1048576.0;
            assert_eq!(r["peak_mib"].as_str().unwrap(), format!("{peak:.2} MiB"));
            (key, format!("{peak:.2}"))
        })
        .collect();
    assert_eq!(in_report, printed);
    assert!(said.contains("wrote"), "{said}");
    let r = check_in_browser(
        &page,
        "report-llama.png",
        &[
            "--expect-text",
            "MUL_MAT",
            "--expect-text",
            "generation: 11 calls",
            "--expect-text",
            "prefill: 1 calls",
            "--expect-text",
            "CPU_Mapped",
            "--expect-text",
            "KV cache",
            // The per-op table's columns for nodes.
            "--expect-text",
            "thread time",
            "--expect-text",
            "imbal.",
            "--widths",
            "1000,1600",
        ],
    );
    // The numbers at the top are the trace's own: ops are nodes, not their threads' shares.
    assert_eq!(card(&r, "graph computes"), stats.graph_computes.to_string());
    assert_eq!(card(&r, "ops"), nodes.to_string());
    assert_eq!(card(&r, "events"), stats.events().to_string());
    assert_eq!(card(&r, "events dropped"), "0");
    assert_eq!(card(&r, "damage"), "none");
    // Tables, both charts (latency, live bytes), and a tooltip with what a span is.
    assert!(r["op_rows"].as_u64().unwrap() >= 6, "{r}");
    let source = r["op_source"].as_str().unwrap();
    assert!(
        source.contains("From nodes") && source.contains("op timing threads"),
        "{r}"
    );
    assert!(r["tensor_rows"].as_u64().unwrap() >= 10, "{r}");
    // Every op's backend is known by name (the hook writes names before the events using them).
    assert_eq!(r["backends"], serde_json::json!(["CPU"]), "{r}");
    assert_eq!(r["charts"].as_u64(), Some(2), "{r}");
    assert!(r["timeline_ink_px"].as_u64().unwrap() > 1000, "{r}");
    assert!(r["tooltip"].as_str().unwrap().contains("duration:"), "{r}");

    // The timeline's legend names every op type drawn (fewer than its 16 keys).
    let mut legend_names: Vec<&str> = r["legend"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    legend_names.sort();
    let mut op_names: Vec<&str> = data["by_op"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap())
        .collect();
    op_names.sort();
    assert_eq!(legend_names, op_names, "{r}");
    // The per-layer table: each layer's nodes, counted from the caller thread's op begins (one
    // per node) by their tensor's layer suffix (`ffn_up-1`), in layer order.
    let mut by_layer: std::collections::BTreeMap<u32, u64> = Default::default();
    for e in &events {
        if e.event_type() == Some(EventType::OpComputeBegin)
            && e.thread_id == caller
            && let Some(layer) = e
                .label_str()
                .and_then(|l| l.rsplit_once('-').and_then(|(_, n)| n.parse().ok()))
        {
            *by_layer.entry(layer).or_default() += 1;
        }
    }
    assert!(by_layer.len() >= 2, "{by_layer:?}");
    let shown: Vec<(String, String)> = r["layer_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row[0].as_str().unwrap().into(),
                row[1].as_str().unwrap().replace(',', ""),
            )
        })
        .filter(|(name, _)| name != "(none)")
        .collect();
    let expected: Vec<(String, String)> = by_layer
        .iter()
        .map(|(l, n)| (format!("layer {l}"), n.to_string()))
        .collect();
    assert_eq!(shown, expected);
    // At 1000 and 1600 px: the charts' time axes have several ticks, none overlapping the next
    // (screenshots of both widths in the artifacts).
    for width in ["1000", "1600"] {
        let axes = r["widths"][width]["axes"].as_object().unwrap();
        assert_eq!(axes.len(), 2, "{width}: {axes:?}");
        for (chart, axis) in axes {
            let labels = axis["labels"].as_array().unwrap();
            assert!(labels.len() >= 3, "{width} {chart}: {axis}");
            assert_eq!(axis["overlaps"], 0, "{width} {chart}: {axis}");
        }
    }

    // The per-op table's wait share of MUL_MAT, against the events' own: the waits while a
    // MUL_MAT share is open and those right after one, of its shares' time and the waits after.
    let (thread_ns, inner, after) = crate::threads::shares(&events).mul_mat_ns;
    assert!(inner > 0 && after > 0, "{inner} {after}");
    let mul_mat = data["by_op"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == "MUL_MAT")
        .expect("a MUL_MAT row");
    let expected = (inner + after) as f64 / (thread_ns + after) as f64;
    let shown = mul_mat["wait_share"].as_f64().unwrap();
    assert!(
        (shown - expected).abs() < 1e-9,
        "{shown} against {expected}"
    );
}

fn push(out: &mut Vec<u8>, type_code: u8, ts: u64, tid: u32, payload: Payload, label: &str) {
    let e = Event {
        type_code,
        timestamp_ns: ts,
        thread_id: tid,
        payload,
        label: (!label.is_empty()).then(|| Cow::Owned(label.as_bytes().to_vec())),
    };
    format::encode_event(out, Layout::Packed, &e);
}

const T0: u64 = 1_700_000_000_000_000_000;

/// One graph of `ops` op pairs, labelled by `name(k)`, on thread `tid` from `ts`; returns its end.
/// Its tensors lie apart from other threads' (graphs computed at once on two threads never share
/// a live tensor), so that the report joins no two threads' ops into one node.
fn graph(out: &mut Vec<u8>, tid: u32, ts: u64, ops: u64, name: impl Fn(u64) -> String) -> u64 {
    let g = Payload::Graph {
        graph_ptr: 0x1000,
        n_nodes: ops as u32,
        n_threads: 1,
        backend_ptr: 0,
    };
    push(
        out,
        0,
        ts,
        tid,
        g,
        "ggml_backend_sched_graph_compute_async CPU",
    );
    for k in 0..ops {
        let op = Payload::Op {
            tensor_ptr: 0x2000 + u64::from(tid) * 0x10_0000 + k * 0x100,
            op_type: 29,
            op_size: 4096,
            backend_ptr: 0,
        };
        push(out, 2, ts + 10 + k * 100, tid, op, &name(k));
        push(out, 3, ts + 90 + k * 100, tid, op, &name(k));
    }
    let end = ts + 20 + ops * 100;
    push(
        out,
        1,
        end,
        tid,
        g,
        "ggml_backend_sched_graph_compute_async CPU",
    );
    end
}

const HOSTILE: [&str; 3] = [
    "<img src=x onerror=\"window.__pwned=1\">",
    "</script><script>window.__pwned=2</script>",
    "<iframe srcdoc=\"<script>parent.__pwned=3</script>\"></iframe>",
];

#[test]
fn labels_from_a_trace_render_as_text_and_damage_is_shown() {
    let dir = scratch("report-hostile");
    let mut bytes = Vec::new();
    format::encode_header(&mut bytes);
    let names = ext::OpNames {
        names: [(
            "29".to_string(),
            "<b onmouseover=alert(1)>MUL_MAT</b>".to_string(),
        )]
        .into(),
    };
    ext::encode_extension(
        &mut bytes,
        Layout::Packed,
        ExtensionKind::OpNames,
        T0,
        7,
        &names,
    );
    let info = TensorInfo {
        name: HOSTILE[0].into(),
        op_type: Some(29),
        type_name: "<svg onload=alert(1)>".into(),
        ..TensorInfo::default()
    };
    ext::encode_extension(
        &mut bytes,
        Layout::Packed,
        ExtensionKind::TensorInfo,
        T0,
        7,
        &info,
    );
    let mut ts = T0 + 1000;
    for _ in 0..3 {
        ts = graph(&mut bytes, 7, ts, 3, |k| HOSTILE[k as usize].to_string()) + 1000;
    }
    let complete = bytes.len();
    // A record cut short at the end: the page says where.
    push(
        &mut bytes,
        0,
        ts,
        7,
        Payload::Graph {
            graph_ptr: 1,
            n_nodes: 1,
            n_threads: 1,
            backend_ptr: 0,
        },
        "cut",
    );
    bytes.truncate(complete + 20);
    let trace = dir.join("hostile.ggmlviz");
    std::fs::write(&trace, &bytes).unwrap();

    let page = dir.join("hostile.html");
    report(&[&trace], &page);
    let html = std::fs::read_to_string(&page).unwrap();
    for h in HOSTILE {
        assert!(!html.contains(h), "{h} is in the page's source as markup");
    }
    let r = check_in_browser(
        &page,
        "report-hostile.png",
        &[
            "--hostile",
            "--expect-text",
            HOSTILE[0],
            "--expect-text",
            HOSTILE[1],
            "--expect-text",
            "<b onmouseover=alert(1)>MUL_MAT</b>",
            "--expect-text",
            &format!("byte offset {complete}"),
        ],
    );
    assert_eq!(card(&r, "damage"), "1 found");
    assert_eq!(card(&r, "graph computes"), "3");
    assert_eq!(card(&r, "ops"), "9");
    assert_eq!(r["hostile_checked"], Value::Bool(true));
}

#[test]
fn a_million_event_trace_is_drawn_in_part_and_says_so() {
    let dir = scratch("report-million");
    let mut bytes = Vec::with_capacity(48 << 20);
    format::encode_header(&mut bytes);
    let names = ["Qcur-0", "Kcur-0", "ffn_up-0", "norm-0"];
    let mut ts = [T0, T0];
    let mut graphs = 0u64;
    // Two threads, 4-token decode calls around graphs of 100 ops, buffers coming and going.
    while graphs < 5_100 {
        let tid = (graphs % 2) as u32;
        let t = &mut ts[tid as usize];
        let span = ext::SpanBoundary {
            name: "llama_decode".into(),
            n_tokens: Some(if graphs < 2 { 16 } else { 1 }),
            ..Default::default()
        };
        ext::encode_extension(
            &mut bytes,
            Layout::Packed,
            ExtensionKind::SpanBegin,
            *t,
            tid + 1,
            &span,
        );
        *t = graph(&mut bytes, tid + 1, *t + 50, 100, |k| {
            names[(k % 4) as usize].to_string()
        });
        ext::encode_extension(
            &mut bytes,
            Layout::Packed,
            ExtensionKind::SpanEnd,
            *t + 50,
            tid + 1,
            &span,
        );
        let buffer = Payload::Memory {
            ptr: 0x9000 + graphs,
            size: 1 << 20,
        };
        push(&mut bytes, 4, *t + 60, tid + 1, buffer, "CPU@0x9000");
        if graphs >= 10 {
            let old = Payload::Memory {
                ptr: 0x9000 + graphs - 10,
                size: 1 << 20,
            };
            push(&mut bytes, 5, *t + 70, tid + 1, old, "");
        }
        *t += 1000;
        graphs += 1;
    }
    let trace = dir.join("million.ggmlviz");
    std::fs::write(&trace, &bytes).unwrap();
    let (_, _, stats) = read_trace(&trace);
    assert!(stats.events() >= 1_000_000, "{}", stats.events());

    let page = dir.join("million.html");
    let started = std::time::Instant::now();
    let said = report(&[&trace], &page);
    let took = started.elapsed();
    let size = std::fs::metadata(&page).unwrap().len();
    eprintln!(
        "{} events: report in {took:?}, {:.1} MB; {said}",
        stats.events(),
        size as f64 / 1e6
    );
    assert!(size < 12_000_000, "the page is {size} bytes");
    let r = check_in_browser(
        &page,
        "report-million.png",
        &["--expect-text", "The timeline draws"],
    );
    eprintln!("browser: {r}");
    assert_eq!(card(&r, "graph computes"), graphs.to_string());
    assert_eq!(card(&r, "ops"), (graphs * 100).to_string());
    assert_eq!(card(&r, "events"), stats.events().to_string());
    assert!(
        r["latency_cards"][1]
            .as_str()
            .unwrap()
            .replace(',', "")
            .contains(&format!("generation: {} calls", graphs - 2)),
        "{r}"
    );
}

/// `report` of real multi-threaded traces (llama-simple at its default 4 threads, threads-mode op
/// timing): worker threads' shares have no parent span, and once they outnumbered the timeline's
/// room the report never ended. It ends (a report still running after its deadline is killed and
/// fails the test), the timeline fits its budget, and every thread that computed shares keeps
/// drawn shares in both halves of the run: thinned evenly, not dropped.
#[test]
fn report_of_multithreaded_llama_traces_ends_and_keeps_every_thread() {
    const SPAN_BUDGET: u64 = 150_000; // the timeline's budget (report/data.rs)
    let dir = scratch("report-threads");
    for n_predict in [128, 500] {
        let trace = dir.join(format!("t{n_predict}.ggmlviz"));
        trace_llama_simple(&trace, n_predict, &[("GGML_VIZ_OP_TIMING", "threads")]);
        let (events, damage, _) = read_trace(&trace);
        assert_eq!(damage, None);
        let mut threads: Vec<u32> = events
            .iter()
            .filter(|e| e.event_type() == Some(EventType::OpComputeBegin))
            .map(|e| e.thread_id)
            .collect();
        threads.sort_unstable();
        threads.dedup();
        assert_eq!(threads.len(), 4, "{threads:?}");

        let page = dir.join(format!("t{n_predict}.html"));
        let mut cmd = Command::new(ggml_viz());
        cmd.arg("report").arg(&trace).arg("-o").arg(&page);
        let what = format!("report of {n_predict} tokens");
        let status = run_within(cmd, std::time::Duration::from_secs(120), &what).status;
        assert!(status.success(), "{status}");

        let data = page_data(&page);
        let drawn = data["sampling"]["drawn_spans"].as_u64().unwrap();
        assert!(drawn <= SPAN_BUDGET, "{drawn}");
        let lanes: Vec<&str> = data["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap())
            .collect();
        let strings = data["strings"].as_array().unwrap();
        let spans = &data["spans"];
        let column = |name: &str| -> Vec<u64> {
            spans[name]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect()
        };
        let (lane, start, cat) = (column("lane"), column("start"), column("cat"));
        let end = *start.iter().max().unwrap();
        for tid in &threads {
            let name = format!("thread {tid}");
            let index = lanes.iter().position(|l| *l == name).unwrap() as u64;
            let halves = [0, 1].map(|half| {
                (0..lane.len())
                    .filter(|&i| lane[i] == index && strings[cat[i] as usize] == "op")
                    .filter(|&i| (start[i] * 2 >= end) == (half == 1))
                    .count()
            });
            assert!(
                halves.iter().all(|&n| n > 0),
                "{n_predict}: {name} {halves:?}"
            );
        }
        eprintln!(
            "{n_predict} tokens: {} events, drawn {drawn} of {} spans, op stride {}",
            events.len(),
            data["sampling"]["total_spans"],
            data["sampling"]["op_stride"]
        );
    }
}
