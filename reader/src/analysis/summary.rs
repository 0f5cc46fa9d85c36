//! Spans grouped by name: count, total, self, mean, min, p50, p99, max and share of wall time.
//!
//! Nested spans of the same name are not counted twice (the defect the ada-pa document describes:
//! a 20 µs tiling made of two 10 µs tilings counted as 3 tilings, 40 µs). The rule:
//! - count = spans of that name with no descendant of the same name (2 tilings);
//! - total = wall time covered by spans of that name: a same-name span inside another adds nothing
//!   (20 µs);
//! - the duration statistics — mean, min, p50, p99, max — are over the counted spans, so that the
//!   mean lies between min and max even where an outer span is longer than its same-name children
//!   (a 30 µs tiling holding two 10 µs tilings: 2 tilings, total 30 µs, mean 10 µs); self time is
//!   summed over all spans.
//!
//! Spans arrive as they close, children before parents, so the rule is applied bottom-up with
//! state kept only for spans still open: memory is bounded by nesting depth × distinct names,
//! whatever the input's size. Percentiles come from a log histogram (buckets 1 % wide).

use rustc_hash::FxHashMap;

use crate::analysis::histogram::Histogram;
use crate::telemetry::{ByAddress, Record, RecordSink, Span, Text};

/// A row's place in [`Summary::rows`].
type RowIndex = u32;

/// Per name, within one subtree: spans counted (no same-name descendant) and time covered. A
/// subtree holds few names: a list, searched.
type Coverage = Vec<(RowIndex, (u64, u64))>;

/// Adds `count` spans covering `covered` of `row`'s name to `coverage`.
fn cover(coverage: &mut Coverage, row: RowIndex, count: u64, covered: u64) {
    match coverage.iter_mut().find(|(r, _)| *r == row) {
        Some((_, e)) => {
            e.0 += count;
            e.1 = e.1.saturating_add(covered);
        }
        None => coverage.push((row, (count, covered))),
    }
}

/// One row.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub count: u64,
    /// Wall time covered by spans of this name; an op type timed on several threads
    /// ([`Summary::use_nodes`]): its nodes' wall times.
    pub total_ns: u64,
    pub self_ns: u64,
    /// The counted spans' (or nodes') durations, summed (for the mean) and bucketed.
    pub counted_ns: u64,
    pub durations: Histogram,
    /// An op type counted by nodes ([`Summary::use_nodes`]): its spans (its threads' shares)
    /// and their time summed, which `count` and `total_ns` hold for other rows.
    pub shares: Option<(u64, u64)>,
}

impl Row {
    /// Spans of this name on every thread.
    pub fn spans(&self) -> u64 {
        self.shares.map_or(self.count, |(n, _)| n)
    }

    /// Their time, summed over the threads.
    pub fn thread_ns(&self) -> u64 {
        self.shares.map_or(self.total_ns, |(_, ns)| ns)
    }

    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.counted_ns as f64 / self.durations.count().max(1) as f64
        }
    }
    pub fn min_ns(&self) -> u64 {
        self.durations.min()
    }
    pub fn max_ns(&self) -> u64 {
        self.durations.max()
    }
}

/// A lane's open spans' coverage, by depth: a span hands its coverage to its parent's slot,
/// one depth up, and takes its own from its depth's slot as it closes. Nothing is looked up in
/// a map for spans that nest (on every worker thread at once, in threads-mode op timing); a slot
/// holds its span's id, and only a crossing pair (a span closed below the top) moves a slot's
/// coverage aside to [`Summary::pending`].
#[derive(Debug, Default)]
struct LaneState {
    by_depth: Vec<(Option<u64>, Coverage)>,
    /// A bit per slot that holds a span's coverage, for depths 0 to 62; bit 63 for all the deeper.
    occupied: u64,
    /// This lane's spans in [`Summary::pending`].
    pending: u32,
}

/// The bit of [`LaneState::occupied`] of the slot at `depth`.
fn depth_bit(depth: usize) -> u64 {
    1 << depth.min(63)
}

