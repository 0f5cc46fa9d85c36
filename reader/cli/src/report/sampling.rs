//! Which spans the timeline draws: every span up to [`SPAN_BUDGET`]; beyond it, the op spans of
//! a uniform sample of keys (a graph compute's ops are drawn together; a worker thread's shares,
//! which have no parent, by the ~1 ms window they start in, the same windows on every lane), the
//! stride doubling as they come, in one pass.

use ggml_viz_reader::telemetry::Span;

/// Spans the timeline carries at most (about 40 bytes of HTML each).
pub const SPAN_BUDGET: u64 = 150_000;

/// Worker threads' shares (op spans with no parent span on their lane) are sampled by the window
/// of this many nanoseconds (about a millisecond, 2^20 ns) they start in, the same windows on
/// every lane: a window kept shows every worker's shares in it.
pub(super) const SHARE_WINDOW_SHIFT: u32 = 20;
/// Past this stride no op span is drawn: it is reached only by op spans no stride thins (more
/// than their room under the one key every stride divides, 0), and ends the doubling.
pub(super) const MAX_OP_STRIDE: u64 = 1 << 40;

/// The spans drawn so far, as sampling sees them.
pub(super) struct TimelineSample {
    /// Op spans are drawn whose [`op_key`] is a multiple of this; doubled (and the drawn ops
    /// thinned to match) whenever they outgrow their room in the budget.
    stride: u64,
    /// For each drawn span, its [`op_key`] if it is an op (`None`: always drawn).
    keys: Vec<Option<u64>>,
    ops: u64,
    /// Spans that are not ops: all drawn.
    others: u64,
}

impl TimelineSample {
    pub(super) fn new() -> TimelineSample {
        TimelineSample {
            stride: 1,
            keys: Vec::new(),
            ops: 0,
            others: 0,
        }
    }

    /// The stride op spans are drawn at now.
    pub(super) fn stride(&self) -> u64 {
        self.stride
    }

    /// The key `span` is sampled by: [`op_key`] for an op, none for any other span.
    pub(super) fn key(span: &Span, is_op: bool) -> Option<u64> {
        is_op.then(|| op_key(span))
    }

    /// Whether a span of `key` is drawn at the stride reached.
    pub(super) fn admits(&self, key: Option<u64>) -> bool {
        key.is_none_or(|k| drawn_at(k, self.stride))
    }

    /// A span of `key` was drawn. Where the drawn ops then outgrow their room, the stride
    /// doubles until they fit, and the spans drawn so far to keep are returned (in the order
    /// drawn): exactly those a pass with that stride from the start would have drawn (a
    /// multiple of 2s is a multiple of s). Bounded: past [`MAX_OP_STRIDE`] no op is drawn.
    pub(super) fn drawn(&mut self, key: Option<u64>) -> Option<Vec<bool>> {
        self.keys.push(key);
        match key {
            Some(_) => self.ops += 1,
            None => self.others += 1,
        }
        if self.ops <= self.op_room() {
            return None;
        }
        while self.ops > self.op_room() {
            self.stride *= 2;
            let stride = self.stride;
            self.ops = (self.keys.iter().flatten())
                .filter(|&&k| drawn_at(k, stride))
                .count() as u64;
        }
        let stride = self.stride;
        let keep: Vec<bool> = (self.keys.iter())
            .map(|k| k.is_none_or(|k| drawn_at(k, stride)))
            .collect();
        self.keys.retain(|k| k.is_none_or(|k| drawn_at(k, stride)));
        Some(keep)
    }

    /// Room for op spans: what the other spans leave of [`SPAN_BUDGET`], at least a tenth of it.
    fn op_room(&self) -> u64 {
        SPAN_BUDGET
            .saturating_sub(self.others)
            .max(SPAN_BUDGET / 10)
    }
}

/// Whether an op span of key `key` is drawn at `stride`.
fn drawn_at(key: u64, stride: u64) -> bool {
    stride <= MAX_OP_STRIDE && key.is_multiple_of(stride)
}

/// The key an op span is drawn by: its parent's (a graph compute's ops are drawn together), or
/// for a parentless share its time window's. Distinct from a parent's key: a window is salted.
fn op_key(span: &Span) -> u64 {
    match span.parent {
        Some(parent) => mix(parent),
        None => mix((span.start_ns >> SHARE_WINDOW_SHIFT) ^ 0x5a5a_5a5a_0000_0000),
    }
}

pub(super) fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer: parents are kept by a hash of their id, never by its residue
    // (ids of graphs with a fixed op count are evenly spaced and would alias with a stride).
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
