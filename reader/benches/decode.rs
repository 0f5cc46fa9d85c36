//! Decode throughput over a 10-million-event trace in each layout: `cargo bench -p ggml-viz-reader`.
//!
//! Prints one table: events/s and MB/s for counting per type over the mapped file (the `info`
//! fast path), full decoding over the mapped file, and streaming decoding through `io::Read`.
//! Each figure is the best of 3 runs; the file is in the page cache after the first.

use std::borrow::Cow;
use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use ggml_viz_reader::format::{self, Event, Layout, Payload};
use ggml_viz_reader::{StreamReader, TraceFile};

/// 10 million, or `GGML_VIZ_BENCH_EVENTS`.
fn events() -> u64 {
    std::env::var("GGML_VIZ_BENCH_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000)
}

fn write_trace(path: &std::path::Path, layout: Layout) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut buf = Vec::with_capacity(1 << 20);
    format::encode_header(&mut buf);
    for i in 0..events() {
        // A graph pair around every 48 ops; one op in 8 carries a tensor name.
        let event = match i % 50 {
            0 | 49 => Event {
                type_code: if i % 50 == 0 { 0 } else { 1 },
                timestamp_ns: 1_700_000_000_000_000_000 + i * 100,
                thread_id: 4242,
                payload: Payload::Graph {
                    graph_ptr: 0x7f00_0000_1000,
                    n_nodes: 48,
                    n_threads: 8,
                    backend_ptr: 0,
                },
                label: Some(Cow::Borrowed(b"ggml_backend_sched_graph_compute_async CPU")),
            },
            k => Event {
                type_code: 2 + (k % 2) as u8,
                timestamp_ns: 1_700_000_000_000_000_000 + i * 100,
                thread_id: 4242 + (k % 4) as u32,
                payload: Payload::Op {
                    tensor_ptr: 0x7f00_0000_2000 + k * 64,
                    op_type: 27,
                    op_size: 1 << 20,
                    backend_ptr: 0,
                },
                label: (k % 8 == 1).then_some(Cow::Borrowed(&b"blk.0.ffn_up"[..])),
            },
        };
        format::encode_event(&mut buf, layout, &event);
        if buf.len() > (1 << 20) - 128 {
            out.write_all(&buf).unwrap();
            buf.clear();
        }
    }
    out.write_all(&buf).unwrap();
    out.flush().unwrap();
}

fn best_of_3(mut run: impl FnMut() -> u64) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            assert_eq!(black_box(run()), events());
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run the table only for
    // the former, so that the test suite does not write 900 MB.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ggml-viz-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "{:<8} {:<28} {:>14} {:>10} {:>9}",
        "layout", "operation", "events/s", "MB/s", "seconds"
    );
    for layout in [Layout::Packed, Layout::Padded] {
        let path = dir.join(format!("{layout}.ggmlviz"));
        write_trace(&path, layout);
        let trace = TraceFile::open(&path, Some(layout)).unwrap();
        let mb = trace.bytes().len() as f64 / 1e6;
        let rows: [(&str, f64); 6] = [
            (
                // The memory-bandwidth floor: memchr over the same bytes, nothing decoded.
                "memchr scan (bandwidth floor)",
                best_of_3(|| {
                    let n = memchr::memchr_iter(format::EXTENSION_TYPE_CODE, trace.bytes()).count();
                    black_box(n);
                    events()
                }),
            ),
            (
                "count per type (mmap)",
                best_of_3(|| trace.count_types().total()),
            ),
            (
                "full decode (mmap)",
                best_of_3(|| {
                    let mut n = 0;
                    let mut sum = 0u64;
                    for e in trace.events() {
                        let e = e.unwrap();
                        sum = sum.wrapping_add(e.timestamp_ns);
                        n += 1;
                    }
                    black_box(sum);
                    n
                }),
            ),
            (
                "stream decode (io::Read)",
                best_of_3(|| {
                    let file = std::fs::File::open(&path).unwrap();
                    StreamReader::new(file, Some(layout))
                        .map(|e| e.unwrap().timestamp_ns)
                        .fold(0u64, |n, _| n + 1)
                }),
            ),
            (
                // How the importers read: each record where it lies in the reader's buffer,
                // decoded as far as needed (here, its time).
                "stream records, as they lie",
                best_of_3(|| {
                    let file = std::fs::File::open(&path).unwrap();
                    let (mut n, mut sum) = (0, 0u64);
                    let ended = StreamReader::new(file, Some(layout)).for_each_record(|_, r| {
                        sum = sum.wrapping_add(r.timestamp_ns());
                        n += 1;
                        true
                    });
                    ended.unwrap();
                    black_box(sum);
                    n
                }),
            ),
            (
                // Events borrowing the reader's buffer, handed over whole.
                "stream decode, borrowed",
                best_of_3(|| {
                    let file = std::fs::File::open(&path).unwrap();
                    let (mut n, mut sum) = (0, 0u64);
                    StreamReader::new(file, Some(layout)).for_each_borrowed(|_, e| {
                        sum = sum.wrapping_add(e.unwrap().timestamp_ns);
                        n += 1;
                        true
                    });
                    black_box(sum);
                    n
                }),
            ),
        ];
        for (name, secs) in rows {
            println!(
                "{:<8} {:<28} {:>14.0} {:>10.0} {:>9.3}",
                layout.name(),
                name,
                events() as f64 / secs,
                mb / secs,
                secs
            );
        }
        drop(trace);
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
