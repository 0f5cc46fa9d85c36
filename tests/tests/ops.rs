//! Per-op timing through the scheduler's eval callback (`GGML_VIZ_OP_TIMING=sched`) on real
//! llama.cpp, and chaining with an application's own eval callback. (Threads mode, the
//! default on the CPU backend: `threads.rs`.)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use ggml_viz_e2e::*;
use ggml_viz_reader::Event;
use ggml_viz_reader::format::ext::{self, SpanBoundary, TensorInfo};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};

/// `cmd` with the hook preloaded in sched mode and `settings`.
fn with_sched_hook(cmd: Command, settings: &[(&str, &str)]) -> Command {
    let mut cmd = with_hook(cmd, settings);
    cmd.env("GGML_VIZ_OP_TIMING", "sched");
    cmd
}

fn ext_payloads<T: serde::de::DeserializeOwned>(
    events: &[Event<'_>],
    kind: ExtensionKind,
) -> Vec<T> {
    events
        .iter()
        .filter(|e| matches!(e.payload, Payload::Extension(x) if x.kind == kind))
        .map(|e| ext::parse_payload(e.label.as_deref().unwrap()).expect("our payload parses"))
        .collect()
}

/// Per outermost graph compute: its n_nodes and the op pairs inside it. Checks on the way that op
/// pairs nest inside their graph on the same thread and that nothing else happens inside an op.
fn ops_per_graph(events: &[Event<'_>]) -> Vec<(u32, usize)> {
    let mut out: Vec<(u32, usize)> = Vec::new();
    let mut depth: HashMap<u32, u32> = HashMap::new();
    let mut open_op: HashMap<u32, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.event_type().is_some()) {
        let t = e.thread_id;
        let d = depth.entry(t).or_default();
        match e.event_type().unwrap() {
            EventType::OpComputeBegin => {
                assert!(*d > 0, "op outside a graph compute");
                assert!(
                    open_op.insert(t, e.timestamp_ns).is_none(),
                    "ops overlap on a thread"
                );
                if let Some(graph) = out.last_mut() {
                    graph.1 += 1;
                }
            }
            EventType::OpComputeEnd => {
                let begin = open_op.remove(&t).expect("op end without begin");
                assert!(e.timestamp_ns >= begin);
            }
            other => {
                assert!(!open_op.contains_key(&t), "{other:?} recorded inside an op");
                match (other, e.payload) {
                    (EventType::GraphComputeBegin, Payload::Graph { n_nodes, .. }) => {
                        if *d == 0 {
                            out.push((n_nodes, 0));
                        }
                        *d += 1;
                    }
                    (EventType::GraphComputeEnd, _) => *d -= 1,
                    _ => {}
                }
            }
        }
    }
    assert!(open_op.is_empty());
    out
}

#[test]
fn llama_simple_ops_are_timed_one_pair_per_node_with_names_and_spans() {
    let dir = scratch("ops");
    let trace = dir.join("t.ggmlviz");
    let plain = run(llama_simple(8));
    let traced = run(with_sched_hook(
        llama_simple(8),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "op timing changed the output"
    );

    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    check_nesting(&events);
    let graphs = ops_per_graph(&events);
    let decoded = decoded_batches(&text(&traced.stderr)) as usize;
    assert_eq!(graphs.len(), decoded);
    for (n_nodes, ops) in &graphs {
        assert_eq!(*ops as u32, *n_nodes, "one op pair per node of the graph");
    }
    assert_eq!(
        stats.sub_graphs, 0,
        "the per-node computes inside ops are not recorded as graphs"
    );

    // Op names from the trace itself, tensor labels as llama.cpp names them.
    let infos: Vec<TensorInfo> = ext_payloads(&events, ExtensionKind::TensorInfo);
    check_tensor_infos(&events);
    let ops: BTreeSet<&str> = infos.iter().map(|i| i.op.as_str()).collect();
    for op in ["MUL_MAT", "RMS_NORM", "ROPE", "GET_ROWS", "MUL", "ADD"] {
        assert!(ops.contains(op), "{op} missing from {ops:?}");
    }
    let labels: BTreeSet<String> = events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::OpComputeBegin))
        .filter_map(|e| e.label_str().map(|l| l.into_owned()))
        .collect();
    for name in ["Qcur-0", "ffn_out-1", "norm-0"] {
        assert!(labels.contains(name), "{name} missing from op labels");
    }
    let mul_mat = infos
        .iter()
        .find(|i| i.op == "MUL_MAT" && i.name == "Qcur-0")
        .unwrap();
    assert_eq!(
        mul_mat.flops,
        Some(2 * 64 * 64 * mul_mat.ne[1] as u64),
        "2·K·M·N for a 64x64 weight"
    );
    let op_names: Vec<ext::OpNames> = ext_payloads(&events, ExtensionKind::OpNames);
    assert!(
        op_names
            .iter()
            .any(|n| n.names.values().any(|v| v == "MUL_MAT"))
    );

    // One llama_decode span per decode call: the prompt, then one token at a time.
    let spans: Vec<SpanBoundary> = ext_payloads(&events, ExtensionKind::SpanBegin);
    assert_eq!(spans.len(), decoded);
    assert!(spans.iter().all(|s| s.name == "llama_decode"));
    assert!(spans[0].n_tokens.unwrap() > 1);
    assert!(spans[1..].iter().all(|s| s.n_tokens == Some(1)));

    // `ggml-viz ops` names the ops, splits prefill from generation, and counts every MUL_MAT.
    let mul_mats = events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::OpComputeEnd))
        .filter(|e| matches!(e.payload, Payload::Op { op_type, .. } if op_names.iter().any(|n| n.names.get(&op_type.to_string()).is_some_and(|v| v == "MUL_MAT"))))
        .count();
    let out = cli(|c| c.args(["ops", "--top", "0"]).arg(&trace));
    assert!(out.status.success());
    let table = text(&out.stdout);
    assert!(table.contains("op timing: sched"), "{table}");
    assert!(
        table.contains("\nprefill (") && table.contains("\ngeneration ("),
        "{table}"
    );
    let counted: usize = table
        .lines()
        .filter(|l| l.starts_with("MUL_MAT "))
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(counted, mul_mats, "{table}");
    let by_layer = cli(|c| c.args(["ops", "--by", "layer"]).arg(&trace));
    let by_layer = text(&by_layer.stdout);
    assert!(
        by_layer.contains("layer 0") && by_layer.contains("layer 1"),
        "{by_layer}"
    );
}

