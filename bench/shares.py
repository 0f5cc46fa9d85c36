#!/usr/bin/env python3
"""Where a node share's instructions go, function by function: callgrind of a line-table build of
the hook (target/prof), op timing threads against off, the difference per share. Each function's
count is its own instructions with everything inlined into it (callgrind charges by symbol), so
the rows add up to the hook's whole cost; bench/run.py's "of which the hook's own functions" rows
count less (only the lines whose file is the function's own).

    python3 bench/shares.py                  # llama-bench -t 1, tiny model: (-n 80) - (-n 16)
    python3 bench/shares.py --model 64x32
    python3 bench/shares.py --add-chain      # the ctypes ADD chain at 2 threads, per node
    python3 bench/shares.py --off            # op timing off over no hook, a token's marginal cost
    python3 bench/shares.py --floor          # a share against a build that records none (below)
    python3 bench/shares.py --add-chain --floor
    python3 bench/shares.py --hook OTHER.so  # a build of your own (with line tables)

The first form is a token's marginal cost once every node has been seen (first sights left out);
the ADD chain's, per node (two shares and two barrier waits), 100 nodes x 50 computes; --off's,
what op timing off (graph times, spans, waits, the wrappers' pass-through) costs a token. About a
minute each on 2 cores (the four or two callgrind runs go two at a time).

--floor puts beside the first form or --add-chain the same runs with a hook built with
`--cfg ggml_viz_floor` (target/floor): every call reaches the hook as it does, each share is taken,
its compute params read, the share opened and its begin's clock read, each barrier wait's end read,
but nothing is described, stored or written. That is what a share costs before anything is
recorded (the trampoline's three calls a node, the call into Rust at the marker); the table below
it is what recording adds, function by function (recorded threads minus the floor's).
"""
import argparse
import collections
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402

# The two runs whose difference is a token's marginal cost (llama-bench -n).
TOKENS = (16, 80)

PROF_BUILD = [
    "cargo", "build", "--release", "-p", "ggml-viz-hook",
    "--config", 'profile.release.package.ggml-viz-hook.debug="line-tables-only"',
    "--config", 'profile.release.package.ggml-viz-hook.strip="none"',
]


def prof_hook(target, rustflags=None):
    """The hook built with line tables into `target`, with `rustflags` if given: its path."""
    env = {"CARGO_TARGET_DIR": target}
    if rustflags:
        env["RUSTFLAGS"] = rustflags
    bench.progress(f"building the hook with line tables ({target})")
    bench.run(PROF_BUILD, env=env)
    return os.path.join(bench.ROOT, target, "release/libggml_viz_hook.so")


def self_counts(path):
    """Instructions by (object, function) in a callgrind output, each function's own with what was
    inlined into it (the inclusive lines after `calls=` left out); an object by its file name, so
    that two builds of the hook in two folders count as one."""
    names = {"ob": {}, "fn": {}}
    cost = collections.Counter()
    ob = fn = None
    skip = False
    for line in open(path):
        if skip:
            skip = False
            continue
        m = re.match(r"(c?)(ob|fn)=(?:\((\d+)\))? ?(.*)", line.rstrip("\n"))
        if m:
            called, kind, ident, name = m.groups()
            table = names[kind]
            if ident is not None and name:
                table[ident] = name
            name = table.get(ident, "?") if ident is not None else name
            if not called:
                ob, fn = (name, fn) if kind == "ob" else (ob, name)
            continue
        if line.startswith("calls="):
            skip = True
            continue
        fields = line.split()
        if len(fields) >= 2 and re.fullmatch(r"[+\-*]?(0x)?[\da-f]*", fields[0]) and fields[-1].isdigit():
            cost[(ob and os.path.basename(ob), fn)] += int(fields[-1])
    return cost


