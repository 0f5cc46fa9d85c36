//! Per-op totals of a GGMLVIZ trace, with the reader API: map the file, pair each op's begin and
//! end events (the reader names them from the trace's own tensor-info records), group by op.
//!
//! ```sh
//! cargo run --release -p ggml-viz-examples --example op_totals -- trace.ggmlviz
//! ```

use ggml_viz_reader::{GroupBy, OpAnalysis, TraceFile, group_ops};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: op_totals TRACE.ggmlviz")?;
    // Memory-mapped; the layout (packed or padded) is read from the trace or inferred.
    let trace = TraceFile::open(&path, None)?;
    let analysis = OpAnalysis::collect(trace.events());
    if let Some(damage) = &analysis.damage {
        eprintln!("{path}: {damage} (totals cover the events before it)");
    }
    println!(
        "{:<16} {:>8} {:>14} {:>10}",
        "op", "count", "total ns", "mean ns"
    );
    for row in group_ops(&analysis.ops, GroupBy::Op) {
        println!(
            "{:<16} {:>8} {:>14} {:>10}",
            row.key,
            row.count,
            row.total_ns,
            row.total_ns / row.count.max(1) as u64
        );
    }
    println!("{} timed ops", analysis.ops.len());
    Ok(())
}
