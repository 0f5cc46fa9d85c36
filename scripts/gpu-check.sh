#!/usr/bin/env bash
# The live CUDA check, run on the GPU machine in one call of the device tool (nothing there can
# be fetched; 10 minutes a call, 15 in all: no full rerun). Here first: `bash scripts/gpu-carry.sh`
# (prepares .gpu/). Then the device tool's run with carry [".gpu"], timeout_s 590, command
# `bash scripts/gpu-check.sh`. Fails soft: every step prints its figures, a failure does not stop
# the rest, and each program run is cut at 2 minutes. What comes back ($OUT, at most 8 files): the CUPTI captures, gzipped (the fixtures the
# attribution is worked out and tested on), a trace, and summary.txt.
#
# 1. llama.cpp built with CUDA for sm_90 (llama-bench, llama-simple, llama-quantize; ~5 min on 16
#    cores), while the models are generated: a small one (256 wide x 2 layers: small fixtures) and
#    the issue's large one (2048 x 16, F32).
# 2. Captures on the small model, F32 and Q4_0, with GGML_CUDA_GRAPH_OPT=1 too: llama-simple
#    -ngl 99 -n 16 hooked (op timing off: CUDA graphs stay on) and unhooked print the same text.
# 3. Speed on the large model: llama-bench -ngl 99 -p 0 -n 64 -r 3, unhooked, hooked (graphs
#    only) and hooked with the capture: what CUPTI's tracing costs.
# 4. The Vulkan layer on NVIDIA's Vulkan driver (the tests' Vulkan build of llama-simple, carried):
#    output compared, the trace's node counts beside GGML_VK_PERF_LOGGER's, tokens/s with and
#    without the layer (real overlap, real calibration: lavapipe in CI has neither).
set -u
OUT="${OUT:-/tmp/gpu-check-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
G="$PWD/.gpu"
B=/tmp/llama-cuda
M=/tmp/models
HOOK="$G/lib/libggml_viz_hook.so"
mkdir -p "$M"
step() { echo "== $1 (at ${SECONDS} s)"; }

step "machine"
nvidia-smi -L || true
nvcc --version | tail -n 2 || true
cupti="$(find /usr/local /opt /usr/lib -name 'libcupti.so.13' 2>/dev/null | head -n 1)"
echo "libcupti: ${cupti:-none found}"
[ -n "$cupti" ] && export LD_LIBRARY_PATH="$(dirname "$cupti"):${LD_LIBRARY_PATH:-}"

step "models (in the background) and the build"
(
  export PYTHONPATH="$G/llama/gguf-py"
  python3 tests/fixtures/make_tiny_llama.py "$M/small.gguf" --n-embd 256 --n-layer 2 &&
    python3 tests/fixtures/make_tiny_llama.py "$M/large.gguf" ${GPU_CHECK_LARGE:---n-embd 2048 --n-layer 16}
) > /tmp/models.log 2>&1 &
models=$!
if [ -z "${GPU_CHECK_BUILD:-}" ]; then
  cmake -S "$G/llama" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF > /tmp/build.log 2>&1 &&
    cmake --build "$B" -j 16 --target llama-bench llama-simple llama-quantize >> /tmp/build.log 2>&1 ||
    { echo "build failed:"; tail -n 40 /tmp/build.log; }
else
  B="$GPU_CHECK_BUILD"   # a build made beforehand (a dry run of this script off the GPU machine)
fi
bin="$B/bin"
wait "$models" || { echo "model generation failed:"; tail -n 20 /tmp/models.log; }
ls -la "$M" "$bin"/llama-simple "$bin"/llama-bench 2>&1 | tail -n 6
timeout 60 "$bin/llama-quantize" "$M/small.gguf" "$M/small-q4_0.gguf" Q4_0 > /tmp/quantize.log 2>&1 ||
  { echo "quantize failed:"; tail -n 5 /tmp/quantize.log; }

