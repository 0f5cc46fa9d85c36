//! Threads-mode op timing (`GGML_VIZ_OP_TIMING=auto|threads`) on real llama.cpp and on ggml
//! driven through ctypes: the run is unchanged, every worker thread records its share of every
//! node, and the nodes are exactly the ones ggml computes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use ggml_viz_e2e::*;
use ggml_viz_reader::format::ext::{self, Metadata, TensorInfo};
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};
use ggml_viz_reader::{Event, OpAnalysis};

/// Ops ggml's CPU backend skips without computing (`ggml_op_is_empty`).
pub(crate) const NOPS: [&str; 5] = ["NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"];

pub(crate) fn settings(events: &[Event<'_>]) -> serde_json::Map<String, serde_json::Value> {
    let e = events
        .iter()
        .find(|e| matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::Metadata))
        .expect("a metadata record");
    ext::parse_payload::<Metadata>(e.label.as_deref().unwrap())
        .expect("our metadata parses")
        .settings
}

/// Per thread: its op spans (begin, end) in order, checked not to overlap; and the barrier waits'
/// (thread index, thread count) per thread. Per op name, per share, the barrier waits inside it.
/// Per thread, its waits inside its shares and between them: (count, time) of each. Of all
/// MUL_MAT shares, their time, the waits inside them and the waits right after them. A wait
/// recorded right after a share of its thread begins where the share ended: the hook reads the
/// clock once for both and stores the share (or its end) and the wait in one slot, whose times
/// the writer converts with one calibration. Checked for every such wait (the hook of stop 57,
/// which stored the end of a share with a wait inside it and the wait after it in two slots, a
/// flush between them now and then, failed it in 5 to 7 of the 13 threads tests: 1 to 11 of
/// 1,248 waits off by up to 12 ns).
pub(crate) struct Shares {
    spans: BTreeMap<u32, Vec<(u64, u64)>>,
    barriers: BTreeMap<u32, BTreeSet<(u32, u32)>>,
    waits_inside: BTreeMap<String, Vec<usize>>,
    waits: BTreeMap<u32, [(u64, u64); 2]>,
    pub(crate) mul_mat_ns: (u64, u64, u64),
}

