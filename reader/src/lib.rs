//! The GGMLVIZ v1 trace format, its readers, and the telemetry model they feed.
//!
//! Six layers, each depending only on those before it:
//! - [`format`](mod@format): the `ggml-viz-format` crate, re-exported: the one definition of the
//!   on-disk format (event types, the packed and padded
//!   layouts, encoding and decoding of records, extension payloads in [`format::ext`], damage,
//!   layout detection). The hook's writer encodes with it too.
//! - reading (private module `read`): [`TraceFile`], a finished trace memory-mapped and iterated
//!   without copying labels; [`StreamReader`], a trace from any `io::Read`; [`Follower`], a trace
//!   another process is still writing, each poll returning only new records; [`Decoder`], the
//!   push decoder the last two are built on.
//! - [`telemetry`]: the common model every import lands in. It knows nothing of who produced the
//!   data.
//! - [`import`]: the importers into the model: GGMLVIZ, GE logs, TelemetryEvent v2, CoMMA.
//! - analysis (private module `analysis`): [`TraceStats`], the counts of one pass over a trace;
//!   [`OpAnalysis`], per-op timings grouped by op, tensor, backend or layer; [`Summary`], spans
//!   per name; [`rpc_join`], ggml-rpc clients and servers joined across traces.
//! - [`export`]: sinks of the model: Perfetto, Chrome JSON, Parquet; TelemetryEvent v2.
//!
//! No input makes a reader panic: damage is returned as a [`Damage`] that names the byte
//! offset, after every complete event before it.
//!
//! ```
//! use ggml_viz_reader::format::{self, Event, Layout, Payload};
//!
//! let mut bytes = Vec::new();
//! format::encode_header(&mut bytes);
//! let event = Event {
//!     type_code: 0,
//!     timestamp_ns: 1_700_000_000_000_000_000,
//!     thread_id: 42,
//!     payload: Payload::Graph { graph_ptr: 0x1000, n_nodes: 7, n_threads: 4, backend_ptr: 0 },
//!     label: None,
//! };
//! format::encode_event(&mut bytes, Layout::Packed, &event);
//!
//! let decoded: Vec<_> = ggml_viz_reader::Events::new(&bytes, Layout::Packed).collect();
//! assert_eq!(decoded, vec![Ok(event)]);
//! ```

mod analysis;
pub mod export;
pub use ggml_viz_format as format;
pub mod import;
mod read;
pub mod telemetry;

pub use analysis::device_use::DeviceUse;
pub use analysis::histogram::Histogram;
pub use analysis::memory::{BufferRole, MemoryRow, MemoryStats};
pub use analysis::nodes::{NO_GRAPH, OpAnalysis, OpSample, Phase, ThreadTotals};
pub use analysis::op_change::{
    MIN_GRAPHS, OpChange, PhaseChange, PhaseOps, TimingCost, compare_runs, timing_cost,
};
pub use analysis::op_groups::{GroupBy, OpGroup, OpGroups, group_ops, imbalance, wait_share};
pub use analysis::op_timings::OpCollector;
pub use analysis::rpc_join;
pub use analysis::stats::{DurationSummary, GraphStep, TraceStats, oversubscription_note};
pub use analysis::summary::{NodeTimes, Row, Summary, csv_cell};
pub use analysis::timing_mode::{leaves_graphs_untimed, op_timing_mode, op_timing_note};
pub use export::chrome_json::ChromeJsonWriter;
pub use export::perfetto::PerfettoWriter;
pub use format::{
    Damage, DamageKind, Event, EventType, Layout, LayoutChoice, LayoutSource, Payload, RecordView,
    choose_layout,
};
pub use import::{
    Format, ImportError, RecordTap, SEQUENCE_CATEGORY, detect, import_path, import_path_reporting,
};
pub use read::{
    Decoder, Events, Follower, NameTables, NamesChanged, Poll, StreamError, StreamReader,
    TraceFile, TypeCounts, count_types,
};
