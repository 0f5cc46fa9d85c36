#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages, Python packages, llama.cpp built
# from the llama-cpp-python sdist, whisper.cpp from the pywhispercpp sdist), then runs clippy, the quick benchmark suite, 60 s of fuzzing a
# target, the whole workspace's tests, and the loom model check of the ring.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the time goes (the CI budget is 90 minutes on 2 cores, the goal under 60): a line after
# each phase, with the seconds since the start.
phase() { echo "test.sh: $1 done at ${SECONDS} s" >&2; }

missing=()
command -v patchelf >/dev/null || missing+=(patchelf)
command -v valgrind >/dev/null || missing+=(valgrind)
[ -x /usr/bin/time ] || missing+=(time)   # the benchmarks' peak-RSS measure
command -v cc >/dev/null || missing+=(gcc)
[ -x /usr/bin/chromium ] || missing+=(chromium)          # the report's browser tests
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v tmux >/dev/null || missing+=(tmux)              # the live view's terminal test
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)  # Spark, over our Parquet
# The RPC test: a server's clock shifted (libfaketime), servers in network namespaces (ip).
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; }
fi
if ! python3 -c "import gguf" 2>/dev/null; then
  echo "test.sh: installing the gguf Python package" >&2
  python3 -m pip install -q gguf
fi
# The reference TelemetryEvent v2 validator the export tests run (pure Python, no dependencies).
if ! python3 -c "import gpumemprof.telemetry" 2>/dev/null; then
  echo "test.sh: installing gpu-memory-profiler (the TelemetryEvent v2 reference validator)" >&2
  python3 -m pip install -q --no-deps gpu-memory-profiler==0.2.3.post1
fi
# Perfetto's generated protobuf classes, which decode our `export --to perfetto` in the tests.
if ! python3 -c "import perfetto.protos.perfetto.trace.perfetto_trace_pb2" 2>/dev/null; then
  echo "test.sh: installing perfetto and protobuf (Perfetto's trace definitions)" >&2
  python3 -m pip install -q "perfetto==0.59.1" "protobuf==7.36.2"
fi
# DuckDB, embedded (its Python package): queries our Parquet export in the tests.
if ! python3 -c "import duckdb" 2>/dev/null; then
  echo "test.sh: installing duckdb" >&2
  python3 -m pip install -q "duckdb==2.0.0"
fi
# Apache Spark in local mode (pyspark, ~450 MB installed; runs on the JRE above): reads a
# directory of several ranks' Parquet exports in the tests.
if ! python3 -c "import pyspark" 2>/dev/null; then
  echo "test.sh: installing pyspark" >&2
  python3 -m pip install -q "pyspark==4.0.1"
fi
# The WebDriver client the report's browser tests drive Chromium with.
if ! python3 -c "import selenium" 2>/dev/null; then
  echo "test.sh: installing selenium" >&2
  python3 -m pip install -q "selenium==4.51.0"
fi
phase "packages"
# CUDA 13.0's CUPTI headers and library (NVIDIA's wheels, ~13 MB, cached): the hook's CUPTI offsets
# are checked against the headers, and the library loaded (no GPU here: its refusal is checked).
GGML_VIZ_CUDA_WHEELS="$(bash scripts/setup-cuda-wheels.sh | tail -n 1)"
export GGML_VIZ_CUDA_WHEELS
GGML_VIZ_LLAMA_BUILD="$(bash scripts/setup-llama.sh | tail -n 1)"
export GGML_VIZ_LLAMA_BUILD
GGML_VIZ_LLAMA_STATIC_BUILD="$(bash scripts/setup-llama.sh static | tail -n 1)"
export GGML_VIZ_LLAMA_STATIC_BUILD
GGML_VIZ_LLAMA_THREADPOOL_BUILD="$(bash scripts/setup-llama.sh threadpool | tail -n 1)"
export GGML_VIZ_LLAMA_THREADPOOL_BUILD
GGML_VIZ_LLAMA_DL_BUILD="$(bash scripts/setup-llama.sh dl | tail -n 1)"
export GGML_VIZ_LLAMA_DL_BUILD
# llama-simple on ggml-vulkan, run on Mesa's lavapipe (~650 CPU-seconds cold, cached).
GGML_VIZ_LLAMA_VULKAN_BUILD="$(bash scripts/setup-llama.sh vulkan | tail -n 1)"
export GGML_VIZ_LLAMA_VULKAN_BUILD
phase "llama.cpp builds"
# A second GGML program, not llama.cpp: whisper-cli from the pywhispercpp sdist (~2.5 min cold).
GGML_VIZ_WHISPER_BUILD="$(bash scripts/setup-whisper.sh | tail -n 1)"
export GGML_VIZ_WHISPER_BUILD
phase "whisper.cpp build"
# Windows under Wine: MinGW, Wine, llama-simple.exe and a prefix (cached).
windows="$(bash scripts/setup-windows.sh | tail -n 2)"
GGML_VIZ_WINDOWS_BUILD="$(echo "$windows" | sed -n 1p)"
GGML_VIZ_WINE_PREFIX="$(echo "$windows" | sed -n 2p)"
export GGML_VIZ_WINDOWS_BUILD GGML_VIZ_WINE_PREFIX
export GGML_VIZ_WINDOWS_TARGET="$PWD/target/cross/x86_64-pc-windows-gnu/release"
phase "Windows setup"

