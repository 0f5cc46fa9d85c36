//! Per-node time on a GPU, measured by the device: llama-simple on ggml-vulkan, run on Mesa's
//! lavapipe (a real Vulkan driver on the CPU), recorded with `ggml-viz record`, which loads the
//! hook's Vulkan layer. Checked against the program's own output, ggml-vulkan's own
//! `GGML_VK_PERF_LOGGER` (an independent count of the nodes it enqueued, per op type) and the
//! trace's graph computes and waits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ggml_viz_e2e::*;
use ggml_viz_reader::format::{Event, EventType, Payload};

/// Tolerance of the clock calibration, between the device's times and the host's.
const SLACK_NS: u64 = 50_000;

/// `llama-simple -ngl <ngl> -n <n>` on the tiny model on lavapipe, recorded into `trace` (none:
/// run plain), with `env` set.
fn llama_simple_vulkan(trace: Option<&Path>, ngl: &str, n: &str, env: &[(&str, &str)]) -> Output {
    let bin = llama_vulkan_bin();
    let mut c = match trace {
        Some(trace) => {
            let mut c = Command::new(ggml_viz());
            c.arg("record")
                .arg("-o")
                .arg(trace)
                .arg("--")
                .arg(bin.join("llama-simple"));
            c
        }
        None => Command::new(bin.join("llama-simple")),
    };
    c.arg("-m")
        .arg(tiny_model())
        .args(["-ngl", ngl, "-n", n, "hello world"])
        // ggml skips CPU-type devices unless told; Mesa's compiled shaders are kept with the build.
        .env("GGML_VK_VISIBLE_DEVICES", "0")
        .env("MESA_SHADER_CACHE_DIR", shader_cache(&bin));
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(c);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out
}

fn shader_cache(bin: &Path) -> PathBuf {
    bin.parent().unwrap().join("mesa-shader-cache")
}

