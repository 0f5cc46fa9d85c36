#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu-check.sh, which runs on the GPU machine (device
# tool), where nothing can be fetched: llama.cpp's sources pruned to what a CUDA build of
# llama-bench, llama-simple and llama-quantize needs (ggml without the other backends, src,
# common, vendor, the three tools, gguf-py for the model generator), and the release hook.
# Prints the carry's size; the device tool takes 64 MiB with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
src="$(dirname "$(bash scripts/setup-llama.sh | tail -n 1)")/src"
rm -rf .gpu && mkdir -p .gpu/llama/tools .gpu/llama/examples .gpu/llama/ggml/src
cp -r "$src"/{CMakeLists.txt,cmake,include,src,common,vendor,gguf-py,licenses} .gpu/llama/
cp -r "$src"/ggml/{CMakeLists.txt,cmake,include} .gpu/llama/ggml/
# ggml/src: the CPU and CUDA backends; ggml-src's CMakeLists adds other backends only when asked.
for f in "$src"/ggml/src/*; do
  case "$(basename "$f")" in
    ggml-*) [ -d "$f" ] || cp "$f" .gpu/llama/ggml/src/ ;;
    *) cp -r "$f" .gpu/llama/ggml/src/ ;;
  esac
done
cp -r "$src"/ggml/src/{ggml-cpu,ggml-cuda} .gpu/llama/ggml/src/
cp -r "$src"/tools/{llama-bench,quantize} .gpu/llama/tools/
cp -r "$src"/examples/simple .gpu/llama/examples/
cat > .gpu/llama/tools/CMakeLists.txt <<'CMAKE'
# Pruned for the GPU check: the two tools and llama-simple only.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
add_subdirectory(${PROJECT_SOURCE_DIR}/examples/simple ${CMAKE_CURRENT_BINARY_DIR}/simple)
CMAKE
cargo build --release --locked -p ggml-viz-hook >&2
mkdir -p .gpu/lib
cp target/release/libggml_viz_hook.so .gpu/lib/
du -sh .gpu
