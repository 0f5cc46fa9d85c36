//! What the tests run: the built hook and CLI, the llama.cpp and whisper.cpp builds, the test
//! fixtures and the tiny models generated from them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::process::{run, scratch, text};

/// `target/release` (or whichever profile built this test).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

pub(crate) fn built(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release --workspace` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// `name` as built, checked to be newer than every file under `sources` (folders of the
/// workspace): `cargo test` does not rebuild what the tests run, and a test of a library older
/// than its sources tests something else than what is checked out.
fn built_from(name: &str, sources: &[&str]) -> PathBuf {
    let path = built(name);
    let made = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut folders: Vec<PathBuf> = sources.iter().map(|s| root.join(s)).collect();
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                folders.push(entry.path());
            } else if meta.modified().unwrap() > made {
                panic!(
                    "{} is older than {}: run `cargo build --release --workspace` first \
                     (scripts/test.sh does)",
                    path.display(),
                    entry.path().display()
                );
            }
        }
    }
    path
}

/// The preloaded library's sources, and those of the crates it depends on.
const HOOK_SOURCES: &[&str] = &["hook/src", "reader/format/src", "config/src"];

pub fn hook() -> PathBuf {
    // Checked once a test process.
    static HOOK: OnceLock<PathBuf> = OnceLock::new();
    HOOK.get_or_init(|| built_from("libggml_viz_hook.so", HOOK_SOURCES))
        .clone()
}

pub fn ggml_viz() -> PathBuf {
    static CLI: OnceLock<PathBuf> = OnceLock::new();
    CLI.get_or_init(|| {
        built_from(
            "ggml-viz",
            &[
                "reader/src",
                "reader/cli/src",
                "reader/cli/assets",
                "reader/format/src",
                "config/src",
            ],
        )
    })
    .clone()
}

/// The `bin/` directory of the llama.cpp build (binaries and shared ggml libraries).
pub fn llama_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_BUILD")
        .expect("GGML_VIZ_LLAMA_BUILD is not set: run the tests through scripts/test.sh, which builds llama.cpp");
    let bin = PathBuf::from(build).join("bin");
    assert!(
        bin.join("llama-simple").exists(),
        "no llama-simple in {}",
        bin.display()
    );
    bin
}

/// The `bin/` directory of the llama.cpp build with ggml linked into the executables
/// (`scripts/setup-llama.sh static`).
pub fn llama_static_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_STATIC_BUILD").expect(
        "GGML_VIZ_LLAMA_STATIC_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of libggml-cpu built with ggml's own thread pool instead of OpenMP
/// (`scripts/setup-llama.sh threadpool`): first on `LD_LIBRARY_PATH`, [`llama_bin`]'s programs
/// run on it.
pub fn llama_threadpool_lib() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_THREADPOOL_BUILD").expect(
        "GGML_VIZ_LLAMA_THREADPOOL_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of the llama.cpp build whose CPU backend is a module loaded with
/// `dlopen(RTLD_LOCAL)` (`GGML_BACKEND_DL=ON`, `scripts/setup-llama.sh dl`).
pub fn llama_dl_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_DL_BUILD").expect(
        "GGML_VIZ_LLAMA_DL_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// The `bin/` directory of llama.cpp built on ggml-vulkan (`scripts/setup-llama.sh vulkan`),
/// whose programs the tests run on Mesa's lavapipe.
pub fn llama_vulkan_bin() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_LLAMA_VULKAN_BUILD").expect(
        "GGML_VIZ_LLAMA_VULKAN_BUILD is not set: run the tests through scripts/test.sh, which builds it",
    );
    PathBuf::from(build).join("bin")
}

/// Runs the model generator `script` (a Python fixture) with `args`: the files it writes, then
/// its options.
fn generate(script: &str, args: &[&OsStr]) {
    let out = Command::new("python3")
        .arg(fixture(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The whisper.cpp build (scripts/setup-whisper.sh): `bin/whisper-cli` and its shared libraries.
pub fn whisper_build() -> PathBuf {
    let build = std::env::var_os("GGML_VIZ_WHISPER_BUILD").expect(
        "GGML_VIZ_WHISPER_BUILD is not set: run the tests through scripts/test.sh, which builds whisper.cpp",
    );
    let build = PathBuf::from(build);
    assert!(
        build.join("bin/whisper-cli").exists(),
        "no whisper-cli in {}",
        build.display()
    );
    build
}

/// The tiny random-weight whisper model and the WAV file it transcribes, generated once per test
/// process (tests/fixtures/make_tiny_whisper.py).
pub fn tiny_whisper() -> (PathBuf, PathBuf) {
    static MODEL: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = scratch("whisper-model");
            let (model, audio) = (dir.join("tiny-whisper.bin"), dir.join("tones.wav"));
            generate(
                "make_tiny_whisper.py",
                &[model.as_os_str(), audio.as_os_str()],
            );
            (model, audio)
        })
        .clone()
}

/// What `ldd` says of an executable or library: the shared objects it loads.
pub fn ldd(path: &Path) -> String {
    let out = run({
        let mut c = Command::new("ldd");
        c.arg(path);
        c
    });
    text(&out.stdout)
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The tiny random-weight llama model, generated once per test process.
pub fn tiny_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-llama.gguf", &[])
}

/// The tiny model with a mixture of 4 experts, 2 used per token, in place of each feed-forward
/// block (its experts' products are MUL_MAT_ID nodes).
pub fn tiny_moe_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-moe.gguf", &["--n-expert", "4"])
}

/// The tiny model with its vocabulary padded to 272 tokens, as converters pad real models':
/// quantized, its output projection (the graph's last node) can be repacked for the CPU, whose
/// kernels take rows in groups of 8.
pub fn tiny_padded_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    tiny_variant(&MODEL, "tiny-padded.gguf", &["--pad-vocab", "8"])
}

/// `make_tiny_llama.py` with `options`, into `file` in a scratch directory of its own, once per
/// test process (`model` holds it).
fn tiny_variant(model: &OnceLock<PathBuf>, file: &str, options: &[&str]) -> PathBuf {
    model
        .get_or_init(|| {
            let path = scratch(file).join(file);
            let mut args = vec![path.as_os_str()];
            args.extend(options.iter().map(OsStr::new));
            generate("make_tiny_llama.py", &args);
            path
        })
        .clone()
}
