//! A GGML program that is not llama.cpp: whisper.cpp's `whisper-cli` (built from the pywhispercpp
//! sdist, with its own ggml, by scripts/setup-whisper.sh) transcribing a WAV file with a tiny
//! random-weight model in whisper's own format. No libllama in the process: the trace must be
//! complete without it. Expected values come from whisper's own printout (its timings' run
//! counts, its buffer sizes) and from the scheduler's eval callback.

use std::collections::BTreeMap;
use std::process::Command;

use ggml_viz_e2e::*;
use ggml_viz_reader::format::{EventType, ExtensionKind, Payload};

use crate::threads::{NOPS, nodes_by_op, settings};

/// `whisper-cli` on the tiny model at 2 threads, greedy (one decoder, so that each decode call
/// is one graph of one token), no temperature fallback.
fn whisper_cli() -> Command {
    let (model, audio) = tiny_whisper();
    let mut c = Command::new(whisper_build().join("bin/whisper-cli"));
    c.arg("-m")
        .arg(model)
        .arg("-f")
        .arg(audio)
        .args(["-t", "2", "-nf", "-bs", "1", "-bo", "1"]);
    c
}

/// The number in whisper's line that contains `label`, before `unit` (`"… = 7.67 MB"`, `"… = 53.83
/// ms /     1 runs"`: the figure before "runs" is the count).
fn figure(stderr: &str, label: &str, unit: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("whisper printed no {label:?}:\n{stderr}"));
    let before = &line[..line.find(unit).unwrap_or_else(|| panic!("{line}"))];
    let number = before.rsplit(['=', '/']).next().unwrap().trim();
    number
        .parse()
        .unwrap_or_else(|_| panic!("{number:?} in {line}"))
}

/// Traced with the hook (memory tracking on, op timing `auto`): whisper prints what it printed
/// without the hook, runs in threads mode, and its graph computes and backend buffers are the
/// ones whisper itself reports.
#[test]
fn whisper_cli_runs_unchanged_and_its_graphs_and_buffers_are_its_own() {
    let dir = scratch("whisper");
    let cli = whisper_build().join("bin/whisper-cli");
    let libs = ldd(&cli);
    assert!(
        libs.contains("libwhisper") && libs.contains("libggml-cpu"),
        "{libs}"
    );
    assert!(!libs.contains("libllama"), "{libs}");

    let plain = run(whisper_cli());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert!(
        text(&plain.stdout).contains("-->"),
        "no transcript: {}",
        text(&plain.stdout)
    );
    let trace = dir.join("whisper.ggmlviz");
    let hooked = run(with_hook(
        whisper_cli(),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_MEMORY_TRACKING", "1"),
        ],
    ));
    assert!(hooked.status.success(), "{}", text(&hooked.stderr));
    assert_eq!(
        text(&hooked.stdout),
        text(&plain.stdout),
        "the hook changed the transcript"
    );
    let said = text(&hooked.stderr);
    assert_eq!(hook_lines(&hooked.stderr), Vec::<String>::new());

    let (events, damage, stats) = read_trace(&trace);
    assert!(damage.is_none(), "{damage:?}");
    assert_eq!(settings(&events)["op_timing_mode"], "threads");
    assert_eq!(
        stats
            .metadata
            .as_ref()
            .and_then(|m| m.ggml_version.as_deref()),
        Some("0.13.1"),
        "whisper's own ggml (the sdist's ggml/CMakeLists.txt)"
    );
    // Nothing of libllama's: no decode spans.
    assert!(
        !events.iter().any(
            |e| matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::SpanBegin)
        ),
        "a span without libllama"
    );

    // Graphs: each encode is three (conv, encoder, cross-attention K/V) and is followed by one
    // prompt decode of a few tokens (whisper's "batchd"), then one graph per single-token decode
    // ("decode"). No prompt of 16 tokens or more ("prompt" time 0).
    let encodes = figure(&said, "encode time", "runs") as u64;
    let decodes = figure(&said, "  decode time", "runs") as u64;
    assert_eq!(figure(&said, "prompt time", "ms"), 0.0, "{said}");
    assert!(figure(&said, "batchd time", "ms") > 0.0, "{said}");
    assert!(encodes >= 1 && decodes > 10, "{said}");
    assert_eq!(stats.graph_computes, 4 * encodes + decodes, "{said}");
    assert!(stats.ops > 0);

    // Backend buffers, in the order whisper allocates and prints them (MB = 10^6 bytes, two
    // decimals): the weights and the three KV caches exactly; a compute buffer's line adds its
    // graph's metadata (host memory, no ggml buffer), the same for the four.
    let sizes: Vec<u64> = events
        .iter()
        .filter_map(|e| match (e.event_type(), e.payload) {
            (Some(EventType::TensorAlloc), Payload::Memory { size, .. }) if size > 0 => Some(size),
            _ => None,
        })
        .collect();
    let printed: Vec<f64> = [
        "CPU total size",
        "kv self size",
        "kv cross size",
        "kv pad  size",
        "compute buffer (conv)",
        "compute buffer (encode)",
        "compute buffer (cross)",
        "compute buffer (decode)",
    ]
    .iter()
    .map(|label| figure(&said, label, "MB"))
    .collect();
    assert_eq!(sizes.len(), printed.len(), "{sizes:?} vs {printed:?}");
    for (size, mb) in sizes.iter().zip(&printed).take(4) {
        assert_eq!(format!("{:.2}", *size as f64 / 1e6), format!("{mb:.2}"));
    }
    let meta: Vec<f64> = sizes[4..]
        .iter()
        .zip(&printed[4..])
        .map(|(size, mb)| mb - *size as f64 / 1e6)
        .collect();
    assert!(meta[0] > 0.1, "{meta:?}");
    assert!(
        meta.iter().all(|m| (m - meta[0]).abs() <= 0.011),
        "{meta:?}"
    );
    assert_eq!(stats.memory.live_bytes, 0, "whisper frees its buffers");
    assert_eq!(stats.memory.live_at_exit, Some(0));
}

