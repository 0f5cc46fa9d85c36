//! The text importers on any input: CoMMA NCCL JSON, TelemetryEvent v2, GE logs, each into the
//! summary and the Perfetto writer. Invariant: no panic; errors are values.
#![no_main]

use ggml_viz_reader::telemetry::Ids;
use ggml_viz_reader::import::{comma, event_v2, ge_log};
use ggml_viz_reader::{ChromeJsonWriter, Summary};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut summary = Summary::default();
    let _ = comma::import(text, "fuzz", &mut Ids::default(), &mut summary);
    let _ = event_v2::import(text, "fuzz", &mut Ids::default(), &mut summary);
    let _ = ge_log::import(text.as_bytes(), "fuzz", &mut Ids::default(), &mut summary);
    let mut out = Vec::new();
    let mut writer = ChromeJsonWriter::new(&mut out);
    let _ = comma::import(text, "fuzz", &mut Ids::default(), &mut writer);
    let _ = ge_log::import(text.as_bytes(), "fuzz", &mut Ids::default(), &mut writer);
    let _ = writer.finish();
});
