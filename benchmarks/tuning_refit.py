"""The machine model against samples already taken: refit and re-predict without measuring again
(docs/tuning.md, "Validation").

`benchmarks/tuning.py --json S.json` writes every sample of a run (the calibration's calls and every candidate of
every cell). This program reads one or more such files, fits the model to each run's calibration calls exactly as
`jaxcoll.tune.calibrate` does, and reports the prediction error over the run's cells: overall, per collective and
size, the worst (plan, size) pairs with the share of each term in their prediction, and how far the samples of a
pair spread and how far the pairs measured twice (in calibration and in a cell) moved between the two (the
measurement's own noise, a floor under any model's error). `--fit-all` also fits to the cells
themselves: the error left then is what the model's formula cannot express, whatever its constants.

    python benchmarks/tuning_refit.py S.json [S2.json ...] [--worst 20] [--fit-all] [--tuning T.json] [--fastest]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import numpy as np


def rows_of(entries, plans, shape, layout, statistic=statistics.median):
    """The fit's rows (`jaxcoll.tune.calibration.row`) and the `statistic` (median, or min: the fastest call) of the
    seconds of (collective, bytes, name, samples)."""
    from jaxcoll.tune.calibration import row

    rows = [row(plans(collective, name), size, shape, layout) for collective, size, name, _ in entries]
    return np.asarray(rows), np.asarray([statistic(samples) for *_, samples in entries])


def held_out_by_size(model, measured, cells, layout=(None, None)) -> list[float]:
    """The model a tuning run keeps (`jaxcoll.tune.run.refined`: calibration's calls and the cells' fitted
    together) checked on sizes it did not measure: each size's cells predicted by `model` refitted to the
    calibration calls `measured` [(plan, bytes, seconds)] and the `cells` [(plan, bytes, seconds)] of every other
    size, the prediction with its program's launch share as measured. Returns each cell's relative error."""
    from jaxcoll.sim.machine import seconds
    from jaxcoll.tune import calibration, measure

    errors = []
    for size in sorted({s for _, s, _ in cells}):
        fitted = calibration.refit(model, [*measured, *((p, s, t) for p, s, t in cells if s != size)], layout)
        errors += [(seconds(p, s, fitted, processes=layout[0], hosts=layout[1])
                    + fitted.launch_s / measure.iterations(s)) / t - 1 for p, s, t in cells if s == size]
    return errors


def held_out_line(errors) -> str:
    a = np.abs(errors)
    return (f"the model refitted to the run's other sizes (what a tuning run keeps), each size held out: median "
            f"|error| {np.median(a):.1%}, 90th {np.percentile(a, 90):.1%}")


def repeatability(calibration, cells) -> list[tuple[str, int, str, float]]:
    """The (plan, size) pairs a run measured twice, in calibration and among its cells' candidates: (collective,
    bytes, name, cell median / calibration median - 1). How far one measurement of a call moves from another of
    the same call in the same run is a floor under what any model's error can show."""
    cal = {(r["collective"], r["bytes"], r["name"]): statistics.median(r["seconds"]) for r in calibration}
    out = []
    for c in cells:
        for name, samples in c["seconds"].items():
            first = cal.get((c["collective"], c["bytes"], name))
            if first:
                out.append((c["collective"], c["bytes"], name, statistics.median(samples) / first - 1))
    return out


def repeatability_line(pairs) -> str:
    if not pairs:
        return "repeatability: no (plan, size) pair measured both in calibration and in a cell"
    d = np.abs([x for *_, x in pairs])
    return (f"repeatability: the same (plan, size) measured in calibration and again in its cell differs by "
            f"{np.median(d):.0%} at the median, {np.percentile(d, 90):.0%} at the 90th percentile "
            f"({len(d)} pairs): a floor under the prediction error this run can show")


def term_names(shape) -> list[str]:
    return (["call", "helpers", "steps"] + [f"cache{size >> 20}M" for size, _ in shape.caches] +
            ["memory", "reduce", "stream", "fresh", "crossing", "net bytes", "net msgs", "process rounds", "rounds",
             "launch"])


def file_layout(processes, hosts) -> str:
    from jaxcoll.tune import file
    return file.layout_key(processes, hosts)


