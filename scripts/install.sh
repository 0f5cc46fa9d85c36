#!/usr/bin/env bash
# Installs ggml-viz and the hook library side by side, where `ggml-viz record` finds it:
# PREFIX/bin/ggml-viz and PREFIX/lib/libggml_viz_hook.so (PREFIX defaults to ~/.local).
# `cargo install` alone installs no cdylib, hence this script.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-$HOME/.local}"
cargo build --release --locked -p ggml-viz -p ggml-viz-hook
install -d "$prefix/bin" "$prefix/lib"
install -m 755 target/release/ggml-viz "$prefix/bin/ggml-viz"
install -m 644 target/release/libggml_viz_hook.so "$prefix/lib/libggml_viz_hook.so"
echo "installed $prefix/bin/ggml-viz and $prefix/lib/libggml_viz_hook.so"
