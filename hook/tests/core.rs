//! The recording core, called directly as a front end would, without preloading anything: what
//! threads record comes out of the trace, read back by the reader, in order and complete.

use std::collections::{BTreeMap, HashSet};

use ggml_viz_config::{Config, Sources};
use ggml_viz_format::ext::{self, Counters, Metadata, RpcBoundary, RpcPart, SpanBoundary};
use ggml_viz_format::{EventType, ExtensionKind, Payload};
use ggml_viz_hook::{Entry, GraphInfo, OpInfo, Setup, ShareEdge, ThisThread, Transfer};
use ggml_viz_reader::TraceFile;

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
/// waits, as thread 2 of 4, outside any graph compute of its own. Node 1's share lasts at least
/// [`LONG_SHARE`]; node 2's holds a barrier wait of its own (as a matrix multiplication's do),
/// which begins [`LONG_SHARE`] or more after the share.
/// Each share ends as the wait after it begins (the two then take one ring slot).
fn pool_worker() {
    let recorder = ggml_viz_hook::active().expect("the session is active");
    let this = ThisThread::get();
    for op in 0..OPS {
        ggml_viz_hook::thread_op(this, recorder, ShareEdge::Begin, &node(op));
        if op == 1 {
            std::thread::sleep(LONG_SHARE);
        }
        if op == 2 {
            std::thread::sleep(LONG_SHARE);
            let waited_from = ggml_viz_hook::now_ticks();
            ggml_viz_hook::barrier_wait(this, recorder, std::ptr::null_mut(), 2, 4, waited_from);
        }
        let ended = ggml_viz_hook::thread_op(this, recorder, ShareEdge::EndAtWait, &node(op));
        ggml_viz_hook::barrier_wait(this, recorder, std::ptr::null_mut(), 2, 4, ended);
    }
}

const LONG_SHARE: std::time::Duration = std::time::Duration::from_millis(3);

/// One ggml-rpc exchange as the transport carries it, in the order ggml-rpc's client and
/// server make their calls: (command, request payload bytes, answer payload bytes if answered).
const EXCHANGE: [(u8, usize, Option<usize>); 4] = [
    (14, 24, Some(36)), // HELLO
    (10, 1805, None),   // GRAPH_COMPUTE: no answer
    (8, 40, Some(96)),  // GET_TENSOR
    (15, 0, Some(4)),   // DEVICE_COUNT: an empty request
];

/// A transport call on the fake socket at `socket`, before and after, as the front end reports it.
fn transport(socket: usize, transfer: Transfer, bytes: &mut [u8]) {
    // SAFETY: `bytes` is readable and writable for its length.
    unsafe {
        ggml_viz_hook::rpc_before(socket, transfer, bytes.as_ptr(), bytes.len());
        ggml_viz_hook::rpc_after(socket, transfer, bytes.as_ptr(), bytes.len(), true);
    }
}

/// The client's side of [`EXCHANGE`]: command byte, size, payload, flush; then the answer.
fn rpc_client(socket: usize) {
    ggml_viz_hook::rpc_connected(socket, "10.0.0.2:50052");
    for (command, request, answer) in EXCHANGE {
        transport(socket, Transfer::Send, &mut [command]);
        transport(socket, Transfer::Send, &mut (request as u64).to_le_bytes());
        transport(socket, Transfer::Send, &mut vec![0; request]);
        transport(socket, Transfer::Flush, &mut []);
        if let Some(answer) = answer {
            transport(socket, Transfer::Recv, &mut (answer as u64).to_le_bytes());
            transport(socket, Transfer::Recv, &mut vec![0; answer]);
        }
    }
}

