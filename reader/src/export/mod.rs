//! The exporters: sinks of the model — Perfetto's protobuf format ([`perfetto::PerfettoWriter`]),
//! Chrome trace JSON ([`chrome_json::ChromeJsonWriter`]), Parquet tables for query engines
//! (`parquet::ParquetWriter`, with the `parquet` feature) — and the TelemetryEvent v2 export of a
//! trace's buffers ([`telemetry_v2`]).

pub mod chrome_json;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod perfetto;
mod protobuf;
pub mod telemetry_v2;
