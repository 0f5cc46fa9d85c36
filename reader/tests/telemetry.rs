//! The telemetry model: GE logs against ada-pa's own reports, the C++ tool's sample, the
//! same-name nesting rule, and the Perfetto export's structure.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use ggml_viz_reader::ChromeJsonWriter;
use ggml_viz_reader::Summary;
use ggml_viz_reader::format::Layout;
use ggml_viz_reader::import::ge_log;
use ggml_viz_reader::import::ggmlviz;
use ggml_viz_reader::import_path;
use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::telemetry::{Clock, Collected, LaneId};
use serde_json::Value;

fn sample(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/samples")
        .join(path)
}

/// ada-pa's summary CSV: event (without brackets) -> (count, total µs).
fn ada_pa_summary(path: &str) -> HashMap<String, (u64, f64)> {
    std::fs::read_to_string(sample(path))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].trim_matches(|c| c == '[' || c == ']').to_string(),
                (f[1].parse().unwrap(), f[3].parse().unwrap()),
            )
        })
        .collect()
}

#[test]
fn ge_logs_agree_with_ada_pa_where_nothing_nests_by_name() {
    // These two logs have no span nested in another of the same name, so ada-pa's double
    // counting does not show: counts and totals must agree exactly. (ada-pa's w-percent is
    // relative to the largest event, ours to wall time: not compared.)
    for (log, csv) in [
        ("ada-pa/pytorch_acl.log", "ada-pa/pytorch_acl_summary_0.csv"),
        ("ada-pa/pytorch_ns.log", "ada-pa/pytorch_ns_summary_0.csv"),
    ] {
        let mut s = Summary::default();
        import_path(&sample(log), None, None, &mut Ids::default(), &mut s).unwrap();
        let theirs = ada_pa_summary(csv);
        assert_eq!(s.rows().count(), theirs.len(), "{log}");
        for (name, (count, total_us)) in theirs {
            let row = s.row(&name).unwrap();
            assert_eq!(row.count, count, "{log} {name}");
            assert!(
                (row.total_ns as f64 / 1000.0 - total_us).abs() < 0.01,
                "{log} {name}: {} vs {total_us}",
                row.total_ns
            );
        }
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    }
}

#[test]
fn a_tiling_inside_a_tiling_is_two_tilings_of_twenty_microseconds() {
    // The case ada-pa's document describes: it reports 3 tilings, 40 µs.
    let log = "Profiler version: 1.0, dump start, records num: 6\n\
               1000000 7 [TransData] [Tiling] Start\n\
               1000000 7 [TransData] [Tiling] Start\n\
               1010000 7 [TransData] [Tiling] End\n\
               1010000 7 [TransData] [Tiling] Start\n\
               1020000 7 [TransData] [Tiling] End\n\
               1020000 7 [TransData] [Tiling] End\n\
               this line is not a record\n\
               Profiling dump end\n";
    let mut s = Summary::default();
    ge_log::import(log.as_bytes(), "hand-made", &mut Ids::default(), &mut s).unwrap();
    let tiling = s.row("Tiling").unwrap();
    assert_eq!((tiling.count, tiling.total_ns), (2, 20_000));
    assert_eq!(tiling.mean_ns(), 10_000.0);
    assert_eq!(s.warnings.len(), 1);
    assert!(
        s.warnings[0].contains("1 line(s) do not parse") && s.warnings[0].contains("lines 8"),
        "{:?}",
        s.warnings
    );
}

