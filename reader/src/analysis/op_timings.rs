//! Per-op timings from a trace: each op begin/end pair is one thread's share of a node, named
//! from the trace's own records (tensor-info, op-name and backend-name extension records). The
//! shares of one node on several threads (threads-mode op timing: every worker thread computes
//! part of every node) are joined into one [`OpSample`], the node: its wall time runs from its
//! first thread's start to its last thread's end (grouped in [`super::op_groups`]).
//!
//! Joining: every share of one compute of a graph lies inside that graph compute (the calling
//! thread waits for its pool's threads before it returns), so shares are grouped by tensor and
//! by the outermost graph compute their start lies in; within a group, sorted by start, a node
//! ends where a thread that already has a share in it starts another (a thread's shares of one
//! tensor are successive computes of it). Each thread's barrier waits (threads mode) count for
//! the node that thread computed last: time it spent waiting for the slowest.

use rustc_hash::FxHashMap as HashMap;

use crate::analysis::device_use::DeviceUseCollector;
use crate::analysis::stats::{GraphStep, OpenGraphs};
use crate::analysis::timing_mode::{op_timing_mode, op_timing_note};
use crate::format::Damage;
use crate::format::ext::{self, Setting, SpanBoundary};
use crate::format::{Event, EventType, ExtensionKind, Payload};
use crate::read::NameTables;
use crate::telemetry::Text;

use super::nodes::{OpAnalysis, OpSample, Phase, ThreadTotals};

/// One thread's share of a node, before joining.
struct Share {
    /// Events taken in when it was read (its end): also its id.
    read_at: u64,
    thread_id: u32,
    begin: u64,
    end: u64,
    tensor_ptr: u64,
    /// Its tensor's name, an index into the collector's names.
    tensor: u32,
    /// Its op, backend and FLOPs, as the trace's tables gave them when it began.
    named: Named,
    bytes: u64,
    phase: Option<Phase>,
    wait_ns: u64,
    inner_wait_ns: u64,
    /// The graph compute its start lies in, once one is found (they are found once they
    /// ended): the events taken in when that compute's end was read, which names it
    /// (`u64::MAX`: none found yet).
    window: u64,
}

#[derive(Default)]
struct Thread {
    /// Begin of the op being timed: time, tensor pointer, tensor name (an index), its op,
    /// backend and FLOPs, result bytes.
    open_op: Option<(u64, u64, u32, Named, u64)>,
    /// The barrier waits inside that op so far.
    open_inner_wait_ns: u64,
    /// The share this thread ended last (its `read_at`), for its barrier waits.
    last_share: Option<u64>,
    /// The outermost graph compute open on this thread has op events.
    graph_has_ops: bool,
    phase: Option<Phase>,
}

/// Builds an [`OpAnalysis`] from events handed over one by one (a trace read as a stream holds
/// no event longer than it takes to look at it).
///
/// [`OpCollector::streaming`] also holds its shares and graph computes only until their nodes
/// are known: the writer drains each thread's ring in turn, so a thread's events may come after
/// other threads' later ones, but not later than the next drain, and a drain holds at most a
/// ring's capacity per thread. A graph compute read twice that many events ago (the capacity from
/// the trace's settings, times the threads seen or named by a graph compute) has had all its
/// shares read, and its nodes are
/// handed out (see [`OpCollector::take_ready`]): memory depends on the rings, not on the trace's
/// length. A share read later than that is still counted, as a node of its own
/// ([`OpAnalysis::late_shares`]).
#[derive(Default)]
pub struct OpCollector {
    a: OpAnalysis,
    names: NameTables,
    threads: HashMap<u32, Thread>,
    /// The graph computes open on each thread.
    graphs: OpenGraphs,
    /// Shares not yet joined into nodes, in the order read.
    shares: Vec<Share>,
    /// Tensor names, each once: shares hold their index.
    tensors: Vec<Text>,
    /// By (tensor, op type, backend), the op, backend and FLOPs of the shares begun since the
    /// name tables last changed: made once, shared by those shares' nodes.
    named: HashMap<(u32, u32, u64), Named>,
    tensor_of: HashMap<Box<[u8]>, u32>,
    /// Outermost graph computes: begin, end, the events taken in when the end was read, and
    /// the phase of the decode call it ran in (its thread's: read in order, unlike other
    /// threads' events).
    windows: Vec<(u64, u64, u64, Option<Phase>)>,
    /// Events taken in; at the last join, events taken in (the shares it looked at were read
    /// before) and up to which graph computes were done with.
    pushed: u64,
    seen: u64,
    cutoff: u64,
    /// Streaming: the capacity of a thread's ring, in events (the most threads a graph compute
    /// said it ran on, some perhaps not met yet, are [`OpAnalysis::graph_threads`]).
    ring: Option<u64>,
    /// Nodes joined and not yet taken, with their start.
    ready: Vec<(u64, OpSample)>,
    /// The phase of the decode call any thread began last.
    latest_phase: Option<Phase>,
    devices: DeviceUseCollector,
}

/// A ring's capacity where the trace does not say (the hook's default `buffer_size`).
const DEFAULT_RING: u64 = 65536;