/// Both op-timing modes on whisper's own ggml: per thread (fusion off so that every computed
/// node is one) and by the scheduler's eval callback time exactly the same nodes, both leave the
/// transcript as it was, and in threads mode each node has a share from both threads.
#[test]
fn whisper_nodes_are_timed_per_thread_and_by_the_scheduler_alike() {
    let dir = scratch("whisper-ops");
    let plain = run(whisper_cli());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = |file: &str, extra: &[(&str, &str)]| {
        let path = dir.join(file);
        let mut all = vec![("GGML_VIZ_OUTPUT", path.to_str().unwrap())];
        all.extend_from_slice(extra);
        let out = run(with_hook(whisper_cli(), &all));
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            text(&plain.stdout),
            "{extra:?} changed the transcript"
        );
        read_trace(&path).0
    };
    let threads = trace(
        "threads.ggmlviz",
        &[
            ("GGML_CPU_DISABLE_FUSION", "1"),
            ("GGML_VIZ_OP_TIMING", "threads"),
        ],
    );
    let sched = trace("sched.ggmlviz", &[("GGML_VIZ_OP_TIMING", "sched")]);
    assert_eq!(settings(&threads)["op_timing_mode"], "threads");
    assert_eq!(settings(&sched)["op_timing_mode"], "sched");

    let mut expected: BTreeMap<String, usize> = nodes_by_op(&sched);
    for nop in NOPS {
        expected.remove(nop);
    }
    let timed = nodes_by_op(&threads);
    assert_eq!(timed, expected, "threads-mode nodes vs the scheduler's");
    for op in ["MUL_MAT", "FLASH_ATTN_EXT", "IM2COL", "NORM", "GELU"] {
        assert!(timed.get(op).is_some_and(|&n| n > 0), "no {op}: {timed:?}");
    }
    let a = ggml_viz_reader::OpAnalysis::collect(threads.iter().cloned().map(Ok));
    assert!(
        a.ops.iter().all(|o| o.threads == 2),
        "a node without 2 shares"
    );
}
