//! TelemetryEvent v2: our conversion against the reference implementation's output, and the
//! strict validation rules.

use std::path::PathBuf;

use ggml_viz_reader::import::event_v2::{self, EventV2};
use serde_json::{Value, json};

fn sample(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/samples/gpumemprof")
        .join(path);
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn legacy_records_convert_exactly_as_gpumemprof_does() {
    let ours: Vec<EventV2> = event_v2::load(&sample("legacy_v1_handmade_input.json")).unwrap();
    let theirs: Value = serde_json::from_str(&sample(
        "legacy_v1_converted_by_gpumemprof_0.2.3.post1.json",
    ))
    .unwrap();
    let ours = serde_json::to_value(&ours).unwrap();
    let (ours, theirs) = (ours.as_array().unwrap(), theirs.as_array().unwrap());
    assert_eq!(ours.len(), theirs.len());
    for (o, t) in ours.iter().zip(theirs) {
        for (field, value) in t.as_object().unwrap() {
            assert_eq!(&o[field], value, "field {field}");
        }
        assert_eq!(o.as_object().unwrap().len(), t.as_object().unwrap().len());
    }
}

#[test]
fn the_cpu_trackers_v2_export_loads_record_for_record() {
    let text = sample("cpu_tracker_export_v2.json");
    let raw: Value = serde_json::from_str(&text).unwrap();
    let events = event_v2::load(&text).unwrap();
    assert_eq!(events.len(), raw.as_array().unwrap().len());
    assert_eq!(
        serde_json::to_value(&events).unwrap(),
        raw,
        "a valid v2 record comes back unchanged"
    );
}

fn base() -> serde_json::Map<String, Value> {
    let v = json!({
        "schema_version": 2, "timestamp_ns": 1, "event_type": "sample", "collector": "c",
        "sampling_interval_ms": 0, "pid": 5, "host": "h", "device_id": 0,
        "allocator_allocated_bytes": 10, "allocator_reserved_bytes": 10,
        "allocator_active_bytes": null, "allocator_inactive_bytes": null, "allocator_change_bytes": -3,
        "device_used_bytes": 10, "device_free_bytes": null, "device_total_bytes": null,
        "context": null, "metadata": {}
    });
    v.as_object().unwrap().clone()
}

#[test]
fn validation_is_strict() {
    assert!(event_v2::validate(&base()).is_ok());
    let cases: [(&str, Value, &str); 9] = [
        ("pid", json!(true), "pid must be an integer"),
        (
            "timestamp_ns",
            json!(1.0),
            "timestamp_ns must be an integer",
        ),
        ("surprise", json!(1), "unknown telemetry fields: surprise"),
        ("metadata", json!([]), "metadata must be an object"),
        ("schema_version", json!(3), "schema_version must be 2"),
        ("rank", json!(1), "rank must be < world_size"),
        (
            "device_total_bytes",
            json!(5),
            "device_used_bytes cannot exceed device_total_bytes",
        ),
        ("host", json!("  "), "host must be a non-empty string"),
        ("pid", json!(-2), "pid must be >= -1"),
    ];
    for (field, value, message) in cases {
        let mut r = base();
        r.insert(field.into(), value);
        assert_eq!(event_v2::validate(&r).unwrap_err(), message, "{field}");
    }
    let mut r = base();
    r.remove("context");
    assert!(
        event_v2::validate(&r)
            .unwrap_err()
            .contains("missing required telemetry fields: context")
    );
    // A present schema_version other than 2 is an error, never a legacy conversion.
    let mut r = base();
    r.insert("schema_version".into(), json!(1));
    assert_eq!(
        event_v2::from_record(&r).unwrap_err(),
        "unsupported schema_version: 1"
    );
}

#[test]
fn every_input_shape_loads() {
    let record = Value::Object(base()).to_string();
    for text in [
        format!("[{record}]"),
        format!("{{\"events\": [{record}, {record}]}}"),
        record.clone(),
        format!("{record}\n{record}\n"),
    ] {
        let n = event_v2::load(&text).unwrap().len();
        assert!(n >= 1, "{text}");
    }
    let bad = format!("{record}\n{{not json\n");
    assert!(event_v2::load(&bad).unwrap_err().starts_with("line 2"));
}
