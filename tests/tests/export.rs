//! `ggml-viz export --to perfetto` (Perfetto's protobuf format) checked by Perfetto's own
//! generated classes (`tests/fixtures/check_perfetto.py`), against the trace's raw events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;

use ggml_viz_e2e::*;
use ggml_viz_reader::OpAnalysis;
use ggml_viz_reader::format::ext::{self, TensorInfo};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};
use serde_json::Value;

fn export(to: &str, trace: &std::path::Path, out: &std::path::Path, extra: &[&str]) {
    let done = cli(|c| {
        c.args(["export", "--to", to, "-o"])
            .arg(out)
            .args(extra)
            .arg(trace)
    });
    assert!(done.status.success(), "{to}: {}", text(&done.stderr));
}

/// Every graph, op, wait and decode span of a real llama-simple trace is a slice with the same
/// nanoseconds, nested on its thread's track; every buffer event a counter sample.
#[test]
fn the_perfetto_export_holds_every_span_and_counter_of_a_real_trace() {
    let dir = scratch("perfetto");
    let trace = dir.join("t.ggmlviz");
    trace_llama_simple(&trace, 6, &[("GGML_VIZ_MEMORY_TRACKING", "1")]);
    let (proto, plain, json) = (
        dir.join("t.pftrace"),
        dir.join("plain.pftrace"),
        dir.join("t.json"),
    );
    export("perfetto", &trace, &proto, &[]);
    export("perfetto", &trace, &plain, &["--no-compress"]);
    export("chrome-json", &trace, &json, &[]);
    let mut decoded = decode_perfetto(&proto);
    let mut decoded_plain = decode_perfetto(&plain);
    // Deflated by default (read as the trace processor inflates them), plain on request: the
    // same tracks, slices, counters and instants either way.
    assert!(decoded["compressed_packets"].as_u64().unwrap() > 0);
    assert_eq!(decoded_plain["compressed_packets"].as_u64(), Some(0));
    decoded
        .as_object_mut()
        .unwrap()
        .remove("compressed_packets");
    decoded_plain
        .as_object_mut()
        .unwrap()
        .remove("compressed_packets");
    assert!(
        decoded == decoded_plain,
        "deflated and plain exports differ"
    );

    // What the raw events say: (category, start, end) of every pair, per thread.
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    let mut expected: Vec<(String, u64, u64)> = Vec::new();
    let mut open: HashMap<(u32, &str), Vec<u64>> = HashMap::new();
    let mut op_kinds = BTreeSet::new();
    let mut buffer_events = 0;
    // Each op begin's time and tensor name (its label).
    let mut op_tensors: Vec<(u64, String)> = Vec::new();
    for e in &events {
        let ts = e.timestamp_ns;
        if e.event_type() == Some(EventType::OpComputeBegin) {
            op_tensors.push((ts, e.label_str().unwrap_or_default().into_owned()));
        }
        let mut pair = |category: &'static str, begin: bool| {
            let stack = open.entry((e.thread_id, category)).or_default();
            if begin {
                stack.push(ts);
            } else {
                let start = stack.pop().expect("an end after its begin");
                expected.push((category.to_string(), start, ts));
            }
        };
        match (e.event_type(), e.payload) {
            (Some(EventType::GraphComputeBegin), _) => pair("graph", true),
            (Some(EventType::GraphComputeEnd), _) => pair("graph", false),
            (Some(EventType::OpComputeBegin), _) => pair("op", true),
            (Some(EventType::OpComputeEnd), _) => pair("op", false),
            (Some(EventType::BarrierWait), Payload::Thread { value, .. }) => {
                expected.push(("wait".into(), ts - value, ts));
            }
            (Some(EventType::TensorAlloc | EventType::TensorFree), _) => buffer_events += 1,
            (None, Payload::Extension(x)) => {
                let label = e.label.as_deref().unwrap_or_default();
                match x.kind {
                    ExtensionKind::SpanBegin => pair("llama", true),
                    ExtensionKind::SpanEnd => pair("llama", false),
                    ExtensionKind::TensorInfo => {
                        let info: TensorInfo = ext::parse_payload(label).unwrap();
                        op_kinds.insert(info.op);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    expected.sort();
    assert!(expected.iter().any(|e| e.0 == "op") && expected.iter().any(|e| e.0 == "llama"));

    let all_slices = decoded["slices"].as_array().unwrap();
    // The sequence lanes' slices are made from the decode spans' batches (below); the others are
    // the raw pairs.
    let (sequence_slices, slices): (Vec<&Value>, Vec<&Value>) =
        all_slices.iter().partition(|s| s["category"] == "sequence");
    let mut got: Vec<(String, u64, u64)> = slices
        .iter()
        .map(|s| {
            (
                s["category"].as_str().unwrap().to_string(),
                s["start"].as_u64().unwrap(),
                s["end"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got, expected,
        "the slices are the raw pairs, to the nanosecond"
    );
    // llama-simple's batches name their sequence: each decode is a step on its lane.
    let decodes: BTreeSet<(u64, u64)> = (expected.iter())
        .filter(|e| e.0 == "llama")
        .map(|e| (e.1, e.2))
        .collect();
    let steps: BTreeSet<(u64, u64)> = (sequence_slices.iter())
        .filter(|s| s["name"] == "prefill" || s["name"] == "generate")
        .map(|s| (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap()))
        .collect();
    assert_eq!(steps, decodes, "a step per decode on the sequence's lane");

    // Tracks: one process, named for the program and its pid, its threads under it; op slices
    // nest inside a graph slice on the calling thread's track, and on the pool's other threads
    // (threads-mode op timing) lie within a graph slice of that thread; named for their op.
    let tracks = decoded["tracks"].as_object().unwrap();
    let of_kind = |kind: &str| -> Vec<(&String, &Value)> {
        tracks.iter().filter(|(_, t)| t["kind"] == kind).collect()
    };
    let processes = of_kind("process");
    assert_eq!(processes.len(), 1);
    let pid = stats.metadata.as_ref().unwrap().pid;
    let label = processes[0].1["label"].as_str().unwrap();
    assert!(
        label.contains("llama-simple") && label.contains(&format!("(pid {pid})")),
        "{label}"
    );
    // The OS threads' tracks, and the sequence's.
    let (sequence_lanes, threads): (Vec<_>, Vec<_>) = of_kind("thread")
        .into_iter()
        .partition(|(_, t)| t["label"].as_str().unwrap().starts_with("sequence "));
    assert_eq!(threads.len(), stats.threads.len());
    assert_eq!(sequence_lanes.len(), 1);
    assert!(
        threads
            .iter()
            .all(|(_, t)| t["parent"].as_u64().unwrap().to_string() == *processes[0].0)
    );
    let mut by_track: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for &s in &slices {
        by_track
            .entry(s["track"].as_u64().unwrap())
            .or_default()
            .push(s);
    }
    let graphs: Vec<&Value> = slices
        .iter()
        .copied()
        .filter(|s| s["category"] == "graph")
        .collect();
    let mut worker_ops = 0;
    for s in slices.iter().filter(|s| s["category"] == "op") {
        let (start, end) = (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap());
        let track = s["track"].as_u64().unwrap();
        let inside =
            |g: &&Value| g["start"].as_u64().unwrap() <= start && end <= g["end"].as_u64().unwrap();
        if by_track[&track].iter().any(|g| g["category"] == "graph") {
            assert!(s["depth"].as_u64().unwrap() > 0);
            assert!(
                by_track[&track]
                    .iter()
                    .any(|g| g["category"] == "graph" && inside(g)),
                "an op outside every graph of its thread: {s}"
            );
        } else {
            worker_ops += 1;
            assert_eq!(s["depth"].as_u64().unwrap(), 0);
            assert!(
                graphs.iter().any(inside),
                "a worker's op outside every graph: {s}"
            );
        }
        let name = s["name"].as_str().unwrap();
        assert!(op_kinds.contains(name), "{name} is not an op of the trace");
    }
    assert!(worker_ops > 0, "no op slice on a worker thread's track");

    // Arguments: an op slice's `args` names the tensor its begin event named.
    let mut slice_tensors: Vec<(u64, String)> = slices
        .iter()
        .filter(|s| s["category"] == "op")
        .map(|s| {
            let args = s["args"]["args"].as_str().unwrap_or_else(|| panic!("{s}"));
            let tensor = args
                .split("; ")
                .find_map(|pair| pair.strip_prefix("tensor="))
                .unwrap_or_else(|| panic!("no tensor in {args}"));
            (s["start"].as_u64().unwrap(), tensor.to_string())
        })
        .collect();
    slice_tensors.sort();
    op_tensors.sort();
    assert_eq!(slice_tensors, op_tensors);

    // Counters: a sample per buffer event, in bytes, back to 0 at the end.
    let counters = decoded["counters"].as_array().unwrap();
    assert_eq!(counters.len(), buffer_events);
    let mut last: HashMap<u64, f64> = HashMap::new();
    for c in counters {
        last.insert(c["track"].as_u64().unwrap(), c["value"].as_f64().unwrap());
    }
    assert!(
        !last.is_empty() && last.values().all(|&v| v == 0.0),
        "{last:?}"
    );
    assert!(
        of_kind("counter").iter().all(|(_, t)| t["unit"] == 3),
        "bytes"
    );

    let [proto_len, plain_len, json_len] =
        [&proto, &plain, &json].map(|p| std::fs::metadata(p).unwrap().len());
    println!(
        "perfetto: {proto_len} bytes ({plain_len} not deflated), chrome-json: {json_len} bytes"
    );
    // The target: 5 times smaller than the JSON. Not deflated, a short run's interned strings
    // (each thread's sequence has its own) weigh more than in a long one.
    assert!(proto_len * 5 < json_len, "{proto_len} vs {json_len} bytes");
    assert!(plain_len * 3 < json_len, "{plain_len} vs {json_len} bytes");
}

/// Two ranks of one job (`RANK`, `WORLD_SIZE`), traced, exported to one Parquet dataset: the
/// traces and the dataset's directory.
fn two_ranks_dataset(name: &str) -> ([std::path::PathBuf; 2], std::path::PathBuf) {
    let dir = scratch(name);
    let traces = [dir.join("rank0.ggmlviz"), dir.join("rank1.ggmlviz")];
    for (rank, (trace, n_predict)) in traces.iter().zip([4, 2]).enumerate() {
        let rank = rank.to_string();
        trace_llama_simple(trace, n_predict, &[("RANK", &rank), ("WORLD_SIZE", "2")]);
    }
    let dataset = dir.join("dataset");
    let done = cli(|c| {
        c.args(["export", "--to", "parquet", "-o"])
            .arg(&dataset)
            .args(&traces)
    });
    assert!(done.status.success(), "{}", text(&done.stderr));
    (traces, dataset)
}

/// Runs a query engine's Python `script` on `dataset` (its first argument): the script prints
/// one header line, then `op count total_ns` per op. Returns the header and the rows.
fn engine_op_totals(
    script: &str,
    dataset: &std::path::Path,
) -> (String, BTreeMap<String, (u64, u64)>) {
    let query = run({
        let mut c = Command::new("python3");
        c.arg("-c").arg(script).arg(dataset);
        c
    });
    assert!(query.status.success(), "{}", text(&query.stderr));
    let out = text(&query.stdout);
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default().to_string();
    let totals: BTreeMap<String, (u64, u64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                (f[1].parse().unwrap(), f[2].parse().unwrap()),
            )
        })
        .collect();
    assert!(totals.contains_key("MUL_MAT"), "{out}");
    (header, totals)
}

/// Per op, the count and total time a query engine found equal `ggml-viz summary`'s spans and
/// thread time of the same traces (the engine sums spans: each thread's share of a node).
fn assert_summary_agrees(
    engine: &str,
    totals: &BTreeMap<String, (u64, u64)>,
    traces: &[std::path::PathBuf],
) {
    let summary = cli(|c| c.args(["summary", "--csv"]).args(traces));
    assert!(summary.status.success(), "{}", text(&summary.stderr));
    let csv = text(&summary.stdout);
    for (op, (count, total_ns)) in totals {
        let row: Vec<&str> = csv
            .lines()
            .find(|l| l.split(',').next() == Some(op.as_str()))
            .unwrap_or_else(|| panic!("{op} not in the summary:\n{csv}"))
            .split(',')
            .collect();
        assert_eq!(row[10].parse::<u64>().unwrap(), *count, "{op}");
        let total_us: f64 = row[11].parse().unwrap();
        assert!(
            (total_us - *total_ns as f64 / 1000.0).abs() < 0.01,
            "{op}: summary {total_us} µs, {engine} {total_ns} ns"
        );
    }
}

/// `export --to parquet` of real traces queried by DuckDB (its Python package, embedded): per
/// op, the count and total time equal `ggml-viz summary`'s; two inputs make one dataset.
#[test]
fn duckdb_over_the_parquet_export_gives_the_summary_per_op_totals() {
    let (traces, dataset) = two_ranks_dataset("parquet-duckdb");
    let (header, totals) = engine_op_totals(
        "import duckdb, sys\n\
         spans = f\"'{sys.argv[1]}/spans/*.parquet'\"\n\
         print(*duckdb.sql(f'SELECT count(DISTINCT input), count(DISTINCT process), count(DISTINCT rank) FROM {spans}').fetchall()[0])\n\
         for op, n, total in duckdb.sql(f'SELECT op, count(*), sum(duration_ns) FROM {spans} WHERE op IS NOT NULL GROUP BY op ORDER BY op').fetchall(): print(op, n, total)\n",
        &dataset,
    );
    assert_eq!(header, "2 2 2", "two inputs, two processes, two ranks");
    assert_summary_agrees("DuckDB", &totals, &traces);
    // Threads-mode op timing: an op's rows are its threads' shares of nodes. The calling
    // thread's share lies in its graph compute (it has a parent), the other workers' in none:
    // the rows with a parent count the nodes, as the reader's op analysis joins them.
    let query = run({
        let mut c = Command::new("python3");
        c.arg("-c")
            .arg(
                "import duckdb, sys\n\
                 spans = f\"'{sys.argv[1]}/spans/*.parquet'\"\n\
                 for op, n in duckdb.sql(f'SELECT op, count(*) FILTER (WHERE parent IS NOT NULL) FROM {spans} WHERE op IS NOT NULL GROUP BY op').fetchall(): print(op, n)\n",
            )
            .arg(&dataset);
        c
    });
    assert!(query.status.success(), "{}", text(&query.stderr));
    let nodes: BTreeMap<String, u64> = text(&query.stdout)
        .lines()
        .map(|l| {
            let (op, n) = l.rsplit_once(' ').unwrap();
            (op.to_string(), n.parse().unwrap())
        })
        .collect();
    let mut joined: BTreeMap<String, u64> = BTreeMap::new();
    for trace in &traces {
        let (events, damage, _) = read_trace(trace);
        assert_eq!(damage, None);
        for node in OpAnalysis::collect(events.into_iter().map(Ok)).ops {
            assert!(node.threads >= 2, "{node:?}");
            *joined.entry(node.op.as_str().to_string()).or_default() += 1;
        }
    }
    assert_eq!(nodes, joined);
}

/// The same dataset read by Apache Spark (pyspark in local mode, on the machine's JRE), as a
/// fleet's traces would be: the directory is one table, the same per-op totals.
#[test]
fn spark_over_the_parquet_export_gives_the_summary_per_op_totals() {
    let (traces, dataset) = two_ranks_dataset("parquet-spark");
    let (header, totals) = engine_op_totals(
        "import sys\n\
         from pyspark.sql import SparkSession, functions as F\n\
         spark = SparkSession.builder.master('local[2]').appName('ggml-viz').config('spark.ui.enabled', 'false').getOrCreate()\n\
         spark.sparkContext.setLogLevel('ERROR')\n\
         spans = spark.read.parquet(sys.argv[1] + '/spans')\n\
         ranks = spans.select(F.countDistinct('input'), F.countDistinct('process'), F.countDistinct('rank')).first()\n\
         print(*ranks)\n\
         rows = spans.where(F.col('op').isNotNull()).groupBy('op').agg(F.count('*'), F.sum('duration_ns')).orderBy('op').collect()\n\
         for op, n, total in rows: print(op, n, total)\n\
         spark.stop()\n",
        &dataset,
    );
    assert_eq!(header, "2 2 2", "two inputs, two processes, two ranks");
    assert_summary_agrees("Spark", &totals, &traces);
}

/// `export --to perfetto` with no `-o` refuses a terminal (it once filled a tmux pane with
/// binary), says what to do in one line and exits 1; into a pipe it writes the same bytes as
/// into `-o FILE`.
#[test]
fn perfetto_to_a_terminal_is_refused_and_to_a_pipe_written() {
    let dir = scratch("export-terminal");
    let trace = dir.join("t.ggmlviz");
    synthesize(&trace, 20_000);
    let done = dir.join("done");
    let socket = dir.join("tmux.sock");
    let socket = socket.to_str().unwrap();
    let script = format!(
        "'{}' export --to perfetto '{}'; echo \"rc=$?\" > '{}'; sleep 60",
        ggml_viz().display(),
        trace.display(),
        done.display()
    );
    tmux_session(socket, 120, 10, &script);
    let rc = wait_for_file(&done, std::time::Duration::from_secs(30));
    let screen = tmux(&["-S", socket, "capture-pane", "-p"]);
    tmux(&["-S", socket, "kill-server"]);
    assert_eq!(rc.trim(), "rc=1", "{screen}");
    let said: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(said.len(), 1, "{screen}");
    assert!(
        said[0].contains("-o FILE") && said[0].contains("pipe"),
        "{screen}"
    );

    let file = dir.join("t.pftrace");
    export("perfetto", &trace, &file, &[]);
    let piped = cli(|c| c.args(["export", "--to", "perfetto"]).arg(&trace));
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    assert!(!piped.stdout.is_empty());
    assert_eq!(piped.stdout, std::fs::read(&file).unwrap());
}
