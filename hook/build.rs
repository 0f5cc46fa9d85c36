//! Link arguments of the preloaded library, per target OS.
//!
//! Linux: `-Bsymbolic` binds the library's own references to its own exported functions (the
//! tables of our wrappers, which the inline hooks write jumps to) at link time. Without it each
//! is a symbol relocation that the dynamic loader resolves through the whole global scope when
//! the library is loaded (123 of them for the per-op wrappers: about 0.1 M instructions in every
//! process), and an executable exporting ggml's names ahead of us would have them point at its
//! own functions instead of our wrappers.
//!
//! Linux with glibc: no `DT_NEEDED` on the dynamic loader. Rust's thread-locals call
//! `__tls_get_addr`, which the loader defines, so the linker records the loader as a
//! dependency of ours (glibc's `libc.so` script names it `AS_NEEDED`). The loader's search
//! order is breadth-first from the executable, where a preloaded library's dependencies come
//! right after the executable's own: the loader then moves ahead of libllama, ggml, libm and
//! the rest, and every symbol lookup in the process visits it first (measured: +0.22 M
//! instructions for an empty library with one thread-local, 0.30 M fewer for ours without it,
//! `llama-bench -t 1 -p 0 -n 16` on the tiny model, callgrind). The library is linked against
//! a copy of the `libc.so` script without the loader; `__tls_get_addr` stays undefined
//! (a shared object may leave symbols to the loader) and binds to the loader's own, which is in
//! every dynamically linked process's scope.
//!
//! macOS: the interpose table names ggml's functions, which the hook is not linked against; they
//! are found at load time in whichever image defines them (weakly: see `src/interpose.rs`).
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    match std::env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("linux") => {
            println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
            if std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
                && let Some(dir) = libc_without_loader()
            {
                println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
            }
        }
        Ok("macos") => {
            println!("cargo:rustc-cdylib-link-arg=-undefined");
            println!("cargo:rustc-cdylib-link-arg=dynamic_lookup");
        }
        _ => {}
    }
}

/// A folder holding glibc's `libc.so` link script less its `AS_NEEDED ( …ld-linux… )` group,
/// when the compiler's is such a script (a native build; anything else: the script as it is,
/// no change).
fn libc_without_loader() -> Option<PathBuf> {
    if std::env::var("TARGET").ok()? != std::env::var("HOST").ok()? {
        return None;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(cc)
        .arg("-print-file-name=libc.so")
        .output()
        .ok()?;
    let script_path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let script = std::fs::read_to_string(&script_path).ok()?;
    println!("cargo:rerun-if-changed={}", script_path.display());
    let without = without_loader(&script)?;
    let dir = Path::new(&std::env::var("OUT_DIR").ok()?).join("libc-without-loader");
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::write(dir.join("libc.so"), without).ok()?;
    Some(dir)
}

/// `script` less its one `AS_NEEDED ( … )` group, if that group names only the dynamic loader
/// (`ld-linux…` or `ld64…`).
fn without_loader(script: &str) -> Option<String> {
    if !script.starts_with("/* GNU ld script") {
        return None;
    }
    let start = script.find("AS_NEEDED")?;
    let end = start + script[start..].find(')')? + 1;
    let group = &script[start..end];
    let inner = group["AS_NEEDED".len()..]
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')');
    let names: Vec<&str> = inner.split_whitespace().collect();
    let loader = |path: &&str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.starts_with("ld-linux") || file.starts_with("ld64.so")
    };
    if names.is_empty() || !names.iter().all(loader) || script[end..].contains("AS_NEEDED") {
        return None;
    }
    Some(format!("{}{}", &script[..start], &script[end..]))
}
