//! The exporters: sinks of the model ([`perfetto::PerfettoWriter`], [`summary::Summary`]) and the
//! TelemetryEvent v2 export of a trace's buffers ([`telemetry_v2`]).

pub mod perfetto;
pub mod summary;
pub mod telemetry_v2;
