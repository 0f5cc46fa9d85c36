//! A GGMLVIZ trace's backend buffers as TelemetryEvent v2 records (gpu-memory-profiler's
//! schema, checked by its reference validator in the tests).

use serde_json::Map;

use crate::import::event_v2::{EventV2, device_of};

/// The collector name our exports carry.
pub const COLLECTOR: &str = "ggml_viz.hook";

/// The backend buffers of a GGMLVIZ trace (TENSOR_ALLOC / TENSOR_FREE, recorded with memory
/// tracking on) as v2 records: one per event, collector [`COLLECTOR`], `context` = the buffer
/// type, `metadata` = buffer type, handle and base address.
///
/// What is measured: the bytes of ggml's live backend buffers on the event's device after it
/// (`allocator_allocated_bytes`) and the buffer's size (`allocator_change_bytes`, negative for a
/// free). ggml allocates tensors inside buffers it reserves whole, so its reserved bytes are
/// those same live bytes (`allocator_reserved_bytes`), and the schema's required
/// `device_used_bytes` carries them too: what the device uses besides ggml's buffers (other
/// allocators, other processes) is not measured. Not measured at all, so `null`: active and
/// inactive bytes, the device's free and total bytes.
pub fn from_ggmlviz(
    file: &[u8],
    layout: crate::format::Layout,
) -> (Vec<EventV2>, Option<crate::Damage>) {
    use crate::format::{EventType, ExtensionKind, Payload};
    let mut out = Vec::new();
    let mut meta = crate::format::ext::Metadata::default();
    let mut live: std::collections::HashMap<i64, i64> = Default::default();
    let mut buffers: std::collections::HashMap<u64, (String, i64)> = Default::default();
    for item in crate::read::Events::new(file, layout) {
        let e = match item {
            Ok(e) => e,
            Err(d) => return (out, Some(d)),
        };
        let label = e.label_str().unwrap_or_default().into_owned();
        let (alloc, ptr, size) = match (e.event_type(), e.payload) {
            (_, Payload::Extension(x)) if x.kind == ExtensionKind::Metadata => {
                meta = crate::format::ext::parse_payload(label.as_bytes()).unwrap_or_default();
                continue;
            }
            (Some(EventType::TensorAlloc), Payload::Memory { ptr, size }) => {
                (true, ptr, size.min(i64::MAX as u64) as i64)
            }
            (Some(EventType::TensorFree), Payload::Memory { ptr, .. }) => {
                match buffers.remove(&ptr) {
                    Some((_, size)) => (false, ptr, size),
                    None => continue,
                }
            }
            _ => continue,
        };
        let (buffer_type, base) = label
            .split_once('@')
            .map_or((label.clone(), ""), |(t, b)| (t.to_string(), b));
        if alloc {
            buffers.insert(ptr, (buffer_type.clone(), size));
        }
        let device_id = device_of(&buffer_type);
        let device_live = live.entry(device_id).or_default();
        *device_live = if alloc {
            device_live.saturating_add(size)
        } else {
            device_live.saturating_sub(size)
        };
        let mut metadata = Map::new();
        metadata.insert("buffer_type".into(), buffer_type.clone().into());
        metadata.insert("buffer".into(), format!("{ptr:#x}").into());
        metadata.insert("base".into(), base.into());
        let d = &meta.distributed;
        out.push(EventV2 {
            schema_version: 2,
            timestamp_ns: e.timestamp_ns.min(i64::MAX as u64) as i64,
            event_type: if alloc { "allocation" } else { "free" }.into(),
            collector: COLLECTOR.into(),
            sampling_interval_ms: 0,
            pid: if meta.pid == 0 { -1 } else { meta.pid as i64 },
            host: if meta.host.is_empty() {
                "unknown".into()
            } else {
                meta.host.clone()
            },
            job_id: d.job_id.clone(),
            rank: d.rank as i64,
            local_rank: d.local_rank as i64,
            world_size: d.world_size as i64,
            device_id,
            allocator_allocated_bytes: (*device_live).max(0),
            allocator_reserved_bytes: (*device_live).max(0),
            allocator_active_bytes: None,
            allocator_inactive_bytes: None,
            allocator_change_bytes: if alloc { size } else { -size },
            device_used_bytes: (*device_live).max(0),
            device_free_bytes: None,
            device_total_bytes: None,
            context: Some(buffer_type),
            metadata,
        });
    }
    (out, None)
}
