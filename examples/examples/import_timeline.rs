//! Any input the telemetry model reads — a GGMLVIZ trace, an Ascend GE profiling log, CoMMA's NCCL
//! JSON, TelemetryEvent v2 records — imported into the common model, then the span names that
//! took the most time, per process.
//!
//! ```sh
//! cargo run --release -p ggml-viz-examples --example import_timeline -- ../shared/samples/ada-pa/pytorch_acl.log
//! ```

use std::collections::HashMap;

use ggml_viz_reader::import_path;
use ggml_viz_reader::telemetry::{Collected, Ids, LaneId, ProcessId};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: import_timeline FILE")?;
    let mut model = Collected::default();
    // The format is recognised from the file's first bytes; `Ids` keeps process, lane and span
    // ids distinct when several files go onto one timeline.
    import_path(path.as_ref(), None, None, &mut Ids::default(), &mut model).map_err(|e| e.0)?;
    for warning in &model.warnings {
        eprintln!("warning: {warning}");
    }
    let process_of_lane: HashMap<LaneId, ProcessId> =
        model.lanes.iter().map(|l| (l.id, l.process)).collect();
    for process in &model.processes {
        let mut totals: HashMap<&str, (u64, u64)> = HashMap::new();
        for span in &model.spans {
            if process_of_lane.get(&span.lane) == Some(&process.id) {
                let entry = totals.entry(span.name.as_str()).or_default();
                entry.0 += 1;
                entry.1 += span.duration_ns();
            }
        }
        let mut rows: Vec<_> = totals.into_iter().collect();
        rows.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        println!("{} ({} span names)", process.name, rows.len());
        for (name, (count, total_ns)) in rows.iter().take(10) {
            println!("  {name:<40} {count:>8} {total_ns:>14} ns");
        }
    }
    Ok(())
}
