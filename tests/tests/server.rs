//! llama-server, as people run it: several slots, concurrent clients, continuous batching, traced
//! with the hook and checked against what the server itself says it did; and llama-batched, one
//! prompt shared by several sequences.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ggml_viz_e2e::*;
use ggml_viz_reader::telemetry::{Arg, Collected, Span};
use serde_json::Value;

use crate::report::{check_in_browser, page_data, report};

/// A loopback port nobody listens on now.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `llama-server` on the tiny model: 4 slots, 2 threads, the Prometheus endpoint, no warm-up.
pub(crate) fn server(port: u16, log: &Path) -> Command {
    let mut cmd = Command::new(llama_bin().join("llama-server"));
    cmd.arg("-m")
        .arg(tiny_model())
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "-np",
            "4",
            "-c",
            "2048",
            "-t",
            "2",
            "--metrics",
            "--no-warmup",
        ])
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(log).unwrap(),
        ));
    cmd
}

/// The body of `GET path`, or `None` while nothing answers.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// Starts the server and waits (at most a minute) until it says it is ready.
pub(crate) fn start(cmd: Command, port: u16, log: &Path) -> Child {
    let mut cmd = cmd;
    let mut child = interruptible(&mut cmd)
        .spawn()
        .expect("llama-server starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !get(port, "/health").is_some_and(|b| b.contains("ok")) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "llama-server exited ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "llama-server not ready in a minute"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

/// Stops the server as a user would (SIGINT), and waits for it to exit (at most 30 s).
pub(crate) fn stop(child: Child) {
    interrupt(child, "llama-server", 30);
}

/// Lets a process `cmd` starts be stopped by SIGINT ([`interrupt`]) however the tests were
/// started: one started in the background by a non-interactive shell (`cargo test … &`) inherits
/// SIGINT ignored, and a program that installs no handler of its own (`ggml-rpc-server`) would
/// then never stop.
pub(crate) fn interruptible(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec, the closure calls `signal` alone, which is
    // async-signal-safe, and touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    }
}

/// Sends SIGINT to `child` (`what`), as Ctrl-C would, and waits at most `seconds` for it to exit.
pub(crate) fn interrupt(mut child: Child, what: &str, seconds: u64) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not stop within {seconds} s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `clients` clients sending `requests` completions each (`tests/fixtures/load_server.py`).
pub(crate) fn load(port: u16, clients: u32, requests: u32) -> Value {
    let out = run({
        let mut c = Command::new("python3");
        c.arg(fixture("load_server.py")).args([
            port.to_string(),
            clients.to_string(),
            requests.to_string(),
        ]);
        c
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    let load: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(load["errors"], Value::Array(vec![]), "{load}");
    assert_eq!(
        load["results"].as_array().unwrap().len(),
        (clients * requests) as usize
    );
    load
}

/// 8 clients x 3 completions, half of them streamed, on 4 slots: the trace's decode spans begun
/// after the load started are exactly the server's own count of decodes (`/metrics`
/// `n_decode_total`), and the tokens they carry exactly what the responses say was decoded:
/// per request `prompt_n + predicted_n - 1` (the last sampled token is never decoded).
#[test]
fn llama_server_under_concurrent_load_decodes_what_it_reports() {
    let dir = scratch("server-load");
    let (trace, log) = (dir.join("server.ggmlviz"), dir.join("server.log"));
    let port = free_port();
    let cmd = with_hook(
        server(port, &log),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    );
    let child = start(cmd, port, &log);
    let started_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let load = load(port, 8, 3);
    stop(child);

    let results = load["results"].as_array().unwrap();
    let decoded: u64 = results
        .iter()
        .map(|r| r["prompt_n"].as_u64().unwrap() + r["predicted_n"].as_u64().unwrap() - 1)
        .sum();
    assert!(
        results
            .iter()
            .all(|r| r["cache_n"] == 0 && r["id_slot"].as_u64().unwrap() < 4),
        "{results:?}"
    );
    let metric = |name: &str| {
        load["metrics"][name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(
        metric("llamacpp:prompt_tokens_total") + metric("llamacpp:tokens_predicted_total")
            - results.len() as f64,
        decoded as f64,
        "the responses and /metrics agree"
    );

    let c = collected(&trace);
    let decodes = decode_batches(&c, started_ns);
    assert_eq!(decodes.len() as f64, metric("llamacpp:n_decode_total"));
    assert_eq!(decodes.iter().map(|(n, _)| n).sum::<u64>(), decoded);
    // Per sequence: a server's slot is the sequence its tokens are added to (`id_slot`), so each
    // slot's tokens over all decodes are what its requests say they decoded.
    let mut by_slot: BTreeMap<u64, u64> = BTreeMap::new();
    for r in results {
        *by_slot.entry(r["id_slot"].as_u64().unwrap()).or_default() +=
            r["prompt_n"].as_u64().unwrap() + r["predicted_n"].as_u64().unwrap() - 1;
    }
    let mut traced: BTreeMap<u64, u64> = BTreeMap::new();
    for (n, seqs) in &decodes {
        assert_eq!(
            seqs.values().sum::<u64>(),
            *n,
            "a batch's sequences hold all its tokens"
        );
        for (seq, tokens) in seqs {
            *traced.entry(*seq).or_default() += tokens;
        }
    }
    assert_eq!(traced, by_slot);
    // Prompt and generated tokens, as the trace infers them (several tokens of a sequence in a
    // batch: its prompt; one: a generation step), against the responses: every prompt here is
    // longer than one token and fits one batch.
    let arg_sum = |key: &str| -> u64 {
        c.spans
            .iter()
            .filter(|s| s.category == "llama" && s.start_ns >= started_ns)
            .filter_map(|s| s.arg(key))
            .map(|v| match v {
                Arg::UInt(n) => *n,
                other => panic!("{key}: {other:?}"),
            })
            .sum()
    };
    let sum = |key: &str| {
        results
            .iter()
            .map(|r| r[key].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(arg_sum("prefill_tokens"), sum("prompt_n"));
    assert_eq!(
        arg_sum("generation_tokens"),
        sum("predicted_n") - results.len() as u64
    );
    // Continuous batching: the server's own average of busy slots per decode is the trace's
    // average of sequences per batch.
    let per_batch =
        decodes.iter().map(|(_, seqs)| seqs.len()).sum::<usize>() as f64 / decodes.len() as f64;
    assert!(
        (per_batch - metric("llamacpp:n_busy_slots_per_decode")).abs() < 1e-3,
        "{per_batch} sequences per batch"
    );
    assert!(
        c.spans.iter().any(|s| s.category == "op"),
        "op timing in the server"
    );

    // A lane per sequence (slot), its steps grouped into inferred requests: per slot, the
    // requests' prompt and generated tokens are those of the responses the slot gave.
    let mut served: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for r in results {
        served
            .entry(r["id_slot"].as_u64().unwrap())
            .or_default()
            .push((
                r["prompt_n"].as_u64().unwrap(),
                r["predicted_n"].as_u64().unwrap() - 1,
            ));
    }
    let mut inferred: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for lane in &c.lanes {
        let Some(slot) = lane.name.strip_prefix("sequence ") else {
            continue;
        };
        let slot: u64 = slot.parse().unwrap();
        for s in (c.spans.iter())
            .filter(|s| s.lane == lane.id && s.name == "request" && s.start_ns >= started_ns)
        {
            inferred
                .entry(slot)
                .or_default()
                .push((uint(s, "prefill_tokens"), uint(s, "generation_tokens")));
        }
    }
    for requests in served.values_mut().chain(inferred.values_mut()) {
        requests.sort_unstable();
    }
    assert_eq!(
        inferred, served,
        "requests per slot: (prompt, generated) tokens"
    );
    // What tells a request's start for certain: the server clears the slot's sequence from its
    // start (`llama_memory_seq_rm(mem, slot, 0, -1)`, no prompt cache here) once per request.
    let clears = (c.spans.iter())
        .filter(|s| s.name == "llama_memory_seq_rm" && s.start_ns >= started_ns)
        .filter(|s| s.arg("from") == Some(&Arg::Int(0)) && s.arg("to") == Some(&Arg::Int(-1)))
        .count();
    assert_eq!(clears, results.len(), "a cleared sequence per request");

    // The live view of the same trace (a second reader of the raw events): every batch that
    // named its sequences, and as many sequences per batch as the importer's decode spans.
    let all_batches: Vec<usize> = (c.spans.iter())
        .filter(|s| s.name == "llama_decode")
        .filter_map(|s| s.arg("sequences"))
        .map(|v| match v {
            Arg::UInt(n) => *n as usize,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(all_batches.len() >= decodes.len());
    let live = cli(|c| c.args(["live", "--plain", "--window", "3600"]).arg(&trace));
    assert!(live.status.success(), "{}", text(&live.stderr));
    let end = text(&live.stderr);
    let per_batch = all_batches.iter().sum::<usize>() as f64 / all_batches.len() as f64;
    for expected in [
        format!("; {} batches (", all_batches.len()),
        format!("/s), {per_batch:.2} sequences per batch, token latency p50 "),
    ] {
        assert!(end.contains(&expected), "{expected} in {end}");
    }

    // The report's per-sequence table: per slot, the requests and tokens of the responses it
    // gave; one slot also ran the server's start-up decode (2 prompt tokens, nothing generated,
    // before the load). Its data, and the page in Chromium.
    let page = dir.join("server.html");
    report(&[&trace], &page);
    let data = page_data(&page);
    let rows = data["sequences"].as_array().unwrap();
    assert_eq!(rows.len(), served.len(), "{rows:?}");
    let mut start_up = 0;
    for row in rows {
        let slot: u64 = row["name"].as_str().unwrap()["sequence ".len()..]
            .parse()
            .unwrap();
        let responses = &served[&slot];
        let field = |k: &str| row[k].as_u64().unwrap();
        let mut from_server = (
            responses.len() as u64,
            responses.iter().map(|r| r.0).sum::<u64>(),
            responses.iter().map(|r| r.1).sum::<u64>(),
        );
        let reported = (
            field("requests"),
            field("prefill_tokens"),
            field("generation_tokens"),
        );
        if reported != from_server {
            start_up += 1;
            from_server = (from_server.0 + 1, from_server.1 + 2, from_server.2);
        }
        assert_eq!(
            reported, from_server,
            "slot {slot}: (requests, prompt, generated)"
        );
        assert!(field("request_p99_ns") >= field("request_p50_ns"));
        assert!(field("per_token_ns") > 0);
    }
    assert_eq!(start_up, 1, "the start-up decode on one slot: {rows:?}");
    check_in_browser(
        &page,
        "report-llama-server.png",
        &[
            "--expect-text",
            "Sequences",
            "--expect-text",
            "per generated token",
        ],
    );
}

/// The decode spans begun at or after `since_ns`: each one's tokens and its tokens per sequence.
fn decode_batches(c: &Collected, since_ns: u64) -> Vec<(u64, BTreeMap<u64, u64>)> {
    c.spans
        .iter()
        .filter(|s| s.category == "llama" && s.name == "llama_decode" && s.start_ns >= since_ns)
        .map(|s| {
            let Some(Arg::UInt(n)) = s.arg("n_tokens") else {
                panic!("a decode without n_tokens: {s:?}")
            };
            let Some(Arg::Str(seqs)) = s.arg("seq_tokens") else {
                panic!("a decode without its sequences: {s:?}")
            };
            let seqs = seqs
                .split(' ')
                .map(|pair| {
                    let (id, n) = pair.split_once(':').unwrap_or_else(|| panic!("{seqs}"));
                    (id.parse().unwrap(), n.parse().unwrap())
                })
                .collect();
            (*n, seqs)
        })
        .collect()
}

/// `llama-batched`: one prompt decoded once for 3 sequences (each token added to sequence 0, then
/// put in 1 and 2 with `llama_batch_ext_add_seq`), then one token per sequence per batch. What
/// the program prints says what each batch held: the prompt's length P from its `n_kv_req = P +
/// (n_predict - P) x n_parallel`, each stream's tokens from `stream i finished at n_cur = X`
/// (X - P), their sum from `decoded N tokens`. (Its generated text is not compared with an
/// unhooked run: llama.cpp's logger thread loses the tail of what it prints at exit, hook or not,
/// llama.cpp #22142; for the same reason a run whose printout lacks those lines is repeated.)
#[test]
fn llama_batched_shares_its_prompt_between_sequences() {
    let dir = scratch("batched");
    let trace = dir.join("batched.ggmlviz");
    let batched = || {
        let mut c = Command::new(llama_bin().join("llama-batched"));
        c.arg("-m").arg(tiny_model()).args([
            "-p",
            "hello world",
            "-np",
            "3",
            "-n",
            "32",
            "-kvu",
            "-s",
            "42",
            "--no-log-timestamps",
            "--no-log-prefix",
        ]);
        c
    };
    // llama.cpp's logger thread may not have written the program's last lines when it exits
    // (#22142): a run whose printout lacks them says nothing to check against, and is run again.
    let complete = |said: &str| {
        said.contains("n_kv_req = ")
            && said.matches(" finished at n_cur = ").count() == 3
            && said.contains("decoded ")
    };
    let said = until_whole(
        5,
        || {
            let out = run(with_hook(
                batched(),
                &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
            ));
            assert!(out.status.success(), "{}", text(&out.stderr));
            text(&out.stderr)
        },
        |said| complete(said),
    );
    assert!(complete(&said), "5 runs without a whole printout: {said}");
    let number_after = |line: &str, key: &str| -> u64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or_else(|_| panic!("{key} in {line}"))
    };
    let params = said
        .lines()
        .find(|l| l.contains("n_kv_req = "))
        .expect("the parameters line");
    let (n_predict, n_parallel, n_kv_req) = (
        number_after(params, "n_predict = "),
        number_after(params, "n_parallel = "),
        number_after(params, "n_kv_req = "),
    );
    assert_eq!(n_parallel, 3);
    let prompt = (n_parallel * n_predict - n_kv_req) / (n_parallel - 1);
    // The streams' lines run together (no newline between them).
    let streams: Vec<u64> = said
        .split("stream ")
        .skip(1)
        .filter(|s| s.contains(" finished at n_cur = "))
        .map(|s| number_after(s, "n_cur = ") - prompt)
        .collect();
    assert_eq!(streams.len(), 3, "{said}");
    let decoded_line = said.lines().find(|l| l.contains("decoded ")).unwrap();
    assert_eq!(
        streams.iter().sum::<u64>(),
        number_after(decoded_line, "decoded "),
        "{said}"
    );

    let c = collected(&trace);
    let decodes = decode_batches(&c, 0);
    let (first, rest) = decodes.split_first().expect("decodes");
    assert_eq!(first.0, prompt, "the prompt is decoded once");
    assert_eq!(
        first.1,
        (0..3).map(|s| (s, prompt)).collect::<BTreeMap<u64, u64>>(),
        "each sequence holds the whole prompt"
    );
    let mut generated: BTreeMap<u64, u64> = BTreeMap::new();
    for (n, seqs) in rest {
        assert_eq!(seqs.values().sum::<u64>(), *n);
        assert!(seqs.values().all(|&t| t == 1), "{seqs:?}");
        for (seq, tokens) in seqs {
            *generated.entry(*seq).or_default() += tokens;
        }
    }
    assert_eq!(generated.values().copied().collect::<Vec<u64>>(), streams);
    // Each sequence's lane: one request, the shared prompt and its own generated tokens.
    for (i, tokens) in streams.iter().enumerate() {
        let lane = (c.lanes.iter())
            .find(|l| l.name == format!("sequence {i}"))
            .unwrap_or_else(|| panic!("no lane for sequence {i}"));
        let requests: Vec<(u64, u64)> = (c.spans.iter())
            .filter(|s| s.lane == lane.id && s.name == "request")
            .map(|s| (uint(s, "prefill_tokens"), uint(s, "generation_tokens")))
            .collect();
        assert_eq!(requests, [(prompt, *tokens)], "sequence {i}");
    }
}

/// One client, the same completions (temperature 0, fixed seed) with and without the hook: the
/// same answers.
#[test]
fn llama_server_answers_the_same_with_the_hook() {
    let dir = scratch("server-same");
    let mut answers = Vec::new();
    for hooked in [false, true] {
        let log = dir.join(format!("server-{hooked}.log"));
        let port = free_port();
        let cmd = server(port, &log);
        let cmd = if hooked {
            let trace = dir.join("server.ggmlviz");
            with_hook(cmd, &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())])
        } else {
            cmd
        };
        let child = start(cmd, port, &log);
        let load = load(port, 1, 5);
        stop(child);
        let contents: Vec<String> = load["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["content"].as_str().unwrap().to_string())
            .collect();
        answers.push(contents);
    }
    assert!(answers[0].iter().all(|a| !a.is_empty()), "{answers:?}");
    assert_eq!(answers[0], answers[1]);
}

/// `span`'s unsigned argument `key`, which it must have.
fn uint(span: &Span, key: &str) -> u64 {
    match span.arg(key) {
        Some(Arg::UInt(n)) => *n,
        other => panic!("{key}: {other:?} in {span:?}"),
    }
}