/// The server's side: it reads each command and its payload, answers, and waits for the next,
/// until the client closes (a failed read).
fn rpc_server(socket: usize) {
    ggml_viz_hook::rpc_listening("0.0.0.0:50052");
    for (command, request, answer) in EXCHANGE {
        transport(socket, Transfer::Recv, &mut [command]);
        transport(socket, Transfer::Recv, &mut (request as u64).to_le_bytes());
        transport(socket, Transfer::Recv, &mut vec![0; request]);
        if let Some(answer) = answer {
            transport(socket, Transfer::Send, &mut (answer as u64).to_le_bytes());
            transport(socket, Transfer::Send, &mut vec![0; answer]);
            transport(socket, Transfer::Flush, &mut []);
        }
    }
    let mut closed = [0u8];
    // SAFETY: as in `transport`.
    unsafe {
        ggml_viz_hook::rpc_before(socket, Transfer::Recv, closed.as_mut_ptr(), 1);
        ggml_viz_hook::rpc_after(socket, Transfer::Recv, closed.as_mut_ptr(), 1, false);
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
        prepare_op_timing: |_| {},
        before_last_flush: || {},
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
    std::thread::spawn(|| rpc_client(0x5000)).join().unwrap();
    std::thread::spawn(|| rpc_server(0x6000)).join().unwrap();
    ggml_viz_hook::finish();

    let trace = TraceFile::open(&path, None).unwrap();
    let mut per_thread: BTreeMap<u32, Vec<EventType>> = BTreeMap::new();
    // The same events' times.
    let mut times: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let (mut metadata, mut counters, mut spans) = (None, None, Vec::new());
    let mut barriers = Vec::new();
    // Per thread, when each of its barrier waits began.
    let mut waits_began: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut rpc = Vec::new();
    for event in trace.events() {
        let event = event.expect("no damage");
        if let Some(ty) = event.event_type() {
            per_thread.entry(event.thread_id).or_default().push(ty);
            times
                .entry(event.thread_id)
                .or_default()
                .push(event.timestamp_ns);
        }
        match (event.event_type(), event.payload) {
            (
                Some(EventType::BarrierWait),
                Payload::Thread {
                    thread_index,
                    n_threads,
                    value,
                    ..
                },
            ) if event.label.as_deref() == Some(b"ggml_barrier") => {
                barriers.push((event.thread_id, thread_index, n_threads));
                (waits_began.entry(event.thread_id).or_default()).push(event.timestamp_ns - value);
            }
            (None, Payload::Extension(x)) => {
                let label = event.label.as_deref().unwrap_or_default();
                match x.kind {
                    ExtensionKind::Metadata => metadata = ext::parse_payload::<Metadata>(label),
                    ExtensionKind::Counters => counters = ext::parse_payload::<Counters>(label),
                    ExtensionKind::RpcBegin | ExtensionKind::RpcEnd => rpc.push((
                        x.kind == ExtensionKind::RpcBegin,
                        ext::parse_payload::<RpcBoundary>(label).unwrap(),
                    )),
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
    // The pool worker: a share and a barrier wait per node, as thread 2 of 4, and node 2's
    // wait within its share.
    let mut worker = Vec::new();
    for op in 0..OPS {
        worker.push(EventType::OpComputeBegin);
        if op == 2 {
            worker.push(EventType::BarrierWait);
        }
        worker.extend([EventType::OpComputeEnd, EventType::BarrierWait]);
    }
    let (&worker_tid, _) = per_thread
        .iter()
        .find(|(_, events)| **events == worker)
        .unwrap_or_else(|| panic!("no thread recorded {worker:?}: {per_thread:?}"));
    per_thread.remove(&worker_tid);
    assert_eq!(barriers, vec![(worker_tid, 2, 4); OPS + 1]);
    // Its times run forward, and node 1's share (begin at index 3, end at 4) lasted as long as
    // its sleep at least.
    let worker_times = &times[&worker_tid];
    assert!(
        worker_times.windows(2).all(|w| w[0] <= w[1]),
        "{worker_times:?}"
    );
    let long_share = worker_times[4] - worker_times[3];
    assert!(
        long_share >= LONG_SHARE.as_nanos() as u64,
        "node 1's share took {long_share} ns, it slept {LONG_SHARE:?}"
    );
    // Each wait after a share began as the share ended (one clock read; each conversion to
    // nanoseconds rounds down); node 2's wait inside its share, within it.
    let ends: Vec<u64> = (worker.iter().zip(worker_times))
        .filter(|(ty, _)| **ty == EventType::OpComputeEnd)
        .map(|(_, &t)| t)
        .collect();
    let mut began = waits_began[&worker_tid].clone();
    // Node 2's: the third wait, between its share's begin (at index 6) and its own time.
    let inside = began.remove(2);
    assert!(worker_times[6] <= inside && inside <= worker_times[7]);
    assert!(
        inside - worker_times[6] >= LONG_SHARE.as_nanos() as u64,
        "node 2's share began at {}, its wait inside at {inside}, it slept {LONG_SHARE:?} between",
        worker_times[6]
    );
    assert_eq!(began.len(), ends.len());
    for (wait, end) in began.iter().zip(&ends) {
        assert!(
            wait.abs_diff(*end) <= 2,
            "a wait began at {wait}, its share ended at {end}"
        );
    }
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
    // The RPC exchange, from the framing alone: on each end every command opens and closes
    // in order, numbered from the HELLO, with the bytes the framing says (command byte, 8-byte
    // size and payload; an answer's size and payload).
    let edge = |begin: bool, part: RpcPart, index: usize, sent: u64, received: u64| {
        let (command, ..) = EXCHANGE[index];
        RpcBoundary {
            part,
            command,
            connection: 0,
            index: index as u32,
            endpoint: None,
            sent: if begin { 0 } else { sent },
            received: if begin { 0 } else { received },
        }
    };
    // Begin records name the endpoint: the client's the server it dialled, the server's the
    // address it serves.
    let named = |mut ends: Vec<(bool, RpcBoundary)>, endpoint: &str| {
        for (begin, b) in &mut ends {
            b.endpoint = begin.then(|| endpoint.to_string());
        }
        ends
    };
    let mut client = Vec::new();
    let mut server = Vec::new();
    for (i, (_, request, answer)) in EXCHANGE.iter().enumerate() {
        let request_bytes = 1 + 8 + *request as u64;
        client.push((true, edge(true, RpcPart::Request, i, 0, 0)));
        client.push((false, edge(false, RpcPart::Request, i, request_bytes, 0)));
        server.push((true, edge(true, RpcPart::Serve, i, 0, 0)));
        if let Some(answer) = answer {
            let answer_bytes = 8 + *answer as u64;
            client.push((true, edge(true, RpcPart::Answer, i, 0, 0)));
            client.push((false, edge(false, RpcPart::Answer, i, 0, answer_bytes)));
            server.push((true, edge(true, RpcPart::Answer, i, 0, 0)));
            server.push((false, edge(false, RpcPart::Answer, i, answer_bytes, 0)));
        }
        server.push((
            false,
            edge(
                false,
                RpcPart::Serve,
                i,
                answer.map_or(0, |a| 8 + a as u64),
                request_bytes,
            ),
        ));
    }
    // Connections are numbered per process, from 1: the client's HELLO came first.
    let mut ends: [Vec<(bool, RpcBoundary)>; 2] = Default::default();
    for (begin, mut b) in rpc {
        let n = std::mem::take(&mut b.connection);
        assert!(n == 1 || n == 2, "connection {n}");
        ends[n as usize - 1].push((begin, b));
    }
    assert_eq!(ends[0], named(client, "10.0.0.2:50052"));
    assert_eq!(ends[1], named(server, "0.0.0.0:50052"));
    std::fs::remove_dir_all(&dir).unwrap();
}
