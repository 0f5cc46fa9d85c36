//! What the commands say besides their tables: the failures they end with ([`Failure`]), and how
//! they write their figures: durations, MiB (as llama.cpp prints its buffers), and what op timing
//! cost a run.

use std::io;

use ggml_viz_reader::TimingCost;

/// Why a command failed; each maps to an exit status.
#[derive(Debug)]
pub enum Failure {
    /// The file is corrupt or unreadable (exit 2). What could be read was already printed; an
    /// input that is no trace at all fails the command before anything is printed or written.
    Data(String),
    /// Writing the output failed (exit 2); a closed pipe is not a failure.
    Output(io::Error),
    /// The request cannot be carried out as given (exit 1).
    Usage(String),
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        Failure::Output(err)
    }
}

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
