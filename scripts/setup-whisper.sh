#!/usr/bin/env bash
# Builds whisper.cpp's command-line program (whisper-cli) from the pywhispercpp sdist (its package index): a
# second GGML program, not llama.cpp, with its own vendored ggml (0.13.1 in pywhispercpp 1.5.1).
# Built the way the package builds it (shared libwhisper and libggml, OpenMP), without SDL,
# tests or server. Prints the build directory (bin/whisper-cli, src/libwhisper.so,
# ggml/src/libggml*.so) on its last line; cached outside the clone, keyed by version, so a
# second run returns at once. ~2.5 minutes on 2 cores.
set -euo pipefail

VERSION=1.5.1
# The sdist's digest; it is fetched through pip's configured index (scripts/fetch-sdist.py:
# `pip download` cannot, as building this sdist's metadata fails).
SHA256=5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5

cache_root="${GGML_VIZ_CACHE:-$HOME/.cache/ggml-viz}"
dest="$cache_root/pywhispercpp-$VERSION"
if [ -f "$dest/build/.complete" ]; then
  echo "$dest/build"
  exit 0
fi
command -v cmake >/dev/null && command -v g++ >/dev/null || {
  echo "setup-whisper: installing cmake g++" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq cmake g++ >&2
}

mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "setup-whisper: downloading pywhispercpp==$VERSION sdist" >&2
python3 "$(dirname "$0")/fetch-sdist.py" pywhispercpp "$VERSION" "$SHA256" "$work/sdist.tar.gz" >&2
tar -xzf "$work/sdist.tar.gz" -C "$work"

echo "setup-whisper: building whisper-cli (a few minutes on 2 cores)" >&2
rm -rf "$dest"
mkdir -p "$dest"
mv "$work/pywhispercpp-$VERSION/whisper.cpp" "$dest/src"
cmake -S "$dest/src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_SERVER=OFF -DWHISPER_SDL2=OFF >&2
cmake --build "$dest/build" -j "$(nproc)" --target whisper-cli >&2
touch "$dest/build/.complete"
echo "$dest/build"