pub(crate) fn shares(events: &[Event<'_>]) -> Shares {
    // Per thread, its open share: when it began, its op's name, the waits inside it so far (a
    // thread's events come in the order it recorded them); and the threads whose last share was a
    // MUL_MAT's.
    let mut open: HashMap<u32, (u64, String, usize)> = HashMap::new();
    let mut after_mul_mat: HashSet<u32> = HashSet::new();
    // Per thread, the end of its share when that was the thread's last event; the waits right
    // after a share, and of them those that began within 2 ns of its end (each conversion of
    // ticks rounds down).
    let mut just_ended: HashMap<u32, u64> = HashMap::new();
    let mut after_share = (0usize, 0usize);
    let mut names = ggml_viz_reader::NameTables::default();
    let mut s = Shares {
        spans: BTreeMap::new(),
        barriers: BTreeMap::new(),
        waits_inside: BTreeMap::new(),
        waits: BTreeMap::new(),
        mul_mat_ns: (0, 0, 0),
    };
    for e in events {
        let share_end = just_ended.remove(&e.thread_id);
        match (e.event_type(), e.payload) {
            (_, Payload::Extension(x)) if x.kind == ExtensionKind::OpNames => {
                names.take(x.kind, e.label.as_deref().unwrap());
            }
            (Some(EventType::OpComputeBegin), Payload::Op { op_type, .. }) => {
                let op = names.op(None, op_type).to_string();
                assert!(
                    open.insert(e.thread_id, (e.timestamp_ns, op, 0)).is_none(),
                    "two shares open at once on thread {}",
                    e.thread_id
                );
            }
            (Some(EventType::OpComputeEnd), _) => {
                let (begin, op, waits) = open.remove(&e.thread_id).expect("an end without a begin");
                assert!(e.timestamp_ns >= begin);
                let mul_mat = op == "MUL_MAT";
                s.waits_inside.entry(op).or_default().push(waits);
                if mul_mat {
                    s.mul_mat_ns.0 += e.timestamp_ns - begin;
                    after_mul_mat.insert(e.thread_id);
                } else {
                    after_mul_mat.remove(&e.thread_id);
                }
                s.spans
                    .entry(e.thread_id)
                    .or_default()
                    .push((begin, e.timestamp_ns));
                just_ended.insert(e.thread_id, e.timestamp_ns);
            }
            (
                Some(EventType::BarrierWait),
                Payload::Thread {
                    thread_index,
                    n_threads,
                    value,
                    ..
                },
            ) if e.label.as_deref() == Some(b"ggml_barrier") => {
                if let Some(end) = share_end {
                    // Within the nanosecond each conversion of ticks rounds down.
                    let began = e.timestamp_ns - value;
                    after_share.0 += 1;
                    after_share.1 += usize::from(began.abs_diff(end) <= 2);
                }
                let inside = open.get_mut(&e.thread_id).map(|(_, op, waits)| {
                    *waits += 1;
                    op == "MUL_MAT"
                });
                let (count, ns) =
                    &mut s.waits.entry(e.thread_id).or_default()[usize::from(inside.is_none())];
                *count += 1;
                *ns += value;
                match inside {
                    Some(true) => s.mul_mat_ns.1 += value,
                    None if after_mul_mat.contains(&e.thread_id) => s.mul_mat_ns.2 += value,
                    _ => {}
                }
                s.barriers
                    .entry(e.thread_id)
                    .or_default()
                    .insert((thread_index, n_threads));
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "shares never ended: {open:?}");
    let (waits, began_there) = after_share;
    // Where threads waited at all, waits came right after shares (every node ends at one).
    assert!(
        s.barriers.is_empty() || waits > 0,
        "barrier waits, none right after a share"
    );
    assert!(
        began_there == waits,
        "of {waits} waits right after a share, {began_there} began where it ended"
    );
    s
}

/// Nodes per op name, from the joined nodes of a trace.
pub(crate) fn nodes_by_op(events: &[Event<'_>]) -> BTreeMap<String, usize> {
    let a = OpAnalysis::collect(events.iter().cloned().map(Ok));
    let mut by_op = BTreeMap::new();
    for o in &a.ops {
        *by_op.entry(o.op.to_string()).or_default() += 1;
    }
    by_op
}

/// How llama-simple runs in a check: its build, its model, the directory of another
/// libggml-cpu to load first (ggml's own thread pool instead of OpenMP), if any, the ops
/// whose every node waits for its threads inside (and which the model must have), and its
/// threads: ggml's default 4, or fewer under `OMP_THREAD_LIMIT` (OpenMP builds), which ggml
/// takes as the thread count of every graph.
struct Run<'a> {
    name: &'a str,
    bin: PathBuf,
    model: &'a Path,
    libs: Option<&'a Path>,
    waiting_ops: &'a [&'a str],
    threads: u32,
}

impl Run<'_> {
    fn simple(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("llama-simple"));
        cmd.arg("-m")
            .arg(self.model)
            .args(["-n", "8", "hello world"]);
        if let Some(libs) = self.libs {
            cmd.env("LD_LIBRARY_PATH", libs);
        }
        if self.threads == 4 {
            cmd.env_remove("OMP_THREAD_LIMIT");
        } else {
            cmd.env("OMP_THREAD_LIMIT", self.threads.to_string());
        }
        cmd
    }
}

