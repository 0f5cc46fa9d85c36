//! The workspace's own sources, read as text: in no crate does a file import a file that imports
//! it back, and no file under a `src/` runs over 600 lines before its unit tests. Imports are
//! the paths a file names through `crate::`, `super::` and `self::` (inline, in `use` lines and
//! in grouped uses), each resolved to the file of the deepest module it names; a module's
//! declaring and re-exporting its own children (`mod x; pub use x::Y;`) is its interface, not
//! an import. A planted circle is caught (the second test), so the first cannot pass by seeing
//! nothing. And the layers of the reader (the format, `read`, the telemetry model, the
//! importers, `analysis` with the cross-host RPC join, the exporters) and of the hook (`base`,
//! `record`, `intercept`), each importing only from itself and the layers below it, a name the
//! crate root re-exports counting as its own module's; planted breaches are found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path below its crate root (`["record", "events"]`); the root is empty.
type Module = Vec<String>;

/// The crates' source roots, from the workspace's root.
const SOURCE_ROOTS: [&str; 6] = [
    "reader/format/src",
    "config/src",
    "reader/src",
    "reader/cli/src",
    "hook/src",
    "tests/src",
];

/// The most lines a file may have before its unit tests.
const MOST_LINES: usize = 600;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `.rs` file under `dir`.
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

/// The module a file under `root` defines (`events/mod.rs` and `events.rs`: `events`).
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// A file's text before its unit tests (`#[cfg(test)] mod tests`; other `#[cfg(test)]` items,
/// such as a helper the tests call, are part of the file).
fn before_tests(source: &str) -> &str {
    source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default()
}

/// A file's code before its unit tests, without comments, its whitespace runs made one space.
fn code_of(source: &str) -> String {
    let mut out = String::new();
    for line in before_tests(source).lines() {
        out.push_str(line.split("//").next().unwrap_or_default());
        out.push(' ');
    }
    let words: Vec<&str> = out.split_whitespace().collect();
    words.join(" ").replace(":: ", "::").replace(" ::", "::")
}

/// The paths `code` names that start at `crate`, `super` or `self`, a grouped use giving one
/// path per item (`use super::{a, b::c}`: `super::a`, `super::b`).
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for head in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(head) {
            let start = from + at;
            from = start + head.len();
            // A whole word only (`my_crate::` is not `crate::`).
            if start > 0 && ident(bytes[start - 1] as char) {
                continue;
            }
            let mut path: Vec<String> = vec![head.trim_end_matches(':').to_string()];
            let mut rest = &code[start + head.len()..];
            loop {
                if let Some(group) = rest.strip_prefix('{') {
                    let mut level = 0;
                    let mut item = String::new();
                    for c in group.chars() {
                        match c {
                            '{' => level += 1,
                            '}' if level == 0 => break,
                            '}' => level -= 1,
                            ',' if level == 0 => {
                                push_item(&mut paths, &path, &item);
                                item.clear();
                                continue;
                            }
                            _ => {}
                        }
                        item.push(c);
                    }
                    push_item(&mut paths, &path, &item);
                    break;
                }
                let end = rest.find(|c: char| !ident(c)).unwrap_or(rest.len());
                if end == 0 {
                    paths.push(path);
                    break;
                }
                path.push(rest[..end].to_string());
                rest = &rest[end..];
                match rest.strip_prefix("::") {
                    Some(next) => rest = next,
                    None => {
                        paths.push(path);
                        break;
                    }
                }
            }
        }
    }
    paths
}

/// One item of a grouped use under `prefix`: its first segment (`self` is the prefix itself).
fn push_item(paths: &mut Vec<Vec<String>>, prefix: &[String], item: &str) {
    let first: String = item
        .trim()
        .chars()
        .take_while(|&c| c.is_alphanumeric() || c == '_')
        .collect();
    let mut path = prefix.to_vec();
    if !first.is_empty() && first != "self" {
        path.push(first);
    }
    paths.push(path);
}

/// The module file `path`, named from module `from`, lands in: the deepest module of `modules`
/// its segments reach.
fn resolve(from: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut at, mut rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (from.clone(), &path[1..]),
        Some("super") => {
            let mut at = from[..from.len().checked_sub(1)?].to_vec();
            let mut rest = &path[1..];
            while rest.first().map(String::as_str) == Some("super") {
                at.pop()?;
                rest = &rest[1..];
            }
            (at, rest)
        }
        _ => return None,
    };
    while let Some(next) = rest.first() {
        let mut deeper = at.clone();
        deeper.push(next.clone());
        if !modules.contains(&deeper) {
            break;
        }
        at = deeper;
        rest = &rest[1..];
    }
    Some(at)
}

