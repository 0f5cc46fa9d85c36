#!/usr/bin/env bash
# The test command: sets up what the tests need (llama.cpp built from the llama-cpp-python sdist,
# the gguf Python package), then runs clippy and the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import gguf" 2>/dev/null; then
  echo "test.sh: installing the gguf Python package" >&2
  python3 -m pip install -q gguf
fi
GGML_VIZ_LLAMA_BUILD="$(bash scripts/setup-llama.sh | tail -n 1)"
export GGML_VIZ_LLAMA_BUILD

cargo clippy --workspace --all-targets --locked -- -D warnings
# Release: the end-to-end tests preload the hook into llama.cpp and measure nothing, but a debug
# hook would make them slower than they need to be.
cargo test --workspace --release --locked
