"""Reading a trace (`jaxcoll trace show`): a text summary per rank (time in steps, time waiting, and who it waited
for), and a picture of the lanes over time with the waits marked, so that a slow rank or a long wait stands out.

Events are the "X" events of `jaxcoll.observe.trace_events.load`. No JAX here.
"""

from __future__ import annotations

from collections import defaultdict

from jaxcoll.observe.trace_events import ARRIVAL, ARRIVAL_NAME, ARRIVAL_TRACK, GROUP_STRIDE, pid_of, track_name

WAITS = ("wait", "barrier")
# A colour per step kind (data steps in blues and greens; waits red, barriers grey, signals black).
COLOURS = {"copy": "#9ecae1", "reduce": "#6baed6", "put": "#2171b5", "get": "#41ab5d", "read_reduce": "#238b45",
           "reduce_put": "#08519c", "read_reduce_put": "#00441b", "zero": "#c6dbef", "signal": "#000000",
           "wait": "#e6550d", "barrier": "#969696", ARRIVAL_NAME: "#fdae6b"}


def one_call(events: list[dict], k: int) -> list[dict]:
    """The events of the k-th call (from 0, in the order the calls started) of each file's trace."""
    first: dict = {}
    for e in events:
        key = (e["args"].get("file", 0), e["args"]["callsite"], e["args"]["call"])
        first[key] = min(first.get(key, e["ts"]), e["ts"])
    order = defaultdict(list)
    for key in sorted(first, key=first.get):
        order[key[0]].append(key)
    keep = {keys[k] for keys in order.values() if k < len(keys)}
    return [e for e in events if (e["args"].get("file", 0), e["args"]["callsite"], e["args"]["call"]) in keep]


def call_of(e: dict) -> tuple:
    """The call an event belongs to, as the files read together name it: a call of a group spanning processes by
    its launch and count within it (alike in every process's file), any other by its file and number there."""
    a = e["args"]
    if "launch" in a:
        return ("job", a["callsite"], e["pid"] // GROUP_STRIDE, a["launch"], a["iteration"])
    return (a.get("file", 0), a["callsite"], a["call"])


def summary(events: list[dict]) -> str:
    """Per rank: its calls' steps, the time its lanes spent in data steps and in waits, how long it waited for
    its peers to arrive and how often it arrived last, its longest wait (where and for whom), and the time other
    ranks spent waiting for its signals. The rank that arrives last, or that others wait for most, is the one to
    look at first."""
    if not events:
        return "no events: was a jaxcoll call run (and blocked on) inside the trace?"
    arrivals = [e for e in events if e["name"] == ARRIVAL_NAME]
    events = [e for e in events if e["name"] != ARRIVAL_NAME]
    for_peers = defaultdict(float)
    last = defaultdict(int)
    calls_arrived = defaultdict(list)
    for e in arrivals:
        for_peers[e["pid"]] += e["dur"]
        calls_arrived[call_of(e)].append(e)
    partial = 0  # calls whose other ranks' arrivals are in files not read: who was last cannot be told
    for evs in calls_arrived.values():
        if len({e["pid"] for e in evs}) < evs[0]["args"].get("ranks", 0):
            partial += 1
            continue
        last[max(evs, key=lambda e: e["ts"])["pid"]] += 1
    busy = defaultdict(float)
    waiting = defaultdict(float)
    waited_for = defaultdict(float)
    longest: dict[int, dict] = {}
    calls = defaultdict(set)
    steps = defaultdict(int)
    for e in events:
        pid, a = e["pid"], e["args"]
        calls[pid].add((a.get("file", 0), a["callsite"], a["call"]))
        steps[pid] += 1
        if e["name"] in WAITS:
            waiting[pid] += e["dur"]
            if isinstance(a.get("from"), int):
                waited_for[pid_of(pid // GROUP_STRIDE, a["from"])] += e["dur"]
            if e["name"] == "wait" and e["dur"] > longest.get(pid, {"dur": -1})["dur"]:
                longest[pid] = e
        elif e["name"] != "signal":
            busy[pid] += e["dur"]
    t0 = min(e["ts"] for e in events + arrivals)
    t1 = max(e["ts"] + e["dur"] for e in events + arrivals)
    lines = [f"{len(events)} steps over {(t1 - t0) / 1e3:.3f} ms; times in ms, summed over each rank's lanes",
             f"{'rank':>16} {'calls':>5} {'steps':>6} {'in data steps':>13} {'waiting':>8} {'for peers':>9} "
             f"{'last in':>7} {'others wait for it':>18}  longest wait"]
    for pid in sorted(steps):
        w = longest.get(pid)
        where = ""
        if w is not None:
            a = w["args"]
            where = (f"{w['dur'] / 1e3:.3f} ms: call {a['call']} lane {w['tid']} step {a['step']} sem {a['sem']}"
                     + (f" from rank {a['from']}" if "from" in a else "")
                     + (" (unfinished: the call failed there)" if a.get("unfinished") else ""))
        lines.append(f"{track_name(pid):>16} {len(calls[pid]):>5} {steps[pid]:>6} {busy[pid] / 1e3:>13.3f} "
                     f"{waiting[pid] / 1e3:>8.3f} {for_peers[pid] / 1e3:>9.3f} {last[pid]:>7} "
                     f"{waited_for[pid] / 1e3:>18.3f}  {where}")
    lines.append("for peers: waiting for the call's other ranks to arrive (in every process of a group spanning "
                 "processes); last in: calls it was the last to arrive at; others wait for it: other ranks' waits "
                 "for its signals")
    if partial:
        lines.append(f"{partial} call(s) have arrivals of only some of their group's ranks: read every process's "
                     "file together to say who arrived last")
    unfinished = [e for e in events if e["args"].get("unfinished")]
    if unfinished:
        lines.append(f"{len(unfinished)} step(s) never finished: the call failed (a timeout?) while they waited")
    return "\n".join(lines)


def draw(events: list[dict], path: str, title: str = "") -> None:
    """Write a picture of `events` to `path` (PNG or SVG, by suffix): one row per rank and lane, time across in
    milliseconds from the first event, a bar per step coloured by its kind, waits in orange-red (those still
    waiting when their call failed outlined in black) and each rank's wait for its peers to arrive in light
    orange on its arrival row, so a long wait or a rank that arrives late stands out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tracks = sorted({(e["pid"], e["tid"]) for e in events})
    row = {t: i for i, t in enumerate(tracks)}
    t0 = min((e["ts"] for e in events), default=0.0)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.32 * max(len(tracks), 1)))
    bars = defaultdict(list)
    for e in events:
        kind = e["name"] if e["name"] in COLOURS else "copy"
        bars[(row[e["pid"], e["tid"]], kind, bool(e["args"].get("unfinished")))].append(
            ((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 1e-6)))
    for (y, kind, unfinished), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLOURS[kind],
                       edgecolors="black" if unfinished else "none", linewidth=1.5 if unfinished else 0)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{track_name(pid)} / " + (ARRIVAL_TRACK if lane == ARRIVAL else f"lane {lane}")
                        for pid, lane in tracks], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first step")
    ax.set_title(title or "jaxcoll trace: lanes over time (waits in orange-red)")
    used = sorted({k for _, k, _ in bars})
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in used], fontsize=7, loc="upper right",
              ncol=min(len(used), 6))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