cargo clippy --workspace --all-targets --locked -- -D warnings
# The docs build without a warning (a broken link, a public doc linking a private item), private
# items included: after clippy, only our crates are documented (~10 s).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items --locked
# What cannot run here is type-checked on every commit (macOS, both architectures), and Windows
# is built for real: the hook DLL and the CLI, linked with MinGW (.cargo/config.toml), and run
# under Wine by tests/tests/windows.rs.
rustup target add x86_64-apple-darwin aarch64-apple-darwin x86_64-pc-windows-gnu
for target in x86_64-apple-darwin aarch64-apple-darwin x86_64-pc-windows-gnu; do
  CARGO_TARGET_DIR=target/cross cargo clippy --locked --target "$target" \
    -p ggml-viz-hook -p ggml-viz-format -p ggml-viz-reader -p ggml-viz-config -p ggml-viz -- -D warnings
done
CARGO_TARGET_DIR=target/cross cargo build --release --locked --target x86_64-pc-windows-gnu \
  -p ggml-viz-hook -p ggml-viz
# The macOS hook compiled to Mach-O objects (no macOS linker needed), which a test reads back
# (hook/tests/macos_interpose.rs: the interpose table dyld will see).
macos_objects=()
for target in x86_64-apple-darwin aarch64-apple-darwin; do
  # Cleaned first: cargo skips rustc for a hook it finds fresh, and then emits no object.
  rm -rf "target/cross/$target/release/deps/ggml_viz_hook-"*.o
  CARGO_TARGET_DIR=target/cross cargo clean -q --release --target "$target" -p ggml-viz-hook
  CARGO_TARGET_DIR=target/cross cargo rustc --release --locked --target "$target" \
    -p ggml-viz-hook --lib --crate-type rlib -- --emit=obj
  macos_objects+=("$PWD/$(ls "target/cross/$target/release/deps/ggml_viz_hook-"*.o)")
done
GGML_VIZ_MACOS_OBJECTS="$(IFS=:; echo "${macos_objects[*]}")"
export GGML_VIZ_MACOS_OBJECTS
# The end-to-end tests (tests/) preload the built hook and run the built CLI: build them first.
cargo build --workspace --release --locked --lib --bins --examples
# The examples (examples/README.md), each run once on a trace or a sample file.
examples_dir="$(mktemp -d)"
target/release/examples/synthesize "$examples_dir/synthetic.ggmlviz" 20000
target/release/examples/op_totals "$examples_dir/synthetic.ggmlviz" | tee "$examples_dir/op_totals.txt"
grep -q "timed ops" "$examples_dir/op_totals.txt"
target/release/examples/import_timeline ../shared/samples/ada-pa/pytorch_acl.log | tee "$examples_dir/import.txt" | head -n 12
[ -s "$examples_dir/import.txt" ]
target/release/examples/synthesize_rpc "$examples_dir/client.ggmlviz" "$examples_dir/server.ggmlviz" 1000
target/release/ggml-viz rpc "$examples_dir/client.ggmlviz" "$examples_dir/server.ggmlviz" > "$examples_dir/rpc.txt"
head -n 4 "$examples_dir/rpc.txt"
grep -q "per token, 1000 decodes" "$examples_dir/rpc.txt"
rm -rf "$examples_dir"
phase "clippy, cross builds, release build and examples"
# The benchmark suite in its quick form: catches a benchmark that no longer builds or runs (its
# figures are not checked here; the machines are too noisy for that).
python3 bench/run.py --quick --out "${TMPDIR:-/tmp}/ggml-viz-bench-quick.json"
phase "quick benchmarks"
# Coverage-guided fuzzing, 60 s a target (needs the nightly toolchain; says so and skips without).
FUZZ_SECONDS="${FUZZ_SECONDS:-60}" bash scripts/fuzz.sh
phase "fuzzing"
cargo test --workspace --release --locked -- --skip alone::
# Tests that compare timings need the machine to themselves (tests/tests/ops.rs, `mod alone`):
# after the rest, one at a time.
cargo test --release --locked -p ggml-viz-e2e --test e2e -- alone:: --test-threads=1
phase "workspace tests"
# The ring under loom's interleavings (its own target dir: --cfg loom rebuilds the crate).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --locked -p ggml-viz-hook --lib loom
phase "loom"
