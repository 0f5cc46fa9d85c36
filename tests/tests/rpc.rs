//! llama.cpp over ggml-rpc on several hosts: two `ggml-rpc-server`s, each in a network namespace
//! of its own with its own address and host name, one with its wall clock 250 ms ahead
//! (libfaketime), and `llama-completion` putting the tiny model's layers on both. Every process
//! is traced; `ggml-viz rpc` joins the traces and estimates the clocks.
//!
//! Where network or UTS namespaces cannot be made (no root, no `ip`), the servers listen on
//! loopback ports instead, and the test says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ggml_viz_e2e::*;
use serde_json::Value;

const SHIFT_NS: i64 = 250_000_000;
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One server host: a namespace (or none: loopback) and the address it serves on.
struct Host {
    name: String,
    netns: Option<String>,
    veth: Option<String>,
    address: String,
    port: u16,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Host {
    /// Host `n` (1-based): namespace `gvz<pid>-n`, 10.<s>.<n>.2 behind a veth pair whose other
    /// end (10.<s>.<n>.1) is in the test's own namespace; `s` from the pid, so that two test
    /// runs side by side use different subnets. `None` if any step fails.
    fn namespaced(n: u8) -> Option<Host> {
        let pid = std::process::id();
        let subnet = 100 + pid % 150;
        let ns = format!("gvz{pid}-{n}");
        let (outer, inner) = (format!("gvz{pid}o{n}"), format!("gvz{pid}i{n}"));
        let host = Host {
            name: format!("rpc-host-{n}"),
            netns: Some(ns.clone()),
            veth: Some(outer.clone()),
            address: format!("10.{subnet}.{n}.2"),
            port: 50052,
        };
        // A UTS namespace gives the server its own host name.
        let uts = Command::new("unshare")
            .args(["--uts", "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let ok = uts
            && ip(&["netns", "add", &ns])
            && ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])
            && ip(&["link", "set", &inner, "netns", &ns])
            && ip(&[
                "addr",
                "add",
                &format!("10.{subnet}.{n}.1/24"),
                "dev",
                &outer,
            ])
            && ip(&["link", "set", &outer, "up"])
            && ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.{subnet}.{n}.2/24"),
                "dev",
                &inner,
            ])
            && ip(&["-n", &ns, "link", "set", &inner, "up"])
            && ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // Dropped on failure: what was made is removed.
        ok.then_some(host)
    }

    fn loopback() -> Host {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Host {
            name: String::new(),
            netns: None,
            veth: None,
            address: "127.0.0.1".into(),
            port,
        }
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.address, self.port)
    }

    /// `ggml-rpc-server` on this host, with `env` (the hook's settings, libfaketime's).
    fn serve(&self, env: &[(&str, String)], log: &Path) -> Child {
        let server = llama_bin().join("ggml-rpc-server");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "unshare", "--uts", "sh", "-c"])
                    .arg(format!(
                        "hostname {} && exec \"$0\" -H {} -p {}",
                        self.name, self.address, self.port
                    ))
                    .arg(&server);
                c
            }
            None => {
                let mut c = Command::new(&server);
                c.args(["-H", &self.address, "-p", &self.port.to_string()]);
                c
            }
        };
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = crate::server::interruptible(&mut cmd)
            .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(log).unwrap(),
            ))
            .spawn()
            .expect("ggml-rpc-server starts");
        // Ready when it accepts a connection (at most 20 s).
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr: std::net::SocketAddr = self.endpoint().parse().unwrap();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "ggml-rpc-server on {} not up in 20 s:\n{}",
                self.endpoint(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(veth) = &self.veth {
            ip(&["link", "del", veth]);
        }
        if let Some(ns) = &self.netns {
            ip(&["netns", "del", ns]);
        }
    }
}

/// Stops a server with SIGINT, as a user would (`ip netns exec` and `sh -c ... exec` leave the
/// server as this very process), and waits at most 20 s for it to exit.
fn stop(child: Child) {
    crate::server::interrupt(child, "ggml-rpc-server", 20);
}