/// The summary sink.
#[derive(Debug, Default)]
pub struct Summary {
    /// One row per distinct name, in the order first seen.
    rows: Vec<(Text, Row)>,
    by_name: FxHashMap<Text, RowIndex>,
    /// Each shared name's row, found by its address.
    by_addr: ByAddress<RowIndex>,
    /// Coverage gathered from the closed children of spans still open, by span id, where it is
    /// not in its lane's slot.
    pending: FxHashMap<u64, Coverage>,
    /// By lane id (ids are handed out densely from 1).
    lanes: Vec<LaneState>,
    pub first_ns: Option<u64>,
    pub last_ns: u64,
    pub warnings: Vec<String>,
}

/// An op type's nodes, for [`Summary::use_nodes`]: how many, their wall times summed, bucketed.
#[derive(Clone, Debug, Default)]
pub struct NodeTimes {
    pub count: u64,
    pub total_ns: u64,
    pub durations: Histogram,
}

impl NodeTimes {
    pub fn add(&mut self, wall_ns: u64) {
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(wall_ns);
        self.durations.add(wall_ns);
    }
}

impl Summary {
    /// The rows of op types timed on several threads (each thread's share of a node a span of
    /// its own) made to count nodes, as `ggml-viz ops` does: count, total, self and the spread
    /// of each node's wall time (its first thread's start to its last thread's end); the
    /// spans' count and time stay in `spans` and `thread_ns`.
    pub fn use_nodes<'a>(&mut self, nodes: impl IntoIterator<Item = (&'a String, &'a NodeTimes)>) {
        for (op, n) in nodes {
            let Some(&i) = self.by_name.get(op.as_str()) else {
                continue;
            };
            let row = &mut self.rows[i as usize].1;
            if row.shares.is_none() {
                row.shares = Some((row.count, row.total_ns));
            }
            row.count = n.count;
            row.total_ns = n.total_ns;
            row.self_ns = n.total_ns;
            row.counted_ns = n.total_ns;
            row.durations = n.durations.clone();
        }
    }

    /// All rows' self time: what each row's share of it is of (the shares add up to 100 %).
    pub fn self_ns_total(&self) -> u64 {
        self.rows.iter().map(|(_, r)| r.self_ns).sum()
    }

    /// Wall time from the first span's start to the last span's end.
    pub fn wall_ns(&self) -> u64 {
        self.first_ns.map_or(0, |f| self.last_ns.saturating_sub(f))
    }

    /// The row of spans named `name`.
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.by_name.get(name).map(|&i| &self.rows[i as usize].1)
    }

    /// Every row with its name, in the order first seen.
    pub fn rows(&self) -> impl Iterator<Item = (&Text, &Row)> {
        self.rows.iter().map(|(name, row)| (name, row))
    }

    /// Rows, most total time first.
    pub fn sorted(&self) -> Vec<(&Text, &Row)> {
        let mut rows: Vec<_> = self.rows().collect();
        rows.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then_with(|| a.0.cmp(b.0)));
        rows
    }

    fn row_index(&mut self, name: &Text) -> RowIndex {
        if let Some(i) = self.by_addr.get(name) {
            return i;
        }
        let i = match self.by_name.get(name.as_str()) {
            Some(&i) => i,
            None => {
                let i = self.rows.len() as RowIndex;
                self.rows.push((name.clone(), Row::default()));
                self.by_name.insert(name.clone(), i);
                i
            }
        };
        self.by_addr.insert(name, i);
        i
    }

    /// Counts `s` into its row, and its coverage into its parent's.
    fn add(&mut self, s: &Span) {
        let dur = s.duration_ns();
        self.first_ns = Some(self.first_ns.map_or(s.start_ns, |f| f.min(s.start_ns)));
        self.last_ns = self.last_ns.max(s.end_ns);
        let index = self.row_index(&s.name);
        let (lane, depth) = (s.lane.0 as usize, s.depth as usize);
        if lane >= self.lanes.len() || depth + 1 >= self.lanes[lane].by_depth.len() {
            self.make_room(lane, depth);
        }
        // The row and the lane, borrowed once for the whole of a leaf's path.
        let Summary {
            rows,
            lanes,
            pending,
            ..
        } = self;
        let row = &mut rows[index as usize].1;
        row.self_ns = row.self_ns.saturating_add(s.self_ns);
        let state = &mut lanes[lane];
        // Deeper slots are empty as a span closes (its descendants closed before it) but where
        // it closed below the top of its stack.
        if depth >= 63 || state.occupied >> depth >> 1 != 0 {
            set_aside_deeper(state, pending, depth);
        }
        // A leaf (most spans): no closed descendant handed it coverage.
        if state.by_depth[depth].0 != Some(s.id) && state.pending == 0 {
            row.durations.add(dur);
            row.counted_ns = row.counted_ns.saturating_add(dur);
            if let Some(parent) = merge_warm(rows, state, s, index, 1, dur) {
                self.merge_cold(s, parent, index, 1, dur);
            }
            return;
        }
        self.add_subtree(s, index, dur);
    }

    /// [`Summary::add`] of a span that may have closed descendants: their coverage, gathered in
    /// its slot (or set aside), is handed on with its own.
    #[inline(never)]
    fn add_subtree(&mut self, s: &Span, index: RowIndex, dur: u64) {
        let (lane, depth) = (s.lane.0 as usize, s.depth as usize);
        let state = &mut self.lanes[lane];
        let own = state.by_depth[depth].0 == Some(s.id);
        let coverage = if own {
            state.by_depth[depth].0 = None;
            state.occupied &= !depth_bit(depth);
            Some(std::mem::take(&mut state.by_depth[depth].1))
        } else {
            self.pending_of(lane, s.id)
        };
        let mut coverage = coverage.unwrap_or_default();
        match coverage.iter_mut().find(|(r, _)| *r == index) {
            // A same-name descendant: this span is not counted, but covers its time.
            Some((_, entry)) => entry.1 = dur,
            None => {
                let row = &mut self.rows[index as usize].1;
                row.durations.add(dur);
                row.counted_ns = row.counted_ns.saturating_add(dur);
                coverage.push((index, (1, dur)));
            }
        }
        for &(row, (count, covered)) in &coverage {
            self.merge(s, row, count, covered);
        }
        if own {
            // The slot keeps its memory for the next span at this depth.
            coverage.clear();
            self.lanes[lane].by_depth[depth].1 = coverage;
        }
    }

    /// Slots for `lane`'s spans at `depth` and the one below.
    #[cold]
    fn make_room(&mut self, lane: usize, depth: usize) {
        if lane >= self.lanes.len() {
            self.lanes.resize_with(lane + 1, LaneState::default);
        }
        let slots = &mut self.lanes[lane].by_depth;
        if depth + 1 >= slots.len() {
            slots.resize_with(depth + 2, Default::default);
        }
    }

    /// The coverage of span `id` of `lane` set aside, if any.
    #[inline]
    fn pending_of(&mut self, lane: usize, id: u64) -> Option<Coverage> {
        let state = &mut self.lanes[lane];
        if state.pending == 0 {
            return None;
        }
        let found = self.pending.remove(&id)?;
        state.pending -= 1;
        Some(found)
    }

    /// Hands the coverage of `row`'s name by `s`'s closed subtree to its parent's, or to the rows
    /// at the top.
    #[inline(always)]
    fn merge(&mut self, s: &Span, row: RowIndex, count: u64, covered: u64) {
        let state = &mut self.lanes[s.lane.0 as usize];
        if let Some(parent) = merge_warm(&mut self.rows, state, s, row, count, covered) {
            self.merge_cold(s, parent, row, count, covered)
        }
    }

    /// [`Summary::merge`] into a parent whose slot holds another span's coverage, or none: that
    /// one's is set aside, the parent's brought back if it was.
    #[cold]
    #[inline(never)]
    fn merge_cold(&mut self, s: &Span, parent: u64, row: RowIndex, count: u64, covered: u64) {
        let depth = (s.depth as usize).saturating_sub(1);
        let found = self.pending_of(s.lane.0 as usize, parent);
        let state = &mut self.lanes[s.lane.0 as usize];
        let slot = &mut state.by_depth[depth];
        if let Some(other) = slot.0 {
            self.pending.insert(other, std::mem::take(&mut slot.1));
            state.pending += 1;
        }
        if let Some(coverage) = found {
            slot.1 = coverage;
        }
        slot.0 = Some(parent);
        state.occupied |= depth_bit(depth);
        cover(&mut slot.1, row, count, covered)
    }
}

