//! The recording core, called directly as a front end would, without preloading anything: what
//! threads record comes out of the trace, read back by the reader, in order and complete.

use std::collections::{BTreeMap, HashSet};

use ggml_viz_config::{Config, Sources};
use ggml_viz_hook::{Entry, GraphInfo, OpInfo, Setup};
use ggml_viz_reader::TraceFile;
use ggml_viz_reader::format::ext::{self, Counters, Metadata, SpanBoundary};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};

const THREADS: usize = 3;
const GRAPHS: usize = 40;
const OPS: usize = 5;

/// The op info of the `op`-th node of a graph.
fn node(op: usize) -> OpInfo {
    OpInfo {
        tensor: (0x100 * (op + 1)) as *mut _,
        op_type: op as u32,
        op_size: 64,
        backend: std::ptr::null_mut(),
        tensor_id: 0,
    }
}

/// A decode's batch: 7 tokens of sequences 3 (two), 0 (four) and 65534 (the largest id a span
/// event carries), plus one of sequences beyond those it names.
const SEQS: [(i32, u32); 3] = [(3, 2), (0, 4), (65534, 0)];

/// One thread's work: GRAPHS graph computes of OPS ops each, inside a decode span, each graph
/// followed by a synchronize wait.
fn work(thread: usize) {
    ggml_viz_hook::span(Entry::LlamaDecode, true, 7, &SEQS, 1);
    for g in 0..GRAPHS {
        let graph = (0x10_000 * (thread + 1) + g) as *mut _;
        let scope = ggml_viz_hook::graph_begin(Entry::GraphCompute, |_| GraphInfo {
            graph,
            n_nodes: OPS as u32,
            n_threads: 1,
            backend: std::ptr::null_mut(),
            name_id: 0,
        })
        .expect("the session is active");
        let recorder = scope.recorder();
        for op in 0..OPS {
            ggml_viz_hook::op_begin(recorder, &node(op));
            ggml_viz_hook::op_end(recorder);
        }
        ggml_viz_hook::graph_end(scope);
        let wait = ggml_viz_hook::wait_begin(Entry::BackendSynchronize, 0x77 as *mut _, |_| 0)
            .expect("waits outside graph computes are recorded without a capture window");
        ggml_viz_hook::wait_end(wait);
    }
    ggml_viz_hook::span(Entry::LlamaDecode, false, 7, &SEQS, 1);
}

/// A thread-pool worker's work (threads-mode op timing): its shares of nodes and its barrier
/// waits, as thread 2 of 4, outside any graph compute of its own.
fn pool_worker() {
    let recorder = ggml_viz_hook::active().expect("the session is active");
    for op in 0..OPS {
        ggml_viz_hook::thread_op(recorder, true, &node(op));
        ggml_viz_hook::thread_op(recorder, false, &node(op));
        let waited_from = ggml_viz_hook::now_ticks();
        ggml_viz_hook::barrier_wait(recorder, std::ptr::null_mut(), 2, 4, waited_from);
    }
}

