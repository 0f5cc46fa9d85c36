//! Each server's clock against its client's, from the bounds the joined commands put on it:
//! one offset where they allow one, else a line (drift), else none.

use crate::telemetry::ProcessId;
use std::collections::BTreeMap;

use super::model::{ClockOffset, Drift, JoinedCommand, RpcAnalysis};
use super::parts::RpcParts;

/// A command's bounds on a server's offset: (client time, lower, upper if answered).
type Bound = (u64, i64, Option<i64>);

/// The bounds joined command `j` puts on its server's offset.
pub(super) fn bound(parts: &RpcParts, j: &JoinedCommand) -> Bound {
    let signed = |t: u64| t.min(i64::MAX as u64) as i64;
    let (request, serve) = (parts.part(j.request), parts.part(j.serve));
    let lower = signed(request.start_ns).saturating_sub(signed(serve.start_ns));
    let upper = j
        .answer
        .zip(j.server_answer)
        .map(|(answer, server_answer)| {
            signed(parts.part(answer).end_ns)
                .saturating_sub(signed(parts.part(server_answer).start_ns))
        });
    (request.start_ns, lower, upper)
}

/// Offsets, per server process, from every joined command of its links: one constant offset
/// where the bounds allow one, else a line (drift), else none.
pub(super) fn offsets(parts: &RpcParts, analysis: &RpcAnalysis) -> Vec<ClockOffset> {
    let server_of = |j: &JoinedCommand| analysis.links[j.link].server_process;
    let mut bounds: BTreeMap<ProcessId, (i64, Option<i64>, usize)> = BTreeMap::new();
    for j in &analysis.joined {
        let b = bounds.entry(server_of(j)).or_insert((i64::MIN, None, 0));
        let (_, lower, upper) = bound(parts, j);
        b.0 = b.0.max(lower);
        if let Some(upper) = upper {
            b.1 = Some(b.1.map_or(upper, |u: i64| u.min(upper)));
        }
        b.2 += 1;
    }
    (bounds.into_iter())
        .map(|(server_process, (lower, upper, commands))| {
            let mut offset = ClockOffset {
                server_process,
                offset_ns: upper
                    .map_or(lower, |u| lower.saturating_add(u.saturating_sub(lower) / 2)),
                lower_ns: lower,
                upper_ns: upper,
                commands,
                drift: None,
                uncertainty: upper.map(|u| u.saturating_sub(lower).max(0) / 2),
                kept_own_clock: false,
            };
            if offset.disagreement_ns().is_some() {
                let all: Vec<Bound> = (analysis.joined.iter())
                    .filter(|j| server_of(j) == server_process)
                    .map(|j| bound(parts, j))
                    .collect();
                match fit_line(&all) {
                    Some((drift, intercept, half_width)) => {
                        offset.offset_ns = intercept;
                        offset.drift = Some(drift);
                        offset.uncertainty = Some(half_width);
                    }
                    None => {
                        offset.offset_ns = 0;
                        offset.uncertainty = None;
                        offset.kept_own_clock = true;
                    }
                }
            }
            offset
        })
        .collect()
}

/// Drifts considered: up to a millisecond a second either way (quartz clocks drift by tens of
/// microseconds a second).
const MAX_SLOPE: f64 = 1e-3;

/// A line through the bounds where no constant offset fits them. For a slope `b`, the
/// intercepts every command allows form an interval, whose width is a concave function of `b`
/// (a minimum of lines less a maximum of lines): its widest point is found by golden-section
/// search, and the line is its middle. `None` when even the widest is empty (a misjoined
/// connection, or a clock that jumped): no line fits.
fn fit_line(bounds: &[Bound]) -> Option<(Drift, i64, i64)> {
    let reference_ns = bounds.iter().map(|b| b.0).min()?;
    let since = |t: u64| (t - reference_ns) as f64;
    // The intercepts slope `b` allows: (lowest, highest).
    let allowed = |b: f64| {
        let (mut lowest, mut highest) = (f64::NEG_INFINITY, f64::INFINITY);
        for &(t, l, u) in bounds {
            let along = b * since(t);
            lowest = lowest.max(l as f64 - along);
            if let Some(u) = u {
                highest = highest.min(u as f64 - along);
            }
        }
        (lowest, highest)
    };
    let width = |b: f64| {
        let (lowest, highest) = allowed(b);
        highest - lowest
    };
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let (mut lo, mut hi) = (-MAX_SLOPE, MAX_SLOPE);
    let (mut x1, mut x2) = (hi - ratio * (hi - lo), lo + ratio * (hi - lo));
    let (mut w1, mut w2) = (width(x1), width(x2));
    // 80 steps shrink the bracket by 0.618^80 ≈ 2e-17: far below a nanosecond over any run.
    for _ in 0..80 {
        if w1 < w2 {
            lo = x1;
            (x1, w1) = (x2, w2);
            x2 = lo + ratio * (hi - lo);
            w2 = width(x2);
        } else {
            hi = x2;
            (x2, w2) = (x1, w1);
            x1 = hi - ratio * (hi - lo);
            w1 = width(x1);
        }
    }
    let slope = (lo + hi) / 2.0;
    let (lowest, highest) = allowed(slope);
    if !(lowest <= highest && highest.is_finite()) {
        return None;
    }
    let intercept = ((lowest + highest) / 2.0) as i64;
    let half_width = ((highest - lowest) / 2.0) as i64;
    Some((
        Drift {
            reference_ns,
            slope,
        },
        intercept,
        half_width,
    ))
}