/// llama-simple traced in threads mode: the output is unchanged, every node ggml computes is
/// there once with a share from each of its threads, fused pairs are one node, each thread waits
/// at barriers with an index of its own (one thread waits for no one). Returns the shares and the
/// threads-mode trace's events.
fn every_worker_records_its_share_of_every_node(how: &Run<'_>) -> (Shares, Vec<Event<'static>>) {
    let dir = scratch(&format!("threads-{}", how.name));
    let plain = run(how.simple());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = |file: &str, extra: &[(&str, &str)]| {
        let path = dir.join(file);
        let mut all = vec![("GGML_VIZ_OUTPUT", path.to_str().unwrap())];
        all.extend_from_slice(extra);
        let out = run(with_hook(how.simple(), &all));
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            text(&plain.stdout),
            "{}: op timing ({extra:?}) changed the output",
            how.name
        );
        read_trace(&path).0
    };
    let threads = trace("threads.ggmlviz", &[]);
    // Flushed every millisecond: workers' shares and their graph's begin are often drained by
    // different flushes, whose times must still agree (the clock's conversion).
    let unfused = trace(
        "unfused.ggmlviz",
        &[
            ("GGML_CPU_DISABLE_FUSION", "1"),
            ("GGML_VIZ_FLUSH_INTERVAL", "1"),
        ],
    );
    let sched = trace("sched.ggmlviz", &[("GGML_VIZ_OP_TIMING", "sched")]);

    let mode = settings(&threads);
    assert_eq!(mode["op_timing"], "auto");
    assert_eq!(mode["op_timing_mode"], "threads", "{mode:?}");
    assert_eq!(settings(&sched)["op_timing_mode"], "sched");
    check_nesting(&threads);
    check_tensor_infos(&threads);
    check_tensor_infos(&unfused);

    // Every thread that computed waits at barriers as one index of 4, and the 4 indices are
    // there (OpenMP keeps 4 threads; ggml's own pool without a persistent pool makes new workers
    // for each graph). One thread records no wait.
    let s = shares(&threads);
    let n = how.threads;
    assert!(
        s.spans.len() >= n as usize,
        "threads with shares: {:?}",
        s.spans.keys()
    );
    let mut indices = BTreeSet::new();
    for (tid, seen) in &s.barriers {
        assert_eq!(seen.len(), 1, "thread {tid} waited as {seen:?}");
        let (ith, nth) = *seen.iter().next().unwrap();
        assert_eq!(nth, n);
        indices.insert(ith);
    }
    if n > 1 {
        assert_eq!(indices, (0..n).collect());
    } else {
        assert_eq!(s.barriers.len(), 0, "waits at one thread: {:?}", s.barriers);
    }
    // The waits inside an op are there too, in each thread's share of every node of the ops
    // that wait for their threads (ggml-cpu.c: mul_mat once it has shared out its chunks,
    // mul_mat_id once they have converted its input).
    for op in how.waiting_ops {
        let waits = s.waits_inside.get(*op).map_or(&[][..], Vec::as_slice);
        assert!(!waits.is_empty(), "{}: no {op} share", how.name);
        assert!(
            waits.iter().all(|&n| n >= 1),
            "{}: {op} shares without a wait inside: {} of {}",
            how.name,
            waits.iter().filter(|&&n| n == 0).count(),
            waits.len()
        );
    }

    // Every thread's shares lie inside the main thread's innermost graph computes (the CPU
    // backend's, inside the scheduler's), begin and end: the share of a graph's last node ends
    // at the barrier after the graph's nodes.
    let main = threads
        .iter()
        .find(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap()
        .thread_id;
    let mut graphs = Vec::new();
    // Per open graph compute: its begin, and whether another began inside it.
    let mut open: Vec<(u64, bool)> = Vec::new();
    for e in threads.iter().filter(|e| e.thread_id == main) {
        match e.event_type() {
            Some(EventType::GraphComputeBegin) => {
                if let Some(outer) = open.last_mut() {
                    outer.1 = true;
                }
                open.push((e.timestamp_ns, false));
            }
            Some(EventType::GraphComputeEnd) => {
                let (begin, outer) = open.pop().unwrap();
                if !outer {
                    graphs.push((begin, e.timestamp_ns));
                }
            }
            _ => {}
        }
    }
    assert!(!graphs.is_empty());
    for (tid, spans) in &s.spans {
        for &(begin, end) in spans {
            let graph = graphs.partition_point(|&(start, _)| start <= begin);
            assert!(
                graph > 0 && end <= graphs[graph - 1].1,
                "{}: a share of thread {tid} ({begin}..{end}) outside its graph",
                how.name
            );
        }
    }

    // Every node ggml computes, once: the eval callback sees every node, the NOPs too; without
    // fusion, threads mode has each computed node; with it, each fused pair is one node.
    let mut expected = nodes_by_op(&sched);
    for nop in NOPS {
        expected.remove(nop);
    }
    let unfused_nodes = nodes_by_op(&unfused);
    assert_eq!(
        unfused_nodes, expected,
        "{}: unfused nodes vs the scheduler's",
        how.name
    );
    let fused_nodes = nodes_by_op(&threads);
    let fused = fused_nodes.get("RMS_NORM+MUL").copied().unwrap_or(0);
    assert!(fused > 0, "no fused call recorded: {fused_nodes:?}");
    let total = |m: &BTreeMap<String, usize>| m.values().sum::<usize>();
    assert_eq!(total(&fused_nodes) + fused, total(&unfused_nodes));
    assert_eq!(
        fused_nodes.get("RMS_NORM"),
        None,
        "fused RMS_NORMs are not nodes of their own"
    );
    assert_eq!(
        fused_nodes.get("MUL").copied().unwrap_or(0) + fused,
        unfused_nodes["MUL"],
        "each fused call covers one MUL"
    );
    let a = OpAnalysis::collect(threads.iter().cloned().map(Ok));
    assert!(
        a.ops.iter().all(|o| o.threads == n),
        "a node without {n} shares"
    );
    // Each thread's waits inside its shares (mul_mat's, ...) and between them, as the events
    // themselves place them, are what the analysis counts as each.
    for t in &a.threads {
        assert_eq!(
            [(t.inner_waits, t.inner_wait_ns), (t.waits, t.wait_ns)],
            s.waits.get(&t.thread_id).copied().unwrap_or_default(),
            "{}: thread {}'s waits inside and between shares",
            how.name,
            t.thread_id
        );
    }
    // The nodes carry the waits inside their shares.
    assert_eq!(
        a.ops.iter().map(|o| o.inner_wait_ns).sum::<u64>(),
        s.waits.values().map(|w| w[0].1).sum::<u64>()
    );
    let shares_total: usize = s.spans.values().map(Vec::len).sum();
    assert_eq!(shares_total, n as usize * a.ops.len());

    // `ggml-viz ops` says the mode and shows the threads' time; `--by thread` lists them.
    let ops = |args: &[&str]| {
        text(&cli(|c| c.arg("ops").args(args).arg(dir.join("threads.ggmlviz"))).stdout)
    };
    let table = ops(&["--top", "0"]);
    assert!(table.contains("op timing: threads"), "{table}");
    assert_eq!(
        table.contains("thread time") && table.contains("imbal"),
        n > 1,
        "{table}"
    );
    let by_thread = ops(&["--by", "thread"]);
    for tid in s.spans.keys() {
        assert!(
            by_thread.contains(&format!("\n{tid} ")),
            "{tid}: {by_thread}"
        );
    }
    (s, threads)
}