impl OpCollector {
    /// Takes in the next event, or the damage that ended the trace (nothing more is taken in).
    /// For a graph compute's begin, and an end whose begin was taken in: what it did to the
    /// computes open on its thread.
    pub fn push(&mut self, item: Result<&Event<'_>, Damage>) -> Option<GraphStep> {
        if self.a.damage.is_some() {
            return None;
        }
        self.pushed += 1;
        if let Some(ring) = self.ring {
            let threads = (self.threads.len() as u64)
                .max(self.a.graph_threads.into())
                .max(1);
            let lag = 2u64.saturating_mul(ring).saturating_mul(threads);
            if self.pushed - self.seen >= lag / 8 && self.pushed > lag {
                self.hand_out(self.pushed - lag);
            }
        }
        let e = match item {
            Ok(e) => e,
            Err(damage) => {
                self.a.damage = Some(damage);
                return None;
            }
        };
        let label = e.label.as_deref().unwrap_or_default();
        if let Payload::Extension(x) = e.payload {
            self.extension(x.kind, e.thread_id, label);
            return None;
        }
        let t = self.threads.entry(e.thread_id).or_default();
        match (e.event_type(), e.payload) {
            (Some(EventType::GraphComputeBegin), payload) => {
                if let Payload::Graph { n_threads, .. } = payload {
                    self.a.graph_threads = self.a.graph_threads.max(n_threads);
                }
                let step = self.graphs.begin(e);
                if step.outermost {
                    t.graph_has_ops = false;
                    self.devices.compute_begins(e.timestamp_ns);
                }
                return Some(step);
            }
            (Some(EventType::GraphComputeEnd), _) => {
                let step = self.graphs.end(e);
                if let Some(step) = step
                    && step.outermost
                {
                    self.windows
                        .push((step.begin_ns, e.timestamp_ns, self.pushed, t.phase));
                    let ns = e.timestamp_ns.saturating_sub(step.begin_ns);
                    self.a.graph_computes.push((t.phase, t.graph_has_ops, ns));
                    if t.graph_has_ops {
                        self.a.timed_graph_ns = self
                            .a
                            .timed_graph_ns
                            .saturating_add(e.timestamp_ns.saturating_sub(step.begin_ns));
                    }
                }
                return step;
            }
            (
                Some(EventType::OpComputeBegin),
                Payload::Op {
                    tensor_ptr,
                    op_type,
                    op_size,
                    backend_ptr,
                },
            ) => {
                let tensor = match self.tensor_of.get(label) {
                    Some(&i) => i,
                    None => {
                        let i = self.tensors.len() as u32;
                        self.tensors
                            .push(String::from_utf8_lossy(label).as_ref().into());
                        self.tensor_of.insert(label.into(), i);
                        i
                    }
                };
                let named = named_now(
                    &self.names,
                    &mut self.named,
                    &self.tensors[tensor as usize],
                    (tensor, op_type, backend_ptr),
                );
                t.open_op = Some((e.timestamp_ns, tensor_ptr, tensor, named, op_size));
                t.open_inner_wait_ns = 0;
                t.graph_has_ops = true;
            }
            (Some(EventType::OpComputeEnd), _) => {
                // An end with no begin taken in: nothing to join.
                let (begin, tensor_ptr, tensor, named, bytes) = t.open_op.take()?;
                t.last_share = Some(self.pushed);
                // A node a device timed: on its queue's lane, no graph compute, a backend named.
                if &*named.1 != "CPU" && self.graphs.outermost_begin(e.thread_id).is_none() {
                    self.devices
                        .device_node(&named.1, begin, e.timestamp_ns.max(begin));
                }
                self.shares.push(Share {
                    read_at: self.pushed,
                    thread_id: e.thread_id,
                    begin,
                    end: e.timestamp_ns.max(begin),
                    tensor_ptr,
                    tensor,
                    named,
                    bytes,
                    // A device queue's lane has no decode span of its own: its nodes are those
                    // of the decode call begun last (they are read when the work is done, which
                    // may be after that call returned).
                    phase: t.phase.or(self.latest_phase),
                    wait_ns: 0,
                    inner_wait_ns: std::mem::take(&mut t.open_inner_wait_ns),
                    window: u64::MAX,
                });
            }
            // A worker's wait at a barrier (no entry point recorded it: no label but ours).
            (Some(EventType::BarrierWait), Payload::Thread { value, .. })
                if label == b"ggml_barrier" =>
            {
                let totals = thread_totals(&mut self.a.threads, e.thread_id);
                if t.open_op.is_some() {
                    // Inside the thread's open share: part of its time, not a wait after a node.
                    totals.inner_waits += 1;
                    totals.inner_wait_ns = totals.inner_wait_ns.saturating_add(value);
                    t.open_inner_wait_ns = t.open_inner_wait_ns.saturating_add(value);
                } else {
                    totals.waits += 1;
                    totals.wait_ns = totals.wait_ns.saturating_add(value);
                    let share = t
                        .last_share
                        .and_then(|id| self.shares.binary_search_by_key(&id, |s| s.read_at).ok());
                    if let Some(i) = share {
                        self.shares[i].wait_ns = self.shares[i].wait_ns.saturating_add(value);
                    }
                }
            }
            _ => {}
        }
        None
    }

    /// Whether a graph compute is open on `thread` (an op begun there is a node of it).
    pub fn graph_open_on(&self, thread: u32) -> bool {
        self.graphs.outermost_begin(thread).is_some()
    }