#[test]
fn what_threads_record_is_in_the_trace_in_order() {
    let dir = std::env::temp_dir().join(format!("ggml-viz-core-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("core.ggmlviz");
    let config = Config::load(&Sources::from_pairs([
        ("GGML_VIZ_OUTPUT", path.to_str().unwrap()),
        ("GGML_VIZ_FLUSH_INTERVAL", "5"),
    ]))
    .unwrap();
    ggml_viz_hook::start_once(|| Setup {
        config: Ok(config),
        ggml_version: Some("0.0.0-core-test".into()),
        cpu_functions: Err("driven by a test".into()),
    });
    assert!(ggml_viz_hook::active().is_some(), "the session started");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || work(t));
        }
    });
    // A compute that returns inside a node (an abort callback): the node is ended with its graph,
    // and the thread records the next compute.
    let stopped_early = std::thread::spawn(|| {
        for _ in 0..2 {
            let scope = ggml_viz_hook::graph_begin(Entry::SchedGraphCompute, |_| GraphInfo {
                graph: 0x9000 as *mut _,
                n_nodes: OPS as u32,
                n_threads: 0,
                backend: std::ptr::null_mut(),
                name_id: 0,
            })
            .expect("the session is active");
            let op = OpInfo {
                tensor: 0x9100 as *mut _,
                op_type: 1,
                op_size: 8,
                backend: std::ptr::null_mut(),
                tensor_id: 0,
            };
            ggml_viz_hook::op_begin(scope.recorder(), &op);
            ggml_viz_hook::graph_end(scope);
        }
    });
    stopped_early.join().unwrap();
    std::thread::spawn(pool_worker).join().unwrap();
    ggml_viz_hook::finish();

    let trace = TraceFile::open(&path, None).unwrap();
    let mut per_thread: BTreeMap<u32, Vec<EventType>> = BTreeMap::new();
    let (mut metadata, mut counters, mut spans) = (None, None, Vec::new());
    let mut barriers = Vec::new();
    for event in trace.events() {
        let event = event.expect("no damage");
        match (event.event_type(), event.payload) {
            (
                Some(ty @ EventType::BarrierWait),
                Payload::Thread {
                    thread_index,
                    n_threads,
                    ..
                },
            ) if event.label.as_deref() == Some(b"ggml_barrier") => {
                barriers.push((event.thread_id, thread_index, n_threads));
                per_thread.entry(event.thread_id).or_default().push(ty);
            }
            (Some(ty), _) => per_thread.entry(event.thread_id).or_default().push(ty),
            (None, Payload::Extension(x)) => {
                let label = event.label.as_deref().unwrap_or_default();
                match x.kind {
                    ExtensionKind::Metadata => metadata = ext::parse_payload::<Metadata>(label),
                    ExtensionKind::Counters => counters = ext::parse_payload::<Counters>(label),
                    ExtensionKind::SpanBegin | ExtensionKind::SpanEnd => spans.push((
                        x.kind,
                        event.thread_id,
                        ext::parse_payload::<SpanBoundary>(label).unwrap(),
                    )),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let metadata = metadata.expect("a metadata record");
    assert_eq!(metadata.ggml_version.as_deref(), Some("0.0.0-core-test"));
    assert_eq!(metadata.pid, std::process::id());
    assert_eq!(counters.expect("a counters record").lost(), 0);

    assert_eq!(per_thread.len(), THREADS + 2, "one event stream per thread");
    // The pool worker: a share and a barrier wait per node, as thread 2 of 4.
    let worker: Vec<EventType> = [
        EventType::OpComputeBegin,
        EventType::OpComputeEnd,
        EventType::BarrierWait,
    ]
    .iter()
    .copied()
    .cycle()
    .take(3 * OPS)
    .collect();
    let (&worker_tid, _) = per_thread
        .iter()
        .find(|(_, events)| **events == worker)
        .unwrap_or_else(|| panic!("no thread recorded {worker:?}: {per_thread:?}"));
    per_thread.remove(&worker_tid);
    assert_eq!(barriers, vec![(worker_tid, 2, 4); OPS]);
    let stopped_early = [
        EventType::GraphComputeBegin,
        EventType::OpComputeBegin,
        EventType::OpComputeEnd,
        EventType::GraphComputeEnd,
    ];
    let stopped_early: Vec<EventType> = stopped_early.iter().copied().cycle().take(8).collect();
    let (tid, _) = per_thread
        .iter()
        .find(|(_, events)| **events == stopped_early)
        .unwrap_or_else(|| panic!("no thread recorded {stopped_early:?}: {per_thread:?}"));
    let tid = *tid;
    per_thread.remove(&tid);
    // Every thread: graph begin, OPS op begin/end pairs, graph end, one wait; GRAPHS times.
    let mut one_graph = vec![EventType::GraphComputeBegin];
    for _ in 0..OPS {
        one_graph.extend([EventType::OpComputeBegin, EventType::OpComputeEnd]);
    }
    one_graph.extend([EventType::GraphComputeEnd, EventType::BarrierWait]);
    let expected: Vec<EventType> = one_graph
        .iter()
        .copied()
        .cycle()
        .take(one_graph.len() * GRAPHS)
        .collect();
    for (tid, events) in &per_thread {
        assert_eq!(events, &expected, "thread {tid}");
    }
    // A decode span opens and closes each thread's work, with its token count and sequences.
    let threads: HashSet<u32> = per_thread.keys().copied().collect();
    assert_eq!(spans.len(), 2 * THREADS);
    for (kind, tid, span) in &spans {
        assert!(threads.contains(tid), "{kind:?} on an unknown thread");
        assert_eq!(
            (span.name.as_str(), span.n_tokens),
            ("llama_decode", Some(7))
        );
        assert_eq!(span.seqs, SEQS);
        assert_eq!(span.other_seq_tokens, 1);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
