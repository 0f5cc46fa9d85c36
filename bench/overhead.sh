#!/usr/bin/env bash
# What the graph-level hook costs a real program (op timing off: bench/op_timing.sh measures that):
# llama-bench -t 1 token generation with and without the hook,
# interleaved in rotating order (medians), and instructions executed by llama-simple under
# callgrind (repeatable where wall-clock time is not). Prints one table.
#   bash bench/overhead.sh            ROUNDS=10 N_GEN=256 to change the amount of work
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-10}"
n_gen="${N_GEN:-256}"

python3 -c "import gguf" 2>/dev/null || python3 -m pip install -q gguf
build="$(bash scripts/setup-llama.sh | tail -n 1)"
cargo build --release -q -p ggml-viz-hook
hook="$PWD/target/release/libggml_viz_hook.so"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
model="$tmp/tiny.gguf"
python3 tests/fixtures/make_tiny_llama.py "$model"
command -v valgrind >/dev/null || { apt-get install -y -qq valgrind >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq valgrind; }; }

tokens_per_s() { # $1: plain|hooked
  local pre=()
  [ "$1" = hooked ] && pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/bench-%p.ggmlviz" GGML_VIZ_OP_TIMING=0)
  "${pre[@]}" "$build/bin/llama-bench" -m "$model" -t 1 -p 0 -n "$n_gen" -r 3 -o csv 2>/dev/null \
    | tail -n 1 | awk -F'","' '{ gsub(/"/, "", $(NF-1)); print $(NF-1) }'
}

plain=(); hooked=()
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then
    plain+=("$(tokens_per_s plain)"); hooked+=("$(tokens_per_s hooked)")
  else
    hooked+=("$(tokens_per_s hooked)"); plain+=("$(tokens_per_s plain)")
  fi
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
mp="$(median "${plain[@]}")"; mh="$(median "${hooked[@]}")"

instructions() { # $1: plain|hooked, $2: tokens to generate
  local pre=()
  [ "$1" = hooked ] && pre=(env LD_PRELOAD="$hook" GGML_VIZ_OUTPUT="$tmp/cg-%p.ggmlviz" GGML_VIZ_OP_TIMING=0)
  "${pre[@]}" valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" \
    "$build/bin/llama-simple" -m "$model" -n "$2" "hello world" >/dev/null 2>&1
  awk '/^totals:|^summary:/ { print $2; exit }' "$tmp/cg.out"
}
ip1="$(instructions plain 16)"; ih1="$(instructions hooked 16)"; ip2="$(instructions plain 16)"; ih2="$(instructions hooked 16)"
ip3="$(instructions plain 128)"; ih3="$(instructions hooked 128)"

printf '%-52s %16s %16s %9s\n' "measure" "without hook" "with hook" "ratio"
printf '%-52s %16.1f %16.1f %9.4f\n' "llama-bench -t 1 tg$n_gen tokens/s (median of $rounds)" "$mp" "$mh" "$(echo "$mh / $mp" | bc -l)"
printf '%-52s %16d %16d %9.6f\n' "llama-simple -n 16 instructions (callgrind, run 1)" "$ip1" "$ih1" "$(echo "$ih1 / $ip1" | bc -l)"
printf '%-52s %16d %16d %9.6f\n' "llama-simple -n 16 instructions (callgrind, run 2)" "$ip2" "$ih2" "$(echo "$ih2 / $ip2" | bc -l)"
printf '%-52s %16d %16d %9.6f\n' "llama-simple -n 128 instructions (callgrind)" "$ip3" "$ih3" "$(echo "$ih3 / $ip3" | bc -l)"
echo "tokens/s, each round: without: ${plain[*]}"
echo "tokens/s, each round: with:    ${hooked[*]}"
