#!/usr/bin/env python3
"""Summarizes a CUPTI capture (GGML_VIZ_CUPTI_CAPTURE's JSON lines): the counts that say whether
it holds what attributing kernels to ggml nodes needs. Usage: cupti_summary.py CAPTURE.jsonl[.gz]...

Per capture: lines by kind; kernels by where they ran (inside a CUDA graph or launched directly);
the driver launches with their parameters read; the graph nodes created and cloned; the graph
computes and their ggml nodes; how many kernels have a driver launch with their correlation id;
how many kernel intervals lie inside the window from a graph compute's begin to the next one's
(kernels run after the launch returns: the window is loose); CUPTI's dropped records.
"""
import collections
import gzip
import json
import sys


# The key that names each line's kind (serde_json writes keys sorted, so it need not come first).
KINDS = ("capture", "graph_begin", "graph_end", "api", "resource", "kernel", "memcpy", "memset",
         "dropped", "clock", "error", "activity_kind")


def lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def summarize(path):
    kinds = collections.Counter()
    kernels, launches, computes = [], {}, []
    cbids = collections.Counter()
    resources = collections.Counter()
    dropped = 0
    for o in lines(path):
        kind = next((k for k in KINDS if k in o), "other")
        kinds[kind] += 1
        if kind == "kernel":
            kernels.append(o)
        elif kind == "api":
            cbids[(o["api"], o["function"])] += 1
            if o.get("params") is not None:
                launches[o["correlation"]] = o
        elif kind == "resource":
            resources[o["resource"]] += 1
        elif kind == "graph_begin":
            computes.append((o["ns"], len(o["nodes"]), o["object"]))
        elif kind == "dropped":
            dropped += o["dropped"]
    print(f"{path}:")
    print("  lines:", dict(kinds))
    in_graph = sum(1 for k in kernels if k["graph_id"])
    print(f"  kernels: {len(kernels)} ({in_graph} inside CUDA graphs, {len(kernels) - in_graph} launched directly)")
    print(f"  kernel time: {sum(k['end'] - k['start'] for k in kernels) / 1e6:.3f} ms")
    print("  API calls:", dict(cbids.most_common(12)))
    print(f"  driver launches with parameters: {len(launches)}")
    matched = sum(1 for k in kernels if k["correlation"] in launches)
    print(f"  direct kernels whose correlation id is a driver launch's: {matched} of {len(kernels) - in_graph}")
    print("  graph resources:", dict(resources))
    print(f"  graph computes: {len(computes)}, ggml nodes each: {sorted(set(n for _, n, _ in computes))[:8]}, "
          f"objects: {sorted(set(o for _, _, o in computes))}")
    starts = sorted(ns for ns, _, _ in computes)
    if starts and kernels:
        inside = sum(1 for k in kernels if k["start"] >= starts[0])
        print(f"  kernels starting after the first graph compute began: {inside} of {len(kernels)}")
    print(f"  dropped records: {dropped}")


for p in sys.argv[1:]:
    try:
        summarize(p)
    except Exception as e:  # a check script's summary: say what failed, go on with the next
        print(f"{p}: cannot summarize: {e!r}")