# capture NAME MODEL [ENV...]: llama-simple unhooked and hooked with the capture; same text?
capture() {
  local name="$1" model="$2"
  shift 2
  step "capture $name"
  timeout 120 env "$@" "$bin/llama-simple" -m "$model" -ngl 99 -n 16 "Hello" > "/tmp/$name.plain" 2> "/tmp/$name.plain.err"
  timeout 120 env "$@" LD_PRELOAD="$HOOK" GGML_VIZ_OP_TIMING=off GGML_VIZ_OUTPUT="/tmp/$name.ggmlviz" \
    GGML_VIZ_CUPTI_CAPTURE="/tmp/$name.jsonl" \
    "$bin/llama-simple" -m "$model" -ngl 99 -n 16 "Hello" > "/tmp/$name.hooked" 2> "/tmp/$name.hooked.err"
  echo "exit status hooked: $?"
  grep "^ggml-viz:" "/tmp/$name.hooked.err" | head -n 5
  if cmp -s "/tmp/$name.plain" "/tmp/$name.hooked" && [ -s "/tmp/$name.plain" ]; then
    echo "output identical ($(wc -c < "/tmp/$name.plain") bytes)"
  else
    echo "OUTPUT DIFFERS or is empty:"; head -c 300 "/tmp/$name.plain"; echo; head -c 300 "/tmp/$name.hooked"; echo
    tail -n 5 "/tmp/$name.plain.err"
  fi
  python3 scripts/cupti_summary.py "/tmp/$name.jsonl"
  gzip -c "/tmp/$name.jsonl" > "$OUT/$name.jsonl.gz" 2>/dev/null && ls -la "$OUT/$name.jsonl.gz"
}
capture f32 "$M/small.gguf"
cp /tmp/f32.ggmlviz "$OUT/f32.ggmlviz" 2>/dev/null
capture q4_0 "$M/small-q4_0.gguf"
capture graph-opt "$M/small.gguf" GGML_CUDA_GRAPH_OPT=1

step "speed: llama-bench -ngl 99 -p 0 -n 64 -r 3 on the large model"
bench() {
  local name="$1"
  shift
  timeout 120 env "$@" "$bin/llama-bench" -m "$M/large.gguf" -ngl 99 -p 0 -n 64 -r 3 -o csv 2> "/tmp/bench-$name.err" |
    python3 -c 'import csv,sys; r=list(csv.DictReader(sys.stdin)); print(sys.argv[1], [(x.get("avg_ts"), x.get("stddev_ts")) for x in r])' "$name" ||
    { echo "bench $name failed:"; tail -n 5 "/tmp/bench-$name.err"; }
}
for round in 1 2; do
  bench plain
  bench hooked LD_PRELOAD="$HOOK" GGML_VIZ_OP_TIMING=off GGML_VIZ_OUTPUT=/tmp/bench.ggmlviz
  bench capture LD_PRELOAD="$HOOK" GGML_VIZ_OP_TIMING=off GGML_VIZ_OUTPUT=/tmp/bench.ggmlviz \
    GGML_VIZ_CUPTI_CAPTURE=/tmp/bench.jsonl
done
python3 scripts/cupti_summary.py /tmp/bench.jsonl

step "Vulkan on the NVIDIA driver: the layer's node times (llama-simple -ngl 99 -n 16, small model)"
mkdir -p /tmp/vk/loader
tar -xJf "$G/vulkan-bin.tar.xz" -C /tmp/vk && dpkg -x "$G"/libvulkan1_*.deb /tmp/vk/loader ||
  echo "unpacking the Vulkan build failed"
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
vk_env=(LD_LIBRARY_PATH="/tmp/vk:/tmp/vk/loader/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}" GGML_VK_VISIBLE_DEVICES=0)
vk_simple=(/tmp/vk/llama-simple -m "$M/small.gguf" -ngl 99 -n 16 "Hello")
timeout 120 env "${vk_env[@]}" "${vk_simple[@]}" > /tmp/vk.plain 2> /tmp/vk.plain.err
grep -m 3 -i "ggml_vulkan: \|device" /tmp/vk.plain.err
timeout 120 env "${vk_env[@]}" GGML_VK_PERF_LOGGER=1 "${vk_simple[@]}" > /dev/null 2> "$OUT/vk-perf-logger.txt"
timeout 120 env "${vk_env[@]}" "$G/lib/ggml-viz" record -o "$OUT/vulkan.ggmlviz" -- "${vk_simple[@]}" > /tmp/vk.hooked 2> /tmp/vk.hooked.err
grep "^ggml-viz" /tmp/vk.hooked.err | head -n 8
if cmp -s /tmp/vk.plain /tmp/vk.hooked && [ -s /tmp/vk.plain ]; then echo "Vulkan output identical"
else echo "VULKAN OUTPUT DIFFERS or is empty"; tail -n 5 /tmp/vk.plain.err; fi
"$G/lib/ggml-viz" info "$OUT/vulkan.ggmlviz" 2>&1 | head -n 30
"$G/lib/ggml-viz" ops --by backend "$OUT/vulkan.ggmlviz" 2>&1 | head -n 30
echo "GGML_VK_PERF_LOGGER lines: $(grep -c . "$OUT/vk-perf-logger.txt")"
for round in 1 2 3; do
  for how in plain layer; do
    if [ "$how" = plain ]; then timeout 120 env "${vk_env[@]}" "${vk_simple[@]}" > /dev/null 2> /tmp/vk.t
    else timeout 120 env "${vk_env[@]}" "$G/lib/ggml-viz" record -o /tmp/vk-speed.ggmlviz -- "${vk_simple[@]}" > /dev/null 2> /tmp/vk.t; fi
    echo "vulkan $how round $round: $(grep -o 'speed: [0-9.]* t/s' /tmp/vk.t)"
  done
done
step "done"
