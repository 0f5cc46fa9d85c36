//! Producer-side cost per recorded event: `cargo bench -p ggml-viz-hook` (and per ggml-rpc
//! command: the protocol reader's share of an answered command's six transport calls); with `-- --sustained`,
//! the write rate N threads sustain into the default ring flat out, and what one thread paced at
//! 5 M events/s loses (the flusher is woken when a ring becomes half full).
//!
//! Records graph begin/end pairs through the same code the exported wrappers run (capture window,
//! event cap, clock, ring), with a ring large enough that nothing is dropped, while the flusher
//! drains to a file. Prints ns per event for 1 and 2 producer threads, next to the cost of reading
//! the clock alone, measured in the same run.
//!
//! Each measuring thread first fills its whole ring once and lets the flusher drain it: the first
//! touch of a ring page is a page fault (microseconds in a VM), paid once per thread in a real
//! program, and not what this measures.

use std::hint::black_box;
use std::time::Instant;

use ggml_viz_config::{Config, Sources};
use ggml_viz_hook::{self as record, Entry, GraphInfo, Setup, Transfer};

const RING: u64 = 1 << 20;
const PAIRS: u64 = 400_000;

/// Starts tracing with the configuration the environment gives, as the first wrapped call would.
fn start() {
    record::start_once(|| Setup {
        config: Config::load(&Sources::from_process_env()),
        ggml_version: None,
        cpu_functions: Err("a benchmark of the recording core".into()),
        prepare_op_timing: |_| {},
        before_last_flush: || {},
    });
}

fn record_pairs(n: u64) {
    let info = |_| GraphInfo {
        graph: 0x1000 as *mut _,
        n_nodes: 68,
        n_threads: 1,
        backend: 0x2000 as *mut _,
        name_id: 0,
    };
    for _ in 0..n {
        let scope = record::graph_begin(Entry::GraphCompute, info).expect("tracing is on");
        record::graph_end(black_box(scope));
    }
}

/// Wall time per event with `threads` producers, each on a warmed-up ring.
fn measure(threads: u64) -> f64 {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads as usize + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                record_pairs(RING / 2);
                std::thread::sleep(std::time::Duration::from_millis(300));
                barrier.wait();
                record_pairs(PAIRS / threads);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    workers.into_iter().for_each(|w| w.join().unwrap());
    start.elapsed().as_nanos() as f64 / (2 * PAIRS) as f64
}

const COMMANDS: u64 = 50_000;

/// What recording a ggml-rpc command costs its client: the six transport calls of an answered
/// command (command byte, size, payload, flush; the answer's size and payload) told to the
/// protocol reader, which records its request and answer (4 events). Nanoseconds per command,
/// on a warmed-up ring, not counting the transport itself.
fn measure_rpc() -> f64 {
    std::thread::spawn(|| {
        record_pairs(RING / 2);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let socket = 0x7000;
        let call = |transfer, bytes: &[u8]| {
            // SAFETY: `bytes` is readable for its length.
            unsafe {
                record::rpc_before(socket, transfer, bytes.as_ptr(), bytes.len());
                record::rpc_after(socket, transfer, bytes.as_ptr(), bytes.len(), true);
            }
        };
        let payload = [0u8; 40];
        let command = |code: u8| {
            call(Transfer::Send, &[code]);
            call(Transfer::Send, &40u64.to_le_bytes());
            call(Transfer::Send, &payload);
            call(Transfer::Flush, &[]);
            call(Transfer::Recv, &40u64.to_le_bytes());
            call(Transfer::Recv, &payload);
        };
        record::rpc_connected(socket, "10.0.0.2:50052");
        command(14);
        let start = Instant::now();
        for _ in 0..COMMANDS {
            command(black_box(8));
        }
        start.elapsed().as_nanos() as f64 / COMMANDS as f64
    })
    .join()
    .unwrap()
}

