#!/usr/bin/env bash
# What op timing costs: llama-bench -t 1 token generation on a 512-wide x 8-layer random model,
# without the hook, graph-only (GGML_VIZ_OP_TIMING=off), threads op timing, sched op timing, and
# sched op timing on 1 graph in 10 — interleaved in rotating order, medians. Also the per-op cost and the share of
# graph time the timed ops account for. Prints one table.
#   bash bench/op_timing.sh            ROUNDS=6 N_GEN=64 to change the amount of work
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-6}"
n_gen="${N_GEN:-64}"

python3 -c "import gguf" 2>/dev/null || python3 -m pip install -q gguf
build="$(bash scripts/setup-llama.sh | tail -n 1)"
cargo build --release -q -p ggml-viz-hook -p ggml-viz
hook="$PWD/target/release/libggml_viz_hook.so"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
model="$tmp/m512x8.gguf"
python3 tests/fixtures/make_tiny_llama.py "$model" --n-embd 512 --n-layer 8

modes=(plain graph threads ops sample10)
tokens_per_s() { # $1: mode
  local pre=(env)
  case "$1" in
    graph) pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/b.ggmlviz" GGML_VIZ_OP_TIMING=off) ;;
    threads) pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/b.ggmlviz" GGML_VIZ_OP_TIMING=threads) ;;
    ops) pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/b.ggmlviz" GGML_VIZ_OP_TIMING=sched) ;;
    sample10) pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/b.ggmlviz" GGML_VIZ_OP_TIMING=sched GGML_VIZ_OP_SAMPLE=10) ;;
  esac
  "${pre[@]}" "$build/bin/llama-bench" -m "$model" -t 1 -p 0 -n "$n_gen" -r 2 -o csv 2>/dev/null \
    | tail -n 1 | awk -F'","' '{ gsub(/"/, "", $(NF-1)); print $(NF-1) }'
}
declare -A results
for ((i = 0; i < rounds; i++)); do
  for ((k = 0; k < ${#modes[@]}; k++)); do
    mode="${modes[$(((i + k) % ${#modes[@]}))]}"
    results[$mode]+="$(tokens_per_s "$mode") "
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# Ops per generated token and the ops' share of graph time, from one traced run.
LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/ops.ggmlviz" GGML_VIZ_OP_TIMING=sched \
  "$build/bin/llama-simple" -m "$model" -n 16 "hello world" >/dev/null 2>&1
report="$(./target/release/ggml-viz ops "$tmp/ops.ggmlviz")"
graphs="$(./target/release/ggml-viz info "$tmp/ops.ggmlviz" | awk '/^graph computes:/ { print $3 }')"
ops="$(./target/release/ggml-viz info "$tmp/ops.ggmlviz" | awk '/^ops:/ { print $2 }')"

base="$(median "${results[plain]}")"
printf '%-44s %12s %9s\n' "llama-bench -t 1 tg$n_gen, 512x8 model" "tokens/s" "ratio"
for mode in plain graph threads ops sample10; do
  m="$(median "${results[$mode]}")"
  printf '%-44s %12.2f %9.4f\n' "$mode (median of $rounds)" "$m" "$(echo "$m / $base" | bc -l)"
done
per_token_ops="$(echo "$ops / $graphs" | bc -l)"
g="$(median "${results[graph]}")"; o="$(median "${results[ops]}")"
printf 'ops per graph compute: %.0f; sched op timing costs %.1f µs per op (vs graph-only)\n' \
  "$per_token_ops" "$(echo "(1 / $o - 1 / $g) * 1000000 / $per_token_ops" | bc -l)"
echo "$report" | sed -n 2p
for mode in plain graph threads ops sample10; do echo "tokens/s, each round, $mode: ${results[$mode]}"; done
