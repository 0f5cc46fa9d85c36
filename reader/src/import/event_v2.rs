//! TelemetryEvent v2 (gpu-memory-profiler's memory records): strict validation, the permissive
//! conversion of legacy records, and import into counters per device (the export is
//! [`crate::export::telemetry_v2`]).
//!
//! The rules are those of the reference implementation (`gpumemprof.telemetry` 0.2.3.post1,
//! summarised in `shared/notes/telemetry-v2-legacy.md`): integers must be JSON integers (not
//! booleans, not `1.0`), unknown top-level fields are rejected, and a legacy record (no
//! `schema_version`) is converted with the documented defaults.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::telemetry::ProcessId;
use crate::telemetry::{CounterSample, Ids, Process, Record, RecordSink};

const REQUIRED: [&str; 18] = [
    "schema_version",
    "timestamp_ns",
    "event_type",
    "collector",
    "sampling_interval_ms",
    "pid",
    "host",
    "device_id",
    "allocator_allocated_bytes",
    "allocator_reserved_bytes",
    "allocator_active_bytes",
    "allocator_inactive_bytes",
    "allocator_change_bytes",
    "device_used_bytes",
    "device_free_bytes",
    "device_total_bytes",
    "context",
    "metadata",
];
const DISTRIBUTED: [&str; 4] = ["job_id", "rank", "local_rank", "world_size"];

/// One v2 record, fields in the reference implementation's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventV2 {
    pub schema_version: i64,
    pub timestamp_ns: i64,
    pub event_type: String,
    pub collector: String,
    pub sampling_interval_ms: i64,
    pub pid: i64,
    pub host: String,
    pub job_id: Option<String>,
    pub rank: i64,
    pub local_rank: i64,
    pub world_size: i64,
    pub device_id: i64,
    pub allocator_allocated_bytes: i64,
    pub allocator_reserved_bytes: i64,
    pub allocator_active_bytes: Option<i64>,
    pub allocator_inactive_bytes: Option<i64>,
    pub allocator_change_bytes: i64,
    pub device_used_bytes: i64,
    pub device_free_bytes: Option<i64>,
    pub device_total_bytes: Option<i64>,
    pub context: Option<String>,
    pub metadata: Map<String, Value>,
}

type R<T> = Result<T, String>;

fn int(v: &Value, field: &str) -> R<i64> {
    match v {
        Value::Number(n) if n.is_i64() => Ok(n.as_i64().expect("checked")),
        Value::Number(n) if n.is_u64() => Err(format!("{field} is out of range")),
        _ => Err(format!("{field} must be an integer")),
    }
}

fn opt_int(v: &Value, field: &str) -> R<Option<i64>> {
    if v.is_null() {
        Ok(None)
    } else {
        int(v, field).map(Some)
    }
}

fn string(v: &Value, field: &str, allow_null: bool) -> R<Option<String>> {
    match v {
        Value::Null if allow_null => Ok(None),
        Value::String(s) if allow_null || !s.trim().is_empty() => Ok(Some(s.clone())),
        Value::String(_) | Value::Null => Err(format!("{field} must be a non-empty string")),
        _ => Err(format!("{field} must be a string")),
    }
}

fn required_string(v: &Value, field: &str) -> R<String> {
    string(v, field, false).map(|s| s.expect("not null"))
}

fn non_negative(v: &Value, field: &str) -> R<i64> {
    let n = int(v, field)?;
    if n < 0 {
        Err(format!("{field} must be >= 0"))
    } else {
        Ok(n)
    }
}

/// `resolve_distributed_identity` without environment: explicit values, else metadata, else the
/// single-process defaults (rank 0, local rank = rank, world size 1).
fn identity(
    record: &Map<String, Value>,
    metadata: Option<&Map<String, Value>>,
) -> R<(Option<String>, i64, i64, i64)> {
    let get = |k: &str| {
        record
            .get(k)
            .filter(|v| !v.is_null())
            .or_else(|| metadata.and_then(|m| m.get(k)).filter(|v| !v.is_null()))
    };
    let job_id = match get("job_id") {
        Some(v) => Some(required_string(v, "job_id")?),
        None => None,
    };
    let rank = match get("rank") {
        Some(v) => non_negative(v, "rank")?,
        None => 0,
    };
    let local_rank = match get("local_rank") {
        Some(v) => non_negative(v, "local_rank")?,
        None => rank,
    };
    let world_size = match get("world_size") {
        Some(v) => {
            let w = int(v, "world_size")?;
            if w <= 0 {
                return Err("world_size must be >= 1".into());
            }
            w
        }
        None => 1,
    };
    if rank >= world_size {
        return Err("rank must be < world_size".into());
    }
    if local_rank >= world_size {
        return Err("local_rank must be < world_size".into());
    }
    Ok((job_id, rank, local_rank, world_size))
}