/// The device lane's thread id (its THREAD_BEGIN names a Vulkan queue) and its nodes: (begin,
/// end, op as labelled).
fn device_nodes(events: &[Event<'_>]) -> (u32, Vec<(u64, u64, String)>) {
    let lane = events
        .iter()
        .find(|e| {
            e.event_type() == Some(EventType::ThreadBegin)
                && e.label
                    .as_deref()
                    .is_some_and(|l| l.starts_with(b"Vulkan0 queue"))
        })
        .map(|e| e.thread_id)
        .expect("a Vulkan queue's lane");
    // Each node's op as labelled: the tensor info record of its name and op number read last
    // before it (FORMAT.md: it applies to the op events of that name and op that follow).
    use ggml_viz_reader::format::ExtensionKind;
    use ggml_viz_reader::format::ext::{self, TensorInfo};
    let mut infos: BTreeMap<(String, Option<u32>), String> = BTreeMap::new();
    let mut open = None;
    let mut nodes = Vec::new();
    for e in events {
        let label = String::from_utf8_lossy(e.label.as_deref().unwrap_or_default()).into_owned();
        match (e.event_type(), &e.payload) {
            (_, Payload::Extension(x)) if x.kind == ExtensionKind::TensorInfo => {
                if let Some(info) = ext::parse_payload::<TensorInfo>(label.as_bytes()) {
                    infos.insert((info.name, info.op_type), info.op);
                }
            }
            (Some(EventType::OpComputeBegin), Payload::Op { op_type, .. })
                if e.thread_id == lane =>
            {
                let op = infos
                    .get(&(label, Some(*op_type)))
                    .cloned()
                    .unwrap_or_default();
                assert!(open.is_none(), "nested device nodes");
                open = Some((e.timestamp_ns, op));
            }
            (Some(EventType::OpComputeEnd), _) if e.thread_id == lane => {
                let (begin, op) = open.take().expect("an end after its begin");
                nodes.push((begin, e.timestamp_ns, op));
            }
            _ => {}
        }
    }
    (lane, nodes)
}

/// `GGML_VK_PERF_LOGGER`'s entries, per op as it names them (`MUL_MAT_VEC` is a `MUL_MAT`; a
/// fusion is named with `_` where a label has `+`), summed over every graph it printed.
fn perf_logger_counts(stderr: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let mut blocks = 0;
    for line in stderr.lines() {
        if line.starts_with("Vulkan Timings:") {
            blocks += 1;
            continue;
        }
        let Some((head, rest)) = line.split_once(": ") else {
            continue;
        };
        let Some(n) = rest
            .split(" x ")
            .next()
            .and_then(|n| n.trim().parse::<u64>().ok())
        else {
            continue;
        };
        let op = head.split([' ', ':']).next().unwrap_or_default();
        let op = if op == "MUL_MAT_VEC" { "MUL_MAT" } else { op };
        *counts.entry(op.to_string()).or_default() += n;
    }
    assert!(blocks > 0, "no GGML_VK_PERF_LOGGER output:\n{stderr}");
    counts
}

/// Output identical with and without the hook; every node ggml-vulkan enqueued is in the trace
/// once (the number of entries ggml's own perf logger counts for the same run, per op type),
/// with a device time; each lies between its graph compute's begin and the end of the wait that
/// completed it; per graph, the nodes' device time fits in that window.
#[test]
fn every_vulkan_node_is_timed_by_the_device_once() {
    let dir = scratch("vulkan");
    let plain = llama_simple_vulkan(None, "99", "16", &[]);
    let trace = dir.join("v.ggmlviz");
    let hooked = llama_simple_vulkan(Some(&trace), "99", "16", &[]);
    assert_eq!(text(&hooked.stdout), text(&plain.stdout));
    let (events, damage, _) = read_trace(&trace);
    assert_eq!(damage, None);
    let (lane, nodes) = device_nodes(&events);
    assert!(nodes.len() > 16 * 20, "{} nodes", nodes.len());
    assert!(
        nodes.iter().all(|(b, e, _)| e > b),
        "a node without device time"
    );

    // Windows: each outermost graph compute (the scheduler's) from its begin to the end of the
    // first scheduler synchronize after it (a wait's timestamp is its end).
    let main = events
        .iter()
        .find(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap()
        .thread_id;
    let label = |e: &Event<'_>| {
        String::from_utf8_lossy(e.label.as_deref().unwrap_or_default()).into_owned()
    };
    let mut begins = Vec::new();
    let mut ends = Vec::new();
    let mut waits = Vec::new();
    for e in events.iter().filter(|e| e.thread_id == main) {
        let l = label(e);
        match e.event_type() {
            Some(EventType::GraphComputeBegin)
                if l.starts_with("ggml_backend_sched_graph_compute") =>
            {
                begins.push(e.timestamp_ns)
            }
            Some(EventType::GraphComputeEnd)
                if l.starts_with("ggml_backend_sched_graph_compute") =>
            {
                ends.push(e.timestamp_ns)
            }
            Some(EventType::BarrierWait) if l.starts_with("ggml_backend_sched_synchronize") => {
                waits.push(e.timestamp_ns)
            }
            _ => {}
        }
    }
    assert_eq!(begins.len(), ends.len());
    let last = events.iter().map(|e| e.timestamp_ns).max().unwrap();
    let windows: Vec<(u64, u64)> = begins
        .iter()
        .zip(&ends)
        .map(|(&b, &e)| (b, waits.iter().copied().find(|&w| w >= e).unwrap_or(last)))
        .collect();
    let mut busy = vec![0u64; windows.len()];
    for (begin, end, op) in &nodes {
        let k = windows
            .iter()
            .rposition(|w| w.0 <= begin + SLACK_NS)
            .unwrap_or_else(|| panic!("{op} at {begin} before every graph compute"));
        let (wb, we) = windows[k];
        assert!(
            *end <= we + SLACK_NS,
            "{op} ends {} µs after its graph's wait ended",
            (end - we) / 1000
        );
        assert!(begin + SLACK_NS >= wb);
        busy[k] += end - begin;
    }
    for (k, (wb, we)) in windows.iter().enumerate() {
        assert!(
            busy[k] <= we - wb + SLACK_NS,
            "graph {k}: {} of {} ns",
            busy[k],
            we - wb
        );
    }
    assert!(busy.iter().filter(|&&b| b > 0).count() >= 16, "{busy:?}");
    eprintln!(
        "{} device nodes on lane {lane:#x} in {} graph computes",
        nodes.len(),
        windows.len()
    );

    // `ops` says how busy the device was: its nodes' union over each graph compute's period
    // (from its begin to the next one's; the last, to its last node), worked out here from the
    // raw events.
    let (mut busy_ns, mut period_ns, mut computes) = (0u64, 0u64, 0u64);
    for (k, &b) in begins.iter().enumerate() {
        let next = begins.get(k + 1).copied();
        let mut mine: Vec<(u64, u64)> = nodes
            .iter()
            .filter(|(nb, _, _)| *nb >= b && next.is_none_or(|n| *nb < n))
            .map(|(nb, ne, _)| (*nb, *ne))
            .collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_unstable();
        let last = mine.iter().map(|n| n.1).max().unwrap();
        let mut reached = 0;
        for (nb, ne) in mine {
            busy_ns += ne.max(reached) - nb.max(reached);
            reached = reached.max(ne);
        }
        period_ns += next.unwrap_or(last).max(last) - b;
        computes += 1;
    }
    // Every command that says how nodes were timed says how the GPU's were.
    let info = text(&cli(|c| c.arg("info").arg(&trace)).stdout);
    assert!(
        info.contains("; on the GPU, each node's own timestamps on the device"),
        "{info}"
    );
    let said = text(&cli(|c| c.arg("ops").arg(&trace)).stdout);
    assert!(
        said.contains("; on the GPU, each node's own timestamps"),
        "{said}"
    );
    let line = said
        .lines()
        .find(|l| l.starts_with("Vulkan0: busy "))
        .unwrap_or_else(|| panic!("no device line in:\n{said}"));
    let expected = format!(
        "Vulkan0: busy {:.1} % of its {computes} graph computes",
        100.0 * busy_ns as f64 / period_ns as f64
    );
    assert!(line.starts_with(&expected), "{line}\nexpected {expected}");

    // Perfetto (its own generated classes decode the export): the device queue is a thread
    // track of the process, described once, with a slice per node at the trace's times.
    let proto = dir.join("v.pftrace");
    let done = cli(|c| {
        c.args(["export", "--to", "perfetto", "-o"])
            .arg(&proto)
            .arg(&trace)
    });
    assert!(done.status.success(), "{}", text(&done.stderr));
    let decoded = decode_perfetto(&proto);
    let (track, _) = decoded["tracks"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, t)| t["label"] == "Vulkan0 queue")
        .expect("a track for the device queue");
    let mut slices: Vec<(u64, u64)> = decoded["slices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["track"].as_u64() == track.parse().ok())
        .map(|s| (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap()))
        .collect();
    slices.sort_unstable();
    let mut expected: Vec<(u64, u64)> = nodes.iter().map(|(b, e, _)| (*b, *e)).collect();
    expected.sort_unstable();
    assert_eq!(slices, expected);

    // The same run with ggml's own perf logger: its entries, per op, are the trace's nodes.
    let logged = dir.join("logged.ggmlviz");
    let out = llama_simple_vulkan(Some(&logged), "99", "6", &[("GGML_VK_PERF_LOGGER", "1")]);
    let expected = perf_logger_counts(&text(&out.stderr));
    let (events, damage, _) = read_trace(&logged);
    assert_eq!(damage, None);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (_, _, op) in device_nodes(&events).1 {
        *counts.entry(op.replace('+', "_")).or_default() += 1;
    }
    assert_eq!(counts, expected);

    // Each node's kernels (the pipelines of the dispatches inside its label): every node ran
    // one at least, a MUL_MAT a matrix multiplication; `ops --by kernel` groups all the
    // device's nodes.
    use ggml_viz_reader::format::ExtensionKind;
    use ggml_viz_reader::format::ext::{self, TensorInfo};
    for e in &events {
        if let Payload::Extension(x) = e.payload
            && x.kind == ExtensionKind::TensorInfo
            && let Some(info) = ext::parse_payload::<TensorInfo>(e.label.as_deref().unwrap())
            && info.op_name.is_some()
            && info.type_name.is_empty()
        {
            let kernels = info.kernels.clone().unwrap_or_default();
            assert!(!kernels.is_empty(), "{info:?}");
            if info.op == "MUL_MAT" {
                // `mul_mat_vec_…` for one token, `matmul_…` for several.
                assert!(
                    kernels.starts_with("mul_mat") || kernels.starts_with("matmul"),
                    "{info:?}"
                );
            }
        }
    }
    let by_kernel = cli(|c| c.args(["ops", "--by", "kernel", "--csv"]).arg(&logged));
    assert!(by_kernel.status.success(), "{}", text(&by_kernel.stderr));
    let with_kernels: u64 = text(&by_kernel.stdout)
        .lines()
        .skip(1)
        .map(csv_fields)
        .filter(|f| f[1] != "(none)")
        .map(|f| f[2].parse::<u64>().unwrap())
        .sum();
    assert_eq!(with_kernels, expected.values().sum::<u64>());

    // `ops --by backend` counts them on the device, apart from the CPU's.
    let ops = cli(|c| c.args(["ops", "--by", "backend", "--csv"]).arg(&logged));
    assert!(ops.status.success(), "{}", text(&ops.stderr));
    let vulkan: u64 = text(&ops.stdout)
        .lines()
        .filter(|l| l.split(',').nth(1) == Some("Vulkan0"))
        .map(|l| l.split(',').nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(vulkan, expected.values().sum::<u64>());
}

/// A partly offloaded model (one of the tiny model's two layers on the GPU): the CPU's nodes
/// timed on its worker threads and the GPU's on the device lane, in one trace; the program's
/// output unchanged, the device's nodes those ggml's perf logger counts.
#[test]
fn a_partly_offloaded_model_has_cpu_and_device_nodes_in_one_trace() {
    let dir = scratch("vulkan-partial");
    let plain = llama_simple_vulkan(None, "1", "6", &[]);
    let trace = dir.join("p.ggmlviz");
    let out = llama_simple_vulkan(Some(&trace), "1", "6", &[("GGML_VK_PERF_LOGGER", "1")]);
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    let expected: u64 = perf_logger_counts(&text(&out.stderr)).values().sum();
    let (events, damage, _) = read_trace(&trace);
    assert_eq!(damage, None);
    let (lane, nodes) = device_nodes(&events);
    assert_eq!(nodes.len() as u64, expected);
    // CPU nodes: op events on the threads that computed them, none naming a backend (threads
    // mode), on at least the graph computes' own thread.
    let cpu_threads: std::collections::BTreeSet<u32> = events
        .iter()
        .filter(|e| e.thread_id != lane && e.event_type() == Some(EventType::OpComputeBegin))
        .map(|e| {
            assert!(
                matches!(e.payload, Payload::Op { backend_ptr: 0, .. }),
                "a CPU node timed by the eval callback: {e:?}"
            );
            e.thread_id
        })
        .collect();
    assert!(!cpu_threads.is_empty());
    let ops = cli(|c| c.args(["ops", "--by", "backend", "--csv"]).arg(&trace));
    assert!(ops.status.success(), "{}", text(&ops.stderr));
    let rows = text(&ops.stdout);
    let count = |backend: &str| -> u64 {
        rows.lines()
            .filter(|l| l.split(',').nth(1) == Some(backend))
            .map(|l| l.split(',').nth(2).unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(count("Vulkan0"), expected);
    assert!(count("CPU") > 6 * 10, "{rows}");
}
