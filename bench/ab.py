#!/usr/bin/env python3
"""Two or more builds of the hook against each other, on the finest wall-clock measure this VM
allows: threads op timing with one graph compute in two timed (`GGML_VIZ_OP_SAMPLE=2`), each
timed graph compute over its untimed neighbours, milliseconds apart (what bench/run.py's
fidelity section calls "within runs"). The builds' runs are interleaved (in turn, the order
reversed every other round), so that the VM's drift over minutes falls on all of them alike.

    python3 bench/ab.py OLD.so NEW.so                 # llama-bench -t 2 -n 32, 512x8 model, 40 rounds
    python3 bench/ab.py --threads 1 --rounds 60 A.so B.so
    python3 bench/ab.py --model 64x32 A.so B.so        # 64 wide x 32 layers: 560 nodes a graph

Each build's line: the median ratio with its bootstrap 95 % interval, over 30 pairs a run.
Build an older hook with `git worktree add /tmp/old REV && cd /tmp/old &&
CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p ggml-viz-hook`.
"""
import argparse
import os
import random
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hooks", nargs="+", help="libggml_viz_hook.so of each build")
    p.add_argument("--threads", default="2")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--model", choices=bench.MODELS, default="512x8")
    args = p.parse_args()
    os.chdir(bench.ROOT)
    build = bench.run(["bash", "scripts/setup-llama.sh"]).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        model = bench.model_file(tmp, args.model)
        trace = os.path.join(tmp, "ab.ggmlviz")
        within = {h: [] for h in args.hooks}
        for r in range(args.rounds):
            bench.progress(f"round {r + 1} of {args.rounds}")
            for hook in args.hooks if r % 2 == 0 else args.hooks[::-1]:
                env = {"LD_PRELOAD": os.path.abspath(hook), "GGML_VIZ_OP_TIMING": "threads",
                       "GGML_VIZ_OP_SAMPLE": "2", "GGML_VIZ_OUTPUT": trace}
                bench.run([f"{build}/bin/llama-bench", "-m", model, "-t", args.threads, "-p", "0", "-n", "32",
                           "-r", "1"], env=env)
                spans = bench.graph_computes(trace)
                within[hook] += bench.neighbour_ratios(spans, lambda i: spans[i][1] > 0)
    rng = random.Random(1)
    print(f"llama-bench -t {args.threads} -n 32, {args.model} model: timed / untimed neighbour graph compute")
    for hook in args.hooks:
        lo, hi = bench.median_interval(within[hook], rng)
        print(f"  {hook}: x{statistics.median(within[hook]):.4f} ({lo:.4f}-{hi:.4f}), {len(within[hook])} pairs")


if __name__ == "__main__":
    main()
