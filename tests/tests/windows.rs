//! Windows, for real, under Wine: `ggml-viz.exe record` starts a MinGW build of llama-simple.exe
//! suspended, injects `ggml_viz_hook.dll`, which hooks ggml's DLL exports inline; the trace is
//! then read back here by the Linux reader. `scripts/test.sh` builds everything
//! (`scripts/setup-windows.sh`, and the Windows targets of this workspace) and sets the paths.

use std::path::{Path, PathBuf};
use std::process::Command;

use ggml_viz_e2e::*;

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_else(|| {
        panic!("{name} is not set: run the tests through scripts/test.sh, which builds the Windows side")
    }))
}

/// A Linux path as a Windows program under Wine sees it (Wine maps `/` to drive Z:).
fn windows_path(p: &Path) -> String {
    format!("Z:{}", p.display()).replace('/', "\\")
}

fn wine(program: &Path, prefix: &Path) -> Command {
    let mut c = Command::new("wine");
    c.arg(program)
        .env("WINEPREFIX", prefix)
        .env("WINEDEBUG", "-all")
        .env_remove("LD_PRELOAD");
    c
}

#[test]
fn record_injects_the_hook_into_a_windows_llama_simple_under_wine() {
    let bin = env_path("GGML_VIZ_WINDOWS_BUILD");
    let prefix = env_path("GGML_VIZ_WINE_PREFIX");
    let ours = env_path("GGML_VIZ_WINDOWS_TARGET");
    let dir = scratch("wine");
    let trace = dir.join("wine.ggmlviz");
    let model = windows_path(&tiny_model());
    let args = ["-m", &model, "-n", "6", "hello"];

    let plain = run({
        let mut c = wine(&bin.join("llama-simple.exe"), &prefix);
        c.args(args);
        c
    });
    assert!(plain.status.success(), "{}", text(&plain.stderr));

    let traced = run({
        let mut c = wine(&ours.join("ggml-viz.exe"), &prefix);
        c.args(["record", "-o", &windows_path(&trace), "--hook"])
            .arg(windows_path(&ours.join("ggml_viz_hook.dll")))
            .arg("--")
            .arg(windows_path(&bin.join("llama-simple.exe")))
            .args(args);
        c
    });
    let stderr = text(&traced.stderr);
    assert_eq!(traced.status.code(), Some(0), "{stderr}");
    assert_eq!(
        text(&traced.stdout),
        text(&plain.stdout),
        "the injected hook changed the program's output"
    );

    // Read back on Linux: one outermost graph compute per decode, properly nested, named.
    let (events, damage, stats) = read_trace(&trace);
    assert_eq!(damage, None);
    check_nesting(&events);
    assert_eq!(stats.graph_computes, decoded_batches(&stderr), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "ggml-viz: {} graph computes",
            stats.graph_computes
        )),
        "the Windows CLI read its own trace back: {stderr}"
    );
    let meta = stats.metadata.expect("a metadata record");
    assert!(meta.writer.starts_with("ggml-viz-hook"), "{meta:?}");
    assert!(
        meta.command_line
            .first()
            .is_some_and(|c| c.ends_with("llama-simple.exe")),
        "{meta:?}"
    );
    assert!(
        meta.ggml_version.is_some(),
        "helpers found in ggml's DLLs: {meta:?}"
    );
    // Op timing works through the hooked eval-callback setter.
    assert!(stats.ops > 0, "no op events");
}