    fn extension(&mut self, kind: ExtensionKind, thread_id: u32, label: &[u8]) {
        match kind {
            ExtensionKind::Metadata => {
                if let Some(m) = ext::parse_payload::<ext::Metadata>(label) {
                    self.a.timing_mode = op_timing_mode(&m).map(String::from);
                    self.a.timing_note = op_timing_note(&m);
                    self.a.n_cpus = m.n_cpus;
                    self.a.memory_bandwidth = (m.setting_u64(Setting::MemoryBandwidthMbS))
                        .filter(|&mb| mb > 0)
                        .map(|mb| mb as f64 * 1e6);
                    if self.ring.is_some() {
                        let size = m.setting_u64(Setting::BufferSize);
                        let size = size.unwrap_or(DEFAULT_RING).clamp(1, 1 << 32);
                        self.ring = Some(size.next_power_of_two());
                    }
                }
            }
            // Taken into the name tables; what nodes were named from them is forgotten when
            // they change.
            ExtensionKind::OpNames | ExtensionKind::TensorInfo | ExtensionKind::BackendNames
                if self.names.take(kind, label).is_some() =>
            {
                self.named.clear();
            }
            ExtensionKind::SpanBegin | ExtensionKind::SpanEnd => {
                let t = self.threads.entry(thread_id).or_default();
                let span = ext::parse_payload::<SpanBoundary>(label).unwrap_or_default();
                let phase = (kind == ExtensionKind::SpanBegin)
                    .then(|| span.is_prefill())
                    .flatten()
                    .map(|prefill| {
                        if prefill {
                            Phase::Prefill
                        } else {
                            Phase::Generation
                        }
                    });
                t.phase = phase;
                if phase.is_some() {
                    self.latest_phase = phase;
                }
            }
            _ => {}
        }
    }

    /// A collector that hands out nodes as they become known (see the type's description).
    pub fn streaming() -> OpCollector {
        OpCollector::with_ring(DEFAULT_RING)
    }

    /// [`OpCollector::streaming`], for rings of `ring` events until the trace says otherwise.
    fn with_ring(ring: u64) -> OpCollector {
        OpCollector {
            ring: Some(ring),
            ..OpCollector::default()
        }
    }

    /// The nodes known so far and not yet taken, in order of start within each call.
    pub fn take_ready(&mut self) -> impl Iterator<Item = OpSample> + '_ {
        self.ready.drain(..).map(|(_, node)| node)
    }

    /// [`crate::oversubscription_note`] for the events taken in so far.
    pub fn oversubscription_note(&self) -> Option<String> {
        crate::oversubscription_note(self.a.graph_threads, self.a.n_cpus)
    }

    /// Events taken in so far: a point to hand nodes out up to later ([`OpCollector::hand_out`]).
    pub fn taken(&self) -> u64 {
        self.pushed
    }

    /// Makes ready (for [`OpCollector::take_ready`]) the nodes of the graph computes whose end
    /// was among the first `taken` events taken in (an earlier [`OpCollector::taken`]), for a
    /// reader that knows those computes' shares have all been read since: a live view a refresh
    /// later, the writer having drained every ring in between. Without it, a streaming
    /// collector waits for two rings' worth of events a thread. A share read later still is
    /// counted as a node of its own ([`OpAnalysis::late_shares`]).
    pub fn hand_out(&mut self, taken: u64) {
        let mut ready = std::mem::take(&mut self.ready);
        self.join(taken.saturating_add(1), &mut |begin, node| {
            ready.push((begin, node))
        });
        self.ready = ready;
    }

    /// Joins the shares of the graph computes whose end was read before `cutoff` events were
    /// taken in, and those in no graph compute read before then, into nodes handed to `each`
    /// with their start.
    fn join(&mut self, cutoff: u64, each: &mut dyn FnMut(u64, OpSample)) {
        // Never back: what was handed out stays handed out (`hand_out` may have gone further
        // than the lag).
        let cutoff = cutoff.max(self.cutoff);
        self.windows.sort_unstable();
        let (windows, before, seen, mut late) = (&self.windows, self.cutoff, self.seen, 0);
        // A share begun after a graph compute still open began may be that compute's.
        let open_since = self.graphs.open_since().unwrap_or(u64::MAX);
        let done: Vec<Share> = self
            .shares
            .extract_if(.., |s| {
                // Looked for until found (a join passes over every share held; most are found
                // at the first), and only where no compute still open may hold it: no share
                // begun in one is done.
                if s.window == u64::MAX
                    && s.begin < open_since
                    && let Some(w) = window_of(windows, s.begin)
                {
                    s.window = w.2;
                    // A worker thread's share takes its compute's phase (its own is the phase
                    // of the decode read last, which may be a later one's).
                    s.phase = w.3.or(s.phase);
                }
                let read_by = if s.window == u64::MAX {
                    s.read_at
                } else {
                    s.window
                };
                let done = read_by < cutoff && s.begin < open_since;
                // Read after the last join had handed out its compute's nodes.
                late += u64::from(done && read_by < before && s.read_at >= seen);
                done
            })
            .collect();
        self.a.late_shares += late;
        (self.cutoff, self.seen) = (cutoff, self.pushed);
        // Graph computes done with (their shares all read), but the last few: a share read late
        // still finds the compute it began in.
        let old = self.windows.iter().filter(|w| w.2 < cutoff).count();
        if old > 64 {
            let mut dropped = 0;
            self.windows.retain(|w| {
                let drop = w.2 < cutoff && dropped < old - 64;
                dropped += usize::from(drop);
                !drop
            });
        }
        for s in &done {
            let totals = thread_totals(&mut self.a.threads, s.thread_id);
            totals.shares += 1;
            totals.share_ns = totals.share_ns.saturating_add(s.end - s.begin);
        }
        join_shares(done, &self.tensors, each);
    }

    /// The analysis of every event taken in; its nodes are those not taken, in order of start.
    pub fn finish(self) -> OpAnalysis {
        let mut ops = Vec::new();
        let mut a = self.finish_each(|begin, node| ops.push((begin, node)));
        ops.sort_by_key(|(begin, _)| *begin);
        a.ops = ops.into_iter().map(|(_, node)| node).collect();
        a
    }

    /// The analysis of every event taken in, without its nodes: those not taken are handed to
    /// `each` with their start (in no particular order), none kept.
    pub fn finish_each(mut self, mut each: impl FnMut(u64, OpSample)) -> OpAnalysis {
        for (begin, node) in std::mem::take(&mut self.ready) {
            each(begin, node);
        }
        self.join(u64::MAX, &mut each);
        self.a.threads.sort_by_key(|t| t.thread_id);
        self.a.devices = std::mem::take(&mut self.devices).finish();
        self.a
    }
}

