//! The GGMLVIZ v1 trace format and everything that reads it.
//!
//! - [`format`]: the one definition of the on-disk format (event types, the packed and padded
//!   layouts, encoding and decoding). Standard library only: the hook's writer uses it too.
//! - [`ext`]: the payloads of ggml-viz extension records (metadata, counters, …).
//! - [`TraceFile`]: a finished trace, memory-mapped, iterated without copying labels.
//! - [`StreamReader`]: a trace from any `io::Read` (a pipe, stdin).
//! - [`Follower`]: a trace another process is still writing; each poll returns only new records.
//! - [`TraceStats`]: the counts `ggml-viz info` prints; [`ops::OpAnalysis`]: per-op timings.
//! - [`telemetry`]: the model every import lands in, its importers and exporters; [`report`]: the
//!   self-contained HTML report.
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

pub mod damage;
pub mod decoder;
pub mod detect;
pub mod ext;
pub mod follow;
pub mod format;
pub mod live;
pub mod ops;
pub mod report;
pub mod slice;
pub mod stats;
pub mod stream;
pub mod telemetry;

pub use damage::{Damage, DamageKind};
pub use decoder::Decoder;
pub use detect::{LayoutChoice, LayoutSource, choose_layout};
pub use follow::{Follower, Poll};
pub use format::{Event, EventType, Layout, Payload};
pub use slice::{Events, TraceFile, TypeCounts, count_types};
pub use stats::{DurationSummary, TraceStats};
pub use stream::{StreamError, StreamReader};