/// `validate_telemetry_record`: the record is a complete, valid v2 record.
pub fn validate(record: &Map<String, Value>) -> R<()> {
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|k| !record.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing required telemetry fields: {}",
            missing.join(", ")
        ));
    }
    let mut unknown: Vec<&str> = record
        .keys()
        .map(String::as_str)
        .filter(|k| !REQUIRED.contains(k) && !DISTRIBUTED.contains(k))
        .collect();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        return Err(format!("unknown telemetry fields: {}", unknown.join(", ")));
    }
    if int(&record["schema_version"], "schema_version")? != 2 {
        return Err("schema_version must be 2".into());
    }
    non_negative(&record["timestamp_ns"], "timestamp_ns")?;
    required_string(&record["event_type"], "event_type")?;
    required_string(&record["collector"], "collector")?;
    non_negative(&record["sampling_interval_ms"], "sampling_interval_ms")?;
    if int(&record["pid"], "pid")? < -1 {
        return Err("pid must be >= -1".into());
    }
    required_string(&record["host"], "host")?;
    int(&record["device_id"], "device_id")?;
    non_negative(
        &record["allocator_allocated_bytes"],
        "allocator_allocated_bytes",
    )?;
    non_negative(
        &record["allocator_reserved_bytes"],
        "allocator_reserved_bytes",
    )?;
    for k in [
        "allocator_active_bytes",
        "allocator_inactive_bytes",
        "device_free_bytes",
        "device_total_bytes",
    ] {
        if opt_int(&record[k], k)?.is_some_and(|n| n < 0) {
            return Err(format!("{k} must be >= 0 when provided"));
        }
    }
    int(&record["allocator_change_bytes"], "allocator_change_bytes")?;
    let used = non_negative(&record["device_used_bytes"], "device_used_bytes")?;
    let free = opt_int(&record["device_free_bytes"], "device_free_bytes")?;
    if let Some(total) = opt_int(&record["device_total_bytes"], "device_total_bytes")? {
        if used > total {
            return Err("device_used_bytes cannot exceed device_total_bytes".into());
        }
        if free.is_some_and(|f| f > total) {
            return Err("device_free_bytes cannot exceed device_total_bytes".into());
        }
    }
    string(&record["context"], "context", true)?;
    if !record["metadata"].is_object() {
        return Err("metadata must be an object".into());
    }
    identity(record, None).map(|_| ())
}

/// `telemetry_event_from_record`: a v2 record (validated), or a legacy one converted.
pub fn from_record(record: &Map<String, Value>) -> R<EventV2> {
    if let Some(version) = record.get("schema_version") {
        let version = int(version, "schema_version")?;
        if version != 2 {
            return Err(format!("unsupported schema_version: {version}"));
        }
        validate(record)?;
        return serde_json::from_value::<EventV2>(Value::Object(with_identity(record)?))
            .map_err(|e| e.to_string());
    }
    legacy(record)
}

/// A valid v2 record with its distributed identity filled in.
fn with_identity(record: &Map<String, Value>) -> R<Map<String, Value>> {
    let (job_id, rank, local_rank, world_size) = identity(record, None)?;
    let mut m = record.clone();
    m.insert("job_id".into(), job_id.map_or(Value::Null, Value::from));
    m.insert("rank".into(), rank.into());
    m.insert("local_rank".into(), local_rank.into());
    m.insert("world_size".into(), world_size.into());
    Ok(m)
}

