#!/usr/bin/env python3
"""The benchmark suite: what ggml-viz costs and how fast it reads, compared with the floors and
the alternatives, on this machine, in one go.

    python3 bench/run.py            # the full suite (~6 minutes on 2 cores once built)
    python3 bench/run.py --quick    # most metrics on less work, no callgrind (~4 minutes)
    python3 bench/run.py --only readers   # one section (figures go to bench/results-readers.json)
    python3 bench/run.py --only instructions   # callgrind counts alone (~6 minutes)

Prints one table and writes the same figures to bench/results.json: one object per metric with
name, value, unit, the reference it is compared with, and the reference's value. Timings are noisy
here: A/B runs are interleaved in rotating order and medians are reported, never a single run.
"""
import argparse
import csv
import io
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = []


def run(cmd, env=None, check=True, **kw):
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, errors="replace", **kw)
    if check and p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def metric(name, value, unit, reference, reference_value=None, reference_unit=None):
    RESULTS.append({
        "name": name, "value": value, "unit": unit, "reference": reference,
        "reference_value": reference_value, "reference_unit": reference_unit or unit,
    })
    ref = "" if reference_value is None else f"{reference_value:,.4g} {reference_unit or unit}"
    print(f"{name:<52} {value:>14,.4g} {unit:<10} {reference:<34} {ref}", flush=True)


