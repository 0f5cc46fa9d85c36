//! What a graph, op or barrier begin's span is called, its category and its arguments.

use crate::format::Payload;
use crate::telemetry::Span;
use crate::telemetry::{Arg, RecordSink};

use super::{Importer, unplaced};

impl<S: RecordSink> Importer<'_, S> {
    /// The span (times left zero) a graph, op or barrier begin with `label` and `payload` opens.
    pub(super) fn describe(&mut self, label: &str, payload: Payload) -> Span {
        let (name, category, args) = match payload {
            Payload::Graph {
                graph_ptr,
                n_nodes,
                n_threads,
                backend_ptr,
            } => {
                let mut words = label.splitn(2, ' ');
                let entry = words
                    .next()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("graph_compute");
                let mut args = vec![
                    (self.texts.get("n_nodes"), Arg::UInt(n_nodes as u64)),
                    (self.texts.get("n_threads"), Arg::UInt(n_threads as u64)),
                    (
                        self.texts.get("graph"),
                        Arg::Str(self.texts.get(&format!("{graph_ptr:#x}"))),
                    ),
                ];
                if let Some(backend) = words
                    .next()
                    .map(str::to_string)
                    .or_else(|| self.names.backend(backend_ptr).map(str::to_string))
                {
                    args.push((
                        self.texts.get("backend"),
                        Arg::Str(self.texts.get(&backend)),
                    ));
                }
                (
                    self.texts.get(entry),
                    self.graph_category.clone(),
                    args.into(),
                )
            }
            Payload::Op {
                op_type,
                op_size,
                backend_ptr,
                ..
            } => {
                let info = self.names.info(label, op_type);
                let op = self.names.op(info, op_type);
                let mut args = vec![
                    (self.texts.get("tensor"), Arg::Str(self.texts.get(label))),
                    (self.texts.get("bytes"), Arg::UInt(op_size)),
                ];
                if let Some(i) = info {
                    let (shape, type_name, flops) =
                        (format!("{:?}", i.ne), i.type_name.clone(), i.flops);
                    args.push((self.texts.get("shape"), Arg::Str(self.texts.get(&shape))));
                    args.push((self.texts.get("type"), Arg::Str(self.texts.get(&type_name))));
                    if let Some(f) = flops {
                        args.push((self.texts.get("flops"), Arg::UInt(f)));
                    }
                }
                // A backend the trace never named is still told apart from the others; none at
                // all is a CPU worker thread's share (threads-mode op timing, FORMAT.md).
                let backend = match self.names.backend(backend_ptr) {
                    Some(b) => b.to_string(),
                    None if backend_ptr == 0 => "CPU".into(),
                    None => format!("backend {backend_ptr:#x}"),
                };
                args.push((
                    self.texts.get("backend"),
                    Arg::Str(self.texts.get(&backend)),
                ));
                (self.texts.get(&op), self.op_category.clone(), args.into())
            }
            // A barrier wait: named for its entry point, the label's first word.
            _ => {
                let entry = label
                    .split(' ')
                    .next()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("barrier_wait");
                let category = self.wait_category.clone();
                (self.texts.get(entry), category, self.no_args.clone())
            }
        };
        unplaced(name, category, args)
    }
}
