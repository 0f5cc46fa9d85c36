//! The page's two time-series charts: each decode call's (or outermost graph compute's)
//! latency to completion, and live bytes per buffer type, both within the point budget.

use std::collections::HashMap;

use ggml_viz_reader::telemetry::LaneId;
use serde::Serialize;

/// Points per chart series at most.
pub(super) const POINT_BUDGET: usize = 4_000;

#[derive(Debug, Default, Serialize)]
pub struct Latency {
    /// `llama_decode spans` or `outermost graph computes`; empty when there is neither.
    pub source: String,
    pub series: Vec<LatencySeries>,
}

#[derive(Debug, Default, Serialize)]
pub struct LatencySeries {
    pub name: String,
    /// Seconds from the origin, and latency to completion in milliseconds (sampled to the
    /// point budget; the statistics are over all of them).
    pub t: Vec<f64>,
    pub ms: Vec<f64>,
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Mean time per token of these calls (their tokens known from the batch).
    pub per_token_ns: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Series {
    pub name: String,
    pub t: Vec<f64>,
    pub values: Vec<f64>,
    pub peak: f64,
}

/// An outermost span of one lane, for latency to completion.
#[derive(Clone, Copy, Debug)]
pub(super) struct TopSpan {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) kind: TopKind,
    pub(super) n_tokens: Option<u64>,
    /// Whether a decode batch holds a prompt (a sequence with several tokens in it), where its
    /// sequences are known; else several tokens are taken for a prompt.
    pub(super) prefill: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TopKind {
    Decode,
    Graph,
    Other,
}

pub(super) fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Latency of each decode call (or outermost graph compute when there are none), measured to
/// completion: an `_async` compute returns at enqueue, and the work is done when the waits that
/// follow it on its thread (synchronize) end. So a call lasts until the latest end of the
/// outermost spans of its thread that begin before the next call.
pub(super) fn latency(
    tops: &mut HashMap<LaneId, Vec<TopSpan>>,
    seconds: impl Fn(u64) -> f64,
) -> Latency {
    let any_decode = tops.values().flatten().any(|t| t.kind == TopKind::Decode);
    let unit = if any_decode {
        TopKind::Decode
    } else {
        TopKind::Graph
    };
    // (series, start, latency ns, tokens)
    let mut calls: Vec<(usize, u64, u64, Option<u64>)> = Vec::new();
    for spans in tops.values_mut() {
        spans.sort_by_key(|s| s.start);
        let mut current: Option<TopSpan> = None;
        let flush = |c: Option<TopSpan>, calls: &mut Vec<_>| {
            if let Some(c) = c {
                let prefill = c.prefill.unwrap_or(c.n_tokens.is_some_and(|n| n > 1));
                let series = match unit {
                    TopKind::Decode if prefill => 0,
                    TopKind::Decode => 1,
                    _ => 2,
                };
                calls.push((series, c.start, c.end - c.start, c.n_tokens));
            }
        };
        for s in spans.iter() {
            if s.kind == unit {
                flush(current.take(), &mut calls);
                current = Some(*s);
            } else if let Some(c) = current.as_mut() {
                c.end = c.end.max(s.end);
            }
        }
        flush(current, &mut calls);
    }
    calls.sort_by_key(|c| c.1);
    let names = ["prefill", "generation", "graph compute"];
    let mut out = Latency {
        source: match (any_decode, calls.is_empty()) {
            (_, true) => String::new(),
            (true, _) => "llama_decode spans".into(),
            (false, _) => "outermost graph computes".into(),
        },
        series: Vec::new(),
    };
    for (i, name) in names.iter().enumerate() {
        let mine: Vec<_> = calls.iter().filter(|c| c.0 == i).collect();
        if mine.is_empty() {
            continue;
        }
        let mut durations: Vec<u64> = mine.iter().map(|c| c.2).collect();
        durations.sort_unstable();
        let tokens: u64 = mine.iter().filter_map(|c| c.3).sum();
        let stride = mine.len().div_ceil(POINT_BUDGET);
        let kept = mine.iter().step_by(stride);
        out.series.push(LatencySeries {
            name: name.to_string(),
            t: kept.clone().map(|c| seconds(c.1)).collect(),
            ms: kept.map(|c| c.2 as f64 / 1e6).collect(),
            count: mine.len() as u64,
            p50_ns: quantile(&durations, 0.5),
            p99_ns: quantile(&durations, 0.99),
            per_token_ns: (i == 0 && tokens > 0).then(|| durations.iter().sum::<u64>() / tokens),
        });
    }
    out
}

/// Live bytes per buffer type; past the point budget each point is the highest value of its
/// interval (a peak must not vanish from the chart).
pub(super) fn memory(
    counters: HashMap<String, Vec<(u64, f64)>>,
    seconds: impl Fn(u64) -> f64,
) -> Vec<Series> {
    let mut out: Vec<Series> = counters
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by_key(|p| p.0);
            let peak = points.iter().map(|p| p.1).fold(0.0, f64::max);
            let (first, last) = (points[0].0, points[points.len() - 1].0);
            let mut kept: Vec<(u64, f64)> = Vec::new();
            if points.len() <= POINT_BUDGET {
                kept = points;
            } else {
                let width = (last - first) / POINT_BUDGET as u64 + 1;
                let mut bucket = u64::MAX;
                for p in points {
                    let b = (p.0 - first) / width;
                    match kept.last_mut() {
                        Some(k) if b == bucket => k.1 = k.1.max(p.1),
                        _ => kept.push(p),
                    }
                    bucket = b;
                }
            }
            Series {
                name,
                t: kept.iter().map(|p| seconds(p.0)).collect(),
                values: kept.iter().map(|p| p.1).collect(),
                peak,
            }
        })
        .collect();
    out.sort_by(|a, b| b.peak.total_cmp(&a.peak).then(a.name.cmp(&b.name)));
    out
}
