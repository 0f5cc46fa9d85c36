//! A lane per sequence of a batching server (llama-server's slots are sequences), made from the
//! composition of its decode batches: each batch a `prefill` or `generate` step on every sequence
//! it carried, and the steps grouped into inferred `request` spans.
//!
//! Inferred, not read: a batch says how many tokens of each sequence it holds, not whether they
//! are prompt or generated, nor where a request begins. A sequence with several tokens in a
//! batch is prefilling (or checking a speculative draft); one token is a generation step. A
//! request begins with a prefill, unless the sequence prefilled in the batch just before (a
//! prompt split over consecutive batches stays one request), or after the sequence was cleared
//! (`llama_memory_seq_rm` from its start: a server does so when a slot's next request starts),
//! and ends with the last step before the next one. A request that finds all but one token of
//! its prompt cached starts with one token, and is taken for the previous request's
//! continuation. Tokens of sequences beyond the six a batch names one by one are not drawn.

use rustc_hash::FxHashMap;

use crate::telemetry::{Arg, Args, Ids, Lane, Record, RecordSink, SpanStack, Text, Texts};
use crate::telemetry::{LaneId, ProcessId};

/// The span category of the lanes' spans.
pub const CATEGORY: &str = "sequence";

struct Sequence {
    lane: LaneId,
    /// The open request, if any (depth 0).
    stack: SpanStack,
    /// Whether the last step generated (one token).
    generating: bool,
    /// The number of the last batch that carried this sequence.
    last_batch: u64,
    /// Whether the sequence was cleared since that batch (its next batch begins a request).
    cleared: bool,
    last_end_ns: u64,
    prompt_tokens: u64,
    generated_tokens: u64,
}

/// The sequences met so far in one process's trace.
#[derive(Default)]
pub struct Sequences {
    by_id: FxHashMap<i32, Sequence>,
    /// Batches seen.
    batches: u64,
}

/// Names and categories shared by every step.
pub struct SequenceNames {
    category: Text,
    request: Text,
    prefill: Text,
    generate: Text,
    tokens: Text,
    sequence: Text,
    prompt: Text,
    generated: Text,
}

impl SequenceNames {
    pub fn new(texts: &mut Texts) -> SequenceNames {
        SequenceNames {
            category: texts.get(CATEGORY),
            request: texts.get("request"),
            prefill: texts.get("prefill"),
            generate: texts.get("generate"),
            tokens: texts.get("tokens"),
            sequence: texts.get("sequence"),
            prompt: texts.get("prefill_tokens"),
            generated: texts.get("generation_tokens"),
        }
    }
}

impl Sequences {
    /// One decode batch from `start_ns` to `end_ns` holding `seqs` (sequence id, tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn batch<S: RecordSink>(
        &mut self,
        sink: &mut S,
        ids: &mut Ids,
        names: &SequenceNames,
        process: ProcessId,
        seqs: &[(i32, u32)],
        start_ns: u64,
        end_ns: u64,
    ) {
        self.batches += 1;
        for &(id, tokens) in seqs {
            let seq = self.by_id.entry(id).or_insert_with(|| {
                let lane = ids.lane();
                sink.record(Record::Lane(Lane {
                    id: lane,
                    process,
                    tid: None,
                    name: format!("sequence {id}"),
                }));
                Sequence {
                    lane,
                    stack: SpanStack::default(),
                    generating: false,
                    last_batch: 0,
                    cleared: false,
                    last_end_ns: 0,
                    prompt_tokens: 0,
                    generated_tokens: 0,
                }
            });
            let prefill = tokens > 1;
            let continues_prompt = !seq.generating && seq.last_batch + 1 == self.batches;
            if (prefill && !continues_prompt) || seq.stack.is_empty() || seq.cleared {
                seq.close_request(sink, names);
                let args: Args = vec![(names.sequence.clone(), Arg::Int(id.into()))].into();
                let (name, category) = (names.request.clone(), names.category.clone());
                seq.stack.open(ids.span(), name, category, start_ns, args);
            }
            let step = if prefill {
                seq.prompt_tokens += u64::from(tokens);
                names.prefill.clone()
            } else {
                seq.generated_tokens += u64::from(tokens);
                names.generate.clone()
            };
            let args: Args = vec![(names.tokens.clone(), Arg::UInt(tokens.into()))].into();
            seq.stack
                .open(ids.span(), step, names.category.clone(), start_ns, args);
            if let Some(span) = seq.stack.close(seq.lane, end_ns) {
                sink.span(&span);
            }
            seq.generating = !prefill;
            seq.cleared = false;
            seq.last_batch = self.batches;
            seq.last_end_ns = end_ns;
        }
    }

    /// Sequence `id` was cleared from its start (`llama_memory_seq_rm(mem, id, p0 <= 0, -1)`): what
    /// comes next on it is a new request, even a prompt in the very next batch.
    pub fn cleared(&mut self, id: i32) {
        if let Some(seq) = self.by_id.get_mut(&id) {
            seq.cleared = true;
        }
    }

    /// Closes every request still open, at its last step's end.
    pub fn finish<S: RecordSink>(&mut self, sink: &mut S, names: &SequenceNames) {
        let mut ids: Vec<i32> = self.by_id.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(seq) = self.by_id.get_mut(&id) {
                seq.close_request(sink, names);
            }
        }
    }
}

