//! The ggml-rpc connection table over many connections, driven through the recording core as
//! the transport wrappers drive it (a process of its own: one recording session). A connection
//! lives as long as its socket: closed sockets leave the table, a live one is never pushed out
//! for another, and what cannot be followed is counted.

use ggml_viz_config::{Config, Sources};
use ggml_viz_format::ExtensionKind;
use ggml_viz_format::ext::{self, Counters, RpcBoundary, RpcPart};
use ggml_viz_hook::{Setup, Transfer};
use ggml_viz_reader::TraceFile;

/// Transport calls made, as the front end reports them (before and after each).
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn transport(socket: usize, transfer: Transfer, bytes: &mut [u8]) {
    CALLS.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: `bytes` is readable and writable for its length.
    unsafe {
        ggml_viz_hook::rpc_before(socket, transfer, bytes.as_ptr(), bytes.len());
        ggml_viz_hook::rpc_after(socket, transfer, bytes.as_ptr(), bytes.len(), true);
    }
}

/// One answered command from a client: command byte, size, payload, flush; the answer.
fn command(socket: usize, command: u8) {
    transport(socket, Transfer::Send, &mut [command]);
    transport(socket, Transfer::Send, &mut 16u64.to_le_bytes());
    transport(socket, Transfer::Send, &mut [0; 16]);
    transport(socket, Transfer::Flush, &mut []);
    transport(socket, Transfer::Recv, &mut 4u64.to_le_bytes());
    transport(socket, Transfer::Recv, &mut [0; 4]);
}

const HELLO: u8 = 14;
const GET_TENSOR: u8 = 8;
/// Connections the table holds at most (record/rpc.rs).
const MAX_CONNS: usize = 64;

#[test]
fn connections_live_as_long_as_their_sockets() {
    let dir = std::env::temp_dir().join(format!("ggml-viz-rpc-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.ggmlviz");
    let config = Config::load(&Sources::from_pairs([(
        "GGML_VIZ_OUTPUT",
        path.to_str().unwrap(),
    )]))
    .unwrap();
    ggml_viz_hook::start_once(|| Setup {
        config: Ok(config),
        ggml_version: Some("0.0.0-rpc-table".into()),
        cpu_functions: Err("driven by a test".into()),
        prepare_op_timing: |_| {},
        before_last_flush: || {},
    });

    // A long-lived client connection: its HELLO and 9 commands, then as many short connections
    // as the table holds, each closed, then 10 more commands on the first (before: the short
    // ones pushed it out, and its last 10 were lost uncounted).
    let long = 0xA000;
    ggml_viz_hook::rpc_connected(long, "10.0.0.2:50052");
    command(long, HELLO);
    (0..9).for_each(|_| command(long, GET_TENSOR));
    for i in 0..MAX_CONNS {
        let short = 0xB000 + i * 0x10;
        ggml_viz_hook::rpc_connected(short, "10.0.0.3:50052");
        command(short, HELLO);
        ggml_viz_hook::rpc_closed(short);
    }
    (0..10).for_each(|_| command(long, GET_TENSOR));
    ggml_viz_hook::rpc_closed(long);

    // A table full of live connections: one more is not followed (and counted, every call),
    // and the live ones go on being recorded.
    let live: Vec<usize> = (0..MAX_CONNS).map(|i| 0xC000 + i * 0x10).collect();
    for &socket in &live {
        ggml_viz_hook::rpc_connected(socket, "10.0.0.4:50052");
        command(socket, HELLO);
    }
    let calls_before = CALLS.load(std::sync::atomic::Ordering::Relaxed);
    ggml_viz_hook::rpc_connected(0xD000, "10.0.0.5:50052");
    command(0xD000, HELLO);
    let refused_calls = CALLS.load(std::sync::atomic::Ordering::Relaxed) - calls_before + 1;
    command(live[0], GET_TENSOR);
    ggml_viz_hook::finish();

    let trace = TraceFile::open(&path, None).unwrap();
    let (mut requests, mut counters) = (Vec::new(), None);
    for event in trace.events() {
        let event = event.expect("no damage");
        if let ggml_viz_format::Payload::Extension(x) = event.payload {
            let label = event.label.as_deref().unwrap_or_default();
            match x.kind {
                ExtensionKind::RpcBegin => {
                    let b = ext::parse_payload::<RpcBoundary>(label).unwrap();
                    if b.part == RpcPart::Request {
                        requests.push(b);
                    }
                }
                ExtensionKind::Counters => counters = ext::parse_payload::<Counters>(label),
                _ => {}
            }
        }
    }
    let of = |endpoint: &str| -> Vec<(u32, u32, u8)> {
        (requests.iter())
            .filter(|b| b.endpoint.as_deref() == Some(endpoint))
            .map(|b| (b.connection, b.index, b.command))
            .collect()
    };
    // The long connection, numbered first: all 20 of its commands, in order.
    let expected: Vec<(u32, u32, u8)> = (0..20)
        .map(|i| (1, i, if i == 0 { HELLO } else { GET_TENSOR }))
        .collect();
    assert_eq!(of("10.0.0.2:50052"), expected);
    assert_eq!(of("10.0.0.3:50052").len(), MAX_CONNS);
    // The full table: every live one's HELLO, the first's next command, nothing of the refused.
    let full = of("10.0.0.4:50052");
    assert_eq!(full.len(), MAX_CONNS + 1);
    assert_eq!(full.last().map(|r| (r.1, r.2)), Some((1, GET_TENSOR)));
    assert!(of("10.0.0.5:50052").is_empty());
    let counters = counters.expect("a counters record");
    assert_eq!(counters.rpc_calls_unfollowed, refused_calls);
    std::fs::remove_dir_all(&dir).unwrap();
}