/// The imports among `files` (module to its code): each module to those it imports.
fn imports(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, code)| {
            let targets = named_paths(code)
                .iter()
                .filter_map(|p| resolve(module, p, &modules))
                .filter(|t| t != module)
                .collect();
            (module.clone(), targets)
        })
        .collect()
}

/// The circles of `graph`: each group of modules that reach one another, of two or more.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    let reach = |from: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&Module, BTreeSet<Module>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for (m, from_m) in &reached {
        if placed.contains(*m) || !from_m.contains(*m) {
            continue;
        }
        let group: Vec<Module> = from_m
            .iter()
            .filter(|other| reached[other].contains(*m))
            .cloned()
            .collect();
        placed.extend(group.iter().cloned());
        out.push(
            group
                .iter()
                .map(|g| {
                    if g.is_empty() {
                        "<root>".into()
                    } else {
                        g.join("/")
                    }
                })
                .collect(),
        );
    }
    out
}

/// Each crate's files, by module: their code before the unit tests.
fn crate_files(root: &Path) -> (BTreeMap<Module, String>, Vec<(PathBuf, usize)>) {
    let mut paths = Vec::new();
    rust_files(root, &mut paths);
    let mut files = BTreeMap::new();
    let mut lengths = Vec::new();
    for path in paths {
        let source = std::fs::read_to_string(&path).unwrap();
        lengths.push((path.clone(), before_tests(&source).lines().count()));
        files.insert(module_of(root, &path), code_of(&source));
    }
    (files, lengths)
}

#[test]
fn no_file_imports_one_that_imports_it_back_and_none_runs_long() {
    let mut found = Vec::new();
    let mut long = Vec::new();
    let mut modules = 0;
    for root in SOURCE_ROOTS {
        let (files, lengths) = crate_files(&workspace().join(root));
        modules += files.len();
        for group in circles(&imports(&files)) {
            found.push(format!("{root}: {}", group.join(" <-> ")));
        }
        long.extend(
            lengths
                .into_iter()
                .filter(|&(_, n)| n > MOST_LINES)
                .map(|(p, n)| format!("{}: {n} lines", p.display())),
        );
    }
    // Every crate was read: dozens of files, not none.
    assert!(modules > 100, "{modules} modules read");
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
    assert!(
        long.is_empty(),
        "over {MOST_LINES} lines before the unit tests:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_planted_circle_is_found() {
    let file = |code: &str| code_of(code);
    let module = |path: &str| -> Module {
        path.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut files = BTreeMap::new();
    files.insert(module(""), file("mod a; mod b; mod c; pub use a::run;"));
    // a -> b through a grouped use; b -> a through an inline `super::` path: a circle.
    files.insert(
        module("a"),
        file("use super::{b::helper, b};\npub fn run() {}"),
    );
    files.insert(
        module("b"),
        file("pub fn helper() { super::a::run() } // crate::c in a comment is no import"),
    );
    // c -> a only: no circle with it.
    files.insert(module("c"), file("use crate::a::run;"));
    let graph = imports(&files);
    assert_eq!(
        graph[&module("c")],
        BTreeSet::from([module("a")]),
        "{graph:?}"
    );
    assert_eq!(
        circles(&graph),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
    // Without the back edge, nothing.
    files.insert(module("b"), file("pub fn helper() {}"));
    assert!(circles(&imports(&files)).is_empty());
}

/// The reader's layers from the bottom, each a list of module paths (a module's children are in
/// its layer). `format` is the format crate, re-exported; the crate root only re-exports.
const READER_LAYERS: &[&[&str]] = &[
    &["format"],
    &["read"],
    &["telemetry"],
    &["import"],
    &["analysis"],
    &["export"],
];

/// The hook's layers: the base (entry names, OS, clock, ring, ggml helpers), the recording core
/// (which names no mechanism), the front ends (wrappers, routing, inline hooks).
const HOOK_LAYERS: &[&[&str]] = &[&["base"], &["record"], &["intercept"]];

/// The layer of `module` among `layers` (its deepest listed ancestor's), if any.
fn layer_of(layers: &[&[&str]], module: &[String]) -> Option<usize> {
    let path = module.join("/");
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| layer.iter().map(move |m| (i, *m)))
        .filter(|(_, m)| path == *m || path.starts_with(&format!("{m}/")))
        .max_by_key(|(_, m)| m.len())
        .map(|(i, _)| i)
}

/// The names the crate root re-exports (`pub use analysis::stats::TraceStats;`), each with the
/// module it comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    for statement in code_of(lib).split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, names) = match path.split_once("::{") {
            Some((m, list)) => (m, list.trim_end_matches('}').split(',').collect::<Vec<_>>()),
            None => match path.rsplit_once("::") {
                Some((m, name)) => (m, vec![name]),
                None => continue,
            },
        };
        let module: Module = module.split("::").map(str::to_string).collect();
        for name in names {
            let name = name.rsplit(" as ").next().unwrap_or_default().trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.clone());
            }
        }
    }
    out
}

