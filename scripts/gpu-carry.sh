#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu-check.sh, which runs on the GPU machine (device
# tool), where nothing can be fetched: llama.cpp's sources pruned to what a CUDA build of
# llama-bench, llama-simple and llama-quantize needs (ggml without the other backends, src,
# common, vendor, the three tools, gguf-py for the model generator), the release hook and CLI,
# the Vulkan build of llama-simple and Vulkan's loader.
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
# The hook and the CLI (`record` for the Vulkan check), stripped.
cargo build --release --locked -p ggml-viz-hook -p ggml-viz >&2
mkdir -p .gpu/lib
strip -o .gpu/lib/libggml_viz_hook.so target/release/libggml_viz_hook.so
strip -o .gpu/lib/ggml-viz target/release/ggml-viz
# llama-simple on ggml-vulkan as the tests build it (no shader compiler there), xz-packed (~5 MB),
# and Vulkan's loader (Debian's libvulkan1): the layer's checks on NVIDIA's Vulkan driver.
vk="$(bash scripts/setup-llama.sh vulkan | tail -n 1)/bin"
tar -C "$vk" -cf - --dereference llama-simple libggml-base.so.0 libggml-cpu.so.0 \
  libggml-vulkan.so.0 libggml.so.0 libllama.so.0 | xz -6 -T2 > .gpu/vulkan-bin.tar.xz
(cd .gpu && apt-get download -qq libvulkan1 >&2)
du -sh .gpu
