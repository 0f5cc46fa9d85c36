//! Backend buffers as TelemetryEvent v2 records (gpu-memory-profiler's schema, checked by its
//! reference validator in the tests): a sink of the model that keeps its buffer events.

use std::collections::HashMap;

use serde_json::Map;

use crate::import::event_v2::{EventV2, device_of};
use crate::telemetry::{BufferEvent, Process, ProcessId, Record, RecordSink, Span};

/// The collector name our exports carry.
pub const COLLECTOR: &str = "ggml_viz.hook";

/// The backend buffers made and freed in what it is fed (a GGMLVIZ trace recorded with memory
/// tracking) as v2 records: one per buffer event, collector [`COLLECTOR`], `context` = the
/// buffer type, `metadata` = buffer type, handle and base address.
///
/// What is measured: the bytes of ggml's live backend buffers on the event's device after it
/// (`allocator_allocated_bytes`) and the buffer's size (`allocator_change_bytes`, negative for a
/// free). ggml allocates tensors inside buffers it reserves whole, so its reserved bytes are
/// those same live bytes (`allocator_reserved_bytes`), and the schema's required
/// `device_used_bytes` carries them too: what the device uses besides ggml's buffers (other
/// allocators, other processes) is not measured. Not measured at all, so `null`: active and
/// inactive bytes, the device's free and total bytes.
#[derive(Debug, Default)]
pub struct TelemetryV2Records {
    /// The records, in the order of the buffer events.
    pub records: Vec<EventV2>,
    processes: HashMap<ProcessId, Process>,
    /// Live bytes by process and device.
    live: HashMap<(ProcessId, i64), i64>,
}

impl RecordSink for TelemetryV2Records {
    fn span(&mut self, _: &Span) {}

    fn record(&mut self, record: Record) {
        match record {
            Record::Process(p) => {
                self.processes.insert(p.id, p);
            }
            Record::Buffer(b) => self.buffer(b),
            _ => {}
        }
    }
}

impl TelemetryV2Records {
    fn buffer(&mut self, b: BufferEvent) {
        let size = b.size.min(i64::MAX as u64) as i64;
        let device_id = device_of(&b.buffer_type);
        let live = self.live.entry((b.process, device_id)).or_default();
        *live = if b.made {
            live.saturating_add(size)
        } else {
            live.saturating_sub(size)
        };
        let live = (*live).max(0);
        let mut metadata = Map::new();
        metadata.insert("buffer_type".into(), b.buffer_type.clone().into());
        metadata.insert("buffer".into(), format!("{:#x}", b.buffer).into());
        metadata.insert("base".into(), b.base.into());
        let process = self.processes.get(&b.process);
        let pid = process.map_or(0, |p| p.pid);
        let host = process.map_or("", |p| p.host.as_str());
        self.records.push(EventV2 {
            schema_version: 2,
            timestamp_ns: b.time_ns.min(i64::MAX as u64) as i64,
            event_type: if b.made { "allocation" } else { "free" }.into(),
            collector: COLLECTOR.into(),
            sampling_interval_ms: 0,
            pid: if pid == 0 { -1 } else { i64::from(pid) },
            host: if host.is_empty() { "unknown" } else { host }.into(),
            job_id: process.and_then(|p| p.job_id.clone()),
            rank: process.and_then(|p| p.rank).map_or(0, i64::from),
            local_rank: process.and_then(|p| p.local_rank).map_or(0, i64::from),
            world_size: process.and_then(|p| p.world_size).map_or(1, i64::from),
            device_id,
            allocator_allocated_bytes: live,
            allocator_reserved_bytes: live,
            allocator_active_bytes: None,
            allocator_inactive_bytes: None,
            allocator_change_bytes: if b.made { size } else { -size },
            device_used_bytes: live,
            device_free_bytes: None,
            device_total_bytes: None,
            context: Some(b.buffer_type),
            metadata,
        });
    }
}