impl OpAnalysis {
    /// The analysis of `events`, nodes in order of start (all of them kept: for traces that fit
    /// in memory; [`OpCollector::streaming`] for any size).
    pub fn collect<'a>(events: impl IntoIterator<Item = Result<Event<'a>, Damage>>) -> OpAnalysis {
        let mut c = OpCollector::default();
        for item in events {
            c.push(item.as_ref().map_err(Clone::clone));
        }
        c.finish()
    }
}

fn thread_totals(threads: &mut Vec<ThreadTotals>, thread_id: u32) -> &mut ThreadTotals {
    let i = match threads.iter().position(|t| t.thread_id == thread_id) {
        Some(i) => i,
        None => {
            threads.push(ThreadTotals {
                thread_id,
                ..ThreadTotals::default()
            });
            threads.len() - 1
        }
    };
    &mut threads[i]
}

/// A node's op, backend, FLOPs, the bytes of its sources and its kernels, as the name tables
/// give them.
type Named = (Text, Text, Option<u64>, u64, Text);

/// The op, backend, FLOPs and source bytes of a node of tensor `name` (`key`: its index, op type and backend
/// pointer) as the tables give them now, made once while they do not change (`cache`).
fn named_now(
    tables: &NameTables,
    cache: &mut HashMap<(u32, u32, u64), Named>,
    name: &str,
    key: (u32, u32, u64),
) -> Named {
    let (_, op_type, backend) = key;
    cache
        .entry(key)
        .or_insert_with(|| {
            let info = tables.info(name, op_type);
            let op = Text::from(&*tables.op(info, op_type));
            let backend = match tables.backend(backend) {
                Some(name) => name.into(),
                // A CPU worker thread's share (threads-mode op timing) names no backend
                // (FORMAT.md).
                None if backend == 0 => "CPU".into(),
                None => format!("{backend:#x}").into(),
            };
            (
                op,
                backend,
                info.and_then(|i| i.flops),
                info.and_then(|i| i.src_bytes).unwrap_or(0),
                info.and_then(|i| i.kernels.as_deref()).unwrap_or("").into(),
            )
        })
        .clone()
}

/// Joins the threads' shares into nodes (see the module's description), each handed to `each`
/// with its start.
fn join_shares(mut shares: Vec<Share>, tensors: &[Text], each: &mut dyn FnMut(u64, OpSample)) {
    // In the order read where the rest is equal (`read_at` is unique): a sort without a buffer.
    shares.sort_unstable_by_key(|s| (s.tensor_ptr, s.window, s.begin, s.read_at));
    let mut start = 0;
    while start < shares.len() {
        let mut end = start + 1;
        while end < shares.len()
            && shares[end].tensor_ptr == shares[start].tensor_ptr
            && shares[end].window == shares[start].window
            && !shares[start..end]
                .iter()
                .any(|s| s.thread_id == shares[end].thread_id)
        {
            end += 1;
        }
        let node = &shares[start..end];
        each(node[0].begin, sample_of(node, tensors));
        start = end;
    }
}

/// The latest-begun of the sorted `windows` that holds `at` (looking back over a few: graph
/// computes of several threads may overlap), if one does.
fn window_of(
    windows: &[(u64, u64, u64, Option<Phase>)],
    at: u64,
) -> Option<&(u64, u64, u64, Option<Phase>)> {
    let after = windows.partition_point(|&(begin, ..)| begin <= at);
    windows[after.saturating_sub(64)..after]
        .iter()
        .rev()
        .find(|w| w.1 >= at)
}

