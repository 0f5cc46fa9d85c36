//! Producer-side cost per recorded event: `cargo bench -p ggml-viz-hook`.
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

use ggml_viz_hook::capture::{self, Entry, GraphInfo};

const RING: u64 = 1 << 20;
const PAIRS: u64 = 400_000;

fn record_pairs(n: u64) {
    let info = |_| GraphInfo {
        graph: 0x1000 as *mut _,
        n_nodes: 68,
        n_threads: 1,
        backend: 0x2000 as *mut _,
        name_id: 0,
    };
    for _ in 0..n {
        let scope = capture::graph_begin(Entry::GraphCompute, info).expect("tracing is on");
        capture::graph_end(black_box(scope));
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

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
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
    capture::start_if_needed();

    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..2 * PAIRS {
        sum = sum.wrapping_add(ggml_viz_hook::clock::now_ticks());
    }
    black_box(sum);
    let clock_ns = start.elapsed().as_nanos() as f64 / (2 * PAIRS) as f64;

    let one_thread = measure(1);
    let two_threads = measure(2);
    let recorder = capture::active().expect("recorder");
    let dropped = recorder.dropped_ring_full();
    println!("{:<44} {:>10}", "measure", "ns/event");
    println!(
        "{:<44} {:>10.1}",
        "clock read alone (the ticks the hook stamps)", clock_ns
    );
    println!("{:<44} {:>10.1}", "record, 1 producer thread", one_thread);
    println!(
        "{:<44} {:>10.1}",
        "record, 2 producer threads (wall / events)", two_threads
    );
    println!(
        "events dropped with a full ring: {dropped} (must be 0 for the figures to mean anything)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
