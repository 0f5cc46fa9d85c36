//! How the commands write their figures: durations, MiB (as llama.cpp prints its buffers), and
//! what op timing cost a run.

use ggml_viz_reader::TimingCost;

/// Bytes in a MiB, the unit llama.cpp prints its buffer sizes in.
pub const MIB: f64 = 1024.0 * 1024.0;

/// A duration for people: ns, µs, ms or s with three significant decimals.
pub fn fmt_ns(ns: f64) -> String {
    match ns {
        n if n < 1e3 => format!("{n:.0} ns"),
        n if n < 1e6 => format!("{:.3} µs", n / 1e3),
        n if n < 1e9 => format!("{:.3} ms", n / 1e6),
        n => format!("{:.3} s", n / 1e9),
    }
}

/// What op timing cost the run (`generation graph computes took … with their ops timed, …
/// without: +1.2 % (95 % interval …)`), as `ops`, `info` and the report say it after their own
/// lead.
pub fn timing_cost_sentence(c: &TimingCost) -> String {
    let pct = |x: f64| format!("{:+.1} %", 100.0 * x);
    format!(
        "{} graph computes took {} (median of {}) with their ops timed, \
         {} (median of {}) without: {} (95 % interval {} .. {})",
        c.phase.map_or("the", |p| p.name()),
        fmt_ns(c.timed.1),
        c.timed.0,
        fmt_ns(c.untimed.1),
        c.untimed.0,
        pct(c.change),
        pct(c.interval.0),
        pct(c.interval.1)
    )
}