def callgrind(out, cmd, env):
    bench.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd], env=env)
    return self_counts(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=bench.MODELS, default="tiny")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--add-chain", action="store_true", help="the ctypes ADD chain at 2 threads, per node")
    which.add_argument("--off", action="store_true", help="op timing off over no hook, a token's marginal cost")
    p.add_argument("--floor", action="store_true",
                   help="beside threads, a build that records no share or wait (--cfg ggml_viz_floor)")
    p.add_argument("--hook", help="a hook built with line tables (default: this tree's, built into target/prof)")
    p.add_argument("--rows", type=int, default=14)
    args = p.parse_args()
    if args.floor and args.off:
        p.error("--floor measures threads against a build that records nothing; --off has no threads")
    os.chdir(bench.ROOT)
    hook = args.hook or prof_hook("target/prof")
    floor_hook = prof_hook("target/floor", "--cfg ggml_viz_floor") if args.floor else None
    build = bench.run(["bash", "scripts/setup-llama.sh"]).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        def env(mode, name):
            if mode == "none":
                return {}
            # The floor is the floor build timing threads.
            preload, timing = (floor_hook, "threads") if mode == "floor" else (hook, mode)
            return {"LD_PRELOAD": preload, "GGML_VIZ_OP_TIMING": timing,
                    "GGML_VIZ_OUTPUT": os.path.join(tmp, f"{name}.ggmlviz")}

        modes = ("off", "none") if args.off else ("threads", "off", "floor") if args.floor else ("threads", "off")
        if args.add_chain:
            per, what = 5000, "a node of the ADD chain (2 threads: two shares, two waits)"
            cmd = [sys.executable, "tests/fixtures/ggml_ctypes.py", f"{build}/bin", "--nodes", "100",
                   "--repeat", "50", "--threads", "2"]
            runs = {mode: (cmd, mode) for mode in modes}
        else:
            model = bench.model_file(tmp, args.model)
            runs = {f"{mode}{n}": ([f"{build}/bin/llama-bench", "-m", model, "-t", "1", "-p", "0", "-n", str(n),
                                    "-r", "1"], mode)
                    for mode in modes for n in TOKENS}
        bench.progress(f"callgrind: {len(runs)} runs, two at a time")
        with ThreadPoolExecutor(2) as pool:
            counts = dict(zip(runs, pool.map(
                lambda item: callgrind(os.path.join(tmp, f"{item[0]}.out"), item[1][0], env(item[1][1], item[0])),
                runs.items())))
        keys = set().union(*counts.values())

        def hook_total(d):
            """The hook's object's instructions in `d`, per unit measured."""
            return sum(v for (ob, _), v in d.items() if ob and "ggml_viz_hook" in ob) / per

        if args.add_chain:
            def difference(hi, lo):
                return {k: counts[hi][k] - counts[lo][k] for k in keys}
            print(f"the hook's whole object {what}: "
                  + ", ".join(f"{m} {hook_total(counts[m]):,.1f}" for m in modes))
        else:
            short, long = TOKENS

            def difference(hi, lo):
                return {k: (counts[f"{hi}{long}"][k] - counts[f"{hi}{short}"][k])
                        - (counts[f"{lo}{long}"][k] - counts[f"{lo}{short}"][k]) for k in keys}
        diff = difference(*modes[:2])
        if args.off:
            per, what = long - short, f"a token, {args.model} model, -t 1"
            print(f"op timing off over no hook, {what}: all the process's code {sum(diff.values()) / per:,.1f}")
        elif not args.add_chain:
            def shares(name):
                info = bench.run(["target/release/ggml-viz", "info", os.path.join(tmp, f"{name}.ggmlviz")]).stdout
                return int(re.search(r"^\s*op_compute_begin\s+(\d+)", info, re.M).group(1))
            per = shares(f"threads{long}") - shares(f"threads{short}")
            what = f"a node share, {args.model} model, -t 1 ({per} shares in {long - short} tokens)"
        total = hook_total(diff)
        over = "op timing off over no hook" if args.off else "threads over off"
        print(f"{over}, {what}: the hook's object {total:,.1f} instructions")
        tables = [(None, diff)]
        if args.floor:
            below = difference("floor", "off")
            floor = hook_total(below)
            tables = [(f"the floor (a build that records no share or wait) over off: {floor:,.1f}", below),
                      (f"recording adds {total - floor:,.1f} to it", difference("threads", "floor"))]
        for title, table in tables:
            if title:
                print(f"{title}, by function:")
            # The hook's functions and the copies it calls (libc's spin and scheduling code, and
            # OpenMP's spin waits, vary with the threads' timing: left out).
            ours = {k: v for k, v in table.items()
                    if k[0] and ("ggml_viz_hook" in k[0] or (k[1] or "").startswith("__mem"))}
            for (ob, fn), v in sorted(ours.items(), key=lambda kv: -abs(kv[1]))[:args.rows]:
                print(f"{v / per:10.1f}  {ob[:24]:<24} {fn}")


if __name__ == "__main__":
    main()
