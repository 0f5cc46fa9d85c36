#!/usr/bin/env bash
# CUDA 13.0's CUPTI headers and library without a GPU or a toolkit: NVIDIA's wheels
# nvidia-cuda-cupti (the headers, libcupti.so.13), nvidia-cuda-runtime (cuda.h, which CUPTI's
# headers include) and nvidia-cuda-crt (crt/host_defines.h), ~13 MB, fetched with pip and
# unpacked into one folder, cached outside the clone by version. Prints the folder
# (include/, lib/) on its last line. The tests compile CUPTI's headers to check the offsets the
# hook reads records at, and load the library; scripts/gpu-check.sh carries it to a GPU machine.
set -euo pipefail
version="13.0"
cache_root="${GGML_VIZ_CACHE:-$HOME/.cache/ggml-viz}"
dest="$cache_root/cuda-$version-wheels"
if [ ! -f "$dest/done" ]; then
  mkdir -p "$cache_root"
  work="$(mktemp -d "$cache_root/.cuda-wheels-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "setup-cuda-wheels: fetching CUDA $version's CUPTI, runtime and crt wheels" >&2
  python3 -m pip download -q --no-deps -d "$work/wheels" \
    "nvidia-cuda-cupti==$version.*" "nvidia-cuda-runtime==$version.*" "nvidia-cuda-crt==$version.*"
  mkdir -p "$work/unpacked"
  for w in "$work"/wheels/*.whl; do
    python3 -m zipfile -e "$w" "$work/unpacked"
  done
  rm -rf "$dest"
  mv "$work/unpacked" "$dest"
  touch "$dest/done"
fi
echo "$dest/nvidia/cu13"
