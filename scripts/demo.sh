#!/usr/bin/env bash
# The main job on a built-in default: builds ggml-viz and llama.cpp's llama-simple (cached),
# generates a tiny model, records llama-simple generating 32 tokens under the hook, summarizes the
# trace, shows its ops, and writes its HTML report next to it.
#   bash scripts/demo.sh [OUTPUT.ggmlviz]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-demo.ggmlviz}"

python3 -c "import gguf" 2>/dev/null || python3 -m pip install -q gguf
build="$(bash scripts/setup-llama.sh simple | tail -n 1)"
cargo build --release --locked -p ggml-viz -p ggml-viz-hook
model="${GGML_VIZ_CACHE:-$HOME/.cache/ggml-viz}/tiny-llama.gguf"
[ -f "$model" ] || python3 tests/fixtures/make_tiny_llama.py "$model"

# The tiny model's random weights make gibberish: the program's own output is left out.
./target/release/ggml-viz record -o "$out" -- \
  "$build/bin/llama-simple" -m "$model" -n 32 "hello world" >/dev/null 2> >(grep -E '^ggml-viz:|^main:' >&2)
echo
./target/release/ggml-viz info "$out"
echo
./target/release/ggml-viz ops "$out" --top 8
echo
./target/release/ggml-viz report "$out" -o "${out%.ggmlviz}.html"