#[test]
fn the_cpp_tools_crossing_op_pairs_are_reported_with_offsets() {
    let mut c = Collected::default();
    import_path(
        &sample("ggml-viz/test_trace.ggmlviz"),
        None,
        None,
        &mut Ids::default(),
        &mut c,
    )
    .unwrap();
    assert_eq!(c.clock, Some(Clock::Relative));
    let crossings: Vec<&String> = c
        .warnings
        .iter()
        .filter(|w| w.contains("crosses"))
        .collect();
    // The offsets, from a second reader written from FORMAT.md (Python).
    let out = std::process::Command::new("python3")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/op_crossings.py"))
        .arg(sample("ggml-viz/test_trace.ggmlviz"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|offset| format!("byte offset {offset}"))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(crossings.len(), expected.len(), "{:?}", c.warnings);
    for (warning, offset) in crossings.iter().zip(&expected) {
        assert!(warning.contains(offset.as_str()), "{warning} vs {offset}");
    }
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("not nanoseconds since the epoch"))
    );
    assert_eq!(c.spans.iter().filter(|s| s.category == "graph").count(), 10);
    assert_eq!(c.spans.iter().filter(|s| s.category == "op").count(), 20);
    // Each op end carried its begin's tensor: every op span kept its own tensor label.
    assert!(
        c.spans
            .iter()
            .filter(|s| s.category == "op")
            .all(|s| !s.args.is_empty())
    );
}

/// X events on one (pid, tid) must nest or be disjoint.
fn assert_properly_nested(events: &[Value]) {
    let mut by_lane: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let (pid, tid) = (
            e["pid"].as_u64().expect("integer pid"),
            e["tid"].as_u64().expect("integer tid"),
        );
        let ts = e["ts"].as_f64().unwrap();
        by_lane
            .entry((pid, tid))
            .or_default()
            .push((ts, ts + e["dur"].as_f64().unwrap()));
    }
    for spans in by_lane.values_mut() {
        spans.sort_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap()
                .then(b.1.partial_cmp(&a.1).unwrap())
        });
        let mut open: Vec<f64> = Vec::new();
        for &(start, end) in spans.iter() {
            while open.last().is_some_and(|&e| e <= start) {
                open.pop();
            }
            if let Some(&outer) = open.last() {
                assert!(
                    end <= outer + 1e-6,
                    "span [{start}, {end}] crosses its parent ending at {outer}"
                );
            }
            open.push(end);
        }
    }
}

#[test]
fn the_perfetto_export_has_integer_ids_names_and_nested_spans() {
    let (bytes, _) = common::encode(&common::sample_trace(Layout::Packed), Layout::Packed);
    let mut out = Vec::new();
    let mut writer = ChromeJsonWriter::new(&mut out);
    let mut ids = Ids::default();
    ggmlviz::import(&bytes, Layout::Packed, "synthetic", &mut ids, &mut writer);
    let ge = std::fs::File::open(sample("ada-pa/pytorch_ns.log")).unwrap();
    ge_log::import(std::io::BufReader::new(ge), "ge", &mut ids, &mut writer).unwrap();
    let (_, n) = writer.finish().unwrap();
    let json: Value = serde_json::from_slice(&out).expect("valid JSON");
    let events = json["traceEvents"].as_array().unwrap();
    assert_eq!(events.len() as u64, n);
    assert_properly_nested(events);
    // Two processes on one timeline, each named; every lane named.
    let names: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(names.len(), 2);
    assert!(events.iter().any(|e| e["name"] == "thread_name"));
    // The synthetic trace: 3 outer graphs, each with a nested one holding 2 ops.
    let x: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == 1)
        .collect();
    assert_eq!(x.iter().filter(|e| e["cat"] == "graph").count(), 6);
    assert_eq!(x.iter().filter(|e| e["cat"] == "op").count(), 6);
    // The synthetic trace's clock starts near zero: not the epoch, and the export says so.
    assert!(json["metadata"]["ggml_viz"]["origin_ns"].is_u64());
    assert_eq!(json["metadata"]["ggml_viz"]["clock"], "relative");
    for e in events {
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    }
}

