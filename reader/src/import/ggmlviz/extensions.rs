//! The writer's extension records: metadata, names, tensor infos, application spans, RPC
//! parts, counters.

use crate::format::ext;
use crate::format::{Event, ExtensionKind};
use crate::read::NamesChanged;
use crate::telemetry::rpc_spans as rpc;
use crate::telemetry::{Arg, Process, Record, RecordSink};

use super::{End, Importer, Kind, Named, Opened, unplaced};

impl<S: RecordSink> Importer<'_, S> {
    /// An extension record; `bytes`, its label, is its JSON payload.
    pub(super) fn extension(&mut self, kind: ExtensionKind, e: &Event<'_>, bytes: &[u8]) {
        match kind {
            ExtensionKind::Metadata => {
                if let Some(m) = ext::parse_payload::<ext::Metadata>(bytes) {
                    let program = m
                        .command_line
                        .first()
                        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string());
                    self.sink.record(Record::Process(Process {
                        id: self.process,
                        pid: m.pid,
                        name: program.unwrap_or_default(),
                        host: m.host,
                        job_id: m.distributed.job_id,
                        rank: Some(m.distributed.rank),
                        local_rank: Some(m.distributed.local_rank),
                        world_size: Some(m.distributed.world_size),
                    }));
                }
            }
            ExtensionKind::OpNames | ExtensionKind::TensorInfo | ExtensionKind::BackendNames => {
                match self.names.take(kind, bytes) {
                    Some(NamesChanged::All) => {
                        let gone: Vec<_> = self.described.drain().flat_map(|(_, v)| v).collect();
                        self.retire(gone.into_iter().map(|(_, t)| t));
                    }
                    Some(NamesChanged::Tensor(name)) => {
                        let gone = self.described.remove(name.as_bytes()).unwrap_or_default();
                        self.retire(gone.into_iter().map(|(_, t)| t));
                    }
                    None => {}
                }
            }
            ExtensionKind::SpanBegin => {
                let span = ext::parse_payload::<ext::SpanBoundary>(bytes).unwrap_or_default();
                let mut args = Vec::new();
                if let Some((seq, p0, p1)) = span.removed {
                    for (key, v) in [("sequence", seq), ("from", p0), ("to", p1)] {
                        args.push((self.texts.get(key), Arg::Int(v.into())));
                    }
                    if p0 <= 0 && p1 < 0 {
                        self.sequences.cleared(seq);
                    }
                }
                if let Some(n) = span.n_tokens {
                    args.push((self.texts.get("n_tokens"), Arg::UInt(n as u64)));
                }
                if !span.seqs.is_empty() {
                    // `seq_tokens`: `id:tokens` per sequence, `+n` for sequences beyond those.
                    let mut text: Vec<String> = span
                        .seqs
                        .iter()
                        .map(|(id, n)| format!("{id}:{n}"))
                        .collect();
                    if span.other_seq_tokens > 0 {
                        text.push(format!("+{}", span.other_seq_tokens));
                    }
                    args.push((
                        self.texts.get("sequences"),
                        Arg::UInt(span.seqs.len() as u64),
                    ));
                    args.push((
                        self.texts.get("seq_tokens"),
                        Arg::Str(self.texts.get(&text.join(" "))),
                    ));
                    // Inferred, not read: a batch does not say whether a token is prompt or
                    // generated. A sequence with several tokens in one batch is prefilling (or
                    // checking a speculative draft); one token is a generation step.
                    let (prefill, generation): (Vec<u32>, Vec<u32>) =
                        span.seqs.iter().map(|&(_, n)| n).partition(|&n| n > 1);
                    for (key, tokens) in [
                        ("prefill_tokens", prefill),
                        ("generation_tokens", generation),
                    ] {
                        let total = tokens.iter().map(|&n| u64::from(n)).sum();
                        args.push((self.texts.get(key), Arg::UInt(total)));
                    }
                }
                let args = if args.is_empty() {
                    self.no_args.clone()
                } else {
                    args.into()
                };
                let (name, category) = (self.texts.get(&span.name), self.call_category.clone());
                let named = Named::Own(Box::new(unplaced(name, category, args)));
                let opened = Opened {
                    kind: Kind::Call,
                    tensor: 0,
                    named,
                };
                self.open(e.thread_id, opened, e.timestamp_ns);
                if !span.seqs.is_empty()
                    && let Some(open) = self.thread(e.thread_id).stack.top()
                {
                    let id = open.id;
                    self.batches.insert(id, span.seqs);
                }
            }
            ExtensionKind::SpanEnd => {
                if let Some((span, lane)) = self.close_span(End::of(e, Kind::Call, 0, 0, "")) {
                    if let Some(seqs) = self.batches.remove(&span.place.id) {
                        self.sequences.batch(
                            self.sink,
                            self.ids,
                            &self.sequence_names,
                            self.process,
                            &seqs,
                            span.place.start_ns,
                            span.place.end_ns,
                        );
                    }
                    self.deliver(span, lane);
                }
            }
            ExtensionKind::RpcBegin => {
                let rpc = ext::RpcBoundary::from_json(bytes).unwrap_or_default();
                let part = match rpc.part {
                    ext::RpcPart::Request => "request",
                    ext::RpcPart::Answer => "answer",
                    ext::RpcPart::Serve => "serve",
                };
                let mut args = vec![
                    (self.texts.get(rpc::PART), Arg::Str(self.texts.get(part))),
                    (
                        self.texts.get(rpc::CONNECTION),
                        Arg::UInt(rpc.connection.into()),
                    ),
                    (self.texts.get(rpc::INDEX), Arg::UInt(rpc.index.into())),
                ];
                if let Some(endpoint) = &rpc.endpoint {
                    args.push((
                        self.texts.get(rpc::ENDPOINT),
                        Arg::Str(self.texts.get(endpoint)),
                    ));
                }
                let name = self.texts.get(&ext::rpc_command_name(rpc.command));
                let category = self.texts.get(rpc::CATEGORY);
                let named = Named::Own(Box::new(unplaced(name, category, args.into())));
                let opened = Opened {
                    kind: Kind::Rpc,
                    tensor: 0,
                    named,
                };
                self.open(e.thread_id, opened, e.timestamp_ns);
            }
            ExtensionKind::RpcEnd => {
                let rpc = ext::RpcBoundary::from_json(bytes).unwrap_or_default();
                let bytes = [(rpc::SENT, rpc.sent), (rpc::RECEIVED, rpc.received)]
                    .map(|(key, n)| (self.texts.get(key), Arg::UInt(n)));
                if let Some((span, lane)) = self.close_span(End::of(e, Kind::Rpc, 0, 0, "")) {
                    let mut span = self.owned(span, lane);
                    span.args = span.args.iter().cloned().chain(bytes).collect();
                    self.sink.span(&span);
                }
            }
            _ => {}
        }
    }
}
