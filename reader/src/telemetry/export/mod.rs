//! The exporters: sinks of the model — Perfetto's protobuf format ([`perfetto::PerfettoWriter`]),
//! Chrome trace JSON ([`chrome_json::ChromeJsonWriter`]), summaries ([`summary::Summary`]) — and
//! the TelemetryEvent v2 export of a trace's buffers ([`telemetry_v2`]).

pub mod chrome_json;
pub mod perfetto;
mod protobuf;
pub mod summary;
pub mod telemetry_v2;
