//! The hook's manifest: the preloaded library depends on the format crate alone among ours (as
//! bytehound's preload library depends on its `common` only). Its layers, `base` < `record` <
//! `intercept`, are checked with every crate's sources in `tests/tests/source.rs`.

use std::path::Path;

/// The library links the format crate, never the reader (its telemetry model, importers,
/// Parquet and Perfetto): in no `[dependencies]` table of the manifest, target-specific ones
/// included (the tests' `[dev-dependencies]` may read traces back with it).
#[test]
fn the_library_depends_on_the_format_not_the_reader() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let mut table = String::new();
    let mut format = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            table = line.to_string();
            continue;
        }
        if !table.ends_with("dependencies]") || table.ends_with("dev-dependencies]") {
            continue;
        }
        assert!(!line.starts_with("ggml-viz-reader"), "{table} {line}");
        format |= line.starts_with("ggml-viz-format");
    }
    assert!(format, "no ggml-viz-format among the dependencies");
}
