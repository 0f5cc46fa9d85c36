#!/usr/bin/env bash
# Windows under Wine, for the hook's Windows test: llama-simple.exe and ggml's DLLs built with
# MinGW from the llama.cpp source setup-llama.sh fetched, and a Wine prefix that runs Rust
# programs. Cached beside the Linux build. Prints the Windows build's bin directory, then the
# Wine prefix. (Recipe measured in ../shared/notes/windows-under-wine.md.)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v wine >/dev/null || missing+=(wine wine64)
command -v x86_64-w64-mingw32-g++-posix >/dev/null || missing+=(g++-mingw-w64-x86-64)
command -v x86_64-w64-mingw32-gcc >/dev/null || missing+=(gcc-mingw-w64-x86-64)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-windows: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
fi

shared="$(bash scripts/setup-llama.sh | tail -n 1)"
dest="$(dirname "$shared")"
out="$dest/build-windows"
prefix="$dest/wine-prefix"
fixtures="$PWD/tests/fixtures/wine"

if [ ! -f "$out/.complete" ]; then
  echo "setup-windows: building llama-simple.exe with MinGW (~1.5 minutes on 2 cores)" >&2
  rm -rf "$out"
  # The -posix compilers: the default MinGW g++ (win32 threads) has no std::mutex.
  cmake -S "$dest/src" -B "$out" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_SYSTEM_NAME=Windows -DCMAKE_SYSTEM_PROCESSOR=x86_64 \
    -DCMAKE_C_COMPILER=x86_64-w64-mingw32-gcc-posix -DCMAKE_CXX_COMPILER=x86_64-w64-mingw32-g++-posix \
    -DCMAKE_RC_COMPILER=x86_64-w64-mingw32-windres -DCMAKE_FIND_ROOT_PATH=/usr/x86_64-w64-mingw32 \
    -DCMAKE_C_FLAGS="-include $fixtures/mingw-compat.h" \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
  cmake --build "$out" -j "$(nproc)" --target llama-simple >&2
  cp /usr/lib/gcc/x86_64-w64-mingw32/12-posix/libstdc++-6.dll \
     /usr/lib/gcc/x86_64-w64-mingw32/12-posix/libgcc_s_seh-1.dll \
     /usr/x86_64-w64-mingw32/lib/libwinpthread-1.dll "$out/bin/"
  touch "$out/.complete"
fi

if [ ! -f "$prefix/.complete" ]; then
  echo "setup-windows: making a Wine prefix" >&2
  rm -rf "$prefix"
  WINEPREFIX="$prefix" WINEDEBUG=-all wineboot -i >&2 2>&1 || true
  x86_64-w64-mingw32-gcc -shared -O2 -o "$prefix/drive_c/windows/system32/bcryptprimitives.dll" \
    "$fixtures/processprng.c" -ladvapi32
  WINEPREFIX="$prefix" wineserver -w
  touch "$prefix/.complete"
fi

echo "$out/bin"
echo "$prefix"