#[test]
fn op_sampling_times_one_graph_in_n() {
    let dir = scratch("ops-sample");
    let trace = dir.join("t.ggmlviz");
    let out = run(with_sched_hook(
        llama_simple(9),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_OP_SAMPLE", "3"),
        ],
    ));
    assert!(out.status.success());
    let (events, _, _) = read_trace(&trace);
    let graphs = ops_per_graph(&events);
    let timed: Vec<usize> = graphs
        .iter()
        .enumerate()
        .filter(|(_, g)| g.1 > 0)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(timed, (0..graphs.len()).step_by(3).collect::<Vec<_>>());
}

fn sched_app(extra: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(fixture("ggml_sched_callback.py"))
        .arg(llama_bin())
        .args(extra);
    cmd
}

#[test]
fn the_applications_eval_callback_sees_exactly_what_it_would_without_us() {
    for (extra, ops_per_compute) in [
        (&[][..], 6),
        (&["--stop", "n3"][..], 4),
        (&["--want", ""][..], 6),
    ] {
        let dir = scratch("app-callback");
        let trace = dir.join("t.ggmlviz");
        let plain = run(sched_app(extra));
        assert!(plain.status.success(), "{}", text(&plain.stderr));
        let traced = run(with_sched_hook(
            sched_app(extra),
            &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
        ));
        assert!(traced.status.success(), "{}", text(&traced.stderr));
        assert_eq!(
            text(&traced.stdout),
            text(&plain.stdout),
            "callback calls differ for {extra:?}"
        );
        assert!(text(&plain.stdout).contains("status=0"));
        let (events, _, _) = read_trace(&trace);
        let graphs = ops_per_graph(&events);
        assert_eq!(
            graphs.iter().map(|g| g.1).collect::<Vec<_>>(),
            [ops_per_compute, ops_per_compute],
            "{extra:?}"
        );
    }
}

/// A scheduler freed and a new one made at its address (glibc returns the freed mapping when
/// every allocation is a mapping: `MALLOC_MMAP_THRESHOLD_=0`) without a callback: the new one
/// must not get the old one's callback (and its freed user data) from the hook.
#[test]
fn a_new_scheduler_at_a_freed_ones_address_does_not_inherit_its_callback() {
    let dir = scratch("sched-reuse");
    let trace = dir.join("t.ggmlviz");
    let app = || {
        let mut cmd = sched_app(&["--fresh-after-free"]);
        cmd.env("MALLOC_MMAP_THRESHOLD_", "0");
        cmd
    };
    let plain = run(app());
    let stdout = text(&plain.stdout);
    assert!(
        stdout.contains("fresh scheduler at the freed one's address"),
        "the address was not reused, so this checks nothing: {stdout}"
    );
    let traced = run(with_sched_hook(
        app(),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stdout), stdout, "the callback calls differ");
    let (events, _, _) = read_trace(&trace);
    assert_eq!(
        ops_per_graph(&events)
            .iter()
            .map(|g| g.1)
            .collect::<Vec<_>>(),
        [6, 6],
        "both computes timed"
    );
}

