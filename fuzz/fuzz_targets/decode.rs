//! The GGMLVIZ decoder on any bytes: layout detection, the slice iterator, the fast counter,
//! and the statistics `info` computes. Invariants: no panic; damage offsets lie inside the input;
//! the counter and the iterator agree.
#![no_main]

use ggml_viz_reader::{Events, TraceStats, choose_layout, count_types};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let records = data.get(12..).unwrap_or(&[]);
    let layout = choose_layout(records, None).layout;
    let mut n = 0u64;
    let mut damage = None;
    for item in Events::new(data, layout) {
        match item {
            Ok(_) => n += 1,
            Err(d) => damage = Some(d),
        }
    }
    if let Some(d) = &damage {
        assert!(d.offset <= data.len() as u64);
    }
    let counts = count_types(data, layout);
    assert_eq!(counts.total(), n);
    assert_eq!(counts.damage, damage);
    let _ = TraceStats::collect(Events::new(data, layout));
});