def analyse(path: str, worst: int, fit_all: bool, overrides: dict, without=(), tuning=(),
            statistic=statistics.median, train=(), drop=()) -> list[float]:
    from jaxcoll.sim.machine import MachineModel, cpu_runtime
    from jaxcoll.tune import calibration, registry

    data = json.load(open(path))
    processes = tuple(data["layout"]["processes"])
    hosts = tuple(data["layout"]["hosts"]) if data["layout"]["hosts"] else None
    spans = len(set(processes)) > 1
    procs = processes if spans else None
    layout = (procs, hosts)
    # The run's machine (its cache sizes, threads, solo threshold), the model's structure as this jaxcoll has it
    run = MachineModel.from_json(data["model"])
    overrides = dict(overrides)
    caches = run.caches
    if "caches" in overrides:  # sizes in bytes, smallest first; any rate: the fit sets them
        caches = tuple((int(size), run.caches[-1][1]) for size in overrides.pop("caches"))
    shape = dataclasses.replace(cpu_runtime(caches=caches, threads=run.threads, solo_bytes=run.solo_bytes),
                                **{k: type(getattr(run, k))(v) for k, v in overrides.items()})
    n = len(processes)
    training = {(c, name): plan for c, _, d in calibration.training(processes) for name, plan in d.items()}
    candidates: dict = {}

    def plans(collective, name):
        if collective not in candidates:
            candidates[collective] = ({} if collective == "ppermute" else
                                      registry.candidates(collective, n, procs, hosts, large=False))
        found = candidates[collective].get(name)
        return found if found is not None else training[collective, name]

    # Probes this jaxcoll's calibration no longer has are left out: their plans cannot be rebuilt by name
    cal = [(r["collective"], r["bytes"], r["name"], r["seconds"]) for r in data["calibration"]
           if r["name"] not in drop and (r["collective"], r["name"]) in training]
    val = [(c["collective"], c["bytes"], name, s) for c in data["cells"] for name, s in c["seconds"].items()]
    # Cells' calls taken into the fit as well: what a calibration that also measured them would make of the rest
    cal += [v for v in val if (v[2], v[1]) in train]
    if "fresh_bytes" not in overrides:  # the threshold of fresh pages that calibration would choose
        ctime = np.asarray([statistic(samples) for *_, samples in cal])
        chosen = calibration.fit_calls(shape, [(plans(c, name), size) for c, size, name, _ in cal], ctime, layout)
        shape = dataclasses.replace(shape, fresh_bytes=chosen.fresh_bytes)
    crow, ctime = rows_of(cal, plans, shape, layout, statistic)
    vrow, vtime = rows_of(val, plans, shape, layout, statistic)
    names = term_names(shape)
    for term in without:  # the model without this term: its column is no work (the fit keeps the default)
        crow[:, names.index(term)] = vrow[:, names.index(term)] = 0.0
    model = calibration.fit(shape, crow, ctime)
    coef = calibration.vector(model)
    print(f"## {path}: {len(cal)} calibration calls, {len(val)} (plan, size) pairs measured in "
          f"{data.get('passes', 1)} pass(es) over the cells, each call's {'fastest' if statistic is min else 'median'}"
          f"; fresh pages from {shape.fresh_bytes >> 10} KiB a rank")
    print("constants: " + ", ".join(f"{k} {v:.3g}" for k, v in zip(names, coef)))
    cerr = crow @ coef / ctime - 1
    print(f"calibration fit: median |error| {np.median(np.abs(cerr)):.0%}, 90th {np.percentile(np.abs(cerr), 90):.0%}")
    pred = vrow @ coef
    err = pred / vtime - 1
    spread = np.array([(max(s) - min(s)) / statistics.median(s) for *_, s in val])
    a = np.abs(err)
    print(f"validation: median |error| {np.median(a):.1%}, 90th {np.percentile(a, 90):.1%}; samples' own spread "
          f"(max-min)/median: median {np.median(spread):.0%}, 90th {np.percentile(spread, 90):.0%}")
    print(repeatability_line(repeatability(data["calibration"], data["cells"])))
    print(held_out_line(held_out_by_size(
        model, [(plans(c, name), size, statistic(x)) for c, size, name, x in cal],
        [(plans(c, name), size, statistic(x)) for c, size, name, x in val], layout)))
    for collective in dict.fromkeys(c for c, *_ in val):
        idx = [i for i, v in enumerate(val) if v[0] == collective]
        by_size = {}
        for i in idx:
            by_size.setdefault(val[i][1], []).append(err[i])
        print(f"- {collective}: median {np.median(a[idx]):.0%}, 90th {np.percentile(a[idx], 90):.0%}; by size "
              "(median signed error): " + ", ".join(f"{s >> 10}K {np.median(e):+.0%}" for s, e in by_size.items()))
    print(f"worst {worst}: plan, size, measured us, predicted us, error, spread, share of each term")
    for i in np.argsort(-a)[:worst]:
        c, size, name, s = val[i]
        parts = vrow[i] * coef
        shares = ", ".join(f"{names[j]} {parts[j] / pred[i]:.0%}" for j in np.argsort(-parts)[:4] if parts[j] > 0)
        print(f"  {c} {size >> 10}K {name}: {vtime[i] * 1e6:.0f} {pred[i] * 1e6:.0f} {err[i]:+.0%} "
              f"(spread {spread[i]:.0%}) [{shares}]")
    medians = [statistics.median(x) for *_, x in val]
    picks = {"model": {}}
    for i, (c, size, name, _) in enumerate(val):
        best = picks["model"].get((c, size))
        if best is None or pred[i] < best[1]:
            picks["model"][c, size] = (name, pred[i])
    picks["model"] = {k: v[0] for k, v in picks["model"].items()}
    for path_t in tuning:
        cells = json.load(open(path_t))["layouts"]
        entry = next(iter(cells.values())) if len(cells) == 1 else cells.get(file_layout(processes, hosts))
        picks[path_t] = {(x["collective"], x["bytes"]): x["choice"] for x in (entry or {}).get("cells", [])}
    measured = {}
    for (c, size, name, _), m in zip(val, medians):
        measured.setdefault((c, size), {})[name] = m
    for source, chosen in picks.items():
        ratios, missed = [], []
        for key, ms in measured.items():
            name = chosen.get(key)
            if name not in ms:
                continue
            ratios.append(ms[name] / min(ms.values()))
            if ratios[-1] > 1.10:
                missed.append(f"{key[0]} {key[1] >> 10}K {name} {ratios[-1]:.2f}x")
        within = sum(r <= 1.10 for r in ratios)
        print(f"auto by {source}: within 10% of the fastest median in {within} of {len(ratios)} cells"
              + (f"; missed: {', '.join(missed)}" if missed else ""))
    if fit_all:
        both = calibration.fit(shape, np.vstack([crow, vrow]), np.concatenate([ctime, vtime]))
        e = np.abs(vrow @ calibration.vector(both) / vtime - 1)
        print(f"fitted to calibration and cells together: median |error| {np.median(e):.1%}, "
              f"90th {np.percentile(e, 90):.1%}; constants: "
              + ", ".join(f"{k} {v:.3g}" for k, v in zip(names, calibration.vector(both))))
    print()
    return list(a)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--worst", type=int, default=20)
    p.add_argument("--fit-all", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a MachineModel field of the model's shape, e.g. fresh_bytes=33554433, or the cache levels' "
                   "sizes in bytes, smallest first, e.g. caches=2097152:8388608")
    p.add_argument("--tuning", action="append", default=[], metavar="FILE",
                   help="a tuning file: how its choices fare against the fastest measured plan of each cell")
    p.add_argument("--without", default="", help="terms to leave out, comma-separated (e.g. reduce,stream)")
    p.add_argument("--fastest", action="store_true",
                   help="fit and judge on each plan's fastest call instead of its median: what the machine does when "
                   "nothing else runs, which other work on a busy machine moves less than the median")
    p.add_argument("--train", default="", metavar="NAME@SIZE,...",
                   help="also fit to these cells' calls (e.g. direct@262144,two_shot@262144): what a calibration "
                   "that measured them would predict for the rest")
    p.add_argument("--drop", default="", metavar="NAME,...", help="calibration probes to leave out of the fit")
    args = p.parse_args(argv)
    train = {(name, int(size)) for name, size in (x.split("@") for x in args.train.split(",") if x)}
    overrides = {k: (tuple(int(float(s)) for s in v.split(":")) if k == "caches" else float(v))
                 for k, v in (x.split("=", 1) for x in args.set)}
    for path in args.files:
        analyse(path, args.worst, args.fit_all, overrides, [t for t in args.without.split(",") if t], args.tuning,
                min if args.fastest else statistics.median, train, [x for x in args.drop.split(",") if x])
    return 0


if __name__ == "__main__":
    sys.exit(main())