#[test]
fn comma_records_become_enqueue_execution_and_proxy_lanes() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/comma_rank0.jsonl");
    let mut c = Collected::default();
    import_path(&path, None, None, &mut Ids::default(), &mut c).unwrap();
    let us = 1000;
    let lane = |id: LaneId| c.lanes.iter().find(|l| l.id == id).unwrap().name.clone();
    let span = |name: &str| {
        c.spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let enqueue = span("all_reduce");
    assert_eq!(
        (enqueue.start_ns, enqueue.duration_ns()),
        (9_615_369 * us, 11_039 * us)
    );
    assert_eq!(lane(enqueue.lane), "collectives (enqueue)");
    // child_dur without child_start_ts: execution starts with the earliest proxy op.
    let exec = span("all_reduce (execution)");
    assert_eq!(
        (exec.start_ns, exec.duration_ns()),
        (9_624_951 * us, 1_456 * us)
    );
    assert_eq!(span("broadcast (execution)").start_ns, 9_700_100 * us);
    // Overlapping proxy ops get a lane each, their overlapping steps sub-lanes: nothing nests.
    let proxies: Vec<String> = c
        .spans
        .iter()
        .filter(|s| s.category == "PROXY")
        .map(|s| lane(s.lane))
        .collect();
    assert_eq!(
        proxies,
        [
            "proxy peer 16 recv",
            "proxy peer 16 send",
            "proxy peer 3 send"
        ]
    );
    let recv_steps: Vec<String> = c
        .spans
        .iter()
        .filter(|s| s.category == "PROXY_STEP" && lane(s.lane).starts_with("proxy peer 16 recv"))
        .map(|s| lane(s.lane))
        .collect();
    assert_eq!(
        recv_steps,
        ["proxy peer 16 recv steps #1", "proxy peer 16 recv steps #2"]
    );
    assert!(c.spans.iter().all(|s| s.parent.is_none()));
    // The PXN proxy line joined rank 0: one process in all.
    assert_eq!(c.processes.len(), 1);
    assert_eq!(c.processes[0].rank, Some(0));
    for name in ["Group", "send", "recv"] {
        span(name);
    }
    let mut out = Vec::new();
    let mut writer = ChromeJsonWriter::new(&mut out);
    import_path(&path, None, None, &mut Ids::default(), &mut writer).unwrap();
    writer.finish().unwrap();
    let json: Value = serde_json::from_slice(&out).unwrap();
    assert_properly_nested(json["traceEvents"].as_array().unwrap());
}

#[test]
fn a_bad_comma_line_is_an_error_naming_it() {
    let mut c = Collected::default();
    let text =
        "{\"cat\":\"COLL\",\"ts\":1,\"dur\":2,\"name\":\"all_gather\",\"rank\":0}\n{\"cat\": \n";
    let err = ggml_viz_reader::import::comma::import(text, "x.jsonl", &mut Ids::default(), &mut c)
        .unwrap_err();
    assert!(err.contains("x.jsonl: line 2"), "{err}");
}

