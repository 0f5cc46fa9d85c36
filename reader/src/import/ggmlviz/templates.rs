//! One span per distinct graph, op or barrier begin: an open span names its template, and at its
//! close the template, its times written in, is what the sink is lent.

use crate::format::Payload;
use crate::telemetry::Span;

/// A slot of [`Templates`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TemplateId(u32);

/// One span per distinct graph, op or barrier begin, with its name, category and arguments: an
/// open span names its template, and at its close the template, its times written in, is what
/// the sink is lent. Nothing is cloned, allocated or reference-counted per span.
#[derive(Default)]
pub(super) struct Templates {
    slots: Vec<Template>,
    /// Slots no begin finds any more and no open span names: reused first.
    free: Vec<TemplateId>,
    /// Slots no begin finds any more that an open span may still name.
    retired: Vec<TemplateId>,
}

/// The span a begin opens, and the begin (its label and key).
pub(super) struct Template {
    pub(super) span: Span,
    label: Box<[u8]>,
    key: BeginKey,
    /// The template of the begin that came after this one last, on the same thread.
    pub(super) next: Option<TemplateId>,
}

impl Templates {
    pub(super) fn add(&mut self, span: Span, label: &[u8], key: BeginKey) -> TemplateId {
        let template = Template {
            span,
            label: label.into(),
            key,
            next: None,
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id.0 as usize] = template;
                id
            }
            None => {
                self.slots.push(template);
                TemplateId(self.slots.len() as u32 - 1)
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, t: TemplateId) -> &Template {
        &self.slots[t.0 as usize]
    }

    #[inline]
    pub(super) fn get_mut(&mut self, t: TemplateId) -> &mut Template {
        &mut self.slots[t.0 as usize]
    }

    /// The template of the begin that came after `t`'s last time, if it is `label` and `key`'s.
    #[inline(always)]
    pub(super) fn after(&self, t: TemplateId, label: &[u8], key: &BeginKey) -> Option<TemplateId> {
        let next = self.get(t).next?;
        let n = self.get(next);
        (n.key == *key && same_bytes(&n.label, label)).then_some(next)
    }

    /// Slots `gone` will not be found again: free once no span in `open` names them.
    pub(super) fn retire(
        &mut self,
        gone: impl IntoIterator<Item = TemplateId>,
        open: &[TemplateId],
    ) {
        self.retired.extend(gone);
        let (named, unnamed) = self.retired.drain(..).partition(|t| open.contains(t));
        self.retired = named;
        self.free.extend::<Vec<_>>(unnamed);
    }
}

/// What of a graph, op or barrier begin's payload its span's name and arguments depend on: all of
/// it but an op's tensor address (the same node's tensor moves between graphs) and a barrier's
/// wait.
pub(super) type BeginKey = [u64; 4];

pub(super) fn begin_key(payload: &Payload) -> BeginKey {
    match *payload {
        Payload::Graph {
            graph_ptr: g,
            n_nodes: n,
            n_threads: t,
            backend_ptr: b,
        } => [0, g, u64::from(n) | u64::from(t) << 32, b],
        Payload::Op {
            op_type,
            op_size,
            backend_ptr,
            ..
        } => [1, u64::from(op_type), op_size, backend_ptr],
        _ => [2, 0, 0, 0],
    }
}

/// Whether `a` and `b` hold the same bytes; short ones (most labels) compared a word at a time.
#[inline(always)]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8"));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4"));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..8 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        _ => a == b,
    }
}