#[test]
fn openmp_workers_record_their_share_of_every_node_and_nothing_changes() {
    every_worker_records_its_share_of_every_node(&Run {
        name: "openmp",
        bin: llama_bin(),
        model: &tiny_model(),
        libs: None,
        waiting_ops: &["MUL_MAT"],
        threads: 4,
    });
}

/// Two threads on one core (`taskset -c 0`): at each barrier the thread that gets there first
/// waits while the other has the core for its share, so the two spend about as long waiting at
/// barriers as in their shares (measured, 3 runs: waits 2.1 to 2.2 times the shares). A wait
/// recorded as beginning where it ends puts that time in the share before it instead (this
/// hook with its stamp taken after ggml's barrier returned, which every other check here
/// passed: waits a 20th of the shares). Checked: the waits take at least half the shares' time.
#[test]
fn two_threads_on_one_core_spend_about_as_long_waiting_as_in_their_shares() {
    let dir = scratch("threads-one-core");
    let how = Run {
        name: "one-core",
        bin: llama_bin(),
        model: &tiny_model(),
        libs: None,
        waiting_ops: &["MUL_MAT"],
        threads: 2,
    };
    let path = dir.join("one-core.ggmlviz");
    let simple = how.simple();
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0"])
        .arg(simple.get_program())
        .args(simple.get_args());
    for (key, value) in simple.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let out = run(with_hook(
        cmd,
        &[("GGML_VIZ_OUTPUT", path.to_str().unwrap())],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = shares(&read_trace(&path).0);
    assert_eq!(
        s.waits.len(),
        2,
        "threads that waited: {:?}",
        s.waits.keys()
    );
    let shares_ns: u64 = s.spans.values().flatten().map(|(b, e)| e - b).sum();
    let waits_ns: u64 = s.waits.values().map(|w| w[0].1 + w[1].1).sum();
    let waits: u64 = s.waits.values().map(|w| w[0].0 + w[1].0).sum();
    assert!(
        2 * waits_ns > shares_ns,
        "{waits} waits took {waits_ns} ns, the shares {shares_ns} ns"
    );
}

/// ggml linked into llama-simple itself (an OpenMP build): the compiler inlined `ggml_barrier`
/// into ggml's graph loop, which calls OpenMP's `GOMP_barrier` directly after each node (at
/// several threads; at one, nothing). Each share still ends at the barrier after its node,
/// inside its graph, and the nodes are the scheduler's, at 4 threads and at one, and for a
/// mixture-of-experts model (whose `mul_mat_id` calls `ggml_barrier` itself).
#[test]
fn a_static_executable_records_every_workers_share_of_every_node() {
    for threads in [4, 1] {
        every_worker_records_its_share_of_every_node(&Run {
            name: &format!("static-{threads}"),
            bin: llama_static_bin(),
            model: &tiny_model(),
            libs: None,
            waiting_ops: if threads > 1 { &["MUL_MAT"] } else { &[] },
            threads,
        });
    }
    moe_shares_wait_once_inside("static-moe", llama_static_bin());
}

#[test]
fn ggml_thread_pool_workers_record_their_share_of_every_node() {
    let libs = llama_threadpool_lib();
    let deps = ldd(&libs.join("libggml-cpu.so"));
    assert!(!deps.contains("libgomp"), "{deps}");
    every_worker_records_its_share_of_every_node(&Run {
        name: "threadpool",
        bin: llama_bin(),
        model: &tiny_model(),
        libs: Some(&libs),
        waiting_ops: &["MUL_MAT"],
        threads: 4,
    });
}

/// `GGML_BACKEND_DL=ON`: llama-simple finds its CPU backend at run time and loads it with
/// `dlopen(RTLD_LOCAL)`, as Python wheels and distributions ship ggml. The backend's calls still
/// reach the hook's wrappers, which find the real functions in the module's own scope.
#[test]
fn a_cpu_backend_loaded_with_dlopen_is_timed_per_thread() {
    let bin = llama_dl_bin();
    assert!(
        !ldd(&bin.join("llama-simple")).contains("libggml-cpu"),
        "the CPU backend is linked in, not loaded"
    );
    assert!(bin.join("libggml-cpu.so").exists());
    every_worker_records_its_share_of_every_node(&Run {
        name: "backend-dl",
        bin,
        model: &tiny_model(),
        libs: None,
        waiting_ops: &["MUL_MAT"],
        threads: 4,
    });
}

/// A mixture-of-experts model: its experts' products are MUL_MAT_ID nodes, which ggml computes
/// in a function no wrapper reaches (`ggml_compute_forward_mul_mat_id` is static in ggml-cpu.c)
/// and which waits at a barrier inside, once the threads have converted its input. Each thread's
/// share of such a node still runs from the node's start to the barrier after it, with that wait
/// inside it, and the other nodes are as in a dense model.
#[test]
fn mixture_of_experts_nodes_are_timed_whole() {
    let events = moe_shares_wait_once_inside("moe", llama_bin());
    // Their work: each token's 2 experts multiply by a 64×128 matrix (gate, up) or a 128×64 one
    // (down), 2 flops per multiply-add.
    let mut products = 0;
    for e in &events {
        if let Payload::Extension(x) = e.payload
            && x.kind == ExtensionKind::TensorInfo
        {
            let info: ext::TensorInfo = ext::parse_payload(e.label.as_deref().unwrap()).unwrap();
            if info.op_name.as_deref() == Some("MUL_MAT_ID") {
                let tokens = info.ne[2] as u64;
                assert_eq!(info.ne[1], 2, "{info:?}");
                assert_eq!(info.flops, Some(2 * 64 * 128 * 2 * tokens), "{info:?}");
                products += 1;
            }
        }
    }
    assert!(products >= 6, "{products} MUL_MAT_ID tensor infos");

    // At one thread its barrier waits for no one, and a share of the node still holds the
    // products: a MUL_MAT_ID node's median time is about what the eval callback measures, which
    // times each node whole (ended at the barrier inside, the shares held 5 % of it). Medians:
    // with the other tests running, a node now and then waits for a core.
    let dir = scratch("threads-moe-1");
    let mul_mat_id_median = |mode: &str| {
        let path = dir.join(format!("{mode}.ggmlviz"));
        let mut bench = Command::new(llama_bin().join("llama-bench"));
        bench.arg("-m").arg(tiny_moe_model());
        bench.args(["-t", "1", "-p", "8", "-n", "32", "-r", "1"]);
        let out = run(with_hook(
            bench,
            &[
                ("GGML_VIZ_OUTPUT", path.to_str().unwrap()),
                ("GGML_VIZ_OP_TIMING", mode),
            ],
        ));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let events = read_trace(&path).0;
        let a = OpAnalysis::collect(events.iter().cloned().map(Ok));
        let mut nodes: Vec<u64> = a
            .ops
            .iter()
            .filter(|o| &*o.op == "MUL_MAT_ID")
            .map(|o| o.duration_ns)
            .collect();
        // 2 layers, 3 products each, in the graphs of the prompt, 32 generation steps and
        // llama-bench's two warm-up runs (a prompt's and a step's).
        assert_eq!(nodes.len(), 6 * 35, "{mode}");
        nodes.sort_unstable();
        nodes[nodes.len() / 2] as f64
    };
    let ratio = mul_mat_id_median("threads") / mul_mat_id_median("sched");
    assert!(
        ratio > 0.4,
        "MUL_MAT_ID at one thread: {ratio:.3} of the eval callback's median"
    );
}

/// The threads-mode check of llama-simple from `bin` on the mixture-of-experts model, whose
/// MUL_MAT_ID shares each hold one barrier wait: mul_mat_id's own (ggml-cpu.c); the one after
/// the node is not in the share. Returns the trace's events.
fn moe_shares_wait_once_inside(name: &str, bin: PathBuf) -> Vec<Event<'static>> {
    let (s, events) = every_worker_records_its_share_of_every_node(&Run {
        name,
        bin,
        model: &tiny_moe_model(),
        libs: None,
        waiting_ops: &["MUL_MAT", "MUL_MAT_ID"],
        threads: 4,
    });
    let waits = &s.waits_inside["MUL_MAT_ID"];
    assert!(
        waits.iter().all(|&n| n == 1),
        "{name}: waits inside MUL_MAT_ID shares: {waits:?}"
    );
    events
}

/// A Q4_0 model (llama-quantize of the same build, every weight Q4_0): its weights are
/// repacked for the CPU (`CPU_REPACK`) and multiplied without any `ggml_compute_forward_*`
/// call; the MUL_MATs are there all the same. Its output projection, the graph's last node, is
/// repacked too (the vocabulary is padded for it): its shares end at the barrier after the
/// graph's nodes, though no per-op call computed the node.
#[test]
fn repacked_quantized_weights_are_timed_too() {
    let dir = scratch("threads-q4");
    let model = dir.join("tiny-q4_0.gguf");
    let quantize = run({
        let mut c = Command::new(llama_bin().join("llama-quantize"));
        c.arg("--pure")
            .arg(tiny_padded_model())
            .arg(&model)
            .arg("Q4_0");
        c
    });
    assert!(quantize.status.success(), "{}", text(&quantize.stderr));
    let repacked = run({
        let mut c = Command::new(llama_bin().join("llama-simple"));
        c.arg("-m").arg(&model).args(["-n", "1", "hello"]);
        c
    });
    assert!(
        text(&repacked.stderr).contains("CPU_REPACK model buffer size"),
        "{}",
        text(&repacked.stderr)
    );
    every_worker_records_its_share_of_every_node(&Run {
        name: "q4_0",
        bin: llama_bin(),
        model: &model,
        libs: None,
        waiting_ops: &["MUL_MAT"],
        threads: 4,
    });
}

#[test]
fn ctypes_graphs_at_one_two_and_four_threads_keep_their_results() {
    for n in ["1", "2", "4"] {
        let dir = scratch(&format!("threads-ctypes-{n}"));
        let path = dir.join("t.ggmlviz");
        let args = ["--nodes", "6", "--repeat", "3", "--threads", n];
        let plain = run(fixture_cmd(&[&llama_bin()], &args));
        assert!(plain.status.success(), "{}", text(&plain.stderr));
        let traced = run(with_hook(
            fixture_cmd(&[&llama_bin()], &args),
            &[
                ("GGML_VIZ_OUTPUT", path.to_str().unwrap()),
                ("GGML_VIZ_OP_TIMING", "threads"),
            ],
        ));
        assert!(traced.status.success(), "{}", text(&traced.stderr));
        assert_eq!(text(&traced.stdout), text(&plain.stdout), "at {n} threads");
        let (events, damage, _) = read_trace(&path);
        assert_eq!(damage, None);
        assert_eq!(settings(&events)["op_timing_mode"], "threads");
        let s = shares(&events);
        let n: usize = n.parse().unwrap();
        assert_eq!(s.spans.len(), n, "threads with shares at {n}");
        // 3 graphs of 6 additions: 18 nodes, each on every thread.
        for spans in s.spans.values() {
            assert_eq!(spans.len(), 18);
        }
        let a = OpAnalysis::collect(events.iter().cloned().map(Ok));
        assert_eq!(a.ops.len(), 18);
        assert!(
            a.ops
                .iter()
                .all(|o| o.op == "ADD" && o.threads as usize == n)
        );
        // One thread: ggml_barrier returns at once and is not recorded.
        assert_eq!(s.barriers.is_empty(), n == 1);
    }
}

/// The hook wraps every per-op function the CPU backend of the build exports, but the helpers
/// ggml calls only from inside another op; beyond those, only the names earlier ggml versions
/// declared in `ggml-cpu/ops.h` (ggml's history from the CPU backend's split to v0.21.0). The
/// same holds for whisper.cpp's ggml (0.13.1), which lacks some of this ggml's functions.
#[test]
fn the_hook_wraps_every_per_op_function_this_ggml_exports() {
    let exported = |path: &std::path::Path| -> BTreeSet<String> {
        let mut c = Command::new("nm");
        c.args(["-D", "--defined-only"]).arg(path);
        let out = run(c);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|s| s.starts_with("ggml_compute_forward_") || *s == "ggml_barrier")
            .map(str::to_string)
            .collect()
    };
    let helpers = [
        "mul_mat_tiled",
        "mul_mat_id_tiled",
        "add_non_quantized",
        "fwht",
    ]
    .map(|h| format!("ggml_compute_forward_{h}"));
    let without_helpers = |mut ggml: BTreeSet<String>| {
        assert!(ggml.len() > 100, "{ggml:?}");
        ggml.retain(|f| !helpers.contains(f));
        ggml
    };
    let ggml = exported(&llama_bin().join("libggml-cpu.so"));
    for helper in &helpers {
        assert!(ggml.contains(helper), "{helper}");
    }
    let ggml = without_helpers(ggml);
    let whisper = without_helpers(exported(&whisper_build().join("ggml/src/libggml-cpu.so")));
    let wrapped = exported(&hook());
    let missing: Vec<&String> = ggml.difference(&wrapped).collect();
    assert!(missing.is_empty(), "not wrapped: {missing:?}");
    let missing: Vec<&String> = whisper.difference(&wrapped).collect();
    assert!(
        missing.is_empty(),
        "whisper's ggml: not wrapped: {missing:?}"
    );
    assert_ne!(whisper, ggml, "a different ggml");
    let earlier: BTreeSet<String> = [
        "map_binary",
        "map_custom1_f32",
        "map_custom2_f32",
        "map_custom3_f32",
        "map_unary",
        "permute",
        "reshape",
        "transpose",
        "view",
    ]
    .iter()
    .map(|n| format!("ggml_compute_forward_{n}"))
    .collect();
    let extra: BTreeSet<String> = wrapped.difference(&ggml).cloned().collect();
    assert_eq!(extra, earlier);
}