/// The client: the tiny model's layers on the servers, greedy, 12 tokens; its stdout.
fn complete(endpoints: &str, env: &[(&str, String)]) -> String {
    let mut cmd = Command::new(llama_bin().join("llama-completion"));
    cmd.arg("-m")
        .arg(tiny_model())
        .args(["--rpc", endpoints, "-ngl", "99", "-p", "Once upon a time"])
        .args(["-n", "12", "--temp", "0", "-no-cnv", "-t", "1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run(cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs the job once: servers on `hosts` (the second with its clock shifted), then the client;
/// traced into `dir` when `traced`. Returns the client's output.
fn job(hosts: &[Host], dir: Option<&Path>) -> String {
    let trace = |name: &str| dir.map(|d| d.join(name));
    let hook_env = |path: Option<PathBuf>| -> Vec<(&str, String)> {
        match path {
            Some(p) => vec![
                ("LD_PRELOAD", hook().display().to_string()),
                ("GGML_VIZ_OUTPUT", p.display().to_string()),
            ],
            None => Vec::new(),
        }
    };
    let scratch_dir = scratch("rpc-logs");
    let servers: Vec<Child> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut env = hook_env(trace(&format!("server-{i}.ggmlviz")));
            if dir.is_some() {
                // The writer's interval out of the way: what a server recorded must reach its
                // file when its client goes (see below), not because a timer fired.
                env.push(("GGML_VIZ_FLUSH_INTERVAL", "600000".into()));
            }
            if i == 1 {
                let preload = env
                    .iter()
                    .find(|(k, _)| *k == "LD_PRELOAD")
                    .map(|(_, v)| format!("{v} {LIBFAKETIME}"))
                    .unwrap_or_else(|| LIBFAKETIME.to_string());
                env.retain(|(k, _)| *k != "LD_PRELOAD");
                env.push(("LD_PRELOAD", preload));
                env.push(("FAKETIME", "+0.25".into()));
                // Our timestamps' epoch comes from the realtime clock; the monotonic one stays.
                env.push(("DONT_FAKE_MONOTONIC", "1".into()));
            }
            h.serve(&env, &scratch_dir.join(format!("server-{i}.log")))
        })
        .collect();
    let endpoints: Vec<String> = hosts.iter().map(Host::endpoint).collect();
    let mut client_env = hook_env(trace("client.ggmlviz"));
    if dir.is_some() {
        // The client's own CPU nodes, per thread; the servers time theirs.
        client_env.push(("GGML_VIZ_OP_TIMING", "auto".into()));
    }
    let output = complete(&endpoints.join(","), &client_env);
    // A server runs until it is stopped, and SIGINT ends it without its exit handlers: the hook
    // writes what a server recorded when its client disconnects. Wait (at most 20 s) until the
    // servers' traces hold every command the client sent, then stop them.
    if let Some(dir) = dir {
        let joined = |out: &std::process::Output| {
            serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|a| a["unjoined_client_connections"] == 0)
        };
        let traces = ["client", "server-0", "server-1"].map(|n| dir.join(format!("{n}.ggmlviz")));
        let out = until_within(
            Duration::from_secs(20),
            || cli(|c| c.args(["rpc", "--json", "-q"]).args(&traces)),
            joined,
        );
        assert!(
            joined(&out),
            "the servers' traces lack commands the client sent 20 s after it ended:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    for s in servers {
        stop(s);
    }
    output
}

fn hosts() -> (Vec<Host>, bool) {
    match (Host::namespaced(1), Host::namespaced(2)) {
        (Some(a), Some(b)) => (vec![a, b], true),
        _ => {
            eprintln!(
                "rpc: network namespaces unavailable (not root, or no `ip`): the servers listen \
                 on loopback ports of this host instead"
            );
            (vec![Host::loopback(), Host::loopback()], false)
        }
    }
}

fn uint(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn rpc_job_on_two_hosts_joins_every_compute_and_finds_the_shifted_clock() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing (scripts/test.sh installs Debian's faketime)"
    );
    let (hosts, namespaced) = hosts();
    let dir = scratch("rpc-traces");
    // llama-completion prints through llama.cpp's logger thread, which may not have written the
    // end of the output when the client exits (llama.cpp #22142), hook or not: a pair of jobs
    // is compared once both outputs are whole (they end with the final "\n\n"), else run again.
    let whole = |(untraced, traced): &(String, String)| {
        untraced.ends_with("\n\n") && traced.ends_with("\n\n")
    };
    let jobs = until_whole(5, || (job(&hosts, None), job(&hosts, Some(&dir))), whole);
    assert!(
        whole(&jobs),
        "5 pairs of runs without a whole output: {jobs:?}"
    );
    let (untraced, traced) = jobs;
    assert_eq!(
        traced, untraced,
        "the client's output changed under the hook"
    );
    assert!(!untraced.trim().is_empty());

    let traces = ["client", "server-0", "server-1"].map(|n| dir.join(format!("{n}.ggmlviz")));
    let out = cli(|c| c.arg("rpc").arg("--json").args(&traces));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Who is who: the servers' traces say the host names their namespaces gave them.
    let processes = a["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 3, "{processes:?}");
    let server_ids: Vec<u64> = processes[1..].iter().map(|p| uint(&p["id"])).collect();
    if namespaced {
        let names: Vec<&str> = processes[1..]
            .iter()
            .map(|p| p["host"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["rpc-host-1", "rpc-host-2"]);
    }

    // Every client connection was joined, to both servers, with the endpoint it dialled.
    assert_eq!(uint(&a["unjoined_client_connections"]), 0, "{}", a["links"]);
    let links = a["links"].as_array().unwrap();
    for (id, host) in server_ids.iter().zip(&hosts) {
        assert!(
            links.iter().any(|l| uint(&l["server_process"]) == *id
                && l["endpoint"].as_str() == Some(&host.endpoint())),
            "no connection to {}: {links:?}",
            host.endpoint()
        );
    }

    // Each graph the client computed on an RPC backend is one GRAPH_COMPUTE or GRAPH_RECOMPUTE
    // (counted independently: the client's graph computes on RPC backends), and each has
    // exactly one joined serve, holding exactly one graph compute on the server.
    let client_rpc_graphs = graph_computes(&traces[0], "ggml_backend_graph_compute_async RPC");
    let joined = a["joined"].as_array().unwrap();
    let computes: Vec<&Value> = joined
        .iter()
        .filter(|j| {
            matches!(
                j["request"]["command"].as_str(),
                Some("GRAPH_COMPUTE" | "GRAPH_RECOMPUTE")
            )
        })
        .collect();
    assert!(client_rpc_graphs > 0);
    assert_eq!(computes.len() as u64, client_rpc_graphs);
    let mut seen = std::collections::BTreeSet::new();
    for j in &computes {
        assert!(
            seen.insert((uint(&j["link"]), uint(&j["request"]["index"]))),
            "a request joined twice: {j}"
        );
    }
    let server_graphs: u64 = traces[1..]
        .iter()
        .map(|t| graph_computes(t, "ggml_backend_graph_compute CPU"))
        .sum();
    assert_eq!(server_graphs, client_rpc_graphs);

    // The clocks: the second server's is 250 ms ahead, the first's is the client's.
    let offsets = a["offsets"].as_array().unwrap();
    let offset_of = |id: u64| {
        offsets
            .iter()
            .find(|o| uint(&o["server_process"]) == id)
            .unwrap_or_else(|| panic!("no offset for process {id}: {offsets:?}"))
    };
    for (id, expected) in server_ids.iter().zip([0, -SHIFT_NS]) {
        let o = offset_of(*id);
        let estimate = o["offset_ns"].as_i64().unwrap();
        assert!(
            (estimate - expected).abs() <= 100_000,
            "server {id}: offset {estimate} ns, expected {expected} ns within 100 µs: {o}"
        );
        assert!(o["upper_ns"].as_i64().is_some(), "no answered command: {o}");
    }

    // Corrected, every server compute starts after its command was sent and ends before the
    // answer that waited for it arrived (the next answered command on its connection).
    for j in &computes {
        let link = &links[uint(&j["link"]) as usize];
        let theta = offset_of(uint(&link["server_process"]))["offset_ns"]
            .as_i64()
            .unwrap();
        let serve_start = j["serve"]["start_ns"].as_i64().unwrap() + theta;
        let serve_end = j["serve"]["end_ns"].as_i64().unwrap() + theta;
        assert!(
            serve_start >= j["request"]["start_ns"].as_i64().unwrap(),
            "served before it was sent: {j}"
        );
        let index = uint(&j["request"]["index"]);
        let next_answer = joined
            .iter()
            .filter(|k| k["link"] == j["link"] && uint(&k["request"]["index"]) > index)
            .filter_map(|k| k["answer"]["end_ns"].as_i64())
            .next();
        if let Some(answered) = next_answer {
            assert!(serve_end <= answered, "ended after its answer arrived: {j}");
            // What the analysis reports as this compute's "sent to answered".
            let position = joined.iter().position(|k| k == *j).unwrap() as u64;
            let reported = a["computes_answered"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| uint(&c["joined"]) == position)
                .unwrap_or_else(|| panic!("no sent-to-answered for {j}"));
            let sent = j["request"]["start_ns"].as_i64().unwrap();
            assert_eq!(uint(&reported["ns"]) as i64, answered - sent);
        }
    }

    // Per token: every decode of the client (counted from its own trace) starts a token whose
    // breakdown adds up to its duration, with compute on both servers; each server's share is the part of
    // its graph computes (corrected, clipped to the decode) that no earlier server claimed, so at
    // most their union, and nearly all of it (servers hardly overlap).
    let tokens = a["tokens"].as_array().unwrap();
    let decodes = span_begins(&traces[0], "llama_decode");
    assert_eq!(tokens.len() as u64, decodes);
    for t in tokens {
        let (lo, hi) = (uint(&t["start_ns"]), uint(&t["end_ns"]));
        let servers = t["servers"].as_array().unwrap();
        let parts: u64 = servers.iter().map(|s| uint(&s["compute_ns"])).sum::<u64>()
            + uint(&t["client_compute_ns"])
            + uint(&t["transfer_ns"])
            + uint(&t["idle_ns"]);
        assert_eq!(parts, hi - lo, "{t}");
        assert_eq!(servers.len(), 2, "{t}");
    }
    for (n, id) in server_ids.iter().enumerate() {
        let theta = offset_of(*id)["offset_ns"].as_i64().unwrap();
        let (mut reported, mut union) = (0u64, 0u64);
        for t in tokens {
            let (lo, hi) = (uint(&t["start_ns"]) as i64, uint(&t["end_ns"]) as i64);
            let mut spans: Vec<(i64, i64)> = computes
                .iter()
                .filter(|j| uint(&links[uint(&j["link"]) as usize]["server_process"]) == *id)
                .map(|j| {
                    let (a, b) = (
                        j["serve"]["start_ns"].as_i64().unwrap(),
                        j["serve"]["end_ns"].as_i64().unwrap(),
                    );
                    ((a + theta).max(lo), (b + theta).min(hi))
                })
                .filter(|(a, b)| a < b)
                .collect();
            spans.sort_unstable();
            let mut end = i64::MIN;
            for (a, b) in spans {
                union += (b - a.max(end)).max(0) as u64;
                end = end.max(b);
            }
            let mine = &t["servers"][n];
            assert_eq!(uint(&mine["process"]), *id);
            reported += uint(&mine["compute_ns"]);
        }
        assert!(union > 0, "server {id} computed nothing during the decodes");
        assert!(
            reported <= union && reported * 100 >= union * 95,
            "server {id}: {reported} ns reported, {union} ns of compute"
        );
    }

    // Merged into one Perfetto trace (decoded with Perfetto's own classes): each joined graph
    // compute is a flow from the client's request slice to a server's serve slice, which, on
    // the client's clock now, begins after the request did.
    let proto = dir.join("job.pftrace");
    let exported = cli(|c| {
        c.args(["export", "--to", "perfetto"])
            .args(&traces)
            .arg("-o")
            .arg(&proto)
    });
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    assert!(
        text(&exported.stderr).contains("onto its ggml-rpc client's clock"),
        "{}",
        text(&exported.stderr)
    );
    let decoded = run({
        let mut c = Command::new("python3");
        c.arg(fixture("check_perfetto.py")).arg(&proto);
        c
    });
    assert!(decoded.status.success(), "{}", text(&decoded.stderr));
    let decoded: Value = serde_json::from_slice(&decoded.stdout).unwrap();
    // One process per host, named with its part in the job.
    let labels: Vec<String> = decoded["tracks"]
        .as_object()
        .unwrap()
        .values()
        .filter(|t| t["kind"] == "process")
        .map(|t| t["label"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(labels.len(), 3, "{labels:?}");
    let endpoints: Vec<String> = hosts.iter().map(Host::endpoint).collect();
    assert!(
        labels
            .iter()
            .any(|l| l.contains(&format!("ggml-rpc client of {}", endpoints.join(", ")))),
        "{labels:?}"
    );
    for (host, endpoint) in hosts.iter().zip(&endpoints) {
        let on_host = if namespaced {
            format!(" on {}", host.name)
        } else {
            String::new()
        };
        assert!(
            labels
                .iter()
                .any(|l| l.contains(&format!("ggml-rpc server at {endpoint})"))
                    && l.ends_with(&on_host)),
            "{labels:?}"
        );
    }
    let mut flows: std::collections::BTreeMap<u64, Vec<&Value>> = Default::default();
    for slice in decoded["slices"].as_array().unwrap() {
        for id in slice["flows"].as_array().unwrap() {
            flows.entry(uint(id)).or_default().push(slice);
        }
    }
    assert_eq!(flows.len(), joined.len(), "one flow per joined command");
    let mut compute_flows = 0;
    for ends in flows.values() {
        let parts: Vec<String> = ends
            .iter()
            .map(|s| {
                let args = s["args"]["args"].as_str().unwrap_or_default();
                args.split("; ").next().unwrap_or_default().to_string()
            })
            .collect();
        assert_eq!(parts, ["rpc_part=request", "rpc_part=serve"], "{ends:?}");
        assert_eq!(ends[0]["name"], ends[1]["name"]);
        assert!(
            uint(&ends[1]["start"]) >= uint(&ends[0]["start"]),
            "{ends:?}"
        );
        if matches!(
            ends[0]["name"].as_str(),
            Some("GRAPH_COMPUTE" | "GRAPH_RECOMPUTE")
        ) {
            compute_flows += 1;
        }
    }
    assert_eq!(compute_flows, client_rpc_graphs);
}

/// Application spans named `name` that begin in `trace`.
fn span_begins(trace: &Path, name: &str) -> u64 {
    use ggml_viz_reader::format::ext::{self, SpanBoundary};
    use ggml_viz_reader::format::{ExtensionKind, Payload};
    let (events, _, _) = read_trace(trace);
    events
        .iter()
        .filter(
            |e| matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::SpanBegin),
        )
        .filter_map(|e| ext::parse_payload::<SpanBoundary>(e.label.as_deref()?))
        .filter(|s| s.name == name)
        .count() as u64
}

/// Graph computes in `trace` whose label starts with `label`.
fn graph_computes(trace: &Path, label: &str) -> u64 {
    let (events, damage, _) = read_trace(trace);
    assert!(damage.is_none(), "{damage:?}");
    events
        .iter()
        .filter(|e| {
            e.event_type() == Some(ggml_viz_reader::EventType::GraphComputeBegin)
                && e.label_str().is_some_and(|l| l.starts_with(label))
        })
        .count() as u64
}

/// llama-server with its layers on a ggml-rpc server, under a few HTTP requests: both are
/// sockets of one process, and only ggml-rpc's are recorded: every command the client recorded
/// went to the RPC server's endpoint and was joined to what that server recorded serving.
#[test]
fn llama_server_over_rpc_records_its_rpc_commands_and_not_its_http() {
    use crate::server;
    let host = Host::loopback();
    let dir = scratch("rpc-llama-server");
    let (client_trace, server_trace) = (dir.join("client.ggmlviz"), dir.join("rpc.ggmlviz"));
    let rpc = host.serve(
        &[
            ("LD_PRELOAD", hook().display().to_string()),
            ("GGML_VIZ_OUTPUT", server_trace.display().to_string()),
        ],
        &dir.join("rpc.log"),
    );
    let port = server::free_port();
    let log = dir.join("server.log");
    let mut cmd = server::server(port, &log);
    cmd.args(["--rpc", &host.endpoint(), "-ngl", "99"]);
    let cmd = with_hook(cmd, &[("GGML_VIZ_OUTPUT", client_trace.to_str().unwrap())]);
    let child = server::start(cmd, port, &log);
    let load = server::load(port, 2, 2);
    assert!(
        load["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["predicted_n"].as_u64() > Some(0))
    );
    server::stop(child);
    std::thread::sleep(Duration::from_millis(400));
    stop(rpc);

    // The client's command records, read from its trace: each went to the RPC endpoint.
    use ggml_viz_reader::format::ext::{self, RpcBoundary, RpcPart};
    use ggml_viz_reader::format::{ExtensionKind, Payload};
    let (events, damage, _) = read_trace(&client_trace);
    assert!(damage.is_none(), "{damage:?}");
    let requests: Vec<RpcBoundary> = events
        .iter()
        .filter(|e| matches!(e.payload, Payload::Extension(x) if x.kind == ExtensionKind::RpcBegin))
        .filter_map(|e| ext::parse_payload::<RpcBoundary>(e.label.as_deref()?))
        .filter(|b| b.part == RpcPart::Request)
        .collect();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|b| b.endpoint.as_deref() == Some(host.endpoint().as_str())),
        "a command to another endpoint: {requests:?}"
    );
    let out = cli(|c| {
        c.arg("rpc")
            .arg("--json")
            .arg(&client_trace)
            .arg(&server_trace)
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(uint(&a["unjoined_client_connections"]), 0);
    assert_eq!(a["joined"].as_array().unwrap().len(), requests.len());
}

/// A server whose clock gains 100 µs a second on its client's (the synthetic job: requests take
/// 2 µs, answers 3 µs, so one offset fits a run of a few tens of milliseconds at most): `rpc`
/// finds no constant offset and reports the drift it fits, with the offset at the first command
/// and its uncertainty (from the synthesizer's own numbers: −5 ms, and the bounds' −2 µs and
/// +4 µs around it); the export moves the server's spans along that line. Without drift the
/// offset stays one number.
#[test]
fn a_drifting_server_clock_is_fitted_with_a_line() {
    let dir = scratch("rpc-drift");
    let (client, server) = (dir.join("client.ggmlviz"), dir.join("server.ggmlviz"));
    synthesize_rpc(&client, &server, 2_000, &["--drift-ppm=100"]);
    let json = cli(|c| c.args(["rpc", "--json"]).arg(&client).arg(&server));
    assert!(json.status.success(), "{}", text(&json.stderr));
    let analysis: Value = serde_json::from_slice(&json.stdout).unwrap();
    let offset = &analysis["offsets"][0];
    assert_eq!(offset["kept_own_clock"], false, "{offset}");
    let slope = offset["drift"]["slope"]
        .as_f64()
        .unwrap_or_else(|| panic!("no drift: {offset}"));
    assert!((slope + 100e-6).abs() < 1e-6, "{slope}");
    assert!(
        offset["disagreement_ns"].as_i64().unwrap() > 10_000,
        "{offset}"
    );
    // The first command's bounds: −2 µs (its way out) and +4 µs (the answer's way back and the
    // server's last microsecond) around −5 ms.
    let at_start = offset["offset_ns"].as_i64().unwrap();
    assert!((-5_002_000..=-4_996_000).contains(&at_start), "{at_start}");
    assert!(
        offset["uncertainty_ns"].as_i64().unwrap() <= 3_000,
        "{offset}"
    );

    let tables = cli(|c| c.arg("rpc").arg(&client).arg(&server));
    assert!(
        text(&tables.stdout).contains("drifting -100.0 µs a second"),
        "{}",
        text(&tables.stdout)
    );
    let export = cli(|c| {
        c.args(["export", "--to", "chrome-json"])
            .arg(&client)
            .arg(&server)
            .arg("-o")
            .arg(dir.join("t.json"))
    });
    assert!(
        text(&export.stderr).contains("drifting"),
        "{}",
        text(&export.stderr)
    );
    // Moved along the line, every answered command keeps its order of causes on the client's
    // clock: served after its request began, answered before its answer ended, the last as the
    // first (a constant offset leaves the late answers 20 µs after they arrived).
    let exported: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
    let mut commands: std::collections::BTreeMap<(u64, &str, u64), f64> = Default::default();
    for e in exported["traceEvents"].as_array().unwrap() {
        if let (Some(index), Some(part), Some(pid)) = (
            e["args"]["index"].as_u64(),
            e["args"]["rpc_part"].as_str(),
            e["pid"].as_u64(),
        ) {
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            let client_answer = part == "answer" && pid == 1;
            commands.insert(
                (index, part, pid),
                if client_answer { ts + dur } else { ts },
            );
        }
    }
    let mut answered = 0;
    for index in 0..6_001u64 {
        let at = |part: &'static str, pid: u64| commands.get(&(index, part, pid)).copied();
        let (Some(request), Some(serve)) = (at("request", 1), at("serve", 2)) else {
            panic!("command {index} not exported whole");
        };
        assert!(
            request <= serve,
            "command {index}: served {serve}, requested {request}"
        );
        if let (Some(arrived), Some(answering)) = (at("answer", 1), at("answer", 2)) {
            assert!(
                answering <= arrived,
                "command {index}: answered {answering}, arrived {arrived}"
            );
            answered += 1;
        }
    }
    assert_eq!(answered, 2_001, "the HELLO and every GET_TENSOR");

    synthesize_rpc(&client, &server, 2_000, &[]);
    let json = cli(|c| c.args(["rpc", "--json"]).arg(&client).arg(&server));
    let analysis: Value = serde_json::from_slice(&json.stdout).unwrap();
    let offset = &analysis["offsets"][0];
    assert!(
        offset["drift"].is_null() && offset["disagreement_ns"].is_null(),
        "{offset}"
    );
    assert_eq!(
        offset["offset_ns"], -4_999_000,
        "the middle of −5 ms −2 µs and −5 ms +4 µs"
    );
}

/// One ggml-rpc command as a client sends it: the command byte, the payload's size, the payload
/// (a broken one's may find the connection closed by the server midway).
fn send_command(
    stream: &mut std::net::TcpStream,
    command: u8,
    size: u64,
    payload: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    stream.write_all(&[command])?;
    stream.write_all(&size.to_le_bytes())?;
    stream.write_all(payload)
}

/// An answer's payload (its 8-byte size first).
fn read_answer(stream: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut size = [0u8; 8];
    stream.read_exact(&mut size).unwrap();
    let mut payload = vec![0u8; u64::from_le_bytes(size) as usize];
    stream.read_exact(&mut payload).unwrap();
    payload
}

/// Waits for the server to end the connection (it reads no more from a broken one).
fn until_closed(stream: &mut std::net::TcpStream) {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
}

/// ggml-rpc's server ends a connection without a failed call when its client breaks the
/// protocol: a payload size it cannot allocate (1 PiB), a HELLO of the wrong size (33), an
/// unknown command byte (200), a second HELLO. The next client's socket then sits at the same
/// address. Each broken connection is followed by a good client (HELLO, then DEVICE_COUNT),
/// which the real server answers; the server's trace has each good session whole, on a
/// connection of its own, numbered from its HELLO (before: the size left the next session
/// unrecorded, the 33 swallowed its HELLO as payload, the 200 named its HELLO "command 200").
#[test]
fn a_broken_connection_leaves_nothing_to_the_next() {
    let dir = scratch("rpc-broken");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let host = Host {
        name: "local".into(),
        netns: None,
        veth: None,
        address: "127.0.0.1".into(),
        port,
    };
    let trace = dir.join("server.ggmlviz");
    let env = [
        ("LD_PRELOAD", hook().display().to_string()),
        ("GGML_VIZ_OUTPUT", trace.display().to_string()),
    ];
    let server = host.serve(&env, &dir.join("server.log"));
    let connect = || std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let hello = |stream: &mut std::net::TcpStream| {
        send_command(stream, 14, 24, &[0; 24]).unwrap();
        assert_eq!(read_answer(stream).len(), 28, "HELLO's answer");
    };
    type Breakage = fn(&mut std::net::TcpStream);
    let breakages: [(&str, Breakage); 4] = [
        // (u64::MAX itself makes the server throw `length_error`, uncaught: it dies.)
        ("a size past memory", |s| {
            let _ = send_command(s, 6, 1 << 50, &[0; 64]);
        }),
        ("a HELLO of 33 bytes", |s| {
            let _ = send_command(s, 14, 33, &[0; 8]);
        }),
        ("an unknown command", |s| {
            use std::io::Write;
            let _ = s.write_all(&[200]);
        }),
        ("a second HELLO", |s| {
            let _ = send_command(s, 14, 24, &[0; 24]);
        }),
    ];
    for (what, breakage) in breakages {
        let mut broken = connect();
        if what != "a HELLO of 33 bytes" {
            hello(&mut broken);
        }
        breakage(&mut broken);
        until_closed(&mut broken);
        let mut good = connect();
        hello(&mut good);
        send_command(&mut good, 15, 0, &[]).unwrap();
        let count = read_answer(&mut good);
        assert_eq!(count, 1u32.to_le_bytes(), "DEVICE_COUNT after {what}");
    }
    // SIGINT ends the server without its exit handlers: the hook writes what it recorded of a
    // client when that client disconnects (the serving of its last command ends at the read that
    // finds the connection closed). Wait (at most 20 s) until the trace holds the four good
    // sessions, then stop the server.
    let four_good =
        |read: &Result<Sessions, String>| read.as_ref().is_ok_and(|(_, good)| good.len() >= 4);
    let read = until_within(Duration::from_secs(20), || sessions(&trace), four_good);
    assert!(
        four_good(&read),
        "20 s after the last client left, the trace does not hold 4 good sessions: {read:?}"
    );
    stop(server);
    let (serves, good) = sessions(&trace).unwrap();
    assert_eq!(good.len(), 4, "{serves:?}");
    let mut distinct = good.clone();
    distinct.dedup();
    assert_eq!(distinct, good, "one connection each: {serves:?}");
    // A HELLO, and only a HELLO, opens each connection (the broken ones' own commands, the
    // unknown 200 among them, stay on theirs).
    assert!(
        (serves.iter()).all(|(_, i, name)| (name == "HELLO") == (*i == 0)),
        "{serves:?}"
    );
}

/// The serving parts in a server's trace: (connection, index, command) each; and its good
/// sessions, the connections that served a DEVICE_COUNT at index 1 after a HELLO at 0.
type Sessions = (Vec<(u32, u32, String)>, Vec<u32>);

/// [`Sessions`] in the server's `trace` so far; why it cannot be read (yet), if it cannot.
fn sessions(trace: &Path) -> Result<Sessions, String> {
    let mut parts = ggml_viz_reader::rpc_join::RpcParts::default();
    ggml_viz_reader::import_path(
        trace,
        None,
        None,
        &mut ggml_viz_reader::telemetry::Ids::default(),
        &mut parts,
    )
    .map_err(|err| format!("{err:?}"))?;
    let serves: Vec<(u32, u32, String)> = (parts.parts.iter())
        .filter(|p| p.part == ggml_viz_reader::rpc_join::Part::Serve)
        .map(|p| {
            (
                p.connection,
                p.index,
                parts.command_name(p.command).to_string(),
            )
        })
        .collect();
    let good = (serves.iter())
        .filter(|(c, i, name)| {
            name == "DEVICE_COUNT" && *i == 1 && serves.contains(&(*c, 0, "HELLO".into()))
        })
        .map(|&(c, ..)| c)
        .collect();
    Ok((serves, good))
}
