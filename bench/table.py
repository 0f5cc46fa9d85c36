#!/usr/bin/env python3
"""Renders the recorded benchmark runs (bench/results*.json, each written by bench/run.py) as the
tables of docs/performance.md, between its `<!-- bench:begin -->` and `<!-- bench:end -->`
lines: one table per file, the newest first, each figure as the run recorded it (no history:
a file holds the latest run of its sections). bench/run.py calls it after a full run.

    python3 bench/table.py          # rewrites docs/performance.md's tables
    python3 bench/table.py --print  # prints them instead
"""
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "performance.md")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def recorded_on(path, machine):
    """The run's date: as the run wrote it, else the day the file was last committed."""
    if machine.get("date"):
        return machine["date"]
    out = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=short", "--", path],
                         cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return out or "not committed"


def number(value, unit):
    """A figure for people: ratios as ×1.016, millions as 22.5 M, thousands with separators."""
    if unit == "ratio":
        return f"×{value:.3f}"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g} M {unit}"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.4g} {unit}"


def reference(m):
    ref = m.get("reference", "")
    if m.get("reference_value") is None:
        return ref
    return f"{ref}: {number(m['reference_value'], m.get('reference_unit', m['unit']))}"


def cell(text):
    return str(text).replace("|", "\\|")


def tables():
    runs = []
    for path in glob.glob(os.path.join(ROOT, "bench", "results*.json")):
        with open(path) as f:
            data = json.load(f)
        machine = data["machine"]
        runs.append((recorded_on(os.path.relpath(path, ROOT), machine), os.path.relpath(path, ROOT), machine, data["metrics"]))
    runs.sort(key=lambda r: (r[0], r[1]), reverse=True)
    out = []
    newer = set()
    for date, path, machine, metrics in runs:
        out.append(f"### `{path}`: {', '.join(machine['sections'])}")
        out.append("")
        superseded = [s for s in machine["sections"] if s in newer]
        note = (f" Its {', '.join(superseded)} figures are superseded by the newer run(s) above."
                if superseded else "")
        out.append(f"Recorded {date} on {machine['cores']} cores ({machine['cpu']}), "
                   f"{machine['seconds']} s{', quick' if machine.get('quick') else ''}.{note}")
        out.append("")
        newer.update(machine["sections"])
        out.append("| metric | value | compared with |")
        out.append("|---|---|---|")
        for m in metrics:
            out.append(f"| {cell(m['name'].strip())} | {cell(number(m['value'], m['unit']))} | {cell(reference(m))} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main():
    rendered = tables()
    if "--print" in sys.argv[1:]:
        sys.stdout.write(rendered)
        return
    with open(DOC) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} lines to put the tables between")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(DOC, "w") as f:
        f.write(head + BEGIN + "\n" + rendered + END + tail)


if __name__ == "__main__":
    main()
