"""The cost model against measurement, and auto against the fastest plan measured in the same run
(docs/tuning.md, "Validation").

In one job (one process of `--devices` CPU devices, or `--processes` processes over shared memory or TCP): calibrate
the model (`jaxcoll.tune.calibrate`), then for every collective and size time every candidate plan (built-ins and
the plans synthesized for the job's layout, the large tree packings left out unless `--large`), alternating call by
call, `--reps` calls each, and put each plan's predicted time beside its measured median (and the spread, min-max).
The cells are visited in turn `--passes` times, the calls split among the visits, so that each cell's calls span
the run rather than the minute of its turn (`jaxcoll.tune.measure.time_cells`).
Then, per cell, what auto runs against the fastest median of the cell, and what the hand-tuned default
(`jaxcoll.algorithms.tuning`) ran: auto is the tuning file's choice where a usable one has the cell (`jaxcoll
tune` wrote it earlier; `JAXCOLL_TUNING` says where), else the model's pick with the calibration just made. Where
that first pass finds auto more than 10% slower than the cell's fastest median, the two are timed again head to
head (`--confirm` calls each), and the verdict is theirs: the fastest of a dozen noisy medians is as often the
luckiest plan as the fastest one.

    python benchmarks/tuning.py --sizes 4K,64K,1M,16M --markdown /tmp/t.md
    python benchmarks/tuning.py --processes 2 --transport tcp
    taskset -c 0 python benchmarks/tuning.py            # one core
    JAXCOLL_NET_DELAY_US=200 python benchmarks/tuning.py --processes 2 --transport tcp   # a slow link
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--sizes", default="4K,16K,64K,256K,1M,4M,16M,64M", help="per-rank input sizes")
    p.add_argument("--devices", type=int, default=8, help="CPU devices in all processes together (default 8)")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--passes", type=int, default=None, help="visit every cell this many times, --reps calls of "
                   "each candidate split among the visits: a cell's samples then span the run, not the minute of its "
                   "turn (jaxcoll.tune.measure.time_cells; default 3, at most --reps)")
    p.add_argument("--confirm", type=int, default=15, help="calls of auto's choice and the fastest plan timed again "
                   "head to head where the first pass found auto more than 10%% slower (0: no second pass)")
    p.add_argument("--large", action="store_true", help="also time the tree packings at their throughput chunks")
    p.add_argument("--markdown", metavar="MD", help="also write the tables to this file")
    p.add_argument("--json", metavar="PATH", help="also write every sample (calibration and cells) to this file, "
                   "for refitting the model apart (benchmarks/tuning_refit.py)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from jaxcoll import launch

    args = parse_args(argv)
    if args.processes > 1 and not launch.in_job():
        env = {"JAXCOLL_TRANSPORT": "tcp"} if args.transport == "tcp" else {}
        results = launch.launch(args.processes, [os.path.abspath(__file__), *sys.argv[1:]],
                                local_devices=args.devices // args.processes, env=env, timeout_s=4 * 3600)
        print(results[0].stdout, end="")
        for r in results:
            if r.returncode:
                print(f"process {r.process} exited with {r.returncode}:\n{r.stderr[-3000:]}", file=sys.stderr)
        return max(r.returncode or 0 for r in results)
    return measure_here(args)


def measure_here(args) -> int:
    import jax

    from jaxcoll import launch
    process = launch.start(args.devices)
    from jaxcoll.cli.bench import format_size, parse_size
    from jaxcoll.sim.machine import seconds
    from jaxcoll.tune import calibrate, choice, file, measure, registry, run

    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    n = len(devices)
    processes = tuple(int(d.process_index) for d in devices)
    spans = len(set(processes)) > 1
    hosts = None
    from jaxcoll import distributed
    if spans:
        hosts = distributed.layout().hosts
    procs = processes if spans else None
    hs = tuple(hosts) if spans and len(set(hosts)) > 1 else None
    say = print if process == 0 else (lambda *a, **k: None)
    record: list = []
    measured: list = []
    model = calibrate(devices, reps=args.reps, hosts=hosts, record=record, measured=measured)
    passes = args.passes or measure.default_passes(args.reps)
    samples = {"layout": {"processes": list(processes), "hosts": list(hs) if hs else None},
               "model": model.to_json(), "calibration": record, "cells": [], "passes": passes}
    where = (f"{n} CPU devices, layout {file.layout_key(processes, hs)}, {file.machine()['cores']} cores, "
             f"{os.environ.get('JAXCOLL_NET_DELAY_US', '0')} us network delay, {args.reps} calls a candidate in "
             f"{passes} passes over the cells")
    lines = [f"{where}", "", f"model: `{json.dumps(model.to_json())}`", ""]
    errors, verdicts, timed = [], [], []
    # A tuning file `jaxcoll tune` wrote earlier for this layout: its cells and its model, read once
    tf = file.current()
    key = file.layout_key(processes, hs)
    kept = tf and tf.model(key)
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    cells = [(collective, measure.per_rank_elements(parse_size(text), n, "float32") * 4) for collective in collectives
             for text in args.sizes.split(",")]
    candidates = {(c, size): registry.candidates(c, n, procs, hs, large=args.large) for c, size in cells}
    measured_cells = dict(zip(cells, measure.time_cells([(c, size, candidates[c, size]) for c, size in cells], mesh,
                                                        reps=args.reps, passes=passes)))
    for collective in collectives:
        lines += [f"### {collective}", "", "| size/rank | plan | predicted us | measured us (min-max) | error |",
                  "|---:|---|---:|---:|---:|"]
        for size in [size for c, size in cells if c == collective]:
            plans = candidates[collective, size]
            times = measured_cells[collective, size]
            medians = {k: statistics.median(v) for k, v in times.items()}
            samples["cells"].append({"collective": collective, "bytes": size, "seconds": times})
            timed += [(plans[name], size, m) for name, m in medians.items()]
            ranked = choice.rank_by_model(collective, n, size, procs, hs, large=args.large, the_model=model)
            # What the measurement also holds: its program's launch, shared among its calls (predict() leaves it out)
            launch = model.launch_s / measure.iterations(size)
            predicted = {name: s + launch for s, name, _ in ranked}
            for name in sorted(medians, key=medians.get):
                err = predicted[name] / medians[name] - 1
                errors.append((collective, size, name, err))
                lines.append(f"| {format_size(size)} | {name} | {predicted[name] * 1e6:.1f} | "
                             f"{medians[name] * 1e6:.1f} ({min(times[name]) * 1e6:.1f}-{max(times[name]) * 1e6:.1f})"
                             f" | {err:+.0%} |")
            fastest = min(medians, key=medians.get)
            auto = ranked[0][1]
            cell = tf and tf.cell(key, collective, n, size, "float32")
            source = "model"
            if cell and cell["choice"] in medians:
                auto, source = cell["choice"], "file"
            elif kept:
                # as auto does: a cell the file lacks is ranked by the file's model, not this run's calibration
                auto, source = choice.rank_by_model(collective, n, size, procs, hs, large=args.large,
                                                    the_model=kept)[0][1], "file's model"
            default = run.default_name(collective, n, size, processes)
            # Every process of a job must time the same programs: process 0's measurements decide.
            fastest, confirm = json.loads(distributed.agree(
                f"bench/tuning/{collective}/{size}",
                lambda: json.dumps([fastest, bool(args.confirm) and medians[auto] > 1.10 * medians[fastest]])))
            first = medians[auto] / medians[fastest]
            if confirm:
                # The fastest median of a dozen candidates, a few noisy calls each, is the luckiest as often as the
                # fastest (the winner's curse): time the two again, head to head, before calling auto slower.
                again = measure.time_cell(collective, size, {auto: plans[auto], fastest: plans[fastest]}, mesh,
                                          reps=args.confirm)
                medians = {**medians, auto: statistics.median(again[auto]),
                           fastest: statistics.median(again[fastest])}
                samples["cells"][-1]["confirm"] = again
            verdicts.append((collective, size, f"{auto} ({source})", medians[auto], fastest, medians[fastest], default,
                             medians.get(default, float("nan")), first))
        lines.append("")
    errs = np.abs([e for *_, e in errors])
    lines += ["### prediction error", "", f"median |error| {np.median(errs):.0%}, 90th percentile "
              f"{np.percentile(errs, 90):.0%}, over {len(errs)} (plan, size) pairs", ""]
    for collective in dict.fromkeys(c for c, *_ in errors):
        e = np.abs([x for c, *_, x in errors if c == collective])
        lines.append(f"- {collective}: median {np.median(e):.0%}, 90th percentile {np.percentile(e, 90):.0%}")
    from tuning_refit import held_out_by_size, held_out_line, repeatability, repeatability_line
    lines += ["", repeatability_line(repeatability(record, samples["cells"]))]
    if len({s for _, s, _ in timed}) > 1:
        lines += ["", held_out_line(held_out_by_size(model, measured, timed, (procs, hs)))]
    if kept:
        # The tuning file's model: its error on this run's cells, apart for the sizes its run did not measure
        tuned = {c["bytes"] for c in tf.layouts[key]["cells"]}
        e = [(s in tuned, (seconds(p, s, kept, processes=procs, hosts=hs) + kept.launch_s / measure.iterations(s))
              / t - 1) for p, s, t in timed]
        parts = (("every cell", [x for _, x in e]), ("sizes it did not measure", [x for m, x in e if not m]))
        for label, part in parts:
            if part:
                a = np.abs(part)
                lines.append(f"- the tuning file's model ({tf.path}), {label}: median |error| {np.median(a):.1%}, "
                             f"90th {np.percentile(a, 90):.1%} ({len(a)} pairs)")
    lines += ["", "### auto against the fastest measured", "",
              "| collective | size/rank | auto | us | fastest | us | auto / fastest | first pass | default | us |",
              "|---|---:|---|---:|---|---:|---:|---:|---|---:|"]
    within = within_first = 0
    for collective, size, auto, t_auto, fastest, t_fast, default, t_default, first in verdicts:
        ratio = t_auto / t_fast
        within += ratio <= 1.10
        within_first += first <= 1.10
        lines.append(f"| {collective} | {format_size(size)} | {auto} | {t_auto * 1e6:.1f} | {fastest} | "
                     f"{t_fast * 1e6:.1f} | {ratio:.2f} | {first:.2f} | {default} | {t_default * 1e6:.1f} |")
    lines += ["", f"auto within 10% of the fastest in {within} of {len(verdicts)} cells ({within_first} in the first "
              f"pass; the cells it missed there timed again head to head, {args.confirm} calls each)", ""]
    say("\n".join(lines))
    if args.json and process == 0:
        with open(args.json, "w") as f:
            json.dump(samples, f)
    if args.markdown and process == 0:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
