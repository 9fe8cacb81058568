"""Seeing a plan: a picture of ranks over time with an arrow per transfer and a colour per chunk (for a large plan a
summary picture), and a text summary (steps per rank, bytes per link). `jaxcoll plan show FILE` is the command-line
face of this module.

Time is counted in rounds: in each round every lane runs its ready signals and waits, then at most one data
step (on `jaxcoll.lang.stepper`, lanes in rank order), so a step's round is the earliest it can run when every
data step takes one unit.
"""

from __future__ import annotations

from collections import Counter

from jaxcoll.lang import stepper
from jaxcoll.plan.ir import Buffer, Op, Plan


def rounds(plan: Plan) -> dict[tuple[int, int, int], int]:
    """The round of every data step (see the module docstring). Steps of a stuck plan are left out."""
    run = stepper.for_plan(plan)
    when: dict[tuple[int, int, int], int] = {}
    t = 0
    while True:
        progress = False
        for (r, l) in run.lanes:
            steps = plan.ranks[r].lanes[l].steps
            for (rr, ll), i in run.run((r, l), data_steps=1):
                if (rr, ll) == (r, l) and steps[i].op.is_data:
                    when[r, l, i] = t
                progress = True
        if not progress:
            return when
        t += 1


def transfers(plan: Plan, chunk_bytes: float) -> Counter:
    """Bytes moved over each link (src rank, dst rank): a remote source is read from its rank, a remote
    destination written to its rank; `chunk_bytes` is the size of one chunk."""
    links: Counter = Counter()
    for r, _, _, s in plan.steps():
        if not s.op.is_data:
            continue
        for ref in s.srcs:
            if ref.rank != r:
                links[ref.rank, r] += ref.count * chunk_bytes
        for ref in s.dsts:
            if ref.rank != r:
                links[r, ref.rank] += ref.count * chunk_bytes
    return links


def summary(plan: Plan, input_bytes: int | None = None, *, when: dict | None = None) -> str:
    """A text summary: per rank its lanes and steps by kind, then what each link carries as a multiple of a rank's
    input (a plan serves every size), in bytes too for an input of `input_bytes` bytes per rank, and the busiest
    link. `when` is `rounds(plan)` where the caller has it already."""
    lines = [f"{plan.name or 'plan'}: {plan.collective.value} over {plan.nranks} ranks, chunk factor "
             f"{plan.chunk_factor}, {'in place' if plan.in_place else 'out of place'}, {plan.num_steps()} steps"]
    lines.append(f"{'rank':>4} {'lanes':>5} {'data':>5} {'signal':>6} {'wait':>5} {'barrier':>7} {'rounds':>6}")
    when = rounds(plan) if when is None else when
    last = Counter()
    for (r, _, _), t in when.items():
        last[r] = max(last[r], t + 1)
    for r, prog in enumerate(plan.ranks):
        kinds = Counter(s.op for lane in prog.lanes for s in lane.steps)
        data = sum(v for k, v in kinds.items() if k.is_data)
        lines.append(f"{r:>4} {len(prog.lanes):>5} {data:>5} {kinds[Op.SIGNAL]:>6} {kinds[Op.WAIT]:>5} "
                     f"{kinds[Op.BARRIER]:>7} {last[r]:>6}")
    links = transfers(plan, 1 / plan.ranks[0].input_chunks)  # in units of a rank's input
    if input_bytes is None:
        lines.append("per link, in multiples of a rank's input (--bytes N also gives bytes for N input bytes a rank):")
        lines += [f"  {a} -> {b}: {v:.3g}x input" for (a, b), v in sorted(links.items())]
    else:
        lines.append(f"bytes per link for {input_bytes} input bytes per rank:")
        lines += [f"  {a} -> {b}: {v * input_bytes:,.0f} ({v:.3g}x input)" for (a, b), v in sorted(links.items())]
    if links:
        (a, b), v = max(links.items(), key=lambda kv: kv[1])
        total = sum(links.values())
        if input_bytes is None:
            lines.append(f"busiest link {a} -> {b}: {v:.3g}x input; total {total:.3g}x input")
        else:
            lines.append(f"busiest link {a} -> {b}: {v * input_bytes:,.0f} bytes; total {total * input_bytes:,.0f} "
                         "bytes")
    return "\n".join(lines)


# A plan of more data steps than this is drawn as a summary picture (steps per rank over time, and the bytes per
# link): one marker and arrow per step stops being legible, and matplotlib takes minutes over 100k of them.
DETAIL_STEPS = 2000

# The marker of each data step kind in the step-by-step picture (its legend names them).
MARKERS = {Op.COPY: "o", Op.REDUCE: "s", Op.PUT: ">", Op.GET: "<", Op.READ_REDUCE: "D", Op.REDUCE_PUT: "P",
           Op.READ_REDUCE_PUT: "X", Op.ZERO: "."}


