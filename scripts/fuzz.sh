#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo fuzz, libFuzzer + AddressSanitizer, nightly) of the GGMLVIZ decoder
# with layout detection, the push decoder behind the stream and follow readers, the text
# importers (CoMMA, TelemetryEvent v2, GE logs), and the ggml-rpc analysis of a trace pair. Each
# target runs FUZZ_SECONDS (default 60) from a
# corpus seeded with the sample files and the tests' own inputs; any crash fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain on this machine: fuzzing skipped" >&2
  exit 0
fi
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked

samples=../shared/samples
corpus=fuzz/corpus
mkdir -p "$corpus/decode" "$corpus/follow" "$corpus/importers" "$corpus/rpc"
cp "$samples"/ggml-viz/*.ggmlviz "$corpus/decode/"
cargo run -q --release -p ggml-viz-examples --example synthesize -- "$corpus/decode/synthetic.ggmlviz" 200
for f in "$corpus"/decode/*; do printf '\007' | cat - "$f" > "$corpus/follow/$(basename "$f")"; done
cp "$samples"/ada-pa/*.log "$samples"/gpumemprof/*.json reader/tests/data/*.jsonl "$corpus/importers/"
# A ggml-rpc client/server pair as one input: the client trace's length (4 bytes, little-endian),
# then both traces.
pair="$(mktemp -d)"
for extra in "" --unanswered; do
  cargo run -q --release -p ggml-viz-examples --example synthesize_rpc -- "$pair/c" "$pair/s" 3 $extra >/dev/null
  python3 -c 'import struct, sys; c, s = (open(p, "rb").read() for p in sys.argv[1:3]); open(sys.argv[3], "wb").write(struct.pack("<I", len(c)) + c + s)' \
    "$pair/c" "$pair/s" "$corpus/rpc/pair$extra"
done
rm -rf "$pair"

for target in decode follow importers rpc; do
  log="$(mktemp)"
  if ! cargo +nightly fuzz run "$target" "$corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target crashed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  echo "fuzz: $target: $(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1), no crash"
done