/// More schedulers with callbacks than the hook remembers at once: every application callback
/// still sees exactly its calls (the schedulers past the table are left untimed).
#[test]
fn more_schedulers_than_the_hook_remembers_keep_their_callbacks() {
    let dir = scratch("many-scheds");
    let trace = dir.join("t.ggmlviz");
    let args = ["--schedulers", "300", "--repeat", "2"];
    let plain = run(sched_app(&args));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert_eq!(text(&plain.stdout).matches("compute ").count(), 600);
    let traced = run(with_sched_hook(
        sched_app(&args),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "callback calls differ"
    );
    let lines = hook_lines(&traced.stderr);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("more than 256 schedulers"), "{lines:?}");
    let (events, _, stats) = read_trace(&trace);
    let ops: Vec<usize> = ops_per_graph(&events).iter().map(|g| g.1).collect();
    assert_eq!(ops.len(), 600, "every compute recorded");
    assert_eq!(
        ops.iter().filter(|&&n| n == 6).count(),
        2 * 256,
        "the first 256 timed"
    );
    // 300 schedulers and a backend overflow the 256 names: the events of the schedulers left
    // unnamed carry the bare entry point as label, and the trace counts exactly those.
    let unnamed = events
        .iter()
        .filter(|e| {
            matches!(
                e.event_type(),
                Some(EventType::GraphComputeBegin | EventType::BarrierWait)
            ) && !e.label_str().unwrap_or_default().contains(' ')
        })
        .count() as u64;
    assert!(unnamed > 0);
    assert_eq!(stats.counters.unwrap().unnamed, unnamed);
    assert!(
        lines[1].contains(&format!("{unnamed} without their object's name")),
        "{lines:?}"
    );
}