impl Sequence {
    /// Closes the open request, if any, with its tokens as arguments.
    fn close_request<S: RecordSink>(&mut self, sink: &mut S, names: &SequenceNames) {
        if let Some(mut span) = self.stack.close(self.lane, self.last_end_ns) {
            let tokens = [
                (names.prompt.clone(), Arg::UInt(self.prompt_tokens)),
                (names.generated.clone(), Arg::UInt(self.generated_tokens)),
            ];
            span.args = span.args.iter().cloned().chain(tokens).collect();
            sink.span(&span);
        }
        self.prompt_tokens = 0;
        self.generated_tokens = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Collected;
    use crate::telemetry::ProcessId;

    /// The names, an empty state, span ids and a sink for one test.
    fn fresh() -> (SequenceNames, Sequences, Ids, Collected) {
        let names = SequenceNames::new(&mut Texts::default());
        (
            names,
            Sequences::default(),
            Ids::default(),
            Collected::default(),
        )
    }

    /// Two sequences over six batches (continuous batching): requests begin at a prefill after
    /// generating, a prompt split over two batches is one request, and each request carries its
    /// tokens.
    #[test]
    fn batches_become_steps_and_requests_per_sequence() {
        let (names, mut seqs, mut ids, mut out) = fresh();
        let batches: [&[(i32, u32)]; 9] = [
            &[(0, 5)],         // 0: prefill
            &[(0, 1), (1, 3)], // 0: generate; 1: prefill, first half
            &[(0, 1), (1, 2)], // 0: generate; 1: prefill, second half
            &[(0, 4), (1, 1)], // 0: a new request's prefill; 1: generate
            &[(0, 1), (1, 1)],
            &[(1, 1)],
            &[(2, 2)], // 2: a request that only prefills (a warm-up)
            &[(1, 1)],
            &[(2, 6)], // 2: not the prompt's rest (a batch came between): a new request
        ];
        for (i, batch) in batches.iter().enumerate() {
            let t = 100 * i as u64;
            seqs.batch(&mut out, &mut ids, &names, ProcessId(7), batch, t, t + 50);
        }
        seqs.finish(&mut out, &names);

        assert_eq!(out.lanes.len(), 3);
        let lane_of = |seq: &str| out.lanes.iter().find(|l| l.name == seq).unwrap().id;
        let spans = |seq: &str, name: &str| -> Vec<(u64, u64, Vec<u64>)> {
            (out.spans.iter())
                .filter(|s| s.lane == lane_of(seq) && s.name == name)
                .map(|s| {
                    let tokens = s.args.iter().filter_map(|(_, v)| match v {
                        Arg::UInt(n) => Some(*n),
                        _ => None,
                    });
                    (s.start_ns, s.end_ns, tokens.collect())
                })
                .collect()
        };
        // Sequence 0: prompt 5 then 2 generated; prompt 4 then 1 generated.
        assert_eq!(
            spans("sequence 0", "request"),
            vec![(0, 250, vec![5, 2]), (300, 450, vec![4, 1])]
        );
        assert_eq!(spans("sequence 0", "prefill").len(), 2);
        assert_eq!(spans("sequence 0", "generate").len(), 3);
        // Sequence 1: a prompt of 3 + 2 tokens in two batches, one request, 4 generated.
        assert_eq!(spans("sequence 1", "request"), vec![(100, 750, vec![5, 4])]);
        assert_eq!(
            spans("sequence 1", "prefill"),
            vec![(100, 150, vec![3]), (200, 250, vec![2])]
        );
        assert_eq!(
            spans("sequence 2", "request"),
            vec![(600, 650, vec![2, 0]), (800, 850, vec![6, 0])]
        );
        // Steps nest in their request.
        assert!(
            (out.spans.iter())
                .filter(|s| s.name != "request")
                .all(|s| s.depth == 1 && s.parent.is_some())
        );
    }

    /// A warm-up prefill, then the sequence cleared (`llama_memory_seq_rm` from position 0, as a
    /// server does when its next request starts) and a prompt in the very next batch: two
    /// requests, not one prompt split over two batches.
    #[test]
    fn a_cleared_sequence_begins_a_new_request() {
        let (names, mut seqs, mut ids, mut out) = fresh();
        seqs.batch(&mut out, &mut ids, &names, ProcessId(7), &[(0, 2)], 0, 50);
        seqs.cleared(0);
        seqs.batch(
            &mut out,
            &mut ids,
            &names,
            ProcessId(7),
            &[(0, 23)],
            100,
            150,
        );
        seqs.batch(
            &mut out,
            &mut ids,
            &names,
            ProcessId(7),
            &[(0, 1)],
            200,
            250,
        );
        seqs.finish(&mut out, &names);
        let requests: Vec<(u64, u64)> = (out.spans.iter())
            .filter(|s| s.name == "request")
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        assert_eq!(requests, [(0, 50), (100, 250)]);
    }
}
