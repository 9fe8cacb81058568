"""Seeing a plan: a picture of ranks over time with an arrow per transfer and a colour per chunk, and a text
summary (steps per rank, bytes per link). `jaxcoll plan show FILE` is the command-line face of this module.

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


def summary(plan: Plan, input_bytes: int = 1 << 20) -> str:
    """A text summary: per rank its lanes and steps by kind, then the bytes each link carries for a rank input
    of `input_bytes` bytes, and the busiest link."""
    lines = [f"{plan.name or 'plan'}: {plan.collective.value} over {plan.nranks} ranks, chunk factor "
             f"{plan.chunk_factor}, {'in place' if plan.in_place else 'out of place'}, {plan.num_steps()} steps"]
    lines.append(f"{'rank':>4} {'lanes':>5} {'data':>5} {'signal':>6} {'wait':>5} {'barrier':>7} {'rounds':>6}")
    when = rounds(plan)
    for r, prog in enumerate(plan.ranks):
        kinds = Counter(s.op for lane in prog.lanes for s in lane.steps)
        data = sum(v for k, v in kinds.items() if k.is_data)
        last = max((t for (rr, _, _), t in when.items() if rr == r), default=-1) + 1
        lines.append(f"{r:>4} {len(prog.lanes):>5} {data:>5} {kinds[Op.SIGNAL]:>6} {kinds[Op.WAIT]:>5} "
                     f"{kinds[Op.BARRIER]:>7} {last:>6}")
    chunk_bytes = input_bytes / plan.ranks[0].input_chunks
    links = transfers(plan, chunk_bytes)
    lines.append(f"bytes per link for {input_bytes} input bytes per rank:")
    for (a, b), v in sorted(links.items()):
        lines.append(f"  {a} -> {b}: {v:,.0f} ({v / input_bytes:.3g}x input)")
    if links:
        (a, b), v = max(links.items(), key=lambda kv: kv[1])
        lines.append(f"busiest link {a} -> {b}: {v:,.0f} bytes; total {sum(links.values()):,.0f} bytes")
    return "\n".join(lines)


def draw(plan: Plan, path, *, title: str | None = None) -> None:
    """Draw the plan to `path` (PNG or SVG by its suffix): ranks top to bottom, rounds left to right, a dot per
    data step (in its lane's band of the rank row), an arrow per transfer, one colour per chunk (its input or output index)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    when = rounds(plan)
    nt = max(when.values(), default=0) + 1
    fig, ax = plt.subplots(figsize=(min(4 + 0.6 * nt, 40), 1.2 + 0.8 * plan.nranks))
    cmap = plt.get_cmap("tab20")

    def y(rank: int, lane: int = 0) -> float:
        nl = max(1, len(plan.ranks[rank].lanes))
        return rank + (lane - (nl - 1) / 2) * (0.5 / nl)

    for (r, l, i), t in when.items():
        s = plan.ranks[r].lanes[l].steps[i]
        named = [x for x in s.srcs + s.dsts if x.buffer is not Buffer.SCRATCH]
        color = cmap((named[0].index if named else (s.dsts or s.srcs)[0].index % plan.chunk_factor) % 20)
        ax.plot(t, y(r, l), "o", color=color, ms=6, zorder=3)
        for src in s.srcs:
            if src.rank != r:
                ax.annotate("", xy=(t, y(r, l)), xytext=(t - 0.45, y(src.rank)),
                            arrowprops=dict(arrowstyle="->", color=color, lw=1.2), zorder=2)
        for dst in s.dsts:
            if dst.rank != r:
                ax.annotate("", xy=(t + 0.45, y(dst.rank)), xytext=(t, y(r, l)),
                            arrowprops=dict(arrowstyle="->", color=color, lw=1.2), zorder=2)
        ax.text(t, y(r, l) + 0.12, s.op.value.replace("read_reduce", "rr").replace("reduce", "red"),
                fontsize=6, ha="center", va="bottom")
    ax.set_yticks(range(plan.nranks), [f"rank {r}" for r in range(plan.nranks)])
    ax.set_ylim(plan.nranks - 0.5, -0.5)
    ax.set_xlim(-0.7, nt - 0.3)
    ax.set_xlabel("round (one data step per lane per round)")
    ax.set_title(title or f"{plan.name or 'plan'}: {plan.collective.value}, {plan.nranks} ranks "
                          f"(colour: chunk position)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
