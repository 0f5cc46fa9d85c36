#!/usr/bin/env bash
# Builds the real llama.cpp the hook tests preload into, from the llama-cpp-python sdist on PyPI.
# Prints the build directory (holding bin/llama-simple, bin/llama-bench, bin/llama-quantize and
# the shared ggml libraries) on its last line. The build is cached outside the clone, keyed by
# version, so a second run returns at once.
#   bash scripts/setup-llama.sh              # shared ggml libraries (build/)
#   bash scripts/setup-llama.sh static       # ggml linked into llama-simple itself (build-static/)
#   bash scripts/setup-llama.sh threadpool   # libggml-cpu with ggml's own thread pool instead of
#                                            # OpenMP (build-threadpool/bin: put it first on
#                                            # LD_LIBRARY_PATH to run build/'s programs on it)
#   bash scripts/setup-llama.sh dl           # GGML_BACKEND_DL=ON: llama-simple loading its CPU
#                                            # backend with dlopen(RTLD_LOCAL), as wheels do
#                                            # (build-dl/)
set -euo pipefail

# The targets of the shared build; a cached build that lacks one (an older checkout's) gets it
# built incrementally.
targets=(llama-simple llama-bench llama-quantize)

if [ "${1:-}" = dl ]; then
  shared="$(bash "$0" | tail -n 1)"
  dest="$(dirname "$shared")"
  if [ ! -f "$dest/build-dl/.complete" ]; then
    echo "setup-llama: building llama-simple with GGML_BACKEND_DL=ON" >&2
    cmake -S "$dest/src" -B "$dest/build-dl" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
    cmake --build "$dest/build-dl" -j "$(nproc)" --target llama-simple ggml-cpu >&2
    touch "$dest/build-dl/.complete"
  fi
  echo "$dest/build-dl"
  exit 0
fi

if [ "${1:-}" = threadpool ]; then
  shared="$(bash "$0" | tail -n 1)"
  dest="$(dirname "$shared")"
  if [ ! -f "$dest/build-threadpool/.complete" ]; then
    echo "setup-llama: building libggml-cpu with GGML_OPENMP=OFF" >&2
    cmake -S "$dest/src" -B "$dest/build-threadpool" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
    cmake --build "$dest/build-threadpool" -j "$(nproc)" --target ggml-cpu >&2
    touch "$dest/build-threadpool/.complete"
  fi
  echo "$dest/build-threadpool"
  exit 0
fi

if [ "${1:-}" = static ]; then
  shared="$(bash "$0" | tail -n 1)"   # the source comes with the shared build
  dest="$(dirname "$shared")"
  if [ ! -f "$dest/build-static/.complete" ]; then
    echo "setup-llama: building llama-simple with ggml linked in statically" >&2
    cmake -S "$dest/src" -B "$dest/build-static" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
    cmake --build "$dest/build-static" -j "$(nproc)" --target llama-simple >&2
    touch "$dest/build-static/.complete"
  fi
  echo "$dest/build-static"
  exit 0
fi

LLAMA_PY_VERSION="${LLAMA_PY_VERSION:-0.3.36}"
cache_root="${GGML_VIZ_CACHE:-$HOME/.cache/ggml-viz}"
key="llama-cpp-python-${LLAMA_PY_VERSION}"
dest="$cache_root/$key"

# The build happens in place (CMake bakes absolute rpaths into the binaries); .complete marks success.
if [ -f "$dest/build/.complete" ]; then
  for t in "${targets[@]}"; do
    if [ ! -x "$dest/build/bin/$t" ]; then
      echo "setup-llama: building $t" >&2
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
cmake -S "$dest/src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$dest/build" -j "$(nproc)" --target "${targets[@]}" >&2

touch "$dest/build/.complete"
echo "$dest/build"
