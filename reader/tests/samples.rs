//! Files made by the C++ ggml-viz tool (v0.0.12), read from `../shared/samples/ggml-viz/`.

use std::path::PathBuf;

use ggml_viz_reader::format::{EventType, Layout, Payload};
use ggml_viz_reader::{LayoutSource, TraceFile, TraceStats};

fn sample(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/samples/ggml-viz")
        .join(name);
    assert!(
        path.exists(),
        "sample {} is missing: the tests read ../shared/samples beside the checkout",
        path.display()
    );
    path
}

#[test]
fn the_cpp_tools_trace_is_padded_with_sixty_events() {
    let trace = TraceFile::open(sample("test_trace.ggmlviz"), None).unwrap();
    assert_eq!(trace.layout().layout, Layout::Padded);
    assert_eq!(
        trace.layout().source,
        LayoutSource::Inferred {
            other_parsed_cleanly: false
        }
    );
    let stats = TraceStats::collect(trace.events());
    assert_eq!(stats.damage, None);
    assert_eq!(stats.events(), 60);
    assert_eq!(stats.count(EventType::GraphComputeBegin), 10);
    assert_eq!(stats.count(EventType::GraphComputeEnd), 10);
    assert_eq!(stats.count(EventType::OpComputeBegin), 20);
    assert_eq!(stats.count(EventType::OpComputeEnd), 20);
    assert_eq!(stats.graph_computes, 10);
    assert_eq!(stats.labels, 40);
    let counts = trace.count_types();
    assert_eq!(counts.total(), 60);
    // The op events decode to plausible values only in the padded layout.
    let first_op = trace
        .events()
        .map(Result::unwrap)
        .find(|e| e.type_code == 2)
        .unwrap();
    let Payload::Op {
        op_type,
        op_size,
        backend_ptr,
        ..
    } = first_op.payload
    else {
        panic!("not an op")
    };
    assert_eq!((op_type, op_size, backend_ptr), (27, 4 << 20, 0));
    assert_eq!(first_op.label_str().as_deref(), Some("matmul_AB"));
}

#[test]
fn forcing_the_wrong_layout_finds_corruption_with_an_offset() {
    let trace = TraceFile::open(sample("test_trace.ggmlviz"), Some(Layout::Packed)).unwrap();
    let stats = TraceStats::collect(trace.events());
    let damage = stats
        .damage
        .expect("the padded sample cannot read as packed to its end");
    assert!(damage.offset >= 12 && damage.offset < 3352);
}

#[test]
fn the_header_only_trace_has_no_events() {
    let trace = TraceFile::open(sample("header_only.ggmlviz"), None).unwrap();
    let stats = TraceStats::collect(trace.events());
    assert_eq!(stats.events(), 0);
    assert_eq!(stats.damage, None);
}