def draw(plan: Plan, path, *, title: str | None = None, when: dict | None = None) -> str:
    """Draw the plan to `path` (PNG or SVG by its suffix) and say which picture it is: "steps", one marker per
    data step (ranks top to bottom, each lane a line of its rank's band, rounds left to right, a marker shape per
    step kind, an arrow per transfer, one colour per chunk), or for a plan of more than DETAIL_STEPS data steps
    "summary" (data steps per rank and round as a heat map, and the share of the traffic each link carries).
    `when` is `rounds(plan)` where the caller has it already."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    when = rounds(plan) if when is None else when
    if len(when) > DETAIL_STEPS:
        _draw_summary(plan, path, when, title, plt)
        return "summary"
    nt = max(when.values(), default=0) + 1
    lanes = max(1, max(len(p.lanes) for p in plan.ranks))
    band = 0.8 / lanes  # the rank's row is 1 high; its lanes share 0.8 of it
    fig, ax = plt.subplots(figsize=(min(5 + 0.45 * nt, 40), min(1.5 + plan.nranks * (0.5 + 0.12 * lanes), 40)))
    cmap = plt.get_cmap("tab20")
    ms = max(2.5, min(7.0, 40 * band))

    def y(rank: int, lane: int = 0) -> float:
        nl = max(1, len(plan.ranks[rank].lanes))
        return rank + (lane - (nl - 1) / 2) * band

    kinds = set()
    for (r, l, i), t in when.items():
        s = plan.ranks[r].lanes[l].steps[i]
        named = [x for x in s.srcs + s.dsts if x.buffer is not Buffer.SCRATCH]
        color = cmap((named[0].index if named else (s.dsts or s.srcs)[0].index % plan.chunk_factor) % 20)
        ax.plot(t, y(r, l), MARKERS[s.op], color=color, ms=ms, zorder=3, markeredgecolor="black",
                markeredgewidth=0.3)
        kinds.add(s.op)
        arrow = dict(arrowstyle="->", color=color, lw=0.8 if lanes > 2 else 1.2, alpha=0.8)
        for src in s.srcs:
            if src.rank != r:
                ax.annotate("", xy=(t, y(r, l)), xytext=(t - 0.45, y(src.rank)), arrowprops=arrow, zorder=2)
        for dst in s.dsts:
            if dst.rank != r:
                ax.annotate("", xy=(t + 0.45, y(dst.rank)), xytext=(t, y(r, l)), arrowprops=arrow, zorder=2)
    for r in range(plan.nranks - 1):
        ax.axhline(r + 0.5, color="gray", lw=0.5, alpha=0.5)
    for op in (op for op in MARKERS if op in kinds):
        ax.plot([], [], MARKERS[op], color="white", markeredgecolor="black", label=op.value)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="step", title_fontsize=8)
    ax.set_yticks(range(plan.nranks), [f"rank {r}" for r in range(plan.nranks)])
    ax.set_ylim(plan.nranks - 0.5, -0.5)
    ax.set_xlim(-0.7, nt - 0.3)
    ax.set_xlabel("round (one data step per lane per round)" + (f"; {lanes} lanes at most per rank, one line each"
                                                               if lanes > 1 else ""))
    ax.set_title(title or f"{plan.name or 'plan'}: {plan.collective.value}, {plan.nranks} ranks "
                          f"(colour: chunk position)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "steps"


def _draw_summary(plan: Plan, path, when: dict, title: str | None, plt) -> None:
    import numpy as np

    nt = max(when.values(), default=0) + 1
    columns = min(nt, 400)
    busy = np.zeros((plan.nranks, columns))
    for (r, _, _), t in when.items():
        busy[r, t * columns // nt] += 1
    share = np.zeros((plan.nranks, plan.nranks))
    links = transfers(plan, 1 / plan.ranks[0].input_chunks)
    for (a, b), v in links.items():
        share[a, b] = v
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 2 + 0.3 * min(plan.nranks, 64)),
                                      gridspec_kw=dict(width_ratios=(3, 1)))
    im = left.imshow(busy, aspect="auto", interpolation="nearest", cmap="viridis",
                     extent=(0, nt, plan.nranks - 0.5, -0.5))
    fig.colorbar(im, ax=left, label=f"data steps per {nt / columns:.3g} rounds")
    left.set_xlabel("round")
    left.set_ylabel("rank")
    left.set_title(f"data steps over time ({len(when)} steps, {nt} rounds)")
    cmap = plt.get_cmap("magma_r").with_extremes(bad="white")
    im = right.imshow(np.where(share > 0, share, np.nan), cmap=cmap, vmin=0, interpolation="nearest")
    if plan.nranks <= 16:
        for (a, b), v in links.items():
            right.text(b, a, f"{v:.2g}", ha="center", va="center", fontsize=6,
                       color="white" if v > 0.6 * share.max() else "black")
    fig.colorbar(im, ax=right, label="x a rank's input")
    right.set_xlabel("to rank")
    right.set_ylabel("from rank")
    right.set_title("traffic per link")
    fig.suptitle(title or f"{plan.name or 'plan'}: {plan.collective.value}, {plan.nranks} ranks: summary (more "
                          f"than {DETAIL_STEPS} data steps to draw one by one)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