/// The imports of a crate's files that reach a layer of `layers` above their own:
/// `(file, target)`; `lib` is the crate root's source (its re-exports).
fn upward_imports(
    layers: &[&[&str]],
    files: &BTreeMap<Module, String>,
    lib: &str,
) -> Vec<(String, String)> {
    let reexports = root_reexports(lib);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut found = Vec::new();
    for (module, code) in files {
        let Some(own) = layer_of(layers, module) else {
            continue;
        };
        for path in named_paths(code) {
            // `crate::Name` re-exported at the root stands for its own module.
            let path = match (path.first().map(String::as_str), path.get(1)) {
                (Some("crate"), Some(name)) if reexports.contains_key(name) => {
                    let mut p = vec!["crate".to_string()];
                    p.extend(reexports[name].iter().cloned());
                    p.extend(path[2..].iter().cloned());
                    p
                }
                _ => path,
            };
            let target = if path.first().map(String::as_str) == Some("crate")
                && path.get(1).map(String::as_str) == Some("format")
            {
                vec!["format".to_string()]
            } else {
                match resolve(module, &path, &modules) {
                    Some(t) => t,
                    None => continue,
                }
            };
            if layer_of(layers, &target).is_some_and(|t| t > own) {
                found.push((module.join("/"), target.join("/")));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The modules of the crate at `root` in none of `layers`, and its imports of a layer above
/// their own.
fn layer_breaches(root: &str, layers: &[&[&str]]) -> (Vec<String>, Vec<(String, String)>) {
    let root = workspace().join(root);
    let (files, _) = crate_files(&root);
    let unplaced = (files.keys())
        .filter(|m| !m.is_empty() && layer_of(layers, m).is_none())
        .map(|m| m.join("/"))
        .collect();
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    (unplaced, upward_imports(layers, &files, &lib))
}

#[test]
fn the_readers_and_the_hooks_layers_import_only_downwards() {
    for (root, layers) in [("reader/src", READER_LAYERS), ("hook/src", HOOK_LAYERS)] {
        let (unplaced, upward) = layer_breaches(root, layers);
        assert!(
            unplaced.is_empty(),
            "{root}: modules in no layer: {unplaced:?}"
        );
        assert!(
            upward.is_empty(),
            "{root}: imports of a layer above: {upward:?}"
        );
    }
}

/// The binary's commands, one module each (the subcommands `main.rs` dispatches to).
const CLI_COMMANDS: &[&str] = &[
    "diff", "dump", "export", "info", "live", "ops", "record", "report", "rpc", "summary",
];

/// The imports by which a module of one of `commands` (or below it) reaches another's:
/// `(importer, imported)`.
fn imports_between(commands: &[&str], files: &BTreeMap<Module, String>) -> Vec<(String, String)> {
    let command_of = |m: &Module| {
        m.first()
            .filter(|top| commands.contains(&top.as_str()))
            .cloned()
    };
    let mut found: Vec<_> = imports(files)
        .into_iter()
        .flat_map(|(module, targets)| targets.into_iter().map(move |t| (module.clone(), t)))
        .filter(|(module, target)| {
            matches!((command_of(module), command_of(target)), (Some(a), Some(b)) if a != b)
        })
        .map(|(module, target)| (module.join("/"), target.join("/")))
        .collect();
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_command_of_the_binary_imports_another() {
    let root = workspace().join("reader/cli/src");
    let (files, _) = crate_files(&root);
    // The list is main.rs's: each `Command::X(args) => module::…` arm names a command's module.
    let main = code_of(&std::fs::read_to_string(root.join("main.rs")).unwrap());
    let mut dispatched: Vec<&str> = (main.split("Command::").skip(1))
        .filter_map(|arm| arm.split_once("(args) => ")?.1.split_once("::"))
        .map(|(module, _)| module)
        .collect();
    dispatched.sort_unstable();
    assert_eq!(
        dispatched, CLI_COMMANDS,
        "the commands main.rs dispatches to"
    );
    for command in CLI_COMMANDS {
        assert!(
            files.contains_key(&vec![command.to_string()]),
            "no module for the command {command}"
        );
    }
    assert_eq!(imports_between(CLI_COMMANDS, &files), []);
    // Planted: a command's submodule importing another command through `crate::`, and one
    // through `super::`; a shared module importing a command is not between commands.
    let mut planted = files.clone();
    let mut plant = |module: &str, code: &str| {
        let key: Module = module.split('/').map(str::to_string).collect();
        let old = planted[&key].clone();
        planted.insert(key, format!("{old} {code}"));
    };
    plant("report/series", "use crate::ops::OpsArgs;");
    plant("record", "fn f() { super::live::run; }");
    plant("view", "use crate::live::LiveArgs;");
    assert_eq!(
        imports_between(CLI_COMMANDS, &planted),
        [
            ("record".to_string(), "live".to_string()),
            ("report/series".to_string(), "ops".to_string()),
        ]
    );
}

/// Planted upward imports, each found, in the reader's tree and in a hook-like crate: inline
/// paths, grouped uses (nested too), `super::` chains that climb out of a layer, names the
/// crate root re-exports from an upper layer (renamed too); and what a lower layer may write.
#[test]
fn planted_upward_imports_are_found() {
    let (files, _) = crate_files(&workspace().join("reader/src"));
    let lib = std::fs::read_to_string(workspace().join("reader/src/lib.rs")).unwrap();
    let mut planted = files.clone();
    let mut plant = |module: &str, code: &str| {
        let key: Module = module.split('/').map(str::to_string).collect();
        let old = planted[&key].clone();
        planted.insert(key, format!("{old} {code}"));
    };
    plant("telemetry", "use crate::export::perfetto::PerfettoWriter;");
    plant("import/ge_log", "fn f() { crate::TraceStats::default(); }");
    plant("read/mmap", "use crate::telemetry::Span;");
    plant("analysis/stats", "use crate::read::Events;");
    assert_eq!(
        upward_imports(READER_LAYERS, &planted, &lib),
        [
            ("import/ge_log".to_string(), "analysis/stats".to_string()),
            ("read/mmap".to_string(), "telemetry".to_string()),
            ("telemetry".to_string(), "export/perfetto".to_string()),
        ]
    );

    let lib = "mod base; mod intercept; mod record; pub use base::entry::Entry;\n\
               pub use record::{Recorder, graph_begin as begin};";
    let module = |path: &str| -> Module { path.split('/').map(str::to_string).collect() };
    let crate_with = |file: &str, code: &str| {
        let mut files: BTreeMap<Module, String> = [
            "",
            "base",
            "base/os",
            "base/ring",
            "base/entry",
            "record",
            "record/recorder",
            "intercept",
            "intercept/inline",
            "intercept/exports",
        ]
        .iter()
        .map(|m| (module(m), String::new()))
        .map(|(m, c)| (if m == [String::new()] { Vec::new() } else { m }, c))
        .collect();
        files.insert(module(file), code_of(code));
        files
    };
    let caught = |file: &str, code: &str| {
        !upward_imports(HOOK_LAYERS, &crate_with(file, code), lib).is_empty()
    };
    assert!(caught("base/ring", "use crate::record::Recorder;"));
    assert!(caught(
        "base/ring",
        "use crate::{base::os, intercept::inline};"
    ));
    assert!(caught(
        "base/ring",
        "use crate::{\n    record::{self, Setup},\n};"
    ));
    assert!(caught(
        "record/recorder",
        "fn f() { crate::intercept::exports::wrapper(e); }"
    ));
    assert!(caught("base/ring", "use super::super::record::Recorder;"));
    assert!(caught("base", "use super::record;"));
    assert!(caught("base/ring", "let r: &crate::Recorder = todo!();"));
    assert!(caught("base/ring", "use crate::begin;"));
    // What a base module may write.
    assert!(!caught(
        "base/ring",
        "use super::os::thread_id;\nuse crate::base::ring::Ring;\nuse crate::Entry;"
    ));
    assert!(!caught(
        "base/ring",
        "// see crate::record::Recorder\n/// [`crate::intercept`]\nfn f() {}"
    ));
    assert!(!caught(
        "base/ring",
        "use ggml_viz_format::ext::SpanBoundary;"
    ));
}
