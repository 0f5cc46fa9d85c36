//! The layer rule of `src/`: `base` imports nothing above it, `record` nothing from `intercept`
//! — through `use` lines, inline `crate::…` paths, `super::` chains that climb out of a layer,
//! grouped imports, and names the crate root re-exports from an upper layer. A planted upward
//! import is caught (the second test), so the first cannot pass by seeing nothing.

use std::path::{Path, PathBuf};

/// Layers from the bottom; a module may use its own layer and those before it.
const LAYERS: [&str; 3] = ["base", "record", "intercept"];

/// The layer paths that `source` (a file `depth` modules below the crate root) reaches that are
/// in `forbidden`, or that are names `root_reexports` brings up from a forbidden layer.
fn upward_references(
    source: &str,
    depth: usize,
    forbidden: &[&str],
    root_reexports: &[(String, String)],
) -> Vec<String> {
    // Comments out (doc links may name any layer), whitespace out, `super::` chains resolved.
    let code: String = source
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<String>()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut code = code;
    for d in (1..=depth).rev() {
        code = code.replace(
            &"super::".repeat(d),
            if d == depth {
                "crate::"
            } else {
                "crate::<layer>::"
            },
        );
    }
    let mut found = Vec::new();
    let mut check = |path: &str| {
        let first = path.split("::").next().unwrap_or_default();
        let first = first.trim_start_matches('{');
        if forbidden.contains(&first) {
            found.push(format!("crate::{path}"));
        }
        for (name, layer) in root_reexports {
            if first == name && forbidden.contains(&layer.as_str()) {
                found.push(format!("crate::{path} (re-exported from {layer})"));
            }
        }
    };
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A grouped import: each top-level item.
            let (mut level, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => level += 1,
                    '}' if level == 0 => break,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        check(&item);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            check(&item);
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            check(&rest[..end]);
        }
    }
    found
}

/// Names `lib.rs` re-exports at the crate root, with the layer each comes from.
fn root_reexports(lib: &str) -> Vec<(String, String)> {
    let code: String = lib
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = Vec::new();
    for statement in code.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        let Some(at) = words.windows(2).position(|w| w == ["pub", "use"]) else {
            continue;
        };
        let path = words[at + 2..].join(" ");
        let layer = path
            .split("::")
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let items: Vec<String> = match path.split_once("::{") {
            Some((_, list)) => list
                .trim_end_matches('}')
                .split(',')
                .map(str::to_string)
                .collect(),
            None => vec![path.rsplit("::").next().unwrap_or_default().to_string()],
        };
        for item in items {
            // `a as b` brings up `b`.
            let name = item
                .rsplit(" as ")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            if !name.is_empty() {
                out.push((name, layer.clone()));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_reaches_into_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        reexports.iter().any(|(_, layer)| layer == "record"),
        "lib.rs re-exports the recording core's API: {reexports:?}"
    );
    let mut checked = 0;
    let mut violations = Vec::new();
    for (i, layer) in LAYERS.iter().enumerate() {
        let forbidden = &LAYERS[i + 1..];
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "src/{layer} has modules");
        for file in files {
            let relative = file.strip_prefix(&src).unwrap();
            // src/base/mod.rs is one module below the root, src/base/ring.rs two, …
            let depth = relative.components().count()
                - usize::from(relative.file_name().unwrap() == "mod.rs");
            let source = std::fs::read_to_string(&file).unwrap();
            for v in upward_references(&source, depth, forbidden, &reexports) {
                violations.push(format!("{}: {v}", relative.display()));
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} files checked");
    assert!(
        violations.is_empty(),
        "upward imports:\n{}",
        violations.join("\n")
    );
}

#[test]
fn a_planted_upward_import_is_caught() {
    let reexports = root_reexports(
        "pub use base::entry::Entry;\npub use record::{Recorder, graph_begin as begin};",
    );
    assert!(reexports.contains(&("Recorder".into(), "record".into())));
    assert!(reexports.contains(&("begin".into(), "record".into())));
    let upper = ["record", "intercept"];
    let caught =
        |source: &str, depth| !upward_references(source, depth, &upper, &reexports).is_empty();
    assert!(caught("use crate::record::Recorder;", 2));
    assert!(caught("use crate::{base::os, intercept::inline};", 2));
    assert!(caught("use crate::{\n    record::{self, Setup},\n};", 2));
    assert!(caught(
        "fn f() { crate::intercept::exports::wrapper(e); }",
        2
    ));
    assert!(caught("use super::super::record::Recorder;", 2));
    assert!(caught("use super::record;", 1));
    assert!(caught("let r: &crate::Recorder = todo!();", 2));
    assert!(caught("use crate::begin;", 2));
    // What a base module may write.
    assert!(!caught(
        "use super::os::thread_id;\nuse crate::base::ring::Ring;\nuse crate::Entry;",
        2
    ));
    assert!(!caught(
        "// see crate::record::Recorder\n/// [`crate::intercept`]\nfn f() {}",
        2
    ));
    assert!(!caught("use ggml_viz_format::ext::SpanBoundary;", 2));
}

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
