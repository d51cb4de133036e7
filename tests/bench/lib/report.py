#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Turns a run's raw results into results.md and results.png.

  report.py report OUTDIR   reads OUTDIR/raw/{meta.env,results.jsonl}
                            (and the fio JSON files they point to), writes
                            OUTDIR/results.md, results.dat, results.gp and,
                            with gnuplot, results.png
  report.py fio FILE        prints "MiB/s IOPS" of one fio JSON output
                            (run.sh records these as it goes)

Stdlib only; run with /usr/bin/python3.

Ratios: every ratio in the report is a *relative speed*, higher is better,
whatever the metric's unit: for throughput (MiB/s, ops/s) it is
target / reference, for times (s) and memory (MiB) reference / target. So
"0.50x vs kernel" always means "half as good as the kernel".
"""
import json
import os
import statistics
import subprocess
import sys

# (key, group, label, unit, higher_is_better). The group is the run.sh
# workload function that records the metric; a failure recorded under the
# group name (target down) counts against all of its metrics. {seq},
# {rand}, {copyup}, {nfiles}, {tree} are filled in from meta.env.
METRICS = [
    ("seqread-cold-psync", "seqread", "seq read 1M {seq}, cold, psync", "MiB/s", True),
    ("seqread-cold-uring", "seqread", "seq read 1M {seq}, cold, io_uring QD32", "MiB/s", True),
    ("seqread-warm-psync", "seqread", "seq read 1M {seq}, warm, psync", "MiB/s", True),
    ("seqread-warm-uring", "seqread", "seq read 1M {seq}, warm, io_uring QD32", "MiB/s", True),
    ("seqwrite", "seqwrite", "seq write 1M {seq} new file + fsync", "MiB/s", True),
    ("randread-cold-1j", "randread", "rand read 4K {rand}, cold, 1 job", "ops/s", True),
    ("randread-cold-4j", "randread", "rand read 4K {rand}, cold, 4 jobs", "ops/s", True),
    ("randread-cold-uring32", "randread", "rand read 4K {rand}, cold, io_uring QD32", "ops/s", True),
    ("randread-warm-1j", "randread", "rand read 4K {rand}, warm, 1 job", "ops/s", True),
    ("randread-warm-4j", "randread", "rand read 4K {rand}, warm, 4 jobs", "ops/s", True),
    ("randread-warm-uring32", "randread", "rand read 4K {rand}, warm, io_uring QD32", "ops/s", True),
    ("randwrite-1j", "randwrite", "rand write 4K {rand} upper file, 1 job", "ops/s", True),
    ("randwrite-4j", "randwrite", "rand write 4K {rand} upper file, 4 jobs", "ops/s", True),
    ("direct-randread-1j", "direct", "O_DIRECT rand read 4K {rand}, 1 job", "ops/s", True),
    ("direct-randread-uring32", "direct", "O_DIRECT rand read 4K {rand}, io_uring QD32", "ops/s", True),
    ("direct-randwrite-1j", "direct", "O_DIRECT rand write 4K {rand} upper file, 1 job", "ops/s", True),
    ("copyup", "copyup", "copy-up: first append to a {copyup} lower file", "s", False),
    ("copyup-sync", "copyup", "copy-up as above, then sync(2)", "s", False),
    ("meta-create", "meta", "create {nfiles} empty files", "s", False),
    ("meta-stat-warm", "meta", "stat {nfiles} files, warm", "s", False),
    ("meta-stat-cold", "meta", "stat {nfiles} files, cold", "s", False),
    ("meta-readdir-cold", "meta", "readdir of {nfiles} entries, cold", "s", False),
    ("meta-readdir-warm", "meta", "readdir of {nfiles} entries, warm", "s", False),
    ("meta-unlink", "meta", "unlink {nfiles} files", "s", False),
    ("find-cold", "walk", "find over {tree}-entry lower tree, cold", "s", False),
    ("find-warm", "walk", "find over {tree}-entry lower tree, warm", "s", False),
    ("du-cold", "walk", "du -s over {tree}-entry lower tree, cold", "s", False),
    ("du-warm", "walk", "du -s over {tree}-entry lower tree, warm", "s", False),
    ("tar-extract", "tar", "tar -x of the tree into the merged view + sync", "s", False),
    ("tar-out-cold", "tar", "tar -c of the lower tree to a pipe, cold", "s", False),
    ("mount", "mount", "mount until the first lookup answers", "s", False),
    ("rss-after-walk", "walk", "daemon memory after the walks (Pss of all its processes)", "MiB", False),
]
# Metrics that are not performance: no chart bars for them.
NOT_CHARTED = {"rss-after-walk"}
# (metric, target) pairs that are measured but not comparable: native has
# no copy-up, only the append (shown in the table as the floor).
NO_RATIO = {("copyup", "native"), ("copyup-sync", "native")}


def fio_values(path):
    """(MiB/s, IOPS) of a group-reported fio job: read or write,
    whichever did I/O."""
    with open(path) as f:
        d = json.load(f)
    jobs = d["jobs"]
    bw = iops = 0.0
    for j in jobs:
        for ddir in ("read", "write"):
            if j[ddir]["io_bytes"] > 0:
                bw += j[ddir]["bw_bytes"] / 2**20
                iops += j[ddir]["iops"]
        if j.get("error"):
            raise SystemExit("fio job error %s" % j["error"])
    if bw == 0:
        raise SystemExit("fio did no I/O")
    return bw, iops


def size_label(s):
    """fio size strings (2g, 128m) as 2 GiB, 128 MiB."""
    s = s.strip().lower()
    units = {"k": "KiB", "m": "MiB", "g": "GiB", "t": "TiB"}
    if s and s[-1] in units:
        return "%s %s" % (s[:-1], units[s[-1]])
    return s


def fmt(v):
    """Three significant digits, no exponent for the usual ranges."""
    if v is None:
        return "–"
    a = abs(v)
    if a >= 1000:
        return "{:,.0f}".format(v)
    if a >= 100:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    if a >= 0.01:
        return "%.3f" % v
    return "%.4f" % v


def load(out):
    meta = {}
    with open(os.path.join(out, "raw", "meta.env")) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    vals, fails, events = {}, {}, []
    groups = {m[1] for m in METRICS}
    path = os.path.join(out, "raw", "results.jsonl")
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "event" in r:
                events.append(r)
                continue
            wl, t = r["workload"], r["target"]
            keys = [m[0] for m in METRICS if m[1] == wl] if wl in groups and \
                wl not in {m[0] for m in METRICS} else [wl]
            for k in keys:
                if "error" in r:
                    fails.setdefault((k, t), []).append((r["round"], r["error"]))
                else:
                    vals.setdefault((k, t), []).append(float(r["value"]))
    return meta, vals, fails, events


def ratio(m, v, ref, pair=()):
    """Relative speed of v against ref: > 1 means v is better."""
    if any((m[0], t) in NO_RATIO for t in pair):
        return None
    if v is None or ref is None or v <= 0 or ref <= 0:
        return None
    return v / ref if m[4] else ref / v


def report(out):
    meta, vals, fails, events = load(out)
    targets = meta.get("targets", "").split()
    strata = [t for t in targets if t.startswith("stratafs")]
    quick = meta.get("mode") == "quick"
    fill = {
        "seq": size_label(meta.get("seq_size", "?")),
        "rand": size_label(meta.get("rand_size", "?")),
        "copyup": size_label(meta.get("copyup_size", "?")),
        "nfiles": "{:,}".format(int(meta.get("nfiles", "0"))),
        "tree": "{:,}".format(int(meta.get("tree_entries", "0"))),
    }
    metrics = [(k, g, label.format(**fill), unit, hib)
               for k, g, label, unit, hib in METRICS]

    med = {}
    for m in metrics:
        for t in targets:
            v = vals.get((m[0], t))
            med[(m[0], t)] = statistics.median(v) if v else None

    L = []
    title = "Strata benchmark"
    if quick:
        title += " — QUICK MODE (small sizes, for development; not for comparison)"
    L.append("# " + title)
    L.append("")
    L.append("| | |")
    L.append("| --- | --- |")
    info = [
        ("mode", meta.get("mode", "?") + (", %s round(s)" % meta.get("rounds", "?"))),
        ("targets (in order of round 1)", meta.get("targets", "?")),
        ("stratafs", "%s (%s, built %s)" % (meta.get("stratafs", "?"),
                                            meta.get("stratafs_version", "?"),
                                            meta.get("stratafs_built", "?"))),
        ("I/O engines", meta.get("io_note", "?")),
        ("machine", "kernel %s, %s CPUs, %s RAM; backing %s" % (
            meta.get("kernel", "?"), meta.get("cpus", "?"), meta.get("mem", "?"),
            meta.get("backing", "?"))),
        ("tools", "%s, fuse-overlayfs %s" % (meta.get("fio", "?"),
                                             meta.get("fuse_overlayfs", "?"))),
        ("sizes", "seq file %s, random-I/O file %s, copy-up file %s, "
         "%s files for metadata, tree of %s entries (entries files bytes: %s); "
         "fio runtime %s (time-based and cold random jobs), cold sequential reads capped at %s s" % (
             fill["seq"], fill["rand"], fill["copyup"], fill["nfiles"],
             fill["tree"], meta.get("tree", "?"),
             meta.get("runtime", "?") + (" s" if meta.get("runtime", "").isdigit() else ""),
             meta.get("cold_cap", "?"))),
        ("started", meta.get("started", "?")),
    ]
    if meta.get("total_seconds"):
        ts = int(meta["total_seconds"])
        info.append(("duration", "%d min %02d s in all (setup %s s)" % (
            ts // 60, ts % 60, meta.get("setup_seconds", "?"))))
    if meta.get("finished") != "1":
        info.append(("status", "**INTERRUPTED: partial results**"))
    for k, v in info:
        L.append("| %s | %s |" % (k, v.replace("|", "/")))
    L.append("")

    rounds = int(meta.get("rounds", "1") or 1)
    L.append("## Results")
    L.append("")
    L.append("Median of %d round(s)%s. ↑ higher is better, ↓ lower is better. "
             "`native` is a plain directory on the same filesystem (the "
             "physical limit); it has no daemon, no mount and no copy-up (its copy-up "
             "rows are a plain append). The id names the workload in the chart "
             "and in `raw/`." % (
                 rounds, ", then min–max" if rounds > 1 else ""))
    L.append("")
    L.append("| workload | id | unit | " + " | ".join(targets) + " |")
    L.append("| --- | --- | --- | " + " | ".join("---:" for _ in targets) + " |")
    for m in metrics:
        cells = []
        for t in targets:
            v = vals.get((m[0], t), [])
            f = fails.get((m[0], t), [])
            if not v and not f:
                cells.append("n/a")
                continue
            if not v:
                cells.append("**FAIL**")
                continue
            c = fmt(statistics.median(v))
            if len(v) > 1:
                c += " (%s–%s)" % (fmt(min(v)), fmt(max(v)))
            if f:
                c += " **%d failed**" % len(f)
            cells.append(c)
        L.append("| %s | `%s` | %s %s | %s |" % (
            m[2], m[0], m[3], "↑" if m[4] else "↓", " | ".join(cells)))
    L.append("")

    # Ratio columns: everyone against the kernel, stratafs also against
    # fuse-overlayfs, and the two stratafs engines against each other.
    cols = []
    if "kernel" in targets:
        cols += [(t, "kernel") for t in targets if t != "kernel"]
    if "fuse-overlayfs" in targets:
        cols += [(t, "fuse-overlayfs") for t in strata]
    if "stratafs-uring" in targets and "stratafs-sync" in targets:
        cols.append(("stratafs-uring", "stratafs-sync"))
    if "stratafs-ring" in targets and "stratafs-dev" in targets:
        cols.append(("stratafs-ring", "stratafs-dev"))
    if cols:
        L.append("## Relative speed")
        L.append("")
        L.append("Each cell is *A vs B* as a relative speed from the medians, "
                 "**higher is better for A**: A/B for MiB/s and ops/s, B/A "
                 "for seconds and MiB. 1.00 = as fast as B, 0.50 = half as "
                 "fast (or twice the time, or twice the memory).")
        L.append("")
        L.append("| workload | " + " | ".join("%s vs %s" % c for c in cols) + " |")
        L.append("| --- | " + " | ".join("---:" for _ in cols) + " |")
        for m in metrics:
            cells = []
            for a, b in cols:
                q = ratio(m, med[(m[0], a)], med[(m[0], b)], (a, b))
                cells.append("–" if q is None else "%.2f" % q)
            if all(c == "–" for c in cells):
                continue
            L.append("| %s | %s |" % (m[2], " | ".join(cells)))
        L.append("")

    # Things the stratafs author should look at first.
    notes = []
    for e in events:
        notes.append("%s stopped answering before `%s` in round %s and was "
                     "remounted." % (e["target"], e["workload"], e["round"]))
    for (k, t), f in sorted(fails.items()):
        rs = ", ".join("r%s: %s" % (r, msg[:160]) for r, msg in f)
        notes.append("`%s` failed on %s (%s)" % (k, t, rs))
    for s in strata:
        for m in metrics:
            if m[0] in NOT_CHARTED:
                continue
            qk = ratio(m, med[(m[0], s)], med.get((m[0], "kernel")))
            qf = ratio(m, med[(m[0], s)], med.get((m[0], "fuse-overlayfs")))
            if qf is not None and qf < 0.8:
                notes.append("%s is behind fuse-overlayfs on *%s*: %.2f× "
                             "(vs kernel %s)" % (s, m[2], qf,
                                                 "–" if qk is None else "%.2f×" % qk))
    if notes:
        L.append("## Notes")
        L.append("")
        L.extend("- " + n for n in notes)
        L.append("")

    L.append("Raw results: `raw/results.jsonl` (one line per measurement), "
             "`raw/fio/*.json` (fio's own output), `raw/meta.env`; "
             "chart `results.png` (relative speed vs kernel, log scale).")
    L.append("")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L))

    chart(out, metrics, targets, med, quick, meta)
    print(os.path.join(out, "results.md"))


def chart(out, metrics, targets, med, quick, meta):
    """Grouped bars: per workload, each target's relative speed against
    the kernel, on a log scale (the spread is several orders of
    magnitude), with a line at 1 = kernel."""
    if "kernel" not in targets:
        return
    bars = [t for t in targets if t != "kernel"]
    rows = []
    for m in metrics:
        if m[0] in NOT_CHARTED:
            continue
        qs = [ratio(m, med[(m[0], t)], med[(m[0], "kernel")], (t,))
              for t in bars]
        if all(q is None for q in qs):
            continue
        rows.append((m[0], qs))
    if not rows:
        return
    dat = os.path.join(out, "results.dat")
    with open(dat, "w") as f:
        f.write("# workload\t" + "\t".join(bars) + "\n")
        for k, qs in rows:
            f.write(k + "\t" + "\t".join("NaN" if q is None else "%.4f" % q
                                          for q in qs) + "\n")
    lo = min(q for _, qs in rows for q in qs if q is not None)
    hi = max(q for _, qs in rows for q in qs if q is not None)
    lo = min(lo / 1.5, 0.5)
    hi = max(hi * 1.5, 2)
    title = "Strata bench: speed relative to kernel overlayfs (higher is better, 1 = kernel)"
    if quick:
        title += " — QUICK MODE, not for comparison"
    colors = {"native": "#999999", "fuse-overlayfs": "#e69f00",
              "stratafs": "#0072b2", "stratafs-uring": "#0072b2",
              "stratafs-sync": "#56b4e9", "stratafs-passthrough": "#009e73",
              "stratafs-ring": "#cc79a7", "stratafs-dev": "#d55e00"}
    # Bars start at 1 (the kernel) and go up when faster, down when
    # slower: boxxyerror with explicit x and y extents, since gnuplot's
    # histogram style always starts bars at the bottom of the axis.
    n = len(bars)
    w = 0.8 / n
    plots = []
    for j, t in enumerate(bars):
        off = (j - (n - 1) / 2) * w
        plots.append(
            "'results.dat' using ($0%+.4f):(1):($0%+.4f):($0%+.4f):(1):%d "
            "with boxxyerror title '%s' lc rgb '%s'" % (
                off, off - w / 2, off + w / 2, j + 2, t, colors.get(t, "#009e73")))
    xtics = ", ".join("'%s' %d" % (k, i) for i, (k, _) in enumerate(rows))
    # Readable log-scale tics: 1-2-5 steps within the range.
    ytics = ", ".join("'%g' %g" % (v, v) for e in range(-4, 5)
                      for v in (10**e, 2 * 10**e, 5 * 10**e) if lo <= v <= hi)
    gp = os.path.join(out, "results.gp")
    with open(gp, "w") as f:
        f.write("""# Made by lib/report.py; run in this directory: gnuplot results.gp
set terminal pngcairo size 1800,800 font 'sans,10'
set output 'results.png'
set title "%s"
set datafile separator '\\t'
set datafile missing 'NaN'
set style fill solid 0.9 border -1
set logscale y
set yrange [%g:%g]
set xrange [-0.6:%g]
set ylabel 'relative speed vs kernel (log): above 1 faster, below 1 slower'
set grid ytics
set ytics (%s)
set xtics (%s) rotate by 40 right noenhanced
set key top left noenhanced opaque
set bmargin 11
set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 lc rgb 'black' front
plot %s
""" % (title, lo, hi, len(rows) - 0.4, ytics, xtics, ", \\\n     ".join(plots)))
    try:
        subprocess.run(["gnuplot", "results.gp"], cwd=out, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print("gnuplot failed: %s" % e, file=sys.stderr)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "fio":
        bw, iops = fio_values(sys.argv[2])
        print("%.2f %.1f" % (bw, iops))
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
