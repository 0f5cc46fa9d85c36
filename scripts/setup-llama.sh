#!/usr/bin/env bash
# Builds the real llama.cpp the hook tests preload into, from the llama-cpp-python sdist on PyPI.
# Prints the build directory (holding bin/llama-simple, bin/llama-bench, bin/llama-quantize,
# bin/llama-server, bin/llama-completion, bin/llama-batched, bin/ggml-rpc-server and the shared ggml libraries, with
# ggml-rpc) on its last line. The build is cached outside
# the clone, keyed by version, so a second run returns at once.
#   bash scripts/setup-llama.sh              # shared ggml libraries (build/)
#   bash scripts/setup-llama.sh simple       # the same build with llama-simple only (what the
#                                            # demo needs; the other targets come with the next
#                                            # plain call)
#   bash scripts/setup-llama.sh static       # ggml linked into llama-simple itself (build-static/)
#   bash scripts/setup-llama.sh threadpool   # libggml-cpu with ggml's own thread pool instead of
#                                            # OpenMP (build-threadpool/bin: put it first on
#                                            # LD_LIBRARY_PATH to run build/'s programs on it)
#   bash scripts/setup-llama.sh dl           # GGML_BACKEND_DL=ON: llama-simple loading its CPU
#                                            # backend with dlopen(RTLD_LOCAL), as wheels do
#                                            # (build-dl/)
#   bash scripts/setup-llama.sh vulkan       # GGML_VULKAN=ON: llama-simple on ggml-vulkan, run by
#                                            # the tests on Mesa's lavapipe (build-vulkan/;
#                                            # ../shared/notes/vulkan-on-lavapipe.md)
set -euo pipefail

# The targets of the shared build; a cached build that lacks one (an older checkout's) gets it
# built incrementally.
targets=(llama-simple llama-bench llama-quantize llama-server llama-completion ggml-rpc-server llama-batched)

# A variant build from the shared build's source, in build-$1/: "$2" says what it is, the flags
# up to "--" are CMake's (beside the common ones), the rest are the targets. Prints its directory.
variant() {
  local name="$1" what="$2" flags=() targets=()
  shift 2
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  targets=("$@")
  local shared dest
  shared="$(bash "$0" | tail -n 1)"   # the source comes with the shared build
  dest="$(dirname "$shared")"
  if [ ! -f "$dest/build-$name/.complete" ]; then
    echo "setup-llama: building $what" >&2
    cmake -S "$dest/src" -B "$dest/build-$name" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
      -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
    cmake --build "$dest/build-$name" -j "$(nproc)" --target "${targets[@]}" >&2
    touch "$dest/build-$name/.complete"
  fi
  echo "$dest/build-$name"
}

case "${1:-}" in
  simple)
    targets=(llama-simple) ;;
  static)
    variant static "llama-simple with ggml linked in statically" \
      -DBUILD_SHARED_LIBS=OFF -- llama-simple
    exit 0 ;;
  threadpool)
    variant threadpool "libggml-cpu with GGML_OPENMP=OFF" \
      -DBUILD_SHARED_LIBS=ON -DGGML_OPENMP=OFF -- ggml-cpu
    exit 0 ;;
  vulkan)
    vk_need=()
    [ -e /usr/include/vulkan/vulkan.h ] || vk_need+=(libvulkan-dev)
    command -v glslc >/dev/null || vk_need+=(glslc)
    [ -d /usr/include/spirv ] || vk_need+=(spirv-headers)
    ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || vk_need+=(mesa-vulkan-drivers)
    if [ ${#vk_need[@]} -gt 0 ]; then
      echo "setup-llama: installing ${vk_need[*]}" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -qq "${vk_need[@]}" >&2 || { apt-get update -qq >&2 && apt-get install -y -qq "${vk_need[@]}" >&2; }
    fi
    # Debian 12's Vulkan headers (1.3.239) predate VK_EXT_layer_settings, which ggml-vulkan uses
    # only to pass options to the validation layer: that block is compiled out where the headers
    # lack it (idempotent; no other build compiles this file).
    vk_src="$(dirname "$(bash "$0" | tail -n 1)")/src/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    if ! grep -q "ggml-viz: VK_EXT_layer_settings" "$vk_src"; then
      python3 - "$vk_src" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
start = s.index("    VkBool32 enable_best_practice = layer_settings;")
line = "vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);"
end = s.index(line, start) + len(line)
s = (s[:start] + "#ifdef VK_EXT_layer_settings // ggml-viz: VK_EXT_layer_settings\n" + s[start:end]
     + "\n#else\n    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, nullptr);\n#endif"
     + s[end:])
open(path, "w").write(s)
PY
    fi
    variant vulkan "llama-simple on ggml-vulkan" \
      -DBUILD_SHARED_LIBS=ON -DGGML_VULKAN=ON -- llama-simple
    exit 0 ;;
  dl)
    variant dl "llama-simple with GGML_BACKEND_DL=ON" \
      -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -- llama-simple ggml-cpu
    exit 0 ;;
esac

LLAMA_PY_VERSION="${LLAMA_PY_VERSION:-0.3.36}"
cache_root="${GGML_VIZ_CACHE:-$HOME/.cache/ggml-viz}"
key="llama-cpp-python-${LLAMA_PY_VERSION}"
dest="$cache_root/$key"

# The build happens in place (CMake bakes absolute rpaths into the binaries); .complete marks success.
if [ -f "$dest/build/.complete" ]; then
  for t in "${targets[@]}"; do
    if [ ! -x "$dest/build/bin/$t" ]; then
      echo "setup-llama: building $t" >&2
      # A build configured before llama-server or ggml-rpc were targets had them off.
      [ "$t" = llama-server ] && cmake -S "$dest/src" -B "$dest/build" -DLLAMA_BUILD_SERVER=ON >&2
      [ "$t" = ggml-rpc-server ] && cmake -S "$dest/src" -B "$dest/build" -DGGML_RPC=ON >&2
      cmake --build "$dest/build" -j "$(nproc)" --target "$t" >&2
    fi
  done
  echo "$dest/build"
  exit 0
fi

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-llama: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${need_apt[@]}" >&2
fi

mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "setup-llama: downloading llama-cpp-python==$LLAMA_PY_VERSION sdist" >&2
python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
  -d "$work/dl" "llama-cpp-python==$LLAMA_PY_VERSION" >&2
tar -xzf "$work"/dl/llama_cpp_python-*.tar.gz -C "$work"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"

echo "setup-llama: building llama.cpp (a few minutes on 2 cores)" >&2
rm -rf "$dest"
mkdir -p "$dest"
mv "$src" "$dest/src"
# llama-server without its web UI (LLAMA_BUILD_UI, off by default: its assets need the network).
cmake -S "$dest/src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$dest/build" -j "$(nproc)" --target "${targets[@]}" >&2

touch "$dest/build/.complete"
echo "$dest/build"