/// A span at `depth` closed below the top of its lane's stack (`state`): the spans above it,
/// still open, are one depth up from now on, and their slots' coverage waits in `pending`.
#[cold]
fn set_aside_deeper(state: &mut LaneState, pending: &mut FxHashMap<u64, Coverage>, depth: usize) {
    for (d, slot) in state.by_depth.iter_mut().enumerate().skip(depth + 1) {
        if let Some(other) = slot.0.take() {
            pending.insert(other, std::mem::take(&mut slot.1));
            state.pending += 1;
            state.occupied &= !depth_bit(d);
        }
    }
}

/// [`Summary::merge`] where it needs no map: into the parent's slot of `s`'s lane (`state`), or
/// into `rows` at the top. Else the parent, whose slot holds another span's coverage or none.
#[inline(always)]
fn merge_warm(
    rows: &mut [(Text, Row)],
    state: &mut LaneState,
    s: &Span,
    row: RowIndex,
    count: u64,
    covered: u64,
) -> Option<u64> {
    let Some(parent) = s.parent else {
        let row = &mut rows[row as usize].1;
        row.count += count;
        row.total_ns = row.total_ns.saturating_add(covered);
        return None;
    };
    let slot = &mut state.by_depth[(s.depth as usize).saturating_sub(1)];
    if slot.0 != Some(parent) {
        return Some(parent);
    }
    cover(&mut slot.1, row, count, covered);
    None
}

