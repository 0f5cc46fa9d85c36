#!/usr/bin/env python3
"""Two or more builds of the hook against each other, on the finest wall-clock measure this VM
allows: threads op timing with one graph compute in two timed (`GGML_VIZ_OP_SAMPLE=2`), each
timed graph compute over its untimed neighbours, milliseconds apart (what bench/run.py's
fidelity section calls "within runs"). The builds' runs are interleaved (in turn, the order
reversed every other round), so that the VM's drift over minutes falls on all of them alike.

    python3 bench/ab.py OLD.so NEW.so                 # llama-bench -t 2 -n 32, 512x8 model, 40 rounds
    python3 bench/ab.py --threads 1 --rounds 60 A.so B.so
    python3 bench/ab.py --model 64x32 A.so B.so        # 64 wide x 32 layers: 560 nodes a graph
    python3 bench/ab.py --over-off --rounds 300 A.so target/floor/release/libggml_viz_hook.so

Each build's line: the median ratio with its bootstrap 95 % interval, over 30 pairs a run.
--over-off measures instead what issue 51's wall target names: each build with every graph
compute timed over op timing off (the first build's), each round's median graph compute over the
same round's off run, the runs of a round in a shuffled order; a round's spread on this VM is
x0.88-1.32, so a few hundred rounds (about a second each) are needed. A build with `--cfg
ggml_viz_floor` (bench/shares.py --floor) writes no node records: only this form measures it.
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
    p.add_argument("--over-off", action="store_true",
                   help="every graph timed over op timing off, paired by round (issue 51's wall target)")
    args = p.parse_args()
    os.chdir(bench.ROOT)
    build = bench.run(["bash", "scripts/setup-llama.sh"]).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        model = bench.model_file(tmp, args.model)
        trace = os.path.join(tmp, "ab.ggmlviz")

        def graph_computes(hook, mode, sample):
            """One run's graph computes (bench.graph_computes) with `hook`, op timing `mode`, one
            graph in `sample` timed."""
            env = {"LD_PRELOAD": os.path.abspath(hook), "GGML_VIZ_OP_TIMING": mode,
                   "GGML_VIZ_OP_SAMPLE": str(sample), "GGML_VIZ_OUTPUT": trace}
            bench.run([f"{build}/bin/llama-bench", "-m", model, "-t", args.threads, "-p", "0", "-n", "32",
                       "-r", "1"], env=env)
            return bench.graph_computes(trace)

        if args.over_off:
            over_off(args, graph_computes)
            return
        within = {h: [] for h in args.hooks}
        for r in range(args.rounds):
            bench.progress(f"round {r + 1} of {args.rounds}")
            for hook in args.hooks if r % 2 == 0 else args.hooks[::-1]:
                spans = graph_computes(hook, "threads", 2)
                within[hook] += bench.neighbour_ratios(spans, lambda i: spans[i][1] > 0)
    rng = random.Random(1)
    print(f"llama-bench -t {args.threads} -n 32, {args.model} model: timed / untimed neighbour graph compute")
    for hook in args.hooks:
        lo, hi = bench.median_interval(within[hook], rng)
        print(f"  {hook}: x{statistics.median(within[hook]):.4f} ({lo:.4f}-{hi:.4f}), {len(within[hook])} pairs")


def over_off(args, graph_computes):
    """--over-off: each build's median graph compute over op timing off's, round by round."""
    runs = [(hook, "threads") for hook in args.hooks] + [(args.hooks[0], "off")]
    ratios = {hook: [] for hook in args.hooks}
    shuffle = random.Random(0)
    for r in range(args.rounds):
        bench.progress(f"round {r + 1} of {args.rounds}")
        order = shuffle.sample(runs, len(runs))
        medians = {run: statistics.median(d for d, _ in graph_computes(*run, 1)) for run in order}
        for hook in args.hooks:
            ratios[hook].append(medians[(hook, "threads")] / medians[(args.hooks[0], "off")])
    rng = random.Random(1)
    print(f"llama-bench -t {args.threads} -n 32, {args.model} model: median graph compute, every graph "
          f"timed / op timing off, paired by round")
    for hook in args.hooks:
        lo, hi = bench.median_interval(ratios[hook], rng)
        print(f"  {hook}: x{statistics.median(ratios[hook]):.4f} ({lo:.4f}-{hi:.4f}), {args.rounds} rounds")


if __name__ == "__main__":
    main()