fn legacy(record: &Map<String, Value>) -> R<EventV2> {
    let mut metadata = match record.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("metadata must be an object when provided".into()),
    };
    for (k, v) in record {
        if let Some(stripped) = k.strip_prefix("metadata_") {
            metadata.insert(stripped.into(), v.clone());
        }
    }
    let number = |v: &Value| v.as_f64().filter(|_| v.is_number());
    let timestamp_ns = match (record.get("timestamp_ns"), record.get("timestamp")) {
        (Some(v), _) => int(v, "timestamp_ns")?,
        (None, Some(v)) if number(v).is_some() => (number(v).expect("checked") * 1e9) as i64,
        _ => return Err("legacy record is missing a valid timestamp".into()),
    };
    let device_id = match (record.get("device_id"), record.get("device")) {
        (Some(v), _) => int(v, "device_id")?,
        (None, Some(Value::String(d))) if d.to_lowercase().contains("cpu") => -1,
        (None, Some(Value::String(d)))
            if d.rsplit_once(':')
                .is_some_and(|(_, t)| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())) =>
        {
            d.rsplit_once(':')
                .expect("checked")
                .1
                .parse()
                .map_err(|_| "device index out of range".to_string())?
        }
        (None, Some(Value::String(d))) if d.to_lowercase().starts_with("/gpu") => 0,
        _ if record.contains_key("memory_mb") => 0,
        _ => -1,
    };
    let allocated = if let Some(v) = record.get("allocator_allocated_bytes") {
        int(v, "allocator_allocated_bytes")?
    } else if let Some(v) = record.get("memory_allocated") {
        int(v, "memory_allocated")?
    } else if let Some(mb) = record.get("memory_mb").and_then(number) {
        (mb * 1024.0 * 1024.0) as i64
    } else if let Some(v) = record.get("device_used_bytes") {
        int(v, "device_used_bytes")?
    } else {
        0
    };
    let field_or = |keys: &[&str], default: i64| -> R<i64> {
        for k in keys {
            if let Some(v) = record.get(*k) {
                return int(v, k);
            }
        }
        Ok(default)
    };
    let reserved = field_or(&["allocator_reserved_bytes", "memory_reserved"], allocated)?;
    let change = field_or(&["allocator_change_bytes", "memory_change"], 0)?;
    let optional = |k: &str| record.get(k).map_or(Ok(None), |v| opt_int(v, k));
    let used = field_or(&["device_used_bytes"], allocated)?;
    let total = if let Some(v) = record.get("device_total_bytes") {
        opt_int(v, "device_total_bytes")?
    } else {
        match total_field(record).or_else(|| total_field(&metadata)) {
            Some((k, v)) => opt_int(v, k)?,
            None => None,
        }
    };
    let free = match record.get("device_free_bytes") {
        Some(v) => opt_int(v, "device_free_bytes")?,
        None => total.map(|t| t.saturating_sub(used).max(0)),
    };
    let event_type = match record.get("event_type").or_else(|| record.get("type")) {
        Some(v) => string(v, "event_type", false)?.unwrap_or_else(|| "sample".into()),
        None => "sample".into(),
    };
    let sampling_interval_ms = record
        .get("sampling_interval_ms")
        .map_or(Ok(0), |v| int(v, "sampling_interval_ms"))?;
    let pid = match record.get("pid").or_else(|| metadata.get("pid")) {
        Some(v) => int(v, "pid")?,
        None => -1,
    };
    let host = match record.get("host").or_else(|| metadata.get("host")) {
        Some(v) => string(v, "host", false)?.unwrap_or_else(|| "unknown".into()),
        None => "unknown".into(),
    };
    let collector = legacy_collector(record, &metadata, device_id);
    let (job_id, rank, local_rank, world_size) = identity(record, Some(&metadata))?;
    for k in DISTRIBUTED {
        metadata.remove(k);
    }
    let context = match record.get("context").or_else(|| record.get("message")) {
        Some(v) => string(v, "context", true)?,
        None => None,
    };
    Ok(EventV2 {
        schema_version: 2,
        timestamp_ns,
        event_type,
        collector,
        sampling_interval_ms,
        pid,
        host,
        job_id,
        rank,
        local_rank,
        world_size,
        device_id,
        allocator_allocated_bytes: allocated,
        allocator_reserved_bytes: reserved,
        allocator_active_bytes: optional("allocator_active_bytes")?,
        allocator_inactive_bytes: optional("allocator_inactive_bytes")?,
        allocator_change_bytes: change,
        device_used_bytes: used,
        device_free_bytes: free,
        device_total_bytes: total,
        context,
        metadata,
    })
}

/// The first of the legacy total-memory fields present in `m`.
fn total_field(m: &Map<String, Value>) -> Option<(&'static str, &Value)> {
    ["total_memory", "device_total", "total_bytes"]
        .into_iter()
        .find_map(|k| m.get(k).map(|v| (k, v)))
}