impl RecordSink for Summary {
    fn span(&mut self, span: &Span) {
        self.add(span);
    }

    fn record(&mut self, record: Record) {
        if let Record::Warning(w) = record {
            self.warnings.push(w);
        }
    }
}

/// A CSV cell: quoted when needed, and a leading `=`, `+`, `-` or `@` defused with a `'` (a
/// spreadsheet would run it as a formula).
pub fn csv_cell(s: &str) -> String {
    let defused = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if defused.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LaneId;
    use crate::telemetry::SpanStack;

    /// The ada-pa document's case: a 20 µs tiling made of two 10 µs tilings.
    #[test]
    fn nested_same_name_spans_count_once() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        let us = 1000;
        stack.open(1, "Tiling".into(), "ge".into(), 0, Default::default());
        stack.open(2, "Tiling".into(), "ge".into(), 0, Default::default());
        summary.span(&stack.close(LaneId(0), 10 * us).unwrap());
        stack.open(3, "Tiling".into(), "ge".into(), 10 * us, Default::default());
        summary.span(&stack.close(LaneId(0), 20 * us).unwrap());
        summary.span(&stack.close(LaneId(0), 20 * us).unwrap());
        let row = summary.row("Tiling").unwrap();
        assert_eq!((row.count, row.total_ns), (2, 20 * us));
        assert_eq!(row.mean_ns(), 10_000.0);
        assert_eq!((row.min_ns(), row.max_ns()), (10 * us, 10 * us));
        assert_eq!(row.self_ns, 20 * us);
    }

    /// An outer span longer than its same-name children: the counted spans are the children,
    /// and every statistic is over them; the total is the covered time.
    #[test]
    fn the_mean_lies_between_min_and_max_when_an_outer_span_is_longer() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        let us = 1000;
        stack.open(1, "Tiling".into(), "ge".into(), 0, Default::default());
        stack.open(2, "Tiling".into(), "ge".into(), 5 * us, Default::default());
        summary.span(&stack.close(LaneId(0), 15 * us).unwrap());
        stack.open(3, "Tiling".into(), "ge".into(), 16 * us, Default::default());
        summary.span(&stack.close(LaneId(0), 26 * us).unwrap());
        summary.span(&stack.close(LaneId(0), 30 * us).unwrap());
        let row = summary.row("Tiling").unwrap();
        assert_eq!((row.count, row.total_ns), (2, 30 * us));
        assert_eq!(row.mean_ns(), 10_000.0);
        assert_eq!((row.min_ns(), row.max_ns()), (10 * us, 10 * us));
        assert_eq!(row.durations.quantile(0.5), 10 * us);
    }

    /// Opens span `id` named `name` at `at` on `stack`.
    fn open(stack: &mut SpanStack, id: u64, name: &str, at: u64) {
        stack.open(id, name.into(), "c".into(), at, Default::default())
    }

    /// The spans counted of `name`'s row and the time they cover.
    fn counted(summary: &Summary, name: &str) -> (u64, u64) {
        let row = summary.row(name).unwrap();
        (row.count, row.total_ns)
    }

    /// A parent's coverage gathered from its first child is kept while the children of its
    /// second child close (the parent handed to last changes, and changes back).
    #[test]
    fn a_parents_coverage_outlasts_its_next_childs_children() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        open(&mut stack, 1, "decode", 0);
        for (graph, op, at) in [(2, 3, 0), (4, 5, 30)] {
            open(&mut stack, graph, "graph", at);
            open(&mut stack, op, "MUL_MAT", at);
            summary.span(&stack.close(LaneId(0), at + 10).unwrap());
            summary.span(&stack.close(LaneId(0), at + 20).unwrap());
        }
        summary.span(&stack.close(LaneId(0), 60).unwrap());
        assert_eq!(counted(&summary, "MUL_MAT"), (2, 20));
        assert_eq!(counted(&summary, "graph"), (2, 40));
        assert_eq!(counted(&summary, "decode"), (1, 60));
    }

    /// Worker threads closing spans in turn (threads-mode op timing): one summary of all lanes
    /// counts what the lanes' own summaries count, added up, with same-name nesting three levels
    /// deep on each lane and every lane's parents changing between its closes.
    #[test]
    fn interleaved_lanes_count_as_each_alone() {
        // Per lane: (open or close, name, time); spans close in this order, lanes in turn.
        let script = |lane: u64| {
            let t = |k: u64| k * 10 + lane;
            vec![
                (true, "decode", t(0)),
                (true, "graph", t(1)),
                (true, "MUL_MAT", t(2)),
                (false, "", t(3)),
                (true, "Tiling", t(4)),
                (true, "Tiling", t(5)),
                (false, "", t(6)),
                (false, "", t(7 + lane)),
                (false, "", t(9)),
                (true, "graph", t(10)),
                (true, "Tiling", t(11)),
                (false, "", t(12)),
                (true, "graph", t(13)),
                (false, "", t(14)),
                (false, "", t(15)),
                (false, "", t(16)),
            ]
        };
        let mut all = Summary::default();
        let mut alone = [Summary::default(), Summary::default(), Summary::default()];
        let mut stacks = [
            SpanStack::default(),
            SpanStack::default(),
            SpanStack::default(),
        ];
        let mut id = 0;
        let scripts: Vec<_> = (1..=3).map(script).collect();
        for ((one, two), three) in scripts[0].iter().zip(&scripts[1]).zip(&scripts[2]) {
            for (lane, &(open, name, at)) in [one, two, three].into_iter().enumerate() {
                if open {
                    id += 1;
                    stacks[lane].open(id, name.into(), "c".into(), at, Default::default());
                } else {
                    let span = stacks[lane].close(LaneId(lane as u32 + 1), at).unwrap();
                    all.span(&span);
                    alone[lane].span(&span);
                }
            }
        }
        assert!(stacks.iter().all(|s| s.is_empty()));
        for name in ["decode", "graph", "MUL_MAT", "Tiling"] {
            let sum = alone.iter().fold((0, 0, 0), |(c, t, s), one| {
                let row = one.row(name).unwrap();
                (c + row.count, t + row.total_ns, s + row.self_ns)
            });
            let row = all.row(name).unwrap();
            assert_eq!((row.count, row.total_ns, row.self_ns), sum, "{name}");
        }
        // Lane 1 alone, by hand (times t(k) = 10 k + 1): the Tilings counted are the inner one,
        // 51..61, and the one at 111..121; they cover 41..81 (the outer one) and 111..121.
        let tiling = alone[0].row("Tiling").unwrap();
        assert_eq!((tiling.count, tiling.total_ns), (2, 40 + 10));
        // The second graph holds a third: 2 graphs counted (the first and the third), covering
        // 11..91 and 101..151.
        let graph = alone[0].row("graph").unwrap();
        assert_eq!((graph.count, graph.total_ns), (2, 80 + 50));
    }

    /// A crossing pair (the C++ tool's sample has them): a span closed below the top of its
    /// lane's stack, while spans begun after it are open, still hands on its closed children.
    #[test]
    fn a_span_closed_below_the_top_keeps_its_childrens_coverage() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        open(&mut stack, 1, "A", 0);
        open(&mut stack, 2, "B", 10);
        summary.span(&stack.close(LaneId(1), 20).unwrap());
        open(&mut stack, 3, "C", 30);
        open(&mut stack, 4, "D", 40);
        summary.span(&stack.close(LaneId(1), 50).unwrap());
        summary.span(&stack.remove(0, 60).unwrap().into_span(LaneId(1)));
        summary.span(&stack.close(LaneId(1), 70).unwrap());
        assert_eq!(
            ["A", "B", "C", "D"].map(|name| counted(&summary, name)),
            [(1, 60), (1, 10), (1, 40), (1, 10)]
        );
    }

    /// Spans nested deeper than the occupied mask's 64 bits (the fuzzer's: a shift by the depth
    /// overflowed): each still counts once, with its own duration.
    #[test]
    fn spans_nested_past_64_levels_count_once_each() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        let levels = 70;
        for id in 0..levels {
            open(&mut stack, id, &format!("s{id}"), id);
        }
        for _ in 0..levels {
            let end = 1000 + stack.depth() as u64;
            summary.span(&stack.close(LaneId(0), end).unwrap());
        }
        for id in 0..levels {
            let expected = 1000 + (id + 1) - id;
            assert_eq!(counted(&summary, &format!("s{id}")), (1, expected), "s{id}");
        }
    }

    #[test]
    fn different_names_nest_without_interference() {
        let mut stack = SpanStack::default();
        let mut summary = Summary::default();
        stack.open(1, "graph".into(), "g".into(), 0, Default::default());
        for i in 0..3u64 {
            stack.open(
                10 + i,
                "MUL_MAT".into(),
                "op".into(),
                i * 100,
                Default::default(),
            );
            summary.span(&stack.close(LaneId(0), i * 100 + 50).unwrap());
        }
        summary.span(&stack.close(LaneId(0), 400).unwrap());
        assert_eq!(
            (
                summary.row("MUL_MAT").unwrap().count,
                summary.row("MUL_MAT").unwrap().total_ns
            ),
            (3, 150)
        );
        assert_eq!(
            (
                summary.row("graph").unwrap().count,
                summary.row("graph").unwrap().total_ns,
                summary.row("graph").unwrap().self_ns
            ),
            (1, 400, 250)
        );
        assert_eq!(summary.wall_ns(), 400);
    }

    #[test]
    fn csv_cells_are_quoted_and_formulas_defused() {
        assert_eq!(csv_cell("MUL_MAT"), "MUL_MAT");
        assert_eq!(csv_cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_cell("-1+2"), "'-1+2");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
    }
}
