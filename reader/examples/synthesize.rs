//! Writes a synthetic GGMLVIZ trace of any size: graph computes of 48 ops each, 4 threads, every
//! op labelled — for benchmarks and memory measurements of the readers.
//!
//! ```sh
//! cargo run --release -p ggml-viz-reader --example synthesize -- big.ggmlviz 25000000
//! ggml-viz summary big.ggmlviz
//! ```

use std::borrow::Cow;
use std::io::Write;

use ggml_viz_reader::format::{self, Event, Layout, Payload};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: synthesize OUT.ggmlviz N_EVENTS");
        std::process::exit(1);
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
    let mut buf = Vec::with_capacity(1 << 20);
    format::encode_header(&mut buf);
    let names = [
        "Qcur-0",
        "Kcur-0",
        "Vcur-0",
        "ffn_up-0",
        "ffn_gate-0",
        "ffn_down-0",
        "norm-0",
        "kqv_out-0",
    ];
    let mut ts = 1_700_000_000_000_000_000u64;
    let mut written = 0;
    while written < n {
        let tid = 1000 + (written / 100 % 4) as u32;
        let graph = Payload::Graph {
            graph_ptr: 0x7f00_0000_1000,
            n_nodes: 48,
            n_threads: 4,
            backend_ptr: 0,
        };
        let mut push = |type_code: u8, payload: Payload, label: Option<&'static str>, ts: u64| {
            let e = Event {
                type_code,
                timestamp_ns: ts,
                thread_id: tid,
                payload,
                label: label.map(|l| Cow::Borrowed(l.as_bytes())),
            };
            format::encode_event(&mut buf, Layout::Packed, &e);
        };
        push(
            0,
            graph,
            Some("ggml_backend_sched_graph_compute_async CPU"),
            ts,
        );
        for k in 0..48u64 {
            let op = Payload::Op {
                tensor_ptr: 0x7f00_0000_2000 + k * 336,
                op_type: 29,
                op_size: 4096,
                backend_ptr: 0,
            };
            let name = names[(k % 8) as usize];
            push(2, op, Some(name), ts + 10 + k * 100);
            push(3, op, Some(name), ts + 90 + k * 100);
        }
        push(
            1,
            graph,
            Some("ggml_backend_sched_graph_compute_async CPU"),
            ts + 5000,
        );
        ts += 6000;
        written += 98;
        if buf.len() > (1 << 20) - 16384 {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)?;
    out.flush()
}