/// The streamed import (events borrowing the reader's buffer, read in pieces) and the mapped one
/// deliver the same records, the warnings' byte offsets included, whole and cut mid-record.
#[test]
fn streamed_and_mapped_imports_agree_on_every_record() {
    let bytes = std::fs::read(sample("ggml-viz/test_trace.ggmlviz")).unwrap();
    let mut probe = ggml_viz_reader::StreamReader::new(&bytes[..], None);
    probe.next();
    let layout = probe.layout().unwrap().layout;
    let dir = std::env::temp_dir().join(format!("ggml-viz-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for len in [bytes.len(), bytes.len() * 2 / 3 + 7] {
        let path = dir.join(format!("cut-{len}.ggmlviz"));
        std::fs::write(&path, &bytes[..len]).unwrap();
        let mut streamed = Collected::default();
        import_path(&path, None, None, &mut Ids::default(), &mut streamed).unwrap();
        let mut mapped = Collected::default();
        let name = path.display().to_string();
        ggmlviz::import(
            &bytes[..len],
            layout,
            &name,
            &mut Ids::default(),
            &mut mapped,
        );
        assert!(streamed.spans.len() > 20, "{} spans", streamed.spans.len());
        assert_eq!(streamed.spans, mapped.spans, "cut at {len}");
        assert_eq!(streamed.warnings, mapped.warnings, "cut at {len}");
        assert_eq!(streamed.processes, mapped.processes, "cut at {len}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Barrier waits, graph and op spans of two threads, with a memory event and a thread event
/// between them, in both layouts: the streamed import (which reads spans' records where they lie)
/// and the mapped one (which decodes every event) agree, and each wait is a span from `value` ns
/// before its record to the record, inside the op it waited in.
#[test]
fn streamed_and_mapped_imports_agree_on_barrier_waits() {
    use ggml_viz_reader::format::{self, Event, Payload};
    const T0: u64 = 1_700_000_000_000_000_000;
    let dir = std::env::temp_dir().join(format!("ggml-viz-waits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for layout in [Layout::Packed, Layout::Padded] {
        let mut bytes = Vec::new();
        format::encode_header(&mut bytes);
        let mut put = |type_code, tid, ts, payload, label: &str| {
            let label = (!label.is_empty()).then(|| label.as_bytes().into());
            let e = Event {
                type_code,
                timestamp_ns: T0 + ts,
                thread_id: tid,
                payload,
                label,
            };
            format::encode_event(&mut bytes, layout, &e);
        };
        let graph = Payload::Graph {
            graph_ptr: 0x1000,
            n_nodes: 2,
            n_threads: 2,
            backend_ptr: 0,
        };
        let op = |tensor_ptr| Payload::Op {
            tensor_ptr,
            op_type: 29,
            op_size: 64,
            backend_ptr: 0,
        };
        let wait = |thread_index, value| Payload::Thread {
            object_ptr: 0x2000,
            thread_index,
            n_threads: 2,
            value,
        };
        let alloc = Payload::Memory {
            ptr: 0x3000,
            size: 4096,
        };
        put(0, 1, 0, graph, "");
        put(2, 1, 10, op(0xa0), "x");
        put(2, 2, 12, op(0xa0), "x");
        put(3, 2, 30, op(0xa0), "x");
        put(6, 2, 45, wait(1, 15), "ggml_barrier");
        put(4, 1, 46, alloc, "CPU@x");
        put(6, 1, 50, wait(0, 8), "ggml_barrier");
        put(3, 1, 60, op(0xa0), "x");
        put(7, 2, 61, wait(1, 0), "worker");
        put(2, 2, 62, op(0xb0), "y");
        put(6, 2, 70, wait(1, 5), "ggml_barrier");
        put(3, 2, 80, op(0xb0), "y");
        put(1, 1, 90, graph, "");
        let path = dir.join(format!("waits-{layout:?}.ggmlviz"));
        std::fs::write(&path, &bytes).unwrap();
        let mut streamed = Collected::default();
        import_path(
            &path,
            None,
            Some(layout),
            &mut Ids::default(),
            &mut streamed,
        )
        .unwrap();
        let mut mapped = Collected::default();
        let name = path.display().to_string();
        ggmlviz::import(&bytes, layout, &name, &mut Ids::default(), &mut mapped);
        assert_eq!(streamed.spans, mapped.spans, "{layout:?}");
        assert_eq!(streamed.warnings, mapped.warnings, "{layout:?}");
        assert!(mapped.warnings.is_empty(), "{:?}", mapped.warnings);
        // (start, end, depth) of each wait, by the times written above.
        let mut waits: Vec<(u64, u64, u32)> = (streamed.spans.iter())
            .filter(|s| s.name.as_str() == "ggml_barrier")
            .map(|s| (s.start_ns - T0, s.end_ns - T0, s.depth))
            .collect();
        waits.sort();
        assert_eq!(waits, [(30, 45, 0), (42, 50, 2), (65, 70, 1)], "{layout:?}");
        assert_eq!(streamed.spans.len(), 7, "{layout:?}: {:?}", streamed.spans);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A node's span is named by what the trace said of it at its begin: a tensor info that comes
/// while the span is open renames the node's later spans, not that one, whatever begins on other
/// threads meanwhile (the importer reuses the naming of spans no begin can find any more).
#[test]
fn a_span_keeps_the_name_it_began_with_while_infos_change() {
    use ggml_viz_reader::format::ext::{self, TensorInfo};
    use ggml_viz_reader::format::{self, Event, ExtensionKind, Payload};
    let layout = Layout::Packed;
    // Nanoseconds since the epoch (no clock warning): the times below are from this.
    const T0: u64 = 1_700_000_000_000_000_000;
    let mut bytes = Vec::new();
    format::encode_header(&mut bytes);
    let op = |bytes: &mut Vec<u8>, begin: bool, tid: u32, label: &str, op_type, ts| {
        let tensor_ptr = u64::from(op_type) << 8;
        let e = Event {
            type_code: if begin { 2 } else { 3 },
            timestamp_ns: T0 + ts,
            thread_id: tid,
            payload: Payload::Op {
                tensor_ptr,
                op_type,
                op_size: 64,
                backend_ptr: 0,
            },
            label: Some(label.as_bytes().into()),
        };
        format::encode_event(bytes, layout, &e);
    };
    let info = |bytes: &mut Vec<u8>, name: &str, op: &str, op_type, ts| {
        let info = TensorInfo {
            name: name.into(),
            op: op.into(),
            op_type: Some(op_type),
            ..TensorInfo::default()
        };
        ext::encode_extension(bytes, layout, ExtensionKind::TensorInfo, T0 + ts, 1, &info);
    };
    op(&mut bytes, true, 1, "x", 29, 10);
    info(&mut bytes, "x", "SOFT_MAX", 29, 20);
    op(&mut bytes, true, 2, "y", 7, 30);
    op(&mut bytes, false, 2, "y", 7, 40);
    op(&mut bytes, false, 1, "x", 29, 50);
    op(&mut bytes, true, 1, "x", 29, 60);
    op(&mut bytes, false, 1, "x", 29, 70);
    info(&mut bytes, "y", "ADD", 7, 80);
    op(&mut bytes, true, 2, "y", 7, 90);
    op(&mut bytes, false, 2, "y", 7, 100);
    op(&mut bytes, true, 1, "x", 29, 110);
    op(&mut bytes, false, 1, "x", 29, 120);
    let mut got = Collected::default();
    ggmlviz::import(&bytes, layout, "t", &mut Ids::default(), &mut got);
    let spans: Vec<(&str, u64, u64)> = (got.spans.iter())
        .map(|s| (s.name.as_str(), s.start_ns - T0, s.end_ns - T0))
        .collect();
    assert_eq!(
        spans,
        [
            ("op 7", 30, 40),
            ("op 29", 10, 50),
            ("SOFT_MAX", 60, 70),
            ("ADD", 90, 100),
            ("SOFT_MAX", 110, 120)
        ]
    );
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
}

/// Each begin is named by its own label and op, whatever came before it on its thread, for
/// labels of every length (the importer first tries the begin that followed the previous one
/// last time, and compares short labels a word at a time).
#[test]
fn a_begin_is_named_by_its_own_label_and_op() {
    use ggml_viz_reader::format::{self, Event, Payload};
    const T0: u64 = 1_700_000_000_000_000_000;
    let labels = [
        "ab",
        "x_1",
        "Qcur-0",
        "attn_norm-0",
        "kq_soft_max_ext-0",
        "blk.0.attn_q.weight (view)",
    ];
    // Each round: every label with op 29, then a label with op 48 where op 29 came before.
    let mut begins = Vec::new();
    for round in 0..6 {
        for (i, l) in labels.iter().enumerate() {
            let op = if i == round { 48 } else { 29 };
            begins.push((*l, op));
        }
    }
    let mut bytes = Vec::new();
    format::encode_header(&mut bytes);
    for (k, &(label, op_type)) in begins.iter().enumerate() {
        for type_code in [2, 3] {
            let e = Event {
                type_code,
                timestamp_ns: T0 + 10 * k as u64 + u64::from(type_code),
                thread_id: 7,
                payload: Payload::Op {
                    tensor_ptr: 0x1000 + k as u64,
                    op_type,
                    op_size: 64,
                    backend_ptr: 0,
                },
                label: Some(label.as_bytes().into()),
            };
            format::encode_event(&mut bytes, Layout::Packed, &e);
        }
    }
    let mut got = Collected::default();
    ggmlviz::import(&bytes, Layout::Packed, "t", &mut Ids::default(), &mut got);
    let named: Vec<(String, String)> = (got.spans.iter())
        .map(|s| {
            let tensor = s.args.iter().find(|(k, _)| &**k == "tensor").unwrap();
            (s.name.to_string(), tensor.1.to_string())
        })
        .collect();
    let expected: Vec<(String, String)> = (begins.iter())
        .map(|&(l, op)| (format!("op {op}"), l.to_string()))
        .collect();
    assert_eq!(named, expected);
}
