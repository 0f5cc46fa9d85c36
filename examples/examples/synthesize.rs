//! Writes a synthetic GGMLVIZ trace of any size: graph computes of 48 ops each on 4 threads in
//! turn, every op labelled, each op with a share on each of 3 worker threads too (as threads-mode
//! op timing records them: no graph compute open on the worker) — for benchmarks and memory
//! measurements of the readers and the report.
//!
//! With `--rate EVENTS_PER_S` it is a live writer instead: it holds the trace's lock as the hook
//! does and appends at that rate every 10 ms, for the live view's benchmark.
//!
//! ```sh
//! cargo run --release -p ggml-viz-examples --example synthesize -- big.ggmlviz 25000000
//! ggml-viz summary big.ggmlviz
//! cargo run --release -p ggml-viz-examples --example synthesize -- live.ggmlviz 5000000 --rate 1000000 &
//! ggml-viz live live.ggmlviz
//! ```

use std::borrow::Cow;
use std::io::Write;

use ggml_viz_reader::format::{self, Event, Layout, Payload};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: synthesize OUT.ggmlviz N_EVENTS [--rate EVENTS_PER_S]");
        std::process::exit(1);
    };
    let rate = match (
        args.next().as_deref(),
        args.next().and_then(|r| r.parse::<u64>().ok()),
    ) {
        (Some("--rate"), Some(r)) => Some(r),
        (None, _) => None,
        _ => {
            eprintln!("usage: synthesize OUT.ggmlviz N_EVENTS [--rate EVENTS_PER_S]");
            std::process::exit(1);
        }
    };
    let file = std::fs::File::create(&path)?;
    if rate.is_some() {
        // Held until the process exits, as the hook does.
        file.lock()?;
    }
    let started = std::time::Instant::now();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
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
        let mut push = |tid, type_code: u8, payload: Payload, label: Option<&'static str>, ts| {
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
            tid,
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
            push(tid, 2, op, Some(name), ts + 10 + k * 100);
            push(tid, 3, op, Some(name), ts + 90 + k * 100);
            for worker in 0..3 {
                let at = ts + 12 + k * 100 + u64::from(worker);
                push(2000 + worker, 2, op, Some(name), at);
                push(2000 + worker, 3, op, Some(name), at + 70);
            }
        }
        push(
            tid,
            1,
            graph,
            Some("ggml_backend_sched_graph_compute_async CPU"),
            ts + 5000,
        );
        ts += 6000;
        written += 2 + 48 * 2 * 4;
        match rate {
            // Appended every 10 ms, as a writer's flushes are; never ahead of the rate.
            Some(rate) => {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                if written >= due {
                    out.write_all(&buf)?;
                    out.flush()?;
                    buf.clear();
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            None if buf.len() > (1 << 20) - 16384 => {
                out.write_all(&buf)?;
                buf.clear();
            }
            None => {}
        }
    }
    out.write_all(&buf)?;
    out.flush()?;
    println!("{written}");
    Ok(())
}
