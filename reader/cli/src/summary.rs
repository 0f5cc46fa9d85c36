//! `summary`: time per event name over one or more inputs.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use ggml_viz_reader::{Row, Summary, csv_cell};

use crate::input::reading::{InputOpts, say_warnings, summarize};
use crate::say::Failure;
use crate::say::fmt_ns;

/// Time per event name over one or more inputs (GGMLVIZ traces, GE logs).
///
/// Count, total, self, mean, min, p50, p99, max, share and thread time. Nested spans of the same
/// name count once: a 20 µs span containing two 10 µs spans of its own name is 2 spans, 20 µs.
/// `total` is the wall time the name's spans cover; mean, min, p50, p99 and max are over the
/// counted spans. An op type whose nodes a trace timed counts nodes, each node's wall time (its
/// first thread's start to its last one's end), as `ops`, `diff --ops` and the report do; its
/// thread time is every thread's share summed. `share` is the row's part of all rows' self
/// time: the shares add up to 100 %.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  ggml-viz summary trace.ggmlviz\n  ggml-viz summary --csv ge.log > ge.csv"
)]
pub struct SummaryArgs {
    /// Inputs, recognised by content.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write CSV to stdout (units in the column names) instead of a table.
    #[arg(long)]
    csv: bool,
    #[command(flatten)]
    input: InputOpts,
}

pub fn summary(args: SummaryArgs) -> Result<(), Failure> {
    args.input.check(&args.files, None)?;
    let (s, result) = summarize(&args.files, &args.input);
    say_warnings(&s.warnings);
    let mut out = io::stdout().lock();
    if args.csv {
        write_csv(&mut out, &s)?;
    } else {
        write_table(&mut out, &s)?;
    }
    out.flush()?;
    result
}

/// `row`'s part of all rows' self time (`all_self`), in percent.
fn share(row: &Row, all_self: u64) -> f64 {
    if all_self == 0 {
        0.0
    } else {
        100.0 * row.self_ns as f64 / all_self as f64
    }
}

fn write_table(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(out, "wall time: {}", fmt_ns(s.wall_ns() as f64))?;
    if s.rows().any(|(_, r)| r.shares.is_some()) {
        writeln!(
            out,
            "op types count nodes (each node's wall time, as `ops` has it); thread time: every \
             thread's spans of the name, summed"
        )?;
    }
    writeln!(
        out,
        "{:<40} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>11}",
        "name",
        "count",
        "total",
        "self",
        "mean",
        "min",
        "p50",
        "p99",
        "max",
        "share",
        "thread time"
    )?;
    let all_self = s.self_ns_total();
    for (name, r) in s.sorted() {
        writeln!(
            out,
            "{:<40} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6.1}% {:>11}",
            name,
            r.count,
            fmt_ns(r.total_ns as f64),
            fmt_ns(r.self_ns as f64),
            fmt_ns(r.mean_ns()),
            fmt_ns(r.min_ns() as f64),
            fmt_ns(r.durations.quantile(0.5) as f64),
            fmt_ns(r.durations.quantile(0.99) as f64),
            fmt_ns(r.max_ns() as f64),
            share(r, all_self),
            fmt_ns(r.thread_ns() as f64)
        )?;
    }
    Ok(())
}

fn write_csv(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(
        out,
        "name,count,total_us,self_us,mean_us,min_us,p50_us,p99_us,max_us,share_percent,spans,thread_us"
    )?;
    let us = |ns: f64| ns / 1000.0;
    let all_self = s.self_ns_total();
    for (name, r) in s.sorted() {
        writeln!(
            out,
            "{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{:.3}",
            csv_cell(name),
            r.count,
            us(r.total_ns as f64),
            us(r.self_ns as f64),
            us(r.mean_ns()),
            us(r.min_ns() as f64),
            us(r.durations.quantile(0.5) as f64),
            us(r.durations.quantile(0.99) as f64),
            us(r.max_ns() as f64),
            share(r, all_self),
            r.spans(),
            us(r.thread_ns() as f64)
        )?;
    }
    Ok(())
}