fn legacy_collector(
    record: &Map<String, Value>,
    metadata: &Map<String, Value>,
    device_id: i64,
) -> String {
    if let Some(Value::String(c)) = record
        .get("collector")
        .filter(|c| c.as_str().is_some_and(|s| !s.trim().is_empty()))
    {
        return c.clone();
    }
    if let Some(Value::String(b)) = record.get("backend").or_else(|| metadata.get("backend")) {
        match b.trim().to_lowercase().as_str() {
            "mps" => return "gpumemprof.mps_tracker".into(),
            "rocm" => return "gpumemprof.rocm_tracker".into(),
            "cuda" => return "gpumemprof.cuda_tracker".into(),
            "cpu" => return "gpumemprof.cpu_tracker".into(),
            _ => {}
        }
    }
    if record.contains_key("memory_mb") {
        return "tfmemprof.memory_tracker".into();
    }
    if record.contains_key("memory_allocated") {
        return if device_id == -1 {
            "gpumemprof.cpu_tracker"
        } else {
            "gpumemprof.cuda_tracker"
        }
        .into();
    }
    "legacy.unknown".into()
}

/// Records from a JSON list, an object with an `events` list, a single record, or JSON lines;
/// errors name the record (index, or line for JSON lines).
pub fn load(text: &str) -> R<Vec<EventV2>> {
    let records: Vec<(String, Value)> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("record {i}"), v))
            .collect(),
        Ok(Value::Object(mut m)) => match m.remove("events") {
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("record {i}"), v))
                .collect(),
            Some(_) => return Err("`events` must be a list of records".into()),
            None => vec![("record 0".into(), Value::Object(m))],
        },
        Ok(_) => return Err("a telemetry file is a JSON object, a list, or JSON lines".into()),
        Err(_) => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map(|v| (format!("line {}", i + 1), v))
                    .map_err(|e| format!("line {}: {e}", i + 1))
            })
            .collect::<R<_>>()?,
    };
    records
        .into_iter()
        .map(|(at, v)| match v {
            Value::Object(m) => from_record(&m).map_err(|e| format!("{at}: {e}")),
            _ => Err(format!("{at}: must be an object")),
        })
        .collect()
}

/// Imports v2 records as counters per device (allocated and device-used bytes), one process per
/// (host, pid, rank).
pub fn import<S: RecordSink>(text: &str, name: &str, ids: &mut Ids, sink: &mut S) -> R<()> {
    let events = load(text).map_err(|e| format!("{name}: {e}"))?;
    let mut processes: Vec<((String, i64, i64), ProcessId)> = Vec::new();
    for e in events {
        let key = (e.host.clone(), e.pid, e.rank);
        let process = match processes.iter().find(|(k, _)| *k == key) {
            Some((_, id)) => *id,
            None => {
                let id = ids.process();
                sink.record(Record::Process(Process {
                    id,
                    pid: e.pid.max(0) as u32,
                    name: format!("{name} ({})", e.collector),
                    host: e.host.clone(),
                    job_id: e.job_id.clone(),
                    rank: Some(e.rank as u32),
                    local_rank: Some(e.local_rank as u32),
                    world_size: Some(e.world_size as u32),
                }));
                processes.push((key, id));
                id
            }
        };
        let device = if e.device_id < 0 {
            "cpu".to_string()
        } else {
            format!("device {}", e.device_id)
        };
        for (what, value) in [
            ("allocated bytes", e.allocator_allocated_bytes),
            ("used bytes", e.device_used_bytes),
        ] {
            sink.record(Record::Counter(CounterSample {
                process,
                name: format!("{device} {what}"),
                time_ns: e.timestamp_ns.max(0) as u64,
                value: value as f64,
            }));
        }
    }
    Ok(())
}

/// The device a buffer type lives on, as v2 numbers them: `CUDA<n>`/`ROCm<n>`/… → n, other
/// accelerators → 0, host buffer types → -1.
pub(crate) fn device_of(buffer_type: &str) -> i64 {
    let lower = buffer_type.to_lowercase();
    let digits: String = buffer_type
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    if lower.starts_with("cpu") || lower.is_empty() {
        -1
    } else {
        digits.parse().unwrap_or(0)
    }
}
