//! The per-sequence table: a batching server's sequences (llama-server's slots), each with the
//! requests the importer inferred on its lane (`request` spans, with their prompt and generated
//! tokens) and how long they took.

use std::collections::HashMap;

use serde::Serialize;

use ggml_viz_reader::SEQUENCE_CATEGORY;
use ggml_viz_reader::telemetry::{LaneId, Span};

use super::series::quantile;

#[derive(Debug, Default, PartialEq, Serialize)]
pub struct SequenceRow {
    /// The lane's name (`sequence 3`), after its process's when there are several.
    pub name: String,
    pub requests: u64,
    pub prefill_tokens: u64,
    pub generation_tokens: u64,
    /// Request durations, first step's start to last step's end.
    pub request_p50_ns: u64,
    pub request_p99_ns: u64,
    /// Time generating (from the end of a request's last prefill step to its end) per generated
    /// token, over all its requests; `None` without generated tokens.
    pub per_token_ns: Option<u64>,
}

#[derive(Default)]
struct Lane {
    durations: Vec<u64>,
    prefill_tokens: u64,
    generation_tokens: u64,
    generating_ns: u64,
    /// End of the lane's last prefill step.
    prefill_end_ns: u64,
}

/// Collects the table from the spans as they come (a request closes after its steps).
#[derive(Default)]
pub(super) struct SequenceTable {
    lanes: HashMap<LaneId, Lane>,
}

impl SequenceTable {
    pub(super) fn span(&mut self, span: &Span) {
        if span.category != SEQUENCE_CATEGORY {
            return;
        }
        let lane = self.lanes.entry(span.lane).or_default();
        match span.name.as_str() {
            "prefill" => lane.prefill_end_ns = span.end_ns,
            "request" => {
                lane.durations.push(span.duration_ns());
                lane.prefill_tokens += span.arg_uint("prefill_tokens").unwrap_or(0);
                lane.generation_tokens += span.arg_uint("generation_tokens").unwrap_or(0);
                let generating_from = lane.prefill_end_ns.clamp(span.start_ns, span.end_ns);
                lane.generating_ns += span.end_ns - generating_from;
            }
            _ => {}
        }
    }

    /// The rows, in the order `position` gives each lane (the timeline's), named by `name`.
    pub(super) fn finish(
        self,
        position: impl Fn(LaneId) -> u32,
        name: impl Fn(LaneId) -> String,
    ) -> Vec<SequenceRow> {
        let mut rows: Vec<(u32, SequenceRow)> = (self.lanes.into_iter())
            .filter(|(_, l)| !l.durations.is_empty())
            .map(|(id, mut l)| {
                l.durations.sort_unstable();
                let row = SequenceRow {
                    name: name(id),
                    requests: l.durations.len() as u64,
                    prefill_tokens: l.prefill_tokens,
                    generation_tokens: l.generation_tokens,
                    request_p50_ns: quantile(&l.durations, 0.5),
                    request_p99_ns: quantile(&l.durations, 0.99),
                    per_token_ns: (l.generation_tokens > 0)
                        .then(|| l.generating_ns / l.generation_tokens),
                };
                (position(id), row)
            })
            .collect();
        rows.sort_by_key(|(position, _)| *position);
        rows.into_iter().map(|(_, row)| row).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_viz_reader::telemetry::{Arg, Texts};

    fn span(
        texts: &mut Texts,
        lane: u32,
        name: &str,
        start: u64,
        end: u64,
        args: &[(&str, u64)],
    ) -> Span {
        Span {
            id: start,
            parent: None,
            depth: 0,
            lane: LaneId(lane),
            name: texts.get(name),
            category: texts.get(SEQUENCE_CATEGORY),
            start_ns: start,
            end_ns: end,
            args: args
                .iter()
                .map(|(k, v)| (texts.get(k), Arg::UInt(*v)))
                .collect::<Vec<_>>()
                .into(),
            self_ns: 0,
        }
    }

    /// Two requests on one lane, one on another, steps before their requests as the importer
    /// emits them: counts, token sums, percentiles and time per generated token by arithmetic.
    #[test]
    fn requests_are_summed_per_sequence() {
        let mut t = Texts::default();
        let mut table = SequenceTable::default();
        let spans = [
            span(&mut t, 7, "prefill", 0, 40, &[("tokens", 12)]),
            span(&mut t, 7, "generate", 50, 60, &[("tokens", 1)]),
            span(&mut t, 7, "generate", 70, 80, &[("tokens", 1)]),
            span(
                &mut t,
                7,
                "request",
                0,
                80,
                &[("prefill_tokens", 12), ("generation_tokens", 2)],
            ),
            span(&mut t, 7, "prefill", 100, 130, &[("tokens", 5)]),
            span(
                &mut t,
                7,
                "request",
                100,
                130,
                &[("prefill_tokens", 5), ("generation_tokens", 0)],
            ),
            span(&mut t, 3, "prefill", 0, 10, &[("tokens", 2)]),
            span(&mut t, 3, "generate", 20, 30, &[("tokens", 1)]),
            span(
                &mut t,
                3,
                "request",
                0,
                30,
                &[("prefill_tokens", 2), ("generation_tokens", 1)],
            ),
        ];
        for s in &spans {
            table.span(s);
        }
        // Not a sequence's span: left out.
        let other = Span {
            category: t.get("graph"),
            ..span(&mut t, 9, "request", 0, 1, &[])
        };
        table.span(&other);
        let rows = table.finish(|lane| lane.0, |lane| format!("lane {lane}"));
        assert_eq!(
            rows,
            [
                SequenceRow {
                    name: "lane 3".into(),
                    requests: 1,
                    prefill_tokens: 2,
                    generation_tokens: 1,
                    request_p50_ns: 30,
                    request_p99_ns: 30,
                    per_token_ns: Some(20),
                },
                SequenceRow {
                    name: "lane 7".into(),
                    requests: 2,
                    prefill_tokens: 17,
                    generation_tokens: 2,
                    request_p50_ns: 30,
                    request_p99_ns: 80,
                    // Generating 40..80 in the first request, none in the second.
                    per_token_ns: Some(20),
                },
            ]
        );
    }
}
