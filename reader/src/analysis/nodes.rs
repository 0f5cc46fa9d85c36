//! What the op analysis gives: the nodes ([`OpSample`], a node's threads' shares joined), the
//! phase a node ran in, each thread's totals, and the whole analysis ([`OpAnalysis`]) that
//! [`OpCollector`](super::op_timings::OpCollector) makes.

use crate::analysis::device_use::DeviceUse;
use crate::format::Damage;
use crate::telemetry::Text;

/// Whether an op ran for a multi-token batch (prompt processing) or a single token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Prefill,
    Generation,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Generation => "generation",
        }
    }
}

/// [`OpSample::graph`] of a node no graph compute was found for.
pub const NO_GRAPH: u64 = u64::MAX;

/// One timed node.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSample {
    /// `MUL_MAT`, `SILU`, … (the sub-op for unary and GLU ops; `RMS_NORM+MUL` for a fused call).
    pub op: Text,
    pub tensor: Text,
    pub backend: Text,
    /// Wall time: the first thread's start to the last thread's end.
    pub duration_ns: u64,
    /// Threads that computed a share of it (1 with the eval callback).
    pub threads: u32,
    /// The threads' shares, summed.
    pub thread_ns: u64,
    /// Of the threads that had work (a share of at least 1/8 of the slowest's: ops that split
    /// no work return at once on the other threads), the time each finished before the slowest,
    /// summed; and how many they were.
    pub idle_ns: u64,
    pub working_threads: u32,
    /// The longest share.
    pub slowest_ns: u64,
    /// Barrier waits of its threads after it (threads mode).
    pub wait_ns: u64,
    /// Barrier waits of its threads inside it (ggml's ops have barriers of their own: mul_mat's,
    /// once it has shared out its work): part of `thread_ns`.
    pub inner_wait_ns: u64,
    pub flops: Option<u64>,
    /// Bytes moved: its sources read (weights included, where the trace says them) and its
    /// result written (`ggml_nbytes` of each).
    pub bytes: u64,
    /// From the enclosing llama_decode / llama_encode span, when there is one.
    pub phase: Option<Phase>,
    /// The outermost graph compute it ran in: an id unique within the trace ([`NO_GRAPH`]:
    /// none was found).
    pub graph: u64,
    /// A node a GPU computed: the kernels it ran, `, `-separated (empty where not known).
    pub kernels: Text,
}

impl OpSample {
    /// For tests: a CPU node of `ns` on one thread, no FLOPs, bytes, phase or graph known.
    #[cfg(test)]
    pub(crate) fn on_one_thread(op: &str, tensor: &str, ns: u64) -> OpSample {
        OpSample {
            op: op.into(),
            tensor: tensor.into(),
            backend: "CPU".into(),
            duration_ns: ns,
            threads: 1,
            thread_ns: ns,
            idle_ns: 0,
            working_threads: 1,
            slowest_ns: ns,
            wait_ns: 0,
            inner_wait_ns: 0,
            flops: None,
            bytes: 0,
            phase: None,
            graph: NO_GRAPH,
            kernels: Text::default(),
        }
    }

    /// llama.cpp names tensors `<name>-<layer>`.
    pub fn layer(&self) -> Option<u32> {
        self.tensor
            .rsplit_once('-')
            .and_then(|(_, l)| l.parse().ok())
    }

    /// The time of the threads that had work had each taken as long as the slowest: what
    /// [`OpSample::idle_ns`] is a share of (the node's imbalance).
    pub fn working_ns(&self) -> u64 {
        self.slowest_ns
            .saturating_mul(u64::from(self.working_threads))
    }
}

/// What `ggml-viz ops` shows.
#[derive(Clone, Debug, Default)]
pub struct OpAnalysis {
    pub ops: Vec<OpSample>,
    /// Total time of the outermost graph computes that contain timed ops.
    pub timed_graph_ns: u64,
    /// Every outermost graph compute: its phase, whether its ops were timed, its duration (the
    /// runs op sampling or a capture window leave untimed tell what timing costs).
    pub graph_computes: Vec<(Option<Phase>, bool, u64)>,
    /// How the writer took op timings: the mode ([`op_timing_mode`](crate::op_timing_mode)) and what to say of it
    /// ([`op_timing_note`](crate::op_timing_note)).
    pub timing_mode: Option<String>,
    pub timing_note: Option<String>,
    /// Per thread: its shares of nodes and its barrier waits, by thread id.
    pub threads: Vec<ThreadTotals>,
    /// The host's memory bandwidth, bytes/s, where the trace says it (`ggml-viz record`
    /// measured it).
    pub memory_bandwidth: Option<f64>,
    /// The most threads a graph compute said it ran on, and the CPUs the process had (0: the
    /// trace does not say): see [`crate::oversubscription_note`].
    pub graph_threads: u32,
    pub n_cpus: u32,
    pub damage: Option<Damage>,
    /// Shares read after their graph compute's nodes were handed out (streaming only; see
    /// [`OpCollector`](crate::OpCollector)): each was counted as a node of its own.
    pub late_shares: u64,
    /// Each GPU that timed its nodes itself: how busy it was in the graph computes' time.
    pub devices: Vec<DeviceUse>,
}

/// One thread's time in node shares and in barrier waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadTotals {
    pub thread_id: u32,
    pub shares: u64,
    pub share_ns: u64,
    /// Waits between shares (after a node).
    pub waits: u64,
    pub wait_ns: u64,
    /// Waits inside a share, at the barriers ggml's ops have within them (mul_mat's, once it
    /// has shared out its work): part of `share_ns`.
    pub inner_waits: u64,
    pub inner_wait_ns: u64,
}