/// `--sustained`: default ring and flush interval, N threads recording flat out for a while:
/// what is written per second, and what fraction is dropped.
fn sustained(dir: &std::path::Path) {
    // SAFETY: set before any other thread exists.
    unsafe {
        std::env::set_var("GGML_VIZ_OUTPUT", dir.join("sustained.ggmlviz"));
        std::env::set_var("GGML_VIZ_MAX_EVENTS", (1u64 << 50).to_string());
    }
    start();
    let seconds: f64 = std::env::var("GGML_VIZ_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    println!(
        "{:<44} {:>14} {:>10} {:>9}",
        "sustained, default ring and flush", "events/s", "MB/s", "dropped"
    );
    // One thread paced at a fixed rate: 1000-pair bursts, each started when the clock says the
    // rate allows it. First, before the flat-out runs leave gigabytes of dirty pages for the
    // kernel to write back (which then throttles every writer to the disk's own pace).
    let rate = 5_000_000.0;
    let recorder = record::active().expect("recorder");
    let dropped_before = recorder.dropped_ring_full();
    let start = Instant::now();
    let mut produced = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        while (produced as f64) > start.elapsed().as_secs_f64() * rate {
            std::hint::spin_loop();
        }
        record_pairs(1000);
        produced += 2000;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let dropped = recorder.dropped_ring_full() - dropped_before;
    println!(
        "{:<44} {:>14.0} {:>10.1} {:>8.1}%",
        "1 thread paced at 5 M events/s",
        (produced - dropped) as f64 / elapsed,
        (produced - dropped) as f64 * 42.0 / elapsed / 1e6,
        100.0 * dropped as f64 / produced.max(1) as f64
    );
    for threads in [1u64, 2] {
        let recorder = record::active().expect("recorder");
        let dropped_before = recorder.dropped_ring_full();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let start = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut pairs = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        record_pairs(1000);
                        pairs += 1000;
                    }
                    pairs
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let produced: u64 = workers.into_iter().map(|w| w.join().unwrap() * 2).sum();
        let elapsed = start.elapsed().as_secs_f64();
        let dropped = recorder.dropped_ring_full() - dropped_before;
        let written = produced - dropped;
        println!(
            "{:<44} {:>14.0} {:>10.1} {:>8.1}%",
            format!("{threads} thread(s)"),
            written as f64 / elapsed,
            written as f64 * 42.0 / elapsed / 1e6,
            100.0 * dropped as f64 / produced.max(1) as f64
        );
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::args().any(|a| a == "--sustained") {
        let dir = std::env::temp_dir().join(format!("ggml-viz-sustained-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        sustained(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let dir = std::env::temp_dir().join(format!("ggml-viz-producer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: set before any other thread exists.
    unsafe {
        std::env::set_var("GGML_VIZ_OUTPUT", dir.join("bench.ggmlviz"));
        std::env::set_var("GGML_VIZ_BUFFER_SIZE", RING.to_string());
        std::env::set_var("GGML_VIZ_MAX_EVENTS", (1u64 << 40).to_string());
        std::env::set_var("GGML_VIZ_FLUSH_INTERVAL", "10");
    }
    start();

    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..2 * PAIRS {
        sum = sum.wrapping_add(record::now_ticks());
    }
    black_box(sum);
    let clock_ns = start.elapsed().as_nanos() as f64 / (2 * PAIRS) as f64;
    let start = Instant::now();
    for _ in 0..2 * PAIRS {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        black_box(ts.tv_nsec);
    }
    let gettime_ns = start.elapsed().as_nanos() as f64 / (2 * PAIRS) as f64;

    // Best of 3: this VM's neighbours come and go.
    let one_thread = (0..3).map(|_| measure(1)).fold(f64::INFINITY, f64::min);
    let two_threads = (0..3).map(|_| measure(2)).fold(f64::INFINITY, f64::min);
    let rpc = (0..3).map(|_| measure_rpc()).fold(f64::INFINITY, f64::min);
    let recorder = record::active().expect("recorder");
    let dropped = recorder.dropped_ring_full();
    println!("{:<44} {:>10}", "measure", "ns/event");
    println!(
        "{:<44} {:>10.1}",
        "clock read alone (the ticks the hook stamps)", clock_ns
    );
    println!(
        "{:<44} {:>10.1}",
        "clock_gettime(CLOCK_MONOTONIC) alone (floor)", gettime_ns
    );
    println!("{:<44} {:>10.1}", "record, 1 producer thread", one_thread);
    println!(
        "{:<44} {:>10.1}",
        "record, 2 producer threads (wall / events)", two_threads
    );
    println!(
        "{:<44} {:>10.1}",
        "rpc command, answered (ns per command)", rpc
    );
    println!(
        "events dropped with a full ring: {dropped} (must be 0 for the figures to mean anything)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