/// Op sampling in threads mode (`GGML_VIZ_OP_SAMPLE=3`): the worker threads record their
/// shares in the first outermost graph compute of every 3 and none in the others (whose calls go
/// straight to ggml), so a thread that computed untimed graphs still times the next timed one
/// whole: every thread the same shares in each generation step timed, none outside a timed
/// graph compute.
#[test]
fn op_sampling_in_threads_mode_times_one_graph_in_n() {
    let dir = scratch("threads-sample");
    let trace = dir.join("t.ggmlviz");
    trace_llama_simple(&trace, 9, &[("GGML_VIZ_OP_SAMPLE", "3")]);
    let (events, _, _) = read_trace(&trace);
    let main = events
        .iter()
        .find(|e| e.event_type() == Some(EventType::GraphComputeBegin))
        .unwrap()
        .thread_id;
    // The main thread's outermost graph computes, (begin, end).
    let (mut graphs, mut depth, mut begin) = (Vec::new(), 0, 0);
    for e in events.iter().filter(|e| e.thread_id == main) {
        match e.event_type() {
            Some(EventType::GraphComputeBegin) => {
                if depth == 0 {
                    begin = e.timestamp_ns;
                }
                depth += 1;
            }
            Some(EventType::GraphComputeEnd) => {
                depth -= 1;
                if depth == 0 {
                    graphs.push((begin, e.timestamp_ns));
                }
            }
            _ => {}
        }
    }
    assert!(graphs.len() >= 7, "{} graph computes", graphs.len());
    let shares_in = |(begin, end): (u64, u64)| {
        events
            .iter()
            .filter(|e| e.event_type() == Some(EventType::OpComputeBegin))
            .filter(|e| (begin..=end).contains(&e.timestamp_ns))
            .count()
    };
    let timed: Vec<usize> = (0..graphs.len())
        .filter(|&i| shares_in(graphs[i]) > 0)
        .collect();
    assert_eq!(timed, (0..graphs.len()).step_by(3).collect::<Vec<_>>());
    // Per thread, its shares in each timed graph compute; every share lies in one.
    let spans = shares(&events).spans;
    assert!(spans.len() >= 2, "{} threads with shares", spans.len());
    let mut per_graph: BTreeMap<usize, BTreeMap<u32, usize>> = BTreeMap::new();
    for (&thread, thread_spans) in &spans {
        for &(begin, end) in thread_spans {
            let graph = timed
                .iter()
                .copied()
                .find(|&g| graphs[g].0 <= begin && end <= graphs[g].1)
                .unwrap_or_else(|| panic!("a share of thread {thread} outside the timed graphs"));
            *per_graph
                .entry(graph)
                .or_default()
                .entry(thread)
                .or_default() += 1;
        }
    }
    // The generation steps (graph 0 is the prompt's): each thread computed every node.
    let steps: Vec<&BTreeMap<u32, usize>> = timed[1..].iter().map(|g| &per_graph[g]).collect();
    assert!(steps.len() >= 2);
    for step in &steps {
        assert_eq!(step.len(), spans.len(), "threads with shares: {step:?}");
        assert_eq!(
            step, &steps[0],
            "shares per thread differ between timed steps"
        );
        let counts: BTreeSet<usize> = step.values().copied().collect();
        assert_eq!(
            counts.len(),
            1,
            "threads' shares differ in one step: {step:?}"
        );
    }
}