/// One node from its threads' shares (at least one). Its name, info and backend are those of
/// the share that has a name (threads mode: the first thread's; the others carry the node's
/// pointer and op only).
fn sample_of(node: &[Share], tensors: &[Text]) -> OpSample {
    let tensor = |s: &Share| &tensors[s.tensor as usize];
    let first = node
        .iter()
        .find(|s| !tensor(s).is_empty())
        .unwrap_or(&node[0]);
    let (op, backend, flops, src_bytes, kernels) = first.named.clone();
    let begin = node.iter().map(|s| s.begin).min().unwrap_or(0);
    let end = node.iter().map(|s| s.end).max().unwrap_or(begin);
    let slowest_ns = node.iter().map(|s| s.end - s.begin).max().unwrap_or(0);
    // The threads that had work, and the time they finished before the slowest, summed.
    let (working_threads, idle_ns) = node
        .iter()
        .map(|s| s.end - s.begin)
        .filter(|&d| d.saturating_mul(8) >= slowest_ns)
        .fold((0u32, 0u64), |(n, idle), d| {
            (n + 1, idle.saturating_add(slowest_ns - d))
        });
    OpSample {
        op,
        tensor: tensor(first).clone(),
        backend,
        duration_ns: end - begin,
        threads: node.len() as u32,
        thread_ns: node
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.end - s.begin)),
        idle_ns,
        working_threads,
        slowest_ns,
        wait_ns: node.iter().fold(0u64, |a, s| a.saturating_add(s.wait_ns)),
        inner_wait_ns: node
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.inner_wait_ns)),
        flops,
        bytes: node
            .iter()
            .map(|s| s.bytes)
            .max()
            .unwrap_or(0)
            .saturating_add(src_bytes),
        phase: node.iter().find_map(|s| s.phase),
        graph: node[0].window,
        kernels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::op_groups::{GroupBy, group_ops};

    fn op(op: &str, tensor: &str, ns: u64, flops: Option<u64>) -> OpSample {
        OpSample {
            flops,
            bytes: 1000,
            ..OpSample::on_one_thread(op, tensor, ns)
        }
    }

    /// A share as the hook writes it: odd threads' carry the tensor's name and size (the first
    /// thread's), even threads' the pointer and op only.
    fn op_event(begin: bool, ts: u64, thread: u32, tensor: u64) -> Event<'static> {
        let named = thread % 2 == 1;
        Event {
            type_code: if begin {
                EventType::OpComputeBegin
            } else {
                EventType::OpComputeEnd
            } as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Op {
                tensor_ptr: tensor,
                op_type: 29,
                op_size: if named { 64 } else { 0 },
                backend_ptr: 0,
            },
            label: named.then(|| b"ffn_out-0"[..].into()),
        }
    }

    fn barrier(ts: u64, thread: u32, waited: u64) -> Event<'static> {
        Event {
            type_code: EventType::BarrierWait as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Thread {
                object_ptr: 0,
                thread_index: 0,
                n_threads: 2,
                value: waited,
            },
            label: Some(b"ggml_barrier"[..].into()),
        }
    }

    /// A node's op and FLOPs come from the tables as they are when it is joined: a tensor info
    /// that changes between two computes of one node (the prompt's shape, then a step's) names
    /// the second anew.
    #[test]
    fn a_changed_tensor_info_names_the_next_node() {
        let info = |op: &str, flops: u64| {
            let info = ext::TensorInfo {
                name: "ffn_out-0".into(),
                op: op.into(),
                op_type: Some(29),
                flops: Some(flops),
                ..ext::TensorInfo::default()
            };
            Event {
                type_code: crate::format::EXTENSION_TYPE_CODE,
                timestamp_ns: 0,
                thread_id: 1,
                payload: Payload::Extension(crate::format::Extension {
                    kind: ExtensionKind::TensorInfo,
                    version: 1,
                    layout: crate::format::Layout::Packed,
                }),
                label: Some(serde_json::to_vec(&info).unwrap().into()),
            }
        };
        let events = vec![
            info("MUL_MAT", 100),
            op_event(true, 100, 1, 0xA0),
            op_event(false, 200, 1, 0xA0),
            info("SILU", 300),
            op_event(true, 1000, 1, 0xA0),
            op_event(false, 1100, 1, 0xA0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        let named: Vec<_> = a.ops.iter().map(|o| (o.op.as_str(), o.flops)).collect();
        assert_eq!(named, [("MUL_MAT", Some(100)), ("SILU", Some(300))]);
    }

    /// Two threads compute one node in two graph computes; the file holds thread 7's events of
    /// both computes before thread 8's (the writer drains one ring after the other).
    #[test]
    fn shares_of_one_node_on_several_threads_are_joined_per_compute() {
        let events = vec![
            // thread 7: compute 1 at 100..400, waits 50; compute 2 at 1000..1100, waits 200
            op_event(true, 100, 7, 0xA0),
            op_event(false, 400, 7, 0xA0),
            barrier(450, 7, 50),
            op_event(true, 1000, 7, 0xA0),
            op_event(false, 1100, 7, 0xA0),
            barrier(1300, 7, 200),
            // thread 8: compute 1 at 120..450; compute 2 at 1010..1300; and 1010..1012 is not
            // a third thread's share
            op_event(true, 120, 8, 0xA0),
            op_event(false, 450, 8, 0xA0),
            op_event(true, 1010, 8, 0xA0),
            op_event(false, 1300, 8, 0xA0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!(a.ops.len(), 2, "{:?}", a.ops);
        let (first, second) = (&a.ops[0], &a.ops[1]);
        assert_eq!(first.op, "op 29");
        assert_eq!((first.tensor.as_str(), first.bytes), ("ffn_out-0", 64));
        assert_eq!(first.backend, "CPU");
        assert_eq!((first.threads, first.duration_ns), (2, 450 - 100));
        assert_eq!(first.thread_ns, 300 + 330);
        assert_eq!((first.slowest_ns, first.idle_ns), (330, 30));
        assert_eq!(first.wait_ns, 50);
        assert_eq!((second.threads, second.duration_ns), (2, 1300 - 1000));
        assert_eq!((second.slowest_ns, second.idle_ns), (290, 190));
        assert_eq!(second.wait_ns, 200);
        let g = &group_ops(&a.ops, GroupBy::Op)[0];
        assert_eq!(g.count, 2);
        assert_eq!(g.total_ns, 350 + 300);
        assert_eq!(g.thread_ns, 630 + 390);
        assert!((g.imbalance - 220.0 / (2.0 * 330.0 + 2.0 * 290.0)).abs() < 1e-12);
        assert!((g.wait_share - 250.0 / (1020.0 + 250.0)).abs() < 1e-12);
        assert_eq!(a.threads.len(), 2);
        assert_eq!((a.threads[0].thread_id, a.threads[0].share_ns), (7, 400));
        assert_eq!((a.threads[0].waits, a.threads[0].wait_ns), (2, 250));
        assert_eq!((a.threads[1].shares, a.threads[1].share_ns), (2, 620));
    }

    /// ggml's ops wait at barriers inside themselves (mul_mat once it has shared out its
    /// work): such a wait lies inside the thread's share of the node, so it is neither a wait
    /// after the share before (where it was counted) nor time of its own beside the shares (the
    /// thread's shares and waits added up to more than its time).
    #[test]
    fn a_wait_inside_a_share_is_part_of_it_not_a_wait_after_the_share_before() {
        let events = vec![
            op_event(true, 100, 7, 0xA0),
            barrier(150, 7, 30),
            op_event(false, 400, 7, 0xA0),
            barrier(450, 7, 50),
            op_event(true, 1000, 7, 0xB0),
            barrier(1040, 7, 20),
            op_event(false, 1100, 7, 0xB0),
            barrier(1300, 7, 200),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        let waits: Vec<_> = a
            .ops
            .iter()
            .map(|o| (o.thread_ns, o.inner_wait_ns, o.wait_ns))
            .collect();
        assert_eq!(waits, [(300, 30, 50), (100, 20, 200)]);
        // The waits inside the nodes and after them, of the threads' time in and after them.
        let groups = group_ops(&a.ops, GroupBy::Op);
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert!((g.wait_share - (50.0 + 250.0) / (400.0 + 250.0)).abs() < 1e-12);
        let t = &a.threads[0];
        assert_eq!((t.shares, t.share_ns), (2, 400));
        assert_eq!((t.waits, t.wait_ns), (2, 250));
        assert_eq!((t.inner_waits, t.inner_wait_ns), (2, 50));
    }

    fn graph(begin: bool, ts: u64, thread: u32) -> Event<'static> {
        Event {
            type_code: if begin {
                EventType::GraphComputeBegin
            } else {
                EventType::GraphComputeEnd
            } as u8,
            timestamp_ns: ts,
            thread_id: thread,
            payload: Payload::Graph {
                graph_ptr: 0x10,
                n_nodes: 1,
                n_threads: 2,
                backend_ptr: 0,
            },
            label: None,
        }
    }

    /// ggml's own thread pool, made for each compute: the second compute's new worker starts
    /// the node before the calling thread does, and still belongs to the second compute.
    #[test]
    fn new_workers_of_the_next_compute_are_not_joined_to_the_last() {
        let events = vec![
            graph(true, 0, 1),
            op_event(true, 10, 1, 0xC0),
            op_event(false, 20, 1, 0xC0),
            graph(false, 30, 1),
            graph(true, 100, 1),
            op_event(true, 105, 1, 0xC0),
            op_event(false, 115, 1, 0xC0),
            graph(false, 120, 1),
            op_event(true, 5, 2, 0xC0),
            op_event(false, 25, 2, 0xC0),
            op_event(true, 101, 4, 0xC0),
            op_event(false, 110, 4, 0xC0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        let nodes: Vec<(u32, u64)> = a.ops.iter().map(|o| (o.threads, o.duration_ns)).collect();
        assert_eq!(nodes, [(2, 25 - 5), (2, 115 - 101)]);
    }

    /// A share of 1/8 of the slowest or less is a thread with nothing to do, not an imbalance.
    #[test]
    fn threads_without_work_are_not_imbalance() {
        let events = vec![
            op_event(true, 0, 1, 0xB0),
            op_event(false, 800, 1, 0xB0),
            op_event(true, 0, 2, 0xB0),
            op_event(false, 100, 2, 0xB0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!((a.ops[0].working_threads, a.ops[0].idle_ns), (2, 700));
        let events = vec![
            op_event(true, 0, 1, 0xB0),
            op_event(false, 800, 1, 0xB0),
            op_event(true, 0, 2, 0xB0),
            op_event(false, 99, 2, 0xB0),
        ];
        let a = OpAnalysis::collect(events.into_iter().map(Ok));
        assert_eq!((a.ops[0].working_threads, a.ops[0].idle_ns), (1, 0));
    }

    /// Graph computes on thread 1, each with one node shared by threads 1 and 2, thread 2's
    /// share read once `late` more of thread 1's events were read after its compute's end (the
    /// writer drained its ring later).
    fn computes_with_a_late_share(computes: u64, late: usize) -> Vec<Event<'static>> {
        let (mut main, mut held) = (Vec::new(), std::collections::VecDeque::new());
        for k in 0..computes {
            let (t, node) = (1000 * k, 0x100 + k);
            main.extend([
                graph(true, t, 1),
                op_event(true, t + 10, 1, node),
                op_event(false, t + 100, 1, node),
                graph(false, t + 200, 1),
            ]);
            let share = [
                op_event(true, t + 20, 2, node),
                op_event(false, t + 90, 2, node),
            ];
            held.push_back((main.len() + late, share));
        }
        let mut events = Vec::new();
        for (read, e) in main.into_iter().enumerate() {
            events.push(e);
            while let Some((_, share)) = held.pop_front_if(|(at, _)| *at <= read + 1) {
                events.extend(share);
            }
        }
        events.extend(held.into_iter().flat_map(|(_, share)| share));
        events
    }

    fn streamed(events: &[Event<'static>], ring: u64) -> (Vec<OpSample>, OpAnalysis) {
        let mut c = OpCollector::with_ring(ring);
        let mut nodes = Vec::new();
        for e in events {
            c.push(Ok(e));
            nodes.extend(c.take_ready());
        }
        let a = c.finish_each(|_, node| nodes.push(node));
        nodes.sort_by(|x, y| {
            x.tensor
                .cmp(&y.tensor)
                .then(x.duration_ns.cmp(&y.duration_ns))
        });
        (nodes, a)
    }

    #[test]
    fn streamed_nodes_are_the_nodes_of_the_whole_trace() {
        let events = computes_with_a_late_share(200, 0);
        let whole = OpAnalysis::collect(events.iter().cloned().map(Ok));
        assert_eq!(whole.ops.len(), 200);
        assert!(whole.ops.iter().all(|o| o.threads == 2));
        // Rings of 2 events, 2 threads: nodes are handed out 8 events after their compute.
        let (nodes, a) = streamed(&events, 2);
        let mut expected = whole.ops.clone();
        expected.sort_by(|x, y| {
            x.tensor
                .cmp(&y.tensor)
                .then(x.duration_ns.cmp(&y.duration_ns))
        });
        assert_eq!(nodes, expected);
        assert_eq!((a.late_shares, a.threads), (0, whole.threads));
    }

    #[test]
    fn a_share_read_after_its_compute_is_joined_while_within_two_drains() {
        // Thread 2's share comes 4 computes after its own (16 of thread 1's events and 8 of its
        // own): within two drains of rings of 8 events (2 x 8 x 2 threads = 32 events).
        let events = computes_with_a_late_share(50, 16);
        let (nodes, a) = streamed(&events, 8);
        assert_eq!(nodes.len(), 50, "{nodes:?}");
        assert!(nodes.iter().all(|o| o.threads == 2));
        assert_eq!(a.late_shares, 0);
        // Rings of 1 event: 4 events of lag; the share comes later than that, and is said to.
        let (nodes, a) = streamed(&events, 1);
        assert!(
            a.late_shares > 0,
            "{} nodes, {} late",
            nodes.len(),
            a.late_shares
        );
        assert_eq!(nodes.len() as u64, 50 + a.late_shares);
        assert_eq!(nodes.iter().map(|o| o.threads as u64).sum::<u64>(), 100);
    }

    /// A live view's hand-out: a compute's nodes once its end is among the events handed out
    /// up to, its shares read since (the other thread's, drained after the first's end) joined
    /// with it; a share read after its compute's nodes went out is a node of its own, said late.
    #[test]
    fn handed_out_up_to_a_point_with_the_shares_read_since() {
        let mut c = OpCollector::streaming();
        let node = |k: u64| 0x100 + k;
        // Compute 0 on thread 1, its end read as the 4th event; thread 2's share after it.
        for e in [
            graph(true, 0, 1),
            op_event(true, 10, 1, node(0)),
            op_event(false, 100, 1, node(0)),
            graph(false, 200, 1),
        ] {
            c.push(Ok(&e));
        }
        c.hand_out(3);
        assert_eq!(
            c.take_ready().count(),
            0,
            "the compute's end is the 4th event"
        );
        let at_refresh = c.taken();
        for e in [
            op_event(true, 20, 2, node(0)),
            op_event(false, 150, 2, node(0)),
        ] {
            c.push(Ok(&e));
        }
        c.hand_out(at_refresh);
        let nodes: Vec<OpSample> = c.take_ready().collect();
        assert_eq!(nodes.len(), 1);
        assert_eq!((nodes[0].threads, nodes[0].duration_ns), (2, 140));
        // Compute 1: its nodes go out before thread 2's share of it is read.
        for e in [
            graph(true, 1000, 1),
            op_event(true, 1010, 1, node(1)),
            op_event(false, 1100, 1, node(1)),
            graph(false, 1200, 1),
        ] {
            c.push(Ok(&e));
        }
        c.hand_out(c.taken());
        assert_eq!(c.take_ready().map(|n| n.threads).collect::<Vec<_>>(), [1]);
        for e in [
            op_event(true, 1020, 2, node(1)),
            op_event(false, 1090, 2, node(1)),
        ] {
            c.push(Ok(&e));
        }
        let a = c.finish_each(|_, n| assert_eq!((n.threads, n.duration_ns), (1, 70)));
        assert_eq!(a.late_shares, 1);
    }

    /// Graph computes of two threads overlap: a share of the second, begun while the first ran
    /// too and read after the first ended, belongs to the second once it ends (the latest-begun
    /// compute that holds it), with the second's other share of its node (begun after the first
    /// ended), not to the first it was also inside when it was first looked at.
    #[test]
    fn a_share_in_two_overlapping_computes_waits_for_the_later_one() {
        let events = [
            graph(true, 0, 1),
            graph(true, 50, 3),
            op_event(true, 10, 1, 0xa),
            op_event(false, 90, 1, 0xa),
            graph(false, 100, 1),
            // Thread 4's share of compute 3's node, begun inside both computes.
            op_event(true, 70, 4, 0xb),
            op_event(false, 240, 4, 0xb),
            op_event(true, 120, 3, 0xb),
            op_event(false, 250, 3, 0xb),
            op_event(true, 260, 3, 0xc),
            op_event(false, 270, 3, 0xc),
            graph(false, 300, 3),
        ];
        // Rings of 1 event: a join after nearly every event.
        let (nodes, a) = streamed(&events, 1);
        let mut threads: Vec<(u64, u32, u64)> = nodes
            .iter()
            .map(|n| (n.duration_ns, n.threads, n.thread_ns))
            .collect();
        assert_eq!(a.late_shares, 0);
        threads.sort();
        assert_eq!(threads, [(10, 1, 10), (80, 1, 80), (180, 2, 300)]);
    }

    /// A graph compute's end lost (dropped with a full ring) closes with the end of the compute
    /// it was inside: the nodes of the later computes are joined as they come (before, the
    /// compute stayed open for good, and no share begun after it was ever joined: 1 node of 3).
    #[test]
    fn a_lost_graph_end_leaves_no_compute_open_for_good() {
        let inner = |begin: bool, ts: u64| Event {
            payload: Payload::Graph {
                graph_ptr: 0x20,
                n_nodes: 1,
                n_threads: 2,
                backend_ptr: 0,
            },
            ..graph(begin, ts, 1)
        };
        let mut events = Vec::new();
        for k in 0..3u64 {
            let (t, node) = (1000 * k, 0x100 + k);
            events.extend([graph(true, t, 1), inner(true, t + 1)]);
            events.extend([
                op_event(true, t + 10, 1, node),
                op_event(true, t + 20, 2, node),
                op_event(false, t + 90, 2, node),
                op_event(false, t + 100, 1, node),
            ]);
            if k != 1 {
                events.push(inner(false, t + 150));
            }
            events.push(graph(false, t + 200, 1));
        }
        let (nodes, a) = streamed(&events, 4);
        assert_eq!(
            nodes
                .iter()
                .map(|n| (n.threads, n.duration_ns))
                .collect::<Vec<_>>(),
            [(2, 90); 3]
        );
        assert_eq!(a.timed_graph_ns, 600);
    }

    #[test]
    fn a_compute_longer_than_the_lag_is_not_cut() {
        // One compute of 100 nodes on 2 threads, 402 events; rings of 2: 8 events of lag.
        let mut events = vec![graph(true, 0, 1)];
        for k in 0..100 {
            let (t, node) = (10 + 100 * k, 0x100 + k);
            events.extend([
                op_event(true, t, 1, node),
                op_event(true, t + 1, 2, node),
                op_event(false, t + 50, 1, node),
                op_event(false, t + 60, 2, node),
            ]);
        }
        events.push(graph(false, 20_000, 1));
        let (nodes, a) = streamed(&events, 2);
        assert_eq!(nodes.len(), 100);
        assert!(nodes.iter().all(|o| o.threads == 2));
        assert_eq!(a.late_shares, 0);
    }

    #[test]
    fn groups_sum_and_rate() {
        let ops = [
            op("MUL_MAT", "Qcur-0", 1000, Some(2_000)),
            op("MUL_MAT", "Kcur-1", 3000, Some(6_000)),
            op("ADD", "ffn_out-1", 500, None),
        ];
        let by_op = group_ops(&ops, GroupBy::Op);
        assert_eq!(by_op[0].key, "MUL_MAT");
        assert_eq!((by_op[0].count, by_op[0].total_ns), (2, 4000));
        assert_eq!(by_op[0].flops_per_s, Some(8_000.0 / 4e-6));
        assert_eq!(by_op[1].flops_per_s, None);
        assert_eq!(by_op[1].bytes_per_s, 1000.0 / 500e-9);
        let by_layer = group_ops(&ops, GroupBy::Layer);
        assert_eq!(
            by_layer.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(),
            ["layer 1", "layer 0"]
        );
    }
}