def progress(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def table_rows(text, pattern):
    return [m.groups() for m in re.finditer(pattern, text, re.M)]


def producer(quick):
    progress("producer cost (cargo bench -p ggml-viz-hook)")
    out = run(["cargo", "bench", "-q", "-p", "ggml-viz-hook", "--bench", "producer"]).stdout
    one = float(re.search(r"record, 1 producer thread\s+([\d.]+)", out).group(1))
    floor = float(re.search(r"clock_gettime\(CLOCK_MONOTONIC\) alone \(floor\)\s+([\d.]+)", out).group(1))
    tsc = float(re.search(r"clock read alone \(the ticks the hook stamps\)\s+([\d.]+)", out).group(1))
    metric("producer cost per event, 1 thread", one, "ns", "clock_gettime alone (the floor)", floor)
    metric("  of which the timestamp read", tsc, "ns", "clock_gettime alone", floor)
    rpc = float(re.search(r"rpc command, answered \(ns per command\)\s+([\d.]+)", out).group(1))
    metric("recording one answered ggml-rpc command (6 transport calls, 4 events)", rpc, "ns", "target", 1000)
    env = {"GGML_VIZ_BENCH_SECONDS": "1" if quick else "3"}
    # Three runs: each figure is their median (a run shares the 2 cores with whatever else
    # the VM is doing), the paced one's spread beside it.
    outs = [run(["cargo", "bench", "-q", "-p", "ggml-viz-hook", "--bench", "producer", "--", "--sustained"],
                env=env).stdout for _ in range(3)]
    tmp = tempfile.mkdtemp()
    try:
        dd = run(["dd", "if=/dev/zero", f"of={tmp}/dd", "bs=1M", "count=256", "conv=fdatasync"]).stderr
    finally:
        shutil.rmtree(tmp)
    m = re.search(r"([\d.]+) ([MG])B/s", dd)
    dd_mb = float(m.group(1)) * (1000 if m.group(2) == "G" else 1)
    flat = [table_rows(out, r"^(\d) thread\(s\)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%") for out in outs]
    for i, (threads, _, _, _) in enumerate(flat[0]):
        rate, mbs, dropped = (statistics.median(float(rows[i][k]) for rows in flat) for k in (1, 2, 3))
        metric(f"written with default ring, {threads} thread(s) flat out", mbs, "MB/s", "dd to the same disk", dd_mb)
        metric(f"  events/s written ({dropped:.1f} % dropped)", rate, "events/s", "ring / interval: 65536 per 100 ms per thread", 655360 * int(threads))
    paced = [re.search(r"^1 thread paced at 5 M events/s\s+(\d+)\s+([\d.]+)\s+([\d.]+)%", out, re.M).groups()
             for out in outs]
    dropped = sorted(float(d) for _, _, d in paced)
    metric("one thread paced at 5 M events/s: events dropped", dropped[1], "%", "none lost (flusher woken at half full)", 0.0)
    metric("  paced: the most dropped of 3 runs", dropped[2], "%", "the least", dropped[0])
    metric("  events/s written", statistics.median(float(r) for r, _, _ in paced), "events/s", "produced", 5e6)


def decode(quick):
    events = 2_000_000 if quick else 10_000_000
    progress(f"decode throughput, {events} events (cargo bench -p ggml-viz-reader)")
    out = run(["cargo", "bench", "-q", "-p", "ggml-viz-reader", "--bench", "decode"], env={"GGML_VIZ_BENCH_EVENTS": str(events)}).stdout
    rows = {(l, op.strip()): (float(ev), float(mb)) for l, op, ev, mb in table_rows(out, r"^(packed|padded)\s+(.+?)\s+(\d+)\s+(\d+)\s+[\d.]+$")}
    for layout in ("packed", "padded"):
        floor = rows[(layout, "memchr scan (bandwidth floor)")][1] / 1000
        for op in ("count per type (mmap)", "full decode (mmap)", "stream decode (io::Read)",
                   "stream decode, borrowed", "stream records, as they lie"):
            ev, mb = rows[(layout, op)]
            metric(f"{layout}: {op}", ev, "events/s", "memchr over the same bytes (GB/s)", floor, "GB/s")
            metric(f"  {layout}: {op}", mb / 1000, "GB/s", "memchr over the same bytes", floor)


def peak_rss(cmd):
    p = run(["/usr/bin/time", "-v"] + cmd)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    return rss


def readers(quick, tmp):
    events = 2_000_000 if quick else 10_000_000
    progress(f"summary, ops, the Perfetto, Chrome JSON and Parquet exports and the report of a {events}-event trace")
    run(["cargo", "build", "-q", "--release", "-p", "ggml-viz-examples", "--example", "synthesize"])
    trace = os.path.join(tmp, "synthetic.ggmlviz")
    run([os.path.join(ROOT, "target/release/examples/synthesize"), trace, str(events)])
    size_mb = os.path.getsize(trace) / 1e6
    viz = os.path.join(ROOT, "target/release/ggml-viz")
    proto, json_out = os.path.join(tmp, "t.pftrace"), os.path.join(tmp, "t.json")
    plain = os.path.join(tmp, "plain.pftrace")
    dataset = os.path.join(tmp, "dataset")
    for name, cmd in (("summary", [viz, "summary", trace]),
                      ("ops", [viz, "ops", trace]),
                      ("export --to perfetto", [viz, "export", "--to", "perfetto", trace, "-o", proto]),
                      ("export --to perfetto --no-compress",
                       [viz, "export", "--to", "perfetto", "--no-compress", trace, "-o", plain]),
                      ("export --to chrome-json", [viz, "export", "--to", "chrome-json", trace, "-o", json_out]),
                      ("export --to parquet", [viz, "export", "--to", "parquet", trace, "-o", dataset]),
                      ("report", [viz, "report", trace, "-o", os.path.join(tmp, "report.html")])):
        # This VM's speed wanders from run to run: three runs, the median and the spread. Each
        # starts with nothing waiting to be written back (the trace just synthesized, the last
        # command's output): that writeback would take the cores from the run measured.
        rates, rss = [], 0
        for _ in range(3):
            os.sync()
            start = time.perf_counter()
            rss = max(rss, peak_rss(cmd))
            rates.append(events / (time.perf_counter() - start))
        rates.sort()
        metric(f"{name}: throughput", rates[1], "events/s", "input size (MB)", size_mb, "MB")
        metric(f"  {name}: slowest of 3 runs", rates[0], "events/s", "fastest", rates[2])
        metric(f"  {name}: peak RSS", rss / 1024, "MB", "input size", size_mb)
    proto_mb, json_mb = os.path.getsize(proto) / 1e6, os.path.getsize(json_out) / 1e6
    metric("export --to perfetto: output size", proto_mb, "MB", "chrome-json output", json_mb, "MB")
    metric("export --to perfetto --no-compress: output size", os.path.getsize(plain) / 1e6, "MB",
           "chrome-json output", json_mb, "MB")


def rpc(quick, tmp):
    """The ggml-rpc reader on a long job: a synthetic client/server pair (examples/synthesize_rpc:
    per token a decode, SET_TENSOR, GRAPH_COMPUTE and an answered GET_TENSOR), through `rpc`,
    `export --to perfetto` (which joins the pair first, for the clock offset) and `report`; then
    a pair whose graph computes are never answered (the case that was quadratic)."""
    tokens = 50_000 if quick else 1_000_000
    run(["cargo", "build", "-q", "--release", "-p", "ggml-viz-examples", "--example", "synthesize_rpc"])
    synth = os.path.join(ROOT, "target/release/examples/synthesize_rpc")
    viz = os.path.join(ROOT, "target/release/ggml-viz")
    for label, extra in (("", []), ("unanswered, ", ["--unanswered"])):
        progress(f"ggml-rpc reader: {label}{tokens} tokens")
        client, server = os.path.join(tmp, "client.ggmlviz"), os.path.join(tmp, "server.ggmlviz")
        events = int(run([synth, client, server, str(tokens)] + extra).stdout.split()[-1])
        size_mb = (os.path.getsize(client) + os.path.getsize(server)) / 1e6
        commands = [("rpc", [viz, "rpc", client, server])]
        if not extra:
            commands += [("export --to perfetto", [viz, "export", "--to", "perfetto", "-q", client, server,
                                                   "-o", os.path.join(tmp, "rpc.pftrace")]),
                         ("report", [viz, "report", "-q", client, server, "-o", os.path.join(tmp, "rpc.html")])]
        for name, cmd in commands:
            os.sync()
            start = time.perf_counter()
            rss = peak_rss(cmd)
            seconds = time.perf_counter() - start
            metric(f"{label}{name} of a client/server pair: tokens", tokens / seconds, "tokens/s",
                   "tokens", tokens, "tokens")
            metric(f"  {label}{name}: throughput", events / seconds, "events/s", "input size (MB)", size_mb, "MB")
            metric(f"  {label}{name}: peak RSS", rss / 1024, "MB", "input size", size_mb)
        os.remove(client)
        os.remove(server)


# The generated models the llama.cpp sections run, by name: make_tiny_llama.py's options.
MODELS = {
    "tiny": [],
    "512x8": ["--n-embd", "512", "--n-layer", "8"],
    # As many nodes a graph as a 32-layer model's (560), at the tiny model's width.
    "64x32": ["--n-embd", "64", "--n-layer", "32"],
}


def model_file(tmp, name):
    """The generated model `name` (of MODELS) in `tmp`, made once."""
    model = os.path.join(tmp, f"{name}.gguf")
    if not os.path.exists(model):
        run([sys.executable, "tests/fixtures/make_tiny_llama.py", model, *MODELS[name]])
    return model


def llama_setup(tmp):
    """llama.cpp's build (cached), the hook, and the generated 512x8 model: what the llama.cpp
    sections run."""
    build = run(["bash", "scripts/setup-llama.sh"]).stdout.strip().splitlines()[-1]
    run(["cargo", "build", "-q", "--release", "-p", "ggml-viz-hook"])
    return build, os.path.join(ROOT, "target/release/libggml_viz_hook.so"), model_file(tmp, "512x8")


def llama(quick, tmp):
    rounds = 3 if quick else 6
    build, hook, model = llama_setup(tmp)
    noop = os.path.join(tmp, "noop_eval_callback.so")
    run(["cc", "-O2", "-shared", "-fPIC", "-o", noop, "bench/noop_eval_callback.c", "-ldl"])
    modes = {
        "none": {},
        "no-op eval callback": {"LD_PRELOAD": noop},
        "graph-only": {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "off"},
        "threads op timing": {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "threads"},
        "sched op timing": {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "sched"},
        "sched op timing 1 in 10": {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "sched", "GGML_VIZ_OP_SAMPLE": "10"},
    }
    n_gen = "32" if quick else "64"
    for threads in ("1",) if quick else ("1", "2"):
        progress(f"llama.cpp overhead: llama-bench -t {threads} -p 32 -n {n_gen}, 512x8 random model")
        results = {m: {"pp": [], "tg": []} for m in modes}
        names = list(modes)
        for r in range(rounds):
            for k in range(len(names)):
                mode = names[(r + k) % len(names)]
                env = dict(modes[mode], GGML_VIZ_OUTPUT=os.path.join(tmp, "b-%p.ggmlviz"))
                out = run([f"{build}/bin/llama-bench", "-m", model, "-t", threads, "-p", "32", "-n", n_gen, "-r", "2", "-o", "csv"], env=env).stdout
                for row in csv.DictReader(io.StringIO(out)):
                    kind = "pp" if row["n_prompt"] != "0" else "tg"
                    results[mode][kind].append(float(row["avg_ts"]))
        for kind, label in (("pp", "pp32"), ("tg", f"tg{n_gen}")):
            base = statistics.median(results["none"][kind])
            for mode in names[1:]:
                ratios = sorted(v / base for v in results[mode][kind])
                metric(f"llama -t {threads} {label}, {mode}: tokens/s ratio", statistics.median(ratios), "ratio",
                       f"no hook {base:.1f} tok/s; rounds {ratios[0]:.3f}-{ratios[-1]:.3f}", 1.0)
            noop = statistics.median(results["no-op eval callback"][kind])
            ops = statistics.median(results["sched op timing"][kind])
            metric(f"llama -t {threads} {label}, sched op timing vs a no-op eval callback", ops / noop, "ratio", f"no-op callback, {noop:.1f} tok/s", 1.0)
    if not quick:
        # A build of test-backend-ops: the full suite only.
        backend_ops(tmp, build, hook)
    fidelity(quick, tmp, build, hook, model)
    moe_coverage(tmp, build, hook)
    cpu_share(quick, tmp, build, hook, model)


def moe_coverage(tmp, build, hook):
    """A mixture-of-experts model's CPU graph computes (the dense model's width, 4 experts of which
    each token uses 2), covered by its nodes as the dense model's are: its experts' products
    (MUL_MAT_ID) are computed in a function no wrapper reaches, with a barrier inside (shares that
    ended there left 0.33 covered). Each of 3 runs' graph computes, the first left out."""
    model = os.path.join(tmp, "moe.gguf")
    run([sys.executable, "tests/fixtures/make_tiny_llama.py", model, "--n-embd", "512", "--n-layer", "4",
         "--n-expert", "4", "--n-expert-used", "2"])
    for threads in ("1", "2"):
        progress(f"MoE coverage: llama-bench -t {threads} -n 32, 512x4 model with 4 experts, threads op timing")
        coverage = []
        for _ in range(3):
            trace = os.path.join(tmp, "moe.ggmlviz")
            run([f"{build}/bin/llama-bench", "-m", model, "-t", threads, "-p", "0", "-n", "32", "-r", "1"],
                env={"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "threads", "GGML_VIZ_OUTPUT": trace})
            coverage += [c / d for d, c in graph_computes(trace)[1:] if d > 0]
        coverage.sort()
        metric(f"  MoE llama-bench -t {threads} -n 32: node wall times / graph compute, median",
               statistics.median(coverage), "ratio", f"lowest {coverage[0]:.3f}; target >= 0.97", 0.97)


def cpu_share(quick, tmp, build, hook, model):
    """The hook's own CPU time in a real run, from perf's samples: the share of the run's samples
    that fall in the hook's code (its wrappers on the worker threads, its flusher and writer
    threads) or on the hook's own threads in the kernel (the writer's `write` calls, the
    flusher's page faults: counted apart as well). Unlike a ratio of two runs' speeds, it does
    not move with the VM's speed from one run to the next; it leaves out what the hook costs the
    host's own code (caches it evicts). Needs `perf` (the metric is left out without it)."""
    if shutil.which("perf") is None:
        progress("perf is not installed: the hook's CPU share is left out")
        return
    rounds = 2 if quick else 5
    cmd = [f"{build}/bin/llama-bench", "-m", model, "-t", "2", "-p", "0", "-n", "256", "-r", "3"]
    shares = {"threads": [], "off": []}
    kernel = {"threads": [], "off": []}
    for r in range(rounds):
        for mode in (("threads", "off") if r % 2 == 0 else ("off", "threads")):
            progress(f"hook CPU share (perf): llama-bench -t 2 tg256, op timing {mode}, round {r + 1} of {rounds}")
            data = os.path.join(tmp, "perf.data")
            env = {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": mode, "GGML_VIZ_OUTPUT": os.path.join(tmp, "perf.ggmlviz")}
            if run(["perf", "record", "-q", "-F", "10000", "-o", data, *cmd], env=env, check=False).returncode != 0:
                progress("perf record failed (perf_event_paranoid?): the hook's CPU share is left out")
                return
            report = run(["perf", "report", "-i", data, "--no-children", "--sort", "comm,dso", "-g", "none",
                          "--stdio", "-n", "-t", "\t"]).stdout
            rows = [[f.strip() for f in l.split("\t")] for l in report.splitlines()
                    if l.strip() and not l.startswith("#")]
            rows = [(int(r[1]), r[2], r[3]) for r in rows if len(r) == 4 and r[0].endswith("%")]
            total = sum(n for n, _, _ in rows)
            ours = sum(n for n, comm, dso in rows if dso == os.path.basename(hook))
            ours_in_kernel = sum(n for n, comm, dso in rows
                                 if comm.startswith("ggml-viz-") and dso != os.path.basename(hook))
            shares[mode].append(100.0 * (ours + ours_in_kernel) / max(total, 1))
            kernel[mode].append(100.0 * ours_in_kernel / max(total, 1))
    for mode in ("threads", "off"):
        v = sorted(shares[mode])
        metric(f"hook's share of CPU samples, llama-bench -t 2 tg256, op timing {mode}", statistics.median(v), "%",
               f"{rounds} runs: {v[0]:.2f}-{v[-1]:.2f} %; all the run's code", 100.0)
        k = sorted(kernel[mode])
        metric(f"  of which on the hook's threads outside its code (the kernel's, libc's), op timing {mode}",
               statistics.median(k), "%", f"{rounds} runs: {k[0]:.2f}-{k[-1]:.2f} %; all the run's code", 100.0)


def backend_ops(tmp, build, hook):
    """One MUL_MAT shape of llama.cpp's own op benchmark (`test-backend-ops perf`, built from
    the same sources), against the node wall times threads-mode op timing records for it."""
    src = next(l.split("=", 1)[1].strip() for l in open(f"{build}/CMakeCache.txt")
               if l.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="))
    libs = ["-L" + f"{build}/bin", "-lggml", "-lggml-base", "-lggml-cpu", "-Wl,-rpath," + f"{build}/bin"]
    includes = ["-I" + os.path.join(src, "ggml", "include")]
    progress("test-backend-ops: building it from the llama.cpp sources (a minute or two)")
    tbo = os.path.join(tmp, "test-backend-ops")
    run(["c++", "-O2", "-std=c++17", *includes, os.path.join(src, "tests", "test-backend-ops.cpp"),
         "-o", tbo, *libs, "-lpthread"])
    shape = "type_a=q4_0,type_b=f32,m=4096,n=1,k=14336,"
    # test-backend-ops gives the CPU backend half the hardware's threads.
    threads = max(1, (os.cpu_count() or 2) // 2)
    progress(f"test-backend-ops perf -o MUL_MAT -b CPU -p {shape} ({threads} thread(s)) vs a traced program")
    mm = os.path.join(tmp, "mul_mat_perf")
    run(["cc", "-O2", *includes, "bench/mul_mat_perf.c", "-o", mm, *libs])
    trace = os.path.join(tmp, "mm.ggmlviz")
    theirs, ours = [], []
    # A memory-bound mat-vec on a noisy VM: 5 interleaved rounds, medians.
    for r in range(5):
        for who in (("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")):
            if who == "theirs":
                out = run([tbo, "perf", "-o", "MUL_MAT", "-b", "CPU", "-p", shape]).stdout
                us = [float(v) for v in re.findall(r"([0-9.]+) us/run", out)]
                if len(us) != 1:
                    raise SystemExit(f"bench: expected one MUL_MAT case from test-backend-ops, got:\n{out}")
                theirs.append(us[0])
            else:
                run([mm, "30", str(threads)],
                    env={"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "threads", "GGML_VIZ_OUTPUT": trace})
                # Each graph compute holds the one node: its wall time is what the shares cover.
                ours.append(statistics.median(c for _, c in graph_computes(trace)[1:]) / 1000)
    ratios = sorted(o / t for o, t in zip(ours, theirs))
    ours, theirs = statistics.median(ours), statistics.median(theirs)
    metric(f"MUL_MAT q4_0 4096x14336 x f32 column, {threads} thread(s): node wall time (median)", ours, "µs",
           "test-backend-ops perf, same shape", theirs)
    metric("  its ratio to test-backend-ops", ours / theirs, "ratio",
           f"rounds {ratios[0]:.3f}-{ratios[-1]:.3f}", 1.0)


def instructions_section(quick, tmp):
    """callgrind instruction counts and cachegrind's cache misses (minutes under valgrind: full
    runs only)."""
    if quick:
        progress("callgrind instruction counts: full runs only (--only instructions)")
        return
    build, hook, model = llama_setup(tmp)
    instructions(tmp, build, hook, model)


def instructions(tmp, build, hook, big):
    """callgrind instruction counts, llama-bench -t 1 -p 0 -n 16, hooked / unhooked: repeatable
    where wall-clock time is not (at one thread: at two, spin waits depend on timing). Beside
    them, what preloading an empty library costs (the floor for any preloaded hook), and the
    instructions threads op timing adds per node over op timing off, on the tiny model, the 512x8
    one and a deep one (64x32: a graph of over 500 nodes, as a 32-layer model's). Then the same at -n 80: what
    a token costs once every node has been seen (-n 80 minus -n 16), hooked / unhooked, and per
    node share; and per node at two threads, on the ctypes ADD chain. llama-bench runs in the repository's root: ggml looks for its backends in the
    working directory, and a crowded one (/tmp) would count its scan."""
    if shutil.which("valgrind") is None:
        progress("valgrind is missing: no instruction counts")
        return
    tiny, deep = model_file(tmp, "tiny"), model_file(tmp, "64x32")
    empty_c, empty = os.path.join(tmp, "empty.c"), os.path.join(tmp, "libempty.so")
    with open(empty_c, "w") as f:
        f.write("int ggml_viz_bench_empty(void) { return 0; }\n")
    run(["cc", "-O2", "-shared", "-fPIC", "-o", empty, empty_c])
    what = {"none": "no hook", "empty": "an empty library preloaded", "off": "op timing off",
            "threads": "op timing threads", "sched": "op timing sched"}
    def count(model, mode, n_gen, trace, own=False):
        """The run's instructions, and (`own`) those of the hook's own functions."""
        env = ({} if mode == "none" else {"LD_PRELOAD": empty} if mode == "empty" else
               {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": mode, "GGML_VIZ_OUTPUT": trace})
        out = os.path.join(tmp, "callgrind.out")
        run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"{build}/bin/llama-bench",
             "-m", model, "-t", "1", "-p", "0", "-n", n_gen, "-r", "1"], env=env)
        total = int(re.search(r"^summary: (\d+)", open(out).read(), re.M).group(1))
        return total, hook_own(out) if own else None

    def hook_own(out):
        """The instructions of the hook's own functions in a callgrind profile: steadier than the
        run's total, since the host's code does not run alike from run to run (a threads run and
        an off run differ by some 25,000 instructions of llama-bench's own string handling). Our
        exported wrappers' names are left out: callgrind gives them the real ggml functions'
        instructions in some runs (the trampolines jump there)."""
        text = run(["callgrind_annotate", "--threshold=100", out]).stdout
        total = 0
        for line in text.splitlines():
            m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(.*)", line)
            if m and os.path.basename(hook) in m.group(2) and not re.search(r":ggml_(compute_forward|cpu_extra|barrier)", m.group(2)):
                total += int(m.group(1).replace(",", ""))
        return total

    def shares(trace):
        info = run(["target/release/ggml-viz", "info", trace]).stdout
        return int(re.search(r"^\s*op_compute_begin\s+(\d+)", info, re.M).group(1))

    for name, model in (("tiny", tiny), ("512x8", big), ("64x32", deep)):
        counts, own = {}, {}
        trace = os.path.join(tmp, f"cg-{name}-%s.ggmlviz")
        for mode in what:
            progress(f"callgrind: llama-bench -t 1 -p 0 -n 16, {name} model, {what[mode]}")
            counts[mode], own[mode] = count(model, mode, "16", trace % mode, own=mode in ("off", "threads"))
        for mode in ("empty", "off", "threads", "sched"):
            metric(f"instructions, {name} model tg16 -t 1, {what[mode]}", counts[mode] / counts["none"],
                   "ratio", f"no hook: {counts['none'] / 1e6:.1f} M instructions", 1.0)
        nodes = shares(trace % "threads")
        metric(f"  threads over off, {name} model: instructions per node share", (counts["threads"] - counts["off"]) / nodes,
               "instructions", "node shares recorded", nodes, "shares")
        metric(f"  of which the hook's own functions, {name} model: per node share", (own["threads"] - own["off"]) / nodes,
               "instructions", "the host's code differs between runs by ±40 a share")
        longer, long_trace = {}, os.path.join(tmp, f"cg-{name}-80-%s.ggmlviz")
        for mode in ("none", "off", "threads"):
            progress(f"callgrind: llama-bench -t 1 -p 0 -n 80, {name} model, {what[mode]}")
            longer[mode], _ = count(model, mode, "80", long_trace % mode)
        per_token = {m: (longer[m] - counts[m]) / 64 for m in longer}
        for mode in ("off", "threads"):
            metric(f"instructions a token (tg80 - tg16), {name} model, {what[mode]}", per_token[mode] / per_token["none"],
                   "ratio", f"no hook: {per_token['none'] / 1e3:.1f} k a token", 1.0)
        more = shares(long_trace % "threads") - nodes
        metric(f"  threads over off a token, {name} model: per node share", (per_token["threads"] - per_token["off"]) * 64 / more,
               "instructions", "node shares the 64 tokens added", more, "shares")

    # Per node at two threads (two shares, two barrier waits and their records): the ctypes ADD
    # chain, 100 nodes a graph, 50 graphs, under callgrind (which runs one thread at a time: the
    # spin waits' counts vary, our own functions' do not).
    nodes, computes = 100, 50
    own = {}
    for mode in ("off", "threads"):
        progress(f"callgrind: the ctypes ADD chain, {nodes} nodes x {computes} computes, 2 threads, {what[mode]}")
        out = os.path.join(tmp, "callgrind.out")
        env = {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": mode, "GGML_VIZ_OUTPUT": os.path.join(tmp, "add.ggmlviz")}
        run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "tests/fixtures/ggml_ctypes.py", f"{build}/bin", "--nodes", str(nodes), "--repeat", str(computes),
             "--threads", "2"], env=env)
        own[mode] = hook_own(out)
    per_node = nodes * computes
    metric("ADD chain at 2 threads: the hook's own instructions per node, threads", own["threads"] / per_node,
           "instructions", "issue 51's target", 1000)
    metric("  threads over off per node", (own["threads"] - own["off"]) / per_node, "instructions",
           "op timing off's own per node", own["off"] / per_node)
    cache_misses(tmp, build, hook, deep, shares)


def cache_misses(tmp, build, hook, model, shares):
    """What recording shares does to the caches, where this VM has no hardware counters to tell:
    cachegrind's simulation of this CPU's first level and L3 (32 KiB, 32 MiB), llama-bench -t 1
    -p 0 -n 16 on the 64x32 model (a graph of over 500 nodes), op timing off and threads. Misses
    of the whole run: the hook's own and any it causes the host; a host whose data the trace's
    streaming evicted would show as more last-level read misses (the weights' first reads are the
    floor)."""
    misses = {}
    for mode in ("off", "threads"):
        progress(f"cachegrind: llama-bench -t 1 -p 0 -n 16, 64x32 model, op timing {mode}")
        out = os.path.join(tmp, "cachegrind.out")
        trace = os.path.join(tmp, f"cache-{mode}.ggmlviz")
        env = {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": mode, "GGML_VIZ_OUTPUT": trace}
        p = run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64",
                 "--LL=33554432,16,64", f"--cachegrind-out-file={out}", f"{build}/bin/llama-bench", "-m", model,
                 "-t", "1", "-p", "0", "-n", "16", "-r", "1"], env=env)
        counts = {}
        for level in ("D1", "LLd"):
            m = re.search(rf"^==\d+== {level}\s+misses:\s+([\d,]+)\s+\(\s*([\d,]+) rd", p.stderr, re.M)
            counts[level] = tuple(int(x.replace(",", "")) for x in m.groups())
        misses[mode] = counts
    nodes = shares(os.path.join(tmp, "cache-threads.ggmlviz"))
    (d1_off, _), (d1_threads, _) = misses["off"]["D1"], misses["threads"]["D1"]
    metric("cachegrind, 64x32 tg16 -t 1: first-level data misses per node share, threads over off",
           (d1_threads - d1_off) / nodes, "misses", "node shares recorded", nodes, "shares")
    (_, ll_off), (_, ll_threads) = misses["off"]["LLd"], misses["threads"]["LLd"]
    metric("  last-level data read misses, threads / off", ll_threads / ll_off, "ratio",
           f"op timing off: {ll_off:,} (the weights' first reads)", 1.0)


def graph_computes(trace):
    """Per innermost CPU graph compute (ggml_graph_compute) of the trace: its duration and the
    union of its nodes' wall times (every thread's shares of a node, first start to last end).
    A share belongs to the graph compute it begins in: the next graph's nodes (the same tensors
    when llama.cpp reuses its graph) begin after it ends, often within a millisecond."""
    events = [json.loads(l) for l in run(["target/release/ggml-viz", "dump", "--format", "jsonl", trace]).stdout.splitlines()]
    spans, stack, shares, open_share = [], {}, [], {}
    for e in events:
        t, tid, ts = e["type"], e["thread_id"], e["timestamp_ns"]
        if t == "graph_compute_begin":
            stack.setdefault(tid, []).append((ts, e.get("label", "")))
        elif t == "graph_compute_end":
            begin, label = stack[tid].pop()
            if label.startswith("ggml_graph_compute"):
                spans.append((begin, ts))
        elif t == "op_compute_begin":
            open_share[tid] = (ts, e["tensor_ptr"])
        elif t == "op_compute_end" and tid in open_share:
            begin, tensor = open_share.pop(tid)
            shares.append((begin, ts, tensor))
    spans.sort()
    out = []
    for begin, end in spans:
        nodes = {}
        for b, e, tensor in shares:
            if begin <= b <= end and e <= end + 1_000_000:
                lo, hi = nodes.get(tensor, (b, e))
                nodes[tensor] = (min(lo, b), max(hi, e))
        covered, last = 0, begin
        for lo, hi in sorted(nodes.values()):
            lo, hi = max(lo, last), min(hi, end)
            if hi > lo:
                covered += hi - lo
                last = hi
        out.append((end - begin, covered))
    return out


def neighbour_ratios(spans, chosen):
    """Each chosen graph compute's duration over each unchosen neighbour's (before and after it):
    the ratio of two graphs milliseconds apart, which the VM's drift over seconds leaves alone."""
    return [spans[i][0] / spans[j][0] for i in range(1, len(spans) - 1) if chosen(i)
            for j in (i - 1, i + 1) if not chosen(j) and spans[j][0] > 0]


def median_interval(values, rng):
    """A bootstrap 95 % interval of the median of `values`."""
    boot = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return boot[len(boot) // 40], boot[len(boot) - 1 - len(boot) // 40]


def fidelity(quick, tmp, build, hook, model):
    """Threads-mode op timing against graphs only: the CPU backend's graph computes take as long,
    and its nodes cover them. This VM's speed wanders by 10-20 % from one second to the next (the
    ratio of two runs' medians moved from 0.80 to 1.20), so the runs are paired: each pair runs
    both modes back to back (in alternating order) and gives the ratio of its two median graph
    computes; the figure is the median of the pairs' ratios, with a bootstrap 95 % interval.

    That still leaves a few per cent of noise, so each round also runs threads mode timing one
    graph compute in two (`GGML_VIZ_OP_SAMPLE=2`; the untimed ones go straight to ggml, as with
    op timing off): within one run, milliseconds apart, each timed graph compute against each of
    its untimed neighbours. It measures what recording costs the worker threads; the flusher's
    and writer's work, spread over timed and untimed graphs alike, is not in it (it is in the
    paired runs' figure). The same pairing of the off runs' graph computes (each odd one against
    its neighbours) is its control: what the pairing gives where nothing differs.

    The first graph compute of a run (llama-simple's prompt; llama-bench's warm-up) is left out
    of those medians and paired on its own: in it every worker thread records its first events
    (its ring is made) and meets every node and call site for the first time."""
    pairs = 10 if quick else 40
    programs = {
        "llama-simple -n 32 (4 threads on the 2 cores)":
            [f"{build}/bin/llama-simple", "-m", model, "-n", "32", "hello world"],
        **{f"llama-bench -t {t} -n 32": [f"{build}/bin/llama-bench", "-m", model, "-t", t, "-p", "0", "-n", "32", "-r", "1"]
           for t in ("1", "2")},
    }
    rng = random.Random(1)
    for label, cmd in programs.items():
        progress(f"fidelity: {label} on the 512x8 model, op timing threads vs off, {pairs} pairs of runs")
        ratios, coverage, medians, firsts = [], [], {"off": [], "threads": []}, []
        within, control = [], []
        for r in range(pairs):
            median = {}
            for mode in (("off", "threads", "sampled") if r % 2 == 0 else ("sampled", "threads", "off")):
                trace = os.path.join(tmp, f"fid-{mode}.ggmlviz")
                env = {"LD_PRELOAD": hook, "GGML_VIZ_OP_TIMING": "threads" if mode == "sampled" else mode,
                       "GGML_VIZ_OUTPUT": trace}
                if mode == "sampled":
                    env["GGML_VIZ_OP_SAMPLE"] = "2"
                run(cmd, env=env)
                spans = graph_computes(trace)
                if mode == "sampled":
                    within += neighbour_ratios(spans, lambda i: spans[i][1] > 0)
                    continue
                if mode == "off":
                    control += neighbour_ratios(spans, lambda i: i % 2 == 1)
                median[mode + " first"] = spans[0][0]
                spans = spans[1:]
                median[mode] = statistics.median(d for d, _ in spans)
                medians[mode].append(median[mode])
                if mode == "threads":
                    coverage += [c / d for d, c in spans if d > 0]
            ratios.append(median["threads"] / median["off"])
            firsts.append(median["threads first"] / median["off first"])
        lo, hi = median_interval(ratios, rng)
        metric(f"CPU graph compute, threads / off: {label}", statistics.median(ratios), "ratio",
               f"{pairs} pairs; 95 % interval {lo:.3f}-{hi:.3f}; target within 3 %", 1.0)
        lo, hi = median_interval(firsts, rng)
        metric(f"  {label}: the first graph compute, threads / off", statistics.median(firsts), "ratio",
               f"{pairs} pairs; 95 % interval {lo:.3f}-{hi:.3f}", 1.0)
        lo, hi = median_interval(within, rng)
        metric(f"  {label}: within runs, timed / untimed neighbour", statistics.median(within), "ratio",
               f"{len(within)} pairs in {pairs} runs; 95 % interval {lo:.4f}-{hi:.4f}", 1.0)
        lo, hi = median_interval(control, rng)
        metric(f"  {label}: the same pairing of the off runs' graphs", statistics.median(control), "ratio",
               f"{len(control)} pairs; 95 % interval {lo:.4f}-{hi:.4f}; control", 1.0)
        metric(f"  {label}: median graph compute, threads op timing", statistics.median(medians["threads"]) / 1000,
               "µs", "op timing off", statistics.median(medians["off"]) / 1000)
        coverage.sort()
        metric(f"  {label}: node wall times / graph compute, median", statistics.median(coverage), "ratio",
               f"lowest {coverage[0]:.3f}; target >= 0.97", 0.97)


def vulkan(quick, tmp):
    """GPU per-node time on ggml-vulkan (Mesa's lavapipe here): llama-simple's tokens per second
    with the hook's Vulkan layer timing every node (`record`), against the same run with nothing,
    with ggml's debug markers alone (which the layer needs: their own cost), with ggml's own
    GGML_VK_PERF_LOGGER, and with the eval callback (`GGML_VIZ_OP_TIMING=sched`). Rounds run every
    way back to back in rotating order; each way's figure is the median of its per-round ratio to
    the plain run, with a bootstrap 95 % interval."""
    build = run(["bash", "scripts/setup-llama.sh", "vulkan"]).stdout.strip().splitlines()[-1]
    viz = os.path.join(ROOT, "target/release/ggml-viz")
    name, n, rounds = ("tiny", "16", 3) if quick else ("512x8", "32", 8)
    model, label = model_file(tmp, name), f"{name} model"
    progress(f"Vulkan on lavapipe: llama-simple -ngl 99 -n {n}, {label}, {rounds} rounds of 5 ways")
    env = {"GGML_VK_VISIBLE_DEVICES": "0", "MESA_SHADER_CACHE_DIR": os.path.join(build, "mesa-shader-cache")}
    simple = [f"{build}/bin/llama-simple", "-m", model, "-ngl", "99", "-n", n, "hello world"]
    trace = os.path.join(tmp, "vk.ggmlviz")
    record = [viz, "record", "-o", trace, "--"] + simple
    ways = {
        "nothing": (simple, {}),
        "debug markers alone": (simple, {"GGML_VK_DEBUG_MARKERS": "1"}),
        "gpu timing (record)": (record, {}),
        "GGML_VK_PERF_LOGGER": (simple, {"GGML_VK_PERF_LOGGER": "1"}),
        "eval callback (sched)": (record, {"GGML_VIZ_OP_TIMING": "sched"}),
    }

    def speed(way):
        cmd, extra = ways[way]
        err = run(cmd, env=dict(env, **extra)).stderr
        return float(re.search(r"speed: ([\d.]+) t/s", err).group(1))

    speed("nothing")  # Mesa compiles the shaders once (cached with the build)
    speeds = {w: [] for w in ways}
    names = list(ways)
    for r in range(rounds):
        for way in names[r % len(names):] + names[:r % len(names)]:
            speeds[way].append(speed(way))
    rng = random.Random(1)
    metric(f"Vulkan: llama-simple tokens/s, nothing ({label})", statistics.median(speeds["nothing"]), "t/s",
           "lavapipe, -ngl 99", None)
    for way in names[1:]:
        ratios = [a / b for a, b in zip(speeds[way], speeds["nothing"])]
        lo, hi = median_interval(ratios, rng)
        target = "; target >= 0.97" if way.startswith("gpu") else ""
        metric(f"  Vulkan tokens/s, {way} / nothing", statistics.median(ratios), "ratio",
               f"{rounds} rounds; 95 % interval {lo:.3f}-{hi:.3f}{target}", 1.0)


def live(quick, tmp):
    rate, seconds = 1_000_000, (4 if quick else 10)
    progress(f"live view following a writer of {rate:,} events/s for {seconds} s")
    run(["cargo", "build", "-q", "--release", "-p", "ggml-viz-examples", "--example", "synthesize"])
    trace = os.path.join(tmp, "live.ggmlviz")
    writer = subprocess.Popen([os.path.join(ROOT, "target/release/examples/synthesize"), trace,
                               str(rate * seconds), "--rate", str(rate)], stdout=subprocess.PIPE, text=True)
    start = time.perf_counter()
    view = subprocess.Popen([os.path.join(ROOT, "target/release/ggml-viz"), "live", "--plain", trace],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(view.pid, 0)
    wall = time.perf_counter() - start
    written = int(writer.communicate()[0])
    said = view.stderr.read()
    seen = int(re.search(r"ended: [^;]*; (\d+) events", said).group(1))
    if seen != written:
        sys.exit(f"bench: the live view saw {seen} of {written} events:\n{said}")
    cpu = usage.ru_utime + usage.ru_stime
    metric("live view: CPU while following 1 M events/s", cpu / wall, "cores", "one core", 1.0)
    metric("  live view: events seen of written", seen / written, "ratio", "all of them", 1.0)


def inert(quick):
    n = 100 if quick else 400
    progress(f"inert hook: {n} starts of /bin/true with and without it")
    hook = os.path.join(ROOT, "target/release/libggml_viz_hook.so")
    times = {"plain": [], "hooked": []}
    for i in range(n):
        for mode in (("plain", "hooked") if i % 2 == 0 else ("hooked", "plain")):
            env = dict(os.environ, LD_PRELOAD=hook) if mode == "hooked" else dict(os.environ)
            start = time.perf_counter()
            subprocess.run(["/bin/true"], env=env, check=True)
            times[mode].append(time.perf_counter() - start)
    plain, hooked = statistics.median(times["plain"]), statistics.median(times["hooked"])
    metric("inert hook: start-up time of /bin/true", hooked * 1e6, "µs", "without the hook", plain * 1e6)
    metric("  inert hook: start-up ratio", hooked / plain, "ratio", "without the hook", 1.0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="less work per metric: under 3 minutes once built")
    p.add_argument("--out", default=None,
                   help="where to write the figures (default: bench/results.json, or with --only "
                        "bench/results-SECTION.json, so that a partial run never replaces the full one)")
    p.add_argument("--only", choices=SECTIONS, action="append",
                   help="run this section only (repeatable)")
    args = p.parse_args()
    sections = args.only or list(SECTIONS)
    out = args.out or os.path.join(ROOT, "bench", "results.json" if not args.only
                                   else f"results-{'-'.join(args.only)}.json")
    started = time.time()
    progress("building (release)")
    run(["cargo", "build", "-q", "--release", "--workspace"])
    print(f"{'metric':<52} {'value':>14} {'unit':<10} {'compared with':<34} reference")
    tmp = tempfile.mkdtemp(prefix="ggml-viz-bench-")
    try:
        for name in sections:
            if name in ("producer", "decode", "inert"):
                SECTIONS[name](args.quick)
            else:
                SECTIONS[name](args.quick, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    machine = {
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown"),
        "cores": os.cpu_count(),
        "quick": args.quick,
        "sections": sections,
        "seconds": round(time.time() - started),
        "date": time.strftime("%Y-%m-%d"),
    }
    with open(out, "w") as f:
        json.dump({"machine": machine, "metrics": RESULTS}, f, indent=2)
    progress(f"wrote {len(RESULTS)} metrics to {os.path.relpath(out, ROOT)} in {machine['seconds']} s")
    # A recorded run (not --quick, into bench/): docs/performance.md's tables follow it.
    if not args.quick and os.path.dirname(os.path.abspath(out)) == os.path.join(ROOT, "bench"):
        run([sys.executable, os.path.join(ROOT, "bench", "table.py")])
        progress("rendered docs/performance.md's tables (bench/table.py)")


SECTIONS = {"producer": producer, "decode": decode, "readers": readers, "rpc": rpc, "live": live,
            "inert": inert, "llama": llama, "instructions": instructions_section, "vulkan": vulkan}

if __name__ == "__main__":
    main()