/// A node's bytes are what it moves: its sources read (the weights included) and its result
/// written. The tiny model's `ffn_up-0` multiplies a 64×128 f32 weight (32,768 bytes, from the
/// model's shapes) by one token's 64 floats into 128: every tensor info of it says 32,768 +
/// 4·64·n of sources for n tokens, and `ops` gives each generation node at least the weight's
/// bytes (it once counted the result alone: ~0.02 GB/s for a node bound by reading its weights).
#[test]
fn a_nodes_bytes_are_its_sources_and_its_result() {
    let dir = scratch("bytes-moved");
    let trace = dir.join("b.ggmlviz");
    trace_llama_simple(&trace, 8, &[("GGML_VIZ_OP_TIMING", "threads")]);
    let (events, damage, _) = read_trace(&trace);
    assert_eq!(damage, None);
    let infos: Vec<TensorInfo> = events
        .iter()
        .filter(
            |e| matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::TensorInfo),
        )
        .filter_map(|e| ext::parse_payload::<TensorInfo>(e.label.as_deref().unwrap()))
        .filter(|i| i.name == "ffn_up-0" && i.op == "MUL_MAT")
        .collect();
    assert!(!infos.is_empty());
    for info in &infos {
        let tokens = info.ne[1] as u64;
        assert_eq!(
            info.src_bytes,
            Some(64 * 128 * 4 + 64 * 4 * tokens),
            "{info:?}"
        );
    }
    let csv = cli(|c| c.args(["ops", "--by", "name", "--csv"]).arg(&trace));
    assert!(csv.status.success(), "{}", text(&csv.stderr));
    let row = text(&csv.stdout)
        .lines()
        .find(|l| l.starts_with("generation,ffn_up-0 (MUL_MAT),"))
        .map(str::to_string)
        .expect("a generation row for ffn_up-0");
    let cols: Vec<&str> = row.split(',').collect();
    let (count, total_ns, gb_per_s): (f64, f64, f64) = (
        cols[2].parse().unwrap(),
        cols[3].parse().unwrap(),
        cols[9].parse().unwrap(),
    );
    let per_node = gb_per_s * total_ns / count;
    assert!(per_node >= 32_768.0, "{per_node} bytes a node: {row}");
}