/// More distinct tensors than the tensor table holds (8191): the op events past it are
/// recorded without tensor info, counted in the trace and said at exit.
#[test]
fn a_full_tensor_table_is_counted_and_said() {
    let dir = scratch("tensor-table");
    let trace = dir.join("t.ggmlviz");
    let nodes = 9000;
    let args = ["--want", "", "--repeat", "1", "--chain", "9000"];
    let plain = run(sched_app(&args));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let traced = run(with_sched_hook(
        sched_app(&args),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    let (_, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    assert_eq!(stats.ops, nodes, "every node timed");
    let missing = nodes - 8191;
    let counters = stats.counters.unwrap();
    assert_eq!(
        (counters.without_tensor_info, counters.unnamed),
        (missing, 0)
    );
    let lines = hook_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(&format!("{missing} op event(s) without tensor info")),
        "{lines:?}"
    );
}

/// A compute stopped by the CPU backend's abort callback never sends the `ask = false` call of
/// the node it was in: the hook closes that node when the compute returns, so the thread goes
/// on recording the computes that follow.
#[test]
fn a_compute_stopped_by_an_abort_callback_leaves_the_thread_recording() {
    let dir = scratch("abort-callback");
    let trace = dir.join("t.ggmlviz");
    let args = ["--want", "", "--repeat", "6", "--abort-first"];
    let plain = run(sched_app(&args));
    let stdout = text(&plain.stdout);
    assert!(stdout.contains("compute 0 status=1"), "{stdout}"); // GGML_STATUS_ABORTED
    assert_eq!(stdout.matches("status=0").count(), 5, "{stdout}");
    let traced = run(with_sched_hook(
        sched_app(&args),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    // The computes' own results are unchanged (each is printed with its status).
    let computes = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("compute "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(computes(&text(&traced.stdout)), computes(&stdout));
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    check_nesting(&events);
    assert_eq!(stats.graph_computes, 6, "one per compute the program made");
    // The aborted compute timed the one node it reached; the others all six.
    assert_eq!(
        ops_per_graph(&events)
            .iter()
            .map(|g| g.1)
            .collect::<Vec<_>>(),
        [1, 6, 6, 6, 6, 6]
    );
}

#[test]
fn memory_and_thread_tracking_balance_and_leave_the_output_alone() {
    let dir = scratch("memory");
    let trace = dir.join("t.ggmlviz");
    let plain = run(llama_simple(4));
    let traced = run(with_sched_hook(
        llama_simple(4),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_MEMORY_TRACKING", "1"),
            ("GGML_VIZ_THREAD_TRACKING", "1"),
        ],
    ));
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);

    // Every buffer allocated is freed once, keyed by its handle; the model's weights are there.
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut mapped_bytes = 0;
    for e in &events {
        match (e.event_type(), e.payload) {
            (Some(EventType::TensorAlloc), Payload::Memory { ptr, size }) => {
                assert!(
                    live.insert(ptr, size).is_none(),
                    "buffer {ptr:#x} allocated twice"
                );
                if e.label_str().unwrap().starts_with("CPU_Mapped@") {
                    mapped_bytes += size;
                }
            }
            (Some(EventType::TensorFree), Payload::Memory { ptr, size }) => {
                assert_eq!(
                    live.remove(&ptr),
                    Some(size),
                    "free of {ptr:#x} without its alloc"
                );
            }
            _ => {}
        }
    }
    assert!(live.is_empty(), "{} buffer(s) never freed", live.len());
    assert!(stats.memory.allocs > 0 && stats.memory.allocs == stats.memory.frees);
    assert_eq!(stats.memory.live_at_exit, Some(0));
    let model_bytes = std::fs::metadata(tiny_model()).unwrap().len();
    assert!(
        mapped_bytes > model_bytes / 2 && mapped_bytes <= model_bytes,
        "CPU_Mapped {mapped_bytes} of a {model_bytes}-byte model"
    );

    // Each thread that recorded begins once and ends once, named.
    let begins: Vec<&Event<'_>> = events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::ThreadBegin))
        .collect();
    let frees = events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::ThreadFree))
        .count();
    assert_eq!(begins.len(), stats.threads.len());
    assert_eq!(frees, begins.len());
    assert!(
        begins
            .iter()
            .any(|e| e.label_str().as_deref() == Some("llama-simple"))
    );
}

/// `export --to telemetry-v2` of a real trace with memory tracking: every record passes
/// gpu-memory-profiler's own `validate_telemetry_record`; there is one per buffer event of the
/// trace; each allocation's change is its buffer's size and, with everything freed by the end,
/// every device's allocated bytes come back to 0.
#[test]
fn the_telemetry_v2_export_passes_the_reference_validator() {
    let dir = scratch("telemetry-v2");
    let trace = dir.join("t.ggmlviz");
    let json = dir.join("v2.json");
    trace_llama_simple(&trace, 4, &[("GGML_VIZ_MEMORY_TRACKING", "1")]);
    let export = cli(|c| {
        c.args(["export", "--to", "telemetry-v2", "-o"])
            .arg(&json)
            .arg(&trace)
    });
    assert!(export.status.success(), "{}", text(&export.stderr));
    let check = run({
        let mut c = Command::new("python3");
        c.arg("-c")
            .arg(
                "import json, sys\n\
                 from gpumemprof.telemetry import validate_telemetry_record\n\
                 records = json.load(open(sys.argv[1]))\n\
                 for r in records:\n    validate_telemetry_record(r)\n\
                 print(len(records))\n",
            )
            .arg(&json);
        c
    });
    assert!(check.status.success(), "rejected: {}", text(&check.stderr));
    let validated: usize = text(&check.stdout).trim().parse().unwrap();

    let (events, _, _) = read_trace(&trace);
    let sizes = alloc_sizes(&events);
    let frees = events
        .iter()
        .filter(|e| e.event_type() == Some(EventType::TensorFree))
        .count();
    assert!(!sizes.is_empty());
    assert_eq!(
        validated,
        sizes.len() + frees,
        "one record per buffer event"
    );
    let records: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let changes: Vec<u64> = records
        .iter()
        .filter(|r| r["event_type"] == "allocation")
        .map(|r| r["allocator_change_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(changes, sizes);
    let mut last: HashMap<i64, i64> = HashMap::new();
    for r in &records {
        last.insert(
            r["device_id"].as_i64().unwrap(),
            r["allocator_allocated_bytes"].as_i64().unwrap(),
        );
    }
    assert!(last.values().all(|&b| b == 0), "{last:?}");
}

/// `diff --ops`'s rows by phase, split on whitespace: op, nodes A and B, total A and B, per
/// graph A and B (number and unit each), change, then the interval and verdict if any.
fn diff_ops_rows(stdout: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut phases: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut phase = None;
    for line in stdout.lines() {
        if let Some((name, _)) = line.split_once(": ")
            && ["prefill", "generation", "outside llama_decode"].contains(&name)
        {
            phase = Some(name.to_string());
            continue;
        }
        match &phase {
            Some(p) if !line.is_empty() && !line.starts_with("op ") => phases
                .entry(p.clone())
                .or_default()
                .push(line.split_whitespace().map(String::from).collect()),
            _ => {}
        }
    }
    phases
}

/// Per (phase, op type), `ops --csv`'s nodes and wall time (ns).
fn ops_csv_by_phase(trace: &std::path::Path) -> HashMap<(String, String), (u64, u64)> {
    let csv = cli(|c| c.args(["ops", "--csv"]).arg(trace));
    assert!(csv.status.success(), "{}", text(&csv.stderr));
    (text(&csv.stdout).lines().skip(1))
        .map(|row| {
            let cols: Vec<&str> = row.split(',').collect();
            let key = (cols[0].to_string(), cols[1].to_string());
            (key, (cols[2].parse().unwrap(), cols[3].parse().unwrap()))
        })
        .collect()
}

/// A duration as `ggml-viz` prints it (`4.201 ms`), in ns.
fn parse_ns(number: &str, unit: &str) -> f64 {
    let n: f64 = number.parse().unwrap();
    n * match unit {
        "ns" => 1.0,
        "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => panic!("unit {other}"),
    }
}

/// `diff --ops` of two runs of llama-simple (4 and 12 tokens, threads-mode op timing): per phase,
/// a row per op type of either run, whose node counts are `ops --csv`'s of that phase in each run
/// and whose change is B's time per graph over A's, by arithmetic on `ops --csv`'s nanoseconds
/// and the graph computes each run recorded (the prompt's one, then one per token); the prefill,
/// one graph a run, is judged by no interval; the mode sentence is said once; a run against
/// itself changes nothing and is within noise; against a run timed in sched mode, the modes are
/// said; a file that is not a GGMLVIZ trace is refused before anything is printed.
#[test]
fn diff_ops_compares_each_op_types_nodes_of_two_runs() {
    let dir = scratch("diff-ops");
    let (a, b) = (dir.join("a.ggmlviz"), dir.join("b.ggmlviz"));
    trace_llama_simple(&a, 4, &[]);
    trace_llama_simple(&b, 12, &[]);
    let (ca, cb) = (ops_csv_by_phase(&a), ops_csv_by_phase(&b));
    let generation_graphs = |trace: &std::path::Path| {
        let (events, _, _) = read_trace(trace);
        graphs_of(&events, "ggml_backend_sched_graph_compute_async").len() as f64 - 1.0
    };
    let (ga, gb) = (generation_graphs(&a), generation_graphs(&b));
    assert!(gb > ga && ga >= 3.0, "{ga} {gb}");
    // The prefill's nodes are those of the first graph compute: the ops its thread began in it
    // (every thread computes a share of every node). Before, worker threads' shares took the
    // phase of the decode read last, and most of the prompt's nodes counted as generation.
    let (events, _, _) = read_trace(&a);
    let first = (events.iter())
        .position(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap();
    let main = events[first].thread_id;
    let prompt_nodes = (events[first..].iter())
        .filter(|e| e.thread_id == main)
        .take_while(|e| e.event_type() != Some(EventType::GraphComputeEnd))
        .filter(|e| e.event_type() == Some(EventType::OpComputeBegin))
        .count() as u64;
    let prefill_nodes: u64 = (ca.iter())
        .filter(|((phase, _), _)| phase == "prefill")
        .map(|(_, (n, _))| n)
        .sum();
    assert_eq!(prefill_nodes, prompt_nodes);
    let out = cli(|c| c.args(["diff", "--ops"]).arg(&a).arg(&b));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(stdout.matches("op timing: threads").count(), 1, "{stdout}");
    assert!(
        stdout.contains(&format!("generation: {ga} graphs in A, {gb} in B")),
        "{stdout}"
    );
    let phases = diff_ops_rows(&stdout);
    assert_eq!(
        phases.keys().collect::<Vec<_>>(),
        ["generation", "prefill"],
        "{stdout}"
    );
    for (phase, rows) in &phases {
        let ops: BTreeSet<&String> = (ca.keys().chain(cb.keys()))
            .filter(|(p, _)| p == phase)
            .map(|(_, op)| op)
            .collect();
        assert_eq!(rows.len(), ops.len(), "{phase}: {stdout}");
        for r in rows {
            let key = (phase.clone(), r[0].clone());
            let (na, ta) = ca.get(&key).copied().unwrap_or_default();
            let (nb, tb) = cb.get(&key).copied().unwrap_or_default();
            assert_eq!(
                (r[1].parse::<u64>().unwrap(), r[2].parse::<u64>().unwrap()),
                (na, nb)
            );
            let shown = parse_ns(&r[3], &r[4]);
            assert!(
                (shown - ta as f64).abs() <= 0.0015 * ta as f64 + 1.0,
                "{r:?} {ta}"
            );
            if phase == "prefill" {
                assert_eq!(r.len(), 13, "one graph a run: no interval: {r:?}");
                assert_eq!(r[12], "-");
                continue;
            }
            let change = if ta == 0 {
                "new".to_string()
            } else {
                format!(
                    "{:+.1}%",
                    100.0 * ((tb as f64 / gb) / (ta as f64 / ga) - 1.0)
                )
            };
            assert_eq!(r[11], change, "{r:?}");
        }
    }
    // A run timed with the eval callback: said, as the runs' modes.
    let sched = dir.join("sched.ggmlviz");
    trace_llama_simple(&sched, 4, &[("GGML_VIZ_OP_TIMING", "sched")]);
    let mixed = cli(|c| c.args(["diff", "--ops"]).arg(&a).arg(&sched));
    assert!(
        text(&mixed.stdout).contains("the runs timed their ops differently (threads, sched)"),
        "{}",
        text(&mixed.stdout)
    );
    let same = cli(|c| c.args(["diff", "--ops"]).arg(&a).arg(&a));
    let rows = &diff_ops_rows(&text(&same.stdout))["generation"];
    assert!(
        rows.iter()
            .all(|r| r[11] == "+0.0%" && r[r.len() - 2..] == ["within", "noise"]),
        "{rows:?}"
    );
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/samples/ada-pa/pytorch_acl.log");
    let refused = cli(|c| c.args(["diff", "--ops"]).arg(&log).arg(&a));
    assert_eq!(refused.status.code(), Some(2));
    assert!(refused.stdout.is_empty());
    assert!(
        text(&refused.stderr).contains("takes a GGMLVIZ trace only"),
        "{}",
        text(&refused.stderr)
    );
}

/// Tests whose verdict depends on the machine having no other work: scripts/test.sh runs them
/// after the rest, one at a time (`alone::`), so that another test's load cannot land on one side
/// of a comparison only.
mod alone {
    use super::*;

    /// Several recordings a side put the run-to-run spread in `diff --ops`'s intervals. Eight
    /// recordings of one command (llama-completion on 2 threads), four against four, taken in
    /// turn: its two main op types (MUL_MAT and FLASH_ATTN_EXT, most of the time) are within
    /// noise, but for at most one of them (a 95 % interval leaves out 0 one time in twenty with no
    /// change at all). Against two recordings on one thread (no barriers between nodes, no work
    /// shared out): changes are flagged (faster or slower, as the machine's load has it), each
    /// with an interval that holds its change and excludes 0. Alone: in CI beside other tests,
    /// one side's recordings once took 23 times the other's MUL_MAT time (a compute thread
    /// preempted inside its shares), and two against two put "slower" on MUL_MAT in 2 of 9 runs.
    #[test]
    fn diff_ops_tells_run_to_run_noise_from_a_change() {
        let dir = scratch("diff-noise");
        let record = |name: &str, threads: &str| {
            let trace = dir.join(name);
            let mut cmd = Command::new(llama_bin().join("llama-completion"));
            cmd.arg("-m").arg(tiny_model()).args([
                "-p",
                "Once upon a time",
                "-n",
                "24",
                "--temp",
                "0",
                "-no-cnv",
                "-t",
                threads,
            ]);
            let out = run(with_hook(
                cmd,
                &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
            ));
            assert!(out.status.success(), "{}", text(&out.stderr));
            trace
        };
        let two: Vec<_> = (0..8)
            .map(|i| record(&format!("t2-{i}.ggmlviz"), "2"))
            .collect();
        let one: Vec<_> = (0..2)
            .map(|i| record(&format!("t1-{i}.ggmlviz"), "1"))
            .collect();
        let diff = |a: &[std::path::PathBuf], b: &[std::path::PathBuf]| {
            let out = cli(|c| c.args(["diff", "--ops"]).args(a).arg("--vs").args(b));
            assert!(out.status.success(), "{}", text(&out.stderr));
            let stdout = text(&out.stdout);
            assert!(
                stdout.contains("the spread from run to run included"),
                "{stdout}"
            );
            diff_ops_rows(&stdout).remove("generation").unwrap()
        };
        let verdict = |r: &Vec<String>| r[15..].join(" ");
        // The sides alternate (even recordings against odd ones), so that a change in the machine's
        // load between recordings falls on both.
        let side = |first: usize| {
            two.iter()
                .skip(first)
                .step_by(2)
                .cloned()
                .collect::<Vec<_>>()
        };
        let same = diff(&side(0), &side(1));
        let noise = ["MUL_MAT", "FLASH_ATTN_EXT"]
            .iter()
            .filter(|&&op| verdict(same.iter().find(|r| r[0] == op).unwrap()) == "within noise")
            .count();
        assert!(noise >= 1, "{same:?}");
        let changed = diff(&two[..2], &one);
        let flagged: Vec<_> = (changed.iter())
            .filter(|r| ["slower", "faster"].contains(&verdict(r).as_str()))
            .collect();
        assert!(flagged.len() >= 2, "too little flagged: {changed:?}");
        for r in flagged {
            let bound = |x: &str| x.trim_end_matches('%').parse::<f64>().unwrap();
            let (lo, hi) = (bound(&r[12]), bound(&r[14]));
            let change = bound(&r[11]);
            let excludes_0 = if verdict(r) == "slower" {
                lo > 0.0
            } else {
                hi < 0.0
            };
            assert!(excludes_0 && lo <= change && change <= hi, "{r:?}");
        }
    }
}

/// `ops` on a terminal shows how far it has read a large trace (a 2 M-event, 109 MB synthetic
/// one: about a third of a second here) and clears the bar when done, its output what a pipe gets;
/// on a pipe, or with `-q` on a terminal, no bar at all.
#[test]
fn ops_shows_its_progress_on_a_terminal_and_clears_it() {
    let dir = scratch("ops-progress");
    let trace = dir.join("big.ggmlviz");
    synthesize(&trace, 2_000_000);
    let piped = cli(|c| c.arg("ops").arg(&trace));
    assert!(piped.status.success());
    assert_eq!(text(&piped.stderr), "", "a bar on a pipe");
    for (flags, shown) in [("", true), ("-q", false)] {
        let name = if shown { "bar" } else { "quiet" };
        let (out, done) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.done")),
        );
        let socket = dir.join(format!("{name}.sock"));
        let socket = socket.to_str().unwrap();
        let script = format!(
            "{viz} ops {flags} {t} > {out}; echo >> {done}; sleep 60",
            viz = ggml_viz().display(),
            t = trace.display(),
            out = out.display(),
            done = done.display()
        );
        tmux_session(socket, 150, 10, &script);
        // The bar's line, once it shows bytes read (`129.03 MiB/259.05 MiB …`), not only its
        // start (`0 B/…`).
        let mut bar_seen = false;
        let end = Instant::now() + Duration::from_secs(60);
        while !done.exists() && Instant::now() < end {
            let screen = tmux(&["-S", socket, "capture-pane", "-p"]);
            bar_seen |= screen
                .lines()
                .filter(|l| l.starts_with("ggml-viz: big.ggmlviz") && l.contains(" left"))
                .any(|l| !l.contains(" 0 B/"));
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_for_file(&done, Duration::from_secs(5));
        let last = tmux(&["-S", socket, "capture-pane", "-p"]);
        tmux(&["-S", socket, "kill-server"]);
        assert_eq!(bar_seen, shown, "{flags}: bar seen {bar_seen}");
        assert!(
            !last.contains("big.ggmlviz"),
            "the bar was not cleared:\n{last}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), piped.stdout);
    }
}

/// `ops --by name` groups nodes by name and op: `Qcur-0` is a MUL_MAT and a ROPE, two rows
/// (they were one, their counts and times summed). Each row's count is that name's and op's
/// nodes in the raw trace (sched mode: one op pair per node, its op by number from the op
/// names records).
#[test]
fn ops_by_name_keeps_a_names_ops_apart() {
    let dir = scratch("ops-by-name");
    let trace = dir.join("n.ggmlviz");
    trace_llama_simple(&trace, 6, &[("GGML_VIZ_OP_TIMING", "sched")]);
    let (events, damage, _) = read_trace(&trace);
    assert_eq!(damage, None);
    let mut op_names: HashMap<u32, String> = HashMap::new();
    for names in ext_payloads::<ext::OpNames>(&events, ExtensionKind::OpNames) {
        for (number, name) in names.names {
            op_names.insert(number.parse().unwrap(), name);
        }
    }
    let mut expected: HashMap<String, u64> = HashMap::new();
    for e in &events {
        if let (Some(EventType::OpComputeBegin), Payload::Op { op_type, .. }) =
            (e.event_type(), &e.payload)
        {
            let name = String::from_utf8_lossy(e.label.as_deref().unwrap_or_default());
            if name == "Qcur-0" {
                *expected
                    .entry(format!("Qcur-0 ({})", op_names[op_type]))
                    .or_default() += 1;
            }
        }
    }
    assert!(expected.len() >= 2, "{expected:?}");
    let csv = cli(|c| c.args(["ops", "--by", "name", "--csv"]).arg(&trace));
    assert!(csv.status.success(), "{}", text(&csv.stderr));
    let mut rows: HashMap<String, u64> = HashMap::new();
    for row in text(&csv.stdout).lines().skip(1) {
        let cols: Vec<&str> = row.split(',').collect();
        // `Qcur-0 (OP)`, not `Qcur-0 (view) (VIEW)`, another tensor's.
        if cols[1]
            .strip_prefix("Qcur-0 (")
            .is_some_and(|op| !op.contains('('))
        {
            *rows.entry(cols[1].to_string()).or_default() += cols[2].parse::<u64>().unwrap();
        }
    }
    assert_eq!(rows, expected);
}

/// With op sampling (every other graph compute timed, threads mode), `ops`, `info` and the
/// report say what timing cost: the generation's graph computes' medians with and without op
/// timing, over as many of each as the trace holds, and the change between them with its
/// interval. Counts and medians
/// are the raw trace's (graph computes on the decoding thread after the prompt's, timed where
/// that thread began an op inside).
#[test]
fn op_sampling_says_what_op_timing_cost() {
    let dir = scratch("ops-cost");
    let trace = dir.join("t.ggmlviz");
    let out = trace_llama_simple(&trace, 24, &[("GGML_VIZ_OP_SAMPLE", "2")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (events, _, _) = read_trace(&trace);
    let first = (events.iter())
        .position(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap();
    let main = events[first].thread_id;
    let (mut timed, mut untimed) = (Vec::new(), Vec::new());
    let mut open: Option<(u64, bool)> = None;
    let mut depth = 0;
    for e in events.iter().filter(|e| e.thread_id == main) {
        match e.event_type() {
            Some(EventType::GraphComputeBegin) => {
                depth += 1;
                if depth == 1 {
                    open = Some((e.timestamp_ns, false));
                }
            }
            Some(EventType::OpComputeBegin) => {
                if let Some(o) = open.as_mut() {
                    o.1 = true;
                }
            }
            Some(EventType::GraphComputeEnd) => {
                depth -= 1;
                if depth == 0
                    && let Some((begin, has_ops)) = open.take()
                {
                    let ns = (e.timestamp_ns - begin) as f64;
                    if has_ops { &mut timed } else { &mut untimed }.push(ns);
                }
            }
            _ => {}
        }
    }
    timed.remove(0); // the prompt's
    let median = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        }
    };
    let (mt, mu) = (median(&mut timed), median(&mut untimed));
    let ops = cli(|c| c.arg("ops").arg(&trace));
    let stdout = text(&ops.stdout);
    let line = (stdout.lines())
        .find(|l| l.starts_with("op timing's own cost: generation graph computes took"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    // "... took <n> <unit> (median of <k>) with their ops timed, <n> <unit> (median of <k>) without: ..."
    let at = |w: &str| words.iter().position(|x| *x == w).unwrap();
    let took = at("took");
    let (shown_t, k_t) = (parse_ns(words[took + 1], words[took + 2]), words[took + 5]);
    let timed_word = at("timed,");
    let (shown_u, k_u) = (
        parse_ns(words[timed_word + 1], words[timed_word + 2]),
        words[timed_word + 5],
    );
    assert_eq!(k_t.trim_end_matches(')'), timed.len().to_string(), "{line}");
    assert_eq!(
        k_u.trim_end_matches(')'),
        untimed.len().to_string(),
        "{line}"
    );
    assert!((shown_t - mt).abs() <= 0.001 * mt + 1.0, "{line}: {mt}");
    assert!((shown_u - mu).abs() <= 0.001 * mu + 1.0, "{line}: {mu}");
    let change = format!("{:+.1}", 100.0 * (mt / mu - 1.0));
    assert!(
        line.contains(&format!("without: {change} % (95 % interval")),
        "{line}: {change}"
    );
    // `info` and the report say the same.
    let info = text(&cli(|c| c.arg("info").arg(&trace)).stdout);
    // `info` keeps its own lead: `op timing cost:` and the sentence after `ops`' lead.
    let sentence = line.strip_prefix("op timing's own cost: ").unwrap();
    assert!(
        info.lines()
            .any(|l| l == format!("op timing cost:  {sentence}")),
        "{info}"
    );
    let page = trace.with_extension("html");
    let report = cli(|c| c.arg("report").arg(&trace).arg("-o").arg(&page));
    assert!(report.status.success(), "{}", text(&report.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    let at = html
        .find("\"timing_cost\":")
        .expect("the report's timing cost")
        + "\"timing_cost\":".len();
    let said: Vec<String> = serde_json::Deserializer::from_str(&html[at..])
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(said, [format!("{}: {line}", trace.display())]);
}

/// One definition of an op type's time: on one trace (llama-simple, 12 tokens, threads-mode op
/// timing, every thread's share of a node a span of its own), each op type's node time (each
/// node's wall time, summed) is the same in `ops`, `summary`, `diff --ops` and the report (±1 %,
/// the printed rounding); summary's share column adds up to 100 %, as does `ops`' in each phase
/// (before: summary counted the threads' shares, MUL_MAT at 240 % of the wall time).
#[test]
fn every_command_gives_an_op_type_the_same_node_time() {
    let dir = scratch("one-op-time");
    let trace = dir.join("t.ggmlviz");
    assert!(trace_llama_simple(&trace, 12, &[]).status.success());
    let ops = ops_csv_totals(&trace);
    assert!(ops.len() >= 5, "{ops:?}");

    let summary = cli(|c| c.args(["summary", "--csv"]).arg(&trace));
    assert!(summary.status.success(), "{}", text(&summary.stderr));
    let rows: Vec<Vec<String>> = (text(&summary.stdout).lines().skip(1))
        .map(csv_fields)
        .collect();
    let shares: f64 = rows.iter().map(|r| r[9].parse::<f64>().unwrap()).sum();
    assert!(
        (shares - 100.0).abs() < 0.05,
        "summary shares add to {shares}"
    );
    let summary_ns = |op: &str| {
        let r = rows
            .iter()
            .find(|r| r[0] == op)
            .unwrap_or_else(|| panic!("{op}"));
        r[2].parse::<f64>().unwrap() * 1000.0
    };

    let diff = cli(|c| c.args(["diff", "--ops"]).arg(&trace).arg(&trace));
    let phases = diff_ops_rows(&text(&diff.stdout));
    let diff_ns = |op: &str| -> f64 {
        (phases.values().flatten())
            .filter(|r| r[0] == op)
            .map(|r| parse_ns(&r[3], &r[4]))
            .sum()
    };

    let page = dir.join("page.html");
    let report = cli(|c| c.arg("report").arg(&trace).arg("-o").arg(&page));
    assert!(report.status.success(), "{}", text(&report.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    let at = html.find("\"by_op\":").expect("the report's op table") + "\"by_op\":".len();
    let by_op: serde_json::Value = serde_json::Deserializer::from_str(&html[at..])
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    let report_ns = |op: &str| {
        (by_op.as_array().unwrap().iter())
            .find(|r| r["name"] == op)
            .unwrap_or_else(|| panic!("{op} not in the report"))["total_ns"]
            .as_f64()
            .unwrap()
    };

    for (op, &(_, ns)) in &ops {
        let ns = ns as f64;
        for (command, got) in [
            ("summary", summary_ns(op)),
            ("diff --ops", diff_ns(op)),
            ("report", report_ns(op)),
        ] {
            assert!(
                (got - ns).abs() <= 0.01 * ns + 1.0,
                "{op}: ops {ns} ns, {command} {got}"
            );
        }
    }
    // ops' share column, per phase.
    let table = cli(|c| c.arg("ops").arg(&trace));
    let mut phase_shares: Vec<f64> = Vec::new();
    for line in text(&table.stdout).lines() {
        if line.starts_with("prefill (") || line.starts_with("generation (") {
            phase_shares.push(0.0);
        } else if let (Some(sum), Some(share)) = (
            phase_shares.last_mut(),
            line.split_whitespace()
                .nth(4)
                .and_then(|w| w.strip_suffix('%')),
        ) {
            *sum += share.parse::<f64>().unwrap();
        }
    }
    assert_eq!(phase_shares.len(), 2, "{}", text(&table.stdout));
    for sum in phase_shares {
        assert!(
            (sum - 100.0).abs() < 0.5,
            "an ops phase's shares add to {sum}"
        );
    }
}
