"""MSCCL XML algorithms (as written by msccl-tools, TACCL and ForestColl) to and from plans.

An MSCCL algorithm is two-sided: `<algo><gpu><tb send= recv= chan=><step .../></tb></gpu></algo>`. A thread
block (tb) sends to one peer and receives from one peer; the n-th send on a connection (sender, receiver,
channel) meets the n-th receive, and `depid`/`deps` order a step after step `deps` of tb `depid` of its gpu.

Import maps a tb to a lane. A send puts its chunks into a fresh slot of the receiver's scratch and signals the
connection's semaphore (so no slot is ever reused and no write-after-read hazard arises); the receive waits on
it and takes the slot. Step types: s (send), r (receive), rcs (receive, copy, send on), rrc (receive, reduce
with a local chunk, copy to dst), rrs (receive, reduce, send on), rrcs (both), cpy, re (local reduce), nop.
Dependencies become signals between lanes of a rank, one semaphore per (waiting lane, signalling lane).

Export runs the plan's schedule (`jaxcoll.lang.check.schedule`) and writes each data step as sends, receives,
copies and reductions, with nops carrying the dependencies where a step has more than one.
"""

from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET
from collections import defaultdict

from jaxcoll.lang.check import location, schedule
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, default_blocks

COLLECTIVES = {"allreduce": Collective.ALL_REDUCE, "allgather": Collective.ALL_GATHER,
               "reducescatter": Collective.REDUCE_SCATTER, "alltoall": Collective.ALL_TO_ALL,
               "broadcast": Collective.BROADCAST, "ppermute": Collective.PPERMUTE, "custom": Collective.CUSTOM}
NAMES = {v: k for k, v in COLLECTIVES.items()}
BUFFERS = {"i": Buffer.INPUT, "o": Buffer.OUTPUT, "s": Buffer.SCRATCH}
LETTERS = {v: k for k, v in BUFFERS.items()}
SENDS = {"s", "rcs", "rrs", "rrcs"}
RECVS = {"r", "rcs", "rrc", "rrs", "rrcs"}
TYPES = SENDS | RECVS | {"cpy", "re", "nop"}
# The chunks a step type touches on its own gpu (a receive's src and a send's dst name the peer's chunks).
LOCAL = {"s": ("src",), "r": ("dst",), "rcs": ("dst",), "rrc": ("src", "dst"), "rrs": ("src",),
         "rrcs": ("src", "dst"), "cpy": ("src", "dst"), "re": ("src", "dst"), "nop": ()}


def _int(elem_name: str, elem: ET.Element, attr: str, default: int | None = None) -> int:
    v = elem.get(attr)
    if v is None:
        if default is None:
            raise PlanError(f"{elem_name}: missing attribute {attr}")
        return default
    try:
        return int(v)
    except ValueError:
        raise PlanError(f"{elem_name}: attribute {attr}={v!r} is not an integer") from None


def _parse(path_or_text) -> ET.Element:
    text = path_or_text
    if isinstance(path_or_text, (str, os.PathLike)) and not str(path_or_text).lstrip().startswith("<"):
        try:
            with open(path_or_text) as f:
                text = f.read()
        except OSError as e:
            raise PlanError(f"cannot read MSCCL XML file {path_or_text}: {e}") from e
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise PlanError(f"MSCCL XML is not well formed: {e}") from e
    if root.tag != "algo":
        raise PlanError(f"MSCCL XML: the root element is <{root.tag}>, expected <algo>")
    return root


def _sent(st: dict) -> tuple:
    """The local chunk whose value a sending step sends: its src, or for rcs (receive, copy, send on) its dst."""
    return st["src"] if "src" in LOCAL[st["type"]] else st["dst"]


class _ScratchPlaces:
    """Where one gpu's MSCCL scratch chunks go in the plan's scratch.

    MSCCL cuts every buffer into equal chunks, so a scratch chunk may hold any chunk's data. A plan's chunks
    differ in size by position within a block (index mod k, plan-ir.md), so a scratch chunk must sit at the
    position of the data it holds. That position is inferred from the steps (a chunk takes the position of the
    chunks it is copied from, reduced with or sent as); MSCCL scratch offsets that share a shift (position -
    offset mod k) keep their order in a region of their own, so multi-chunk steps stay contiguous."""

    def __init__(self, gid: int, k: int, positions: dict[int, int], floor: int):
        self.gid, self.k = gid, k
        self.shift = {off: (p - off) % k for off, p in positions.items()}
        self.region = {}
        at = 0
        for sh in sorted(set(self.shift.values())):
            self.region[sh] = at
            top = max(off for off, s in self.shift.items() if s == sh) + 1 + sh
            at += -(-top // k) * k
        self.size = max(at, floor)  # chunks of the plan's scratch these places take

    def position(self, where: tuple) -> int:
        buf, off = where
        if buf is Buffer.SCRATCH:
            return (off + self.shift.get(off, 0)) % self.k
        return off % self.k

    def index(self, where: tuple, cnt: int) -> int:
        buf, off = where
        if buf is not Buffer.SCRATCH:
            return off
        shifts = {self.shift.get(o, 0) for o in range(off, off + cnt)}
        if len(shifts) != 1:
            raise PlanError(f"<gpu id={self.gid}>: scratch chunks {off}..{off + cnt - 1} are used as one piece but "
                            f"hold data from different positions of their blocks, which differ in size in a plan")
        (sh,) = shifts
        return self.region.get(sh, 0) + off + sh


def _scratch_places(tbs: dict, pairs: dict, k: int, scratch0: dict[int, int]) -> dict[int, _ScratchPlaces]:
    """Infer the block position of every scratch chunk (union-find over the chunks each step links) and lay
    out each gpu's scratch (see `_ScratchPlaces`). Raises PlanError when one chunk would need two positions."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def link(ga, wa, gb, wb, cnt):
        for t in range(cnt):
            parent[find((ga, wa[0], wa[1] + t))] = find((gb, wb[0], wb[1] + t))

    for gid, lanes in tbs.items():
        for tb in lanes:
            for st in tb["steps"]:
                sides = [st[side] for side in LOCAL[st["type"]] if st[side] is not None]
                if len(sides) == 2:
                    link(gid, sides[0], gid, sides[1], st["cnt"])
    for (a, b, _), matched in pairs.items():
        for s_st, r_st in matched:
            for side in LOCAL[r_st["type"]]:
                if _sent(s_st) is not None and r_st[side] is not None:
                    link(a, _sent(s_st), b, r_st[side], s_st["cnt"])
    fixed: dict = {}
    for node in list(parent):
        if node[1] is Buffer.SCRATCH:
            continue
        root, pos = find(node), node[2] % k
        if fixed.setdefault(root, (pos, node))[0] != pos:
            other = fixed[root][1]
            raise PlanError(f"<gpu id={node[0]}>: {node[1].value} chunk {node[2]} and <gpu id={other[0]}> "
                            f"{other[1].value} chunk {other[2]} pass through the same chunks but sit at different "
                            f"positions of their blocks (mod {k}), so they may differ in size")
    positions: dict[int, dict[int, int]] = defaultdict(dict)
    for node in list(parent):
        if node[1] is Buffer.SCRATCH:
            positions[node[0]][node[2]] = fixed.get(find(node), (node[2] % k,))[0]
    return {gid: _ScratchPlaces(gid, k, positions[gid], scratch0[gid]) for gid in tbs}


def load_msccl_xml(path_or_text) -> Plan:
    """Import an MSCCL XML algorithm (a path or the XML text) as a plan. Raises PlanError naming the element
    for anything unsupported or malformed. The plan is structurally valid; prove it with `check`."""
    algo = _parse(path_or_text)
    coll_name = algo.get("coll", "")
    if coll_name not in COLLECTIVES:
        raise PlanError(f"<algo coll={coll_name!r}>: unknown collective; expected one of {sorted(COLLECTIVES)}")
    coll = COLLECTIVES[coll_name]
    gpus = algo.findall("gpu")
    n = _int("<algo>", algo, "ngpus", len(gpus))
    if len(gpus) != n:
        raise PlanError(f"<algo ngpus={n}> has {len(gpus)} <gpu> elements")
    in_place = algo.get("inplace", "0") == "1"
    by_id = {}
    for g in gpus:
        gid = _int("<gpu>", g, "id")
        if not 0 <= gid < n or gid in by_id:
            raise PlanError(f"<gpu id={gid}>: id out of range or repeated (ngpus={n})")
        by_id[gid] = g
    if coll is Collective.CUSTOM:
        ic, oc = _int("<gpu id=0>", by_id[0], "i_chunks", 0), _int("<gpu id=0>", by_id[0], "o_chunks", 0)
        if not ic or oc % ic:
            raise PlanError(f"<gpu id=0>: a custom algorithm needs o_chunks={oc} to be a multiple of "
                            f"i_chunks={ic}")
        in_blocks, out_blocks = 1, oc // ic
    else:
        in_blocks, out_blocks = default_blocks(coll, n)
    g0 = by_id[0]
    oc0, ic0 = _int("<gpu id=0>", g0, "o_chunks", 0), _int("<gpu id=0>", g0, "i_chunks", 0)
    if oc0 and oc0 % out_blocks == 0:
        k = oc0 // out_blocks
    elif ic0 and ic0 % in_blocks == 0:
        k = ic0 // in_blocks
    else:
        raise PlanError(f"<gpu id=0 i_chunks={ic0} o_chunks={oc0}>: no chunk count fits {coll_name} over {n} gpus")
    sizes = {Buffer.INPUT: in_blocks * k, Buffer.OUTPUT: out_blocks * k}

    # -- read every tb and step ----------------------------------------------------------------------------
    tbs: dict[int, list[dict]] = {}
    scratch0: dict[int, int] = {}
    for gid, g in by_id.items():
        s_chunks = _int(f"<gpu id={gid}>", g, "s_chunks", 0)
        scratch0[gid] = -(-s_chunks // k) * k
        lanes = []
        for tb in g.findall("tb"):
            tname = f"<gpu id={gid}><tb id={tb.get('id')}>"
            info = {"id": _int(tname, tb, "id"), "send": _int(tname, tb, "send", -1),
                    "recv": _int(tname, tb, "recv", -1), "chan": _int(tname, tb, "chan", 0), "steps": []}
            for peer in (info["send"], info["recv"]):
                if peer != -1 and not 0 <= peer < n:
                    raise PlanError(f"{tname}: peer {peer} is out of range for ngpus={n}")
            steps = tb.findall("step")
            for pos, st in enumerate(steps):
                sname = f"{tname}<step s={st.get('s')}>"
                s = _int(sname, st, "s")
                if s != pos:
                    raise PlanError(f"{sname}: steps must be numbered 0, 1, ... in order; expected s={pos}")
                typ = st.get("type")
                if typ not in TYPES:
                    raise PlanError(f"{sname}: unknown step type {typ!r}; supported: {sorted(TYPES)}")
                if typ in SENDS and info["send"] == -1:
                    raise PlanError(f"{sname}: a {typ} step in a tb with send=-1")
                if typ in RECVS and info["recv"] == -1:
                    raise PlanError(f"{sname}: a {typ} step in a tb with recv=-1")
                cnt = _int(sname, st, "cnt", 1)
                step = {"name": sname, "type": typ, "cnt": cnt}
                for side in ("src", "dst"):
                    letter = st.get(f"{side}buf", "i" if side == "src" else "o")
                    off = _int(sname, st, f"{side}off", -1)
                    if typ == "nop" or off < 0:
                        step[side] = None
                        continue
                    if letter not in BUFFERS:
                        raise PlanError(f"{sname}: unknown buffer {side}buf={letter!r}; expected i, o or s")
                    step[side] = (BUFFERS[letter], off)
                deps = []
                dep_ids = [x for x in st.get("depid", "-1").split(",") if x.strip()]
                dep_steps = [x for x in st.get("deps", "-1").split(",") if x.strip()]
                if len(dep_ids) != len(dep_steps):
                    raise PlanError(f"{sname}: depid and deps list different numbers of dependencies")
                for a, b in zip(dep_ids, dep_steps):
                    try:
                        a, b = int(a), int(b)
                    except ValueError:
                        raise PlanError(f"{sname}: depid/deps are not integers") from None
                    if a >= 0:
                        deps.append((a, b))
                step["deps"] = deps
                info["steps"].append(step)
            lanes.append(info)
        lanes.sort(key=lambda t: t["id"])
        if [t["id"] for t in lanes] != list(range(len(lanes))):
            raise PlanError(f"<gpu id={gid}>: tb ids must be 0..{len(lanes) - 1}, got {[t['id'] for t in lanes]}")
        tbs[gid] = lanes
    # chunk ranges and dependency targets
    scratch_need = dict(scratch0)
    for gid, lanes in tbs.items():
        for tb in lanes:
            for st in tb["steps"]:
                for side in LOCAL[st["type"]]:
                    if st[side] is None:
                        continue
                    buf, off = st[side]
                    if buf is Buffer.SCRATCH:
                        if off + st["cnt"] > scratch0[gid]:
                            raise PlanError(f"{st['name']}: {side} chunks {off}..{off + st['cnt'] - 1} of the "
                                            f"scratch buffer are out of range (s_chunks holds {scratch0[gid]})")
                    elif off + st["cnt"] > sizes[buf] and not (in_place and buf is Buffer.INPUT and
                                                                 off + st["cnt"] <= sizes[Buffer.OUTPUT]):
                        raise PlanError(f"{st['name']}: {side} chunks {off}..{off + st['cnt'] - 1} of the "
                                        f"{buf.value} buffer are out of range (it holds {sizes[buf]} chunks)")
                for a, b in st["deps"]:
                    if a >= len(lanes) or b >= len(lanes[a]["steps"]):
                        raise PlanError(f"{st['name']}: depends on tb {a} step {b}, which does not exist")
    # -- connections: the n-th send meets the n-th receive -------------------------------------------------
    senders: dict[tuple, int] = {}
    receivers: dict[tuple, int] = {}
    for gid, lanes in tbs.items():
        for t, tb in enumerate(lanes):
            for role, table, peer in (("send", senders, tb["send"]), ("recv", receivers, tb["recv"])):
                if peer == -1 or not any(st["type"] in (SENDS if role == "send" else RECVS) for st in tb["steps"]):
                    continue
                key = (gid, peer, tb["chan"]) if role == "send" else (peer, gid, tb["chan"])
                if key in table:
                    raise PlanError(f"<gpu id={gid}><tb id={t}>: a second tb {role}s on channel {tb['chan']} "
                                    f"with gpu {peer}; a connection has one tb at each end")
                table[key] = t
    pairs: dict[tuple, list[tuple[dict, dict]]] = {}
    for key in sorted(set(senders) | set(receivers)):
        a, b, ch = key
        if key not in senders or key not in receivers:
            side = f"<gpu id={a}> sends" if key in senders else f"<gpu id={b}> receives"
            raise PlanError(f"{side} on channel {ch} between gpu {a} and gpu {b} but the other end has no tb")
        s_steps = [st for st in tbs[a][senders[key]]["steps"] if st["type"] in SENDS]
        r_steps = [st for st in tbs[b][receivers[key]]["steps"] if st["type"] in RECVS]
        if len(s_steps) != len(r_steps):
            raise PlanError(f"<gpu id={a}><tb id={senders[key]}> sends {len(s_steps)} times to gpu {b} on channel "
                            f"{ch}, but <gpu id={b}><tb id={receivers[key]}> receives {len(r_steps)} times")
        for s_st, r_st in zip(s_steps, r_steps):
            if s_st["cnt"] != r_st["cnt"]:
                raise PlanError(f"{r_st['name']}: receives cnt={r_st['cnt']} but the matching send "
                                f"{s_st['name']} sends cnt={s_st['cnt']}")
        pairs[key] = list(zip(s_steps, r_steps))
    place = _scratch_places(tbs, pairs, k, scratch0)
    scratch_need = {gid: place[gid].size for gid in tbs}
    conn_sem: dict[tuple, int] = {}
    sems = [0] * n
    for key, matched in pairs.items():
        a, b, ch = key
        for s_st, r_st in matched:
            pos = place[a].position(_sent(s_st))
            base = scratch_need[b]
            scratch_need[b] = base + -(-(pos + s_st["cnt"]) // k) * k
            slot = ChunkRef(b, Buffer.SCRATCH, base + pos, s_st["cnt"])
            s_st.setdefault("out", []).append(slot)
            r_st["slot"] = slot
        conn_sem[key] = sems[b]
        sems[b] += 1
        for s_st, r_st in matched:
            s_st["ssem"] = (b, conn_sem[key])
            r_st["rsem"] = conn_sem[key]
    # dependencies: one semaphore per (waiting tb, signalling tb) of a gpu, signals numbered in order
    dep_signals: dict[tuple, list[int]] = defaultdict(list)  # (gpu, from tb, to tb) -> depended step positions
    for gid, lanes in tbs.items():
        for t, tb in enumerate(lanes):
            for st in tb["steps"]:
                for a, b in st["deps"]:
                    if a != t and b not in dep_signals[gid, a, t]:
                        dep_signals[gid, a, t].append(b)
    dep_sem = {}
    for key in sorted(dep_signals):
        dep_signals[key].sort()
        dep_sem[key] = sems[key[0]]
        sems[key[0]] += 1
    # -- emit lanes -------------------------------------------------------------------------------------------
    def ref(gid, where, cnt):
        buf, off = where
        return ChunkRef(gid, buf, place[gid].index(where, cnt), cnt)

    ranks = []
    for gid in range(n):
        lanes_out = []
        consumed: dict[tuple, int] = defaultdict(int)
        for t, tb in enumerate(tbs[gid]):
            out: list[Step] = []
            for pos, st in enumerate(tb["steps"]):
                for a, b in st["deps"]:
                    if a == t:
                        if b >= pos:
                            raise PlanError(f"{st['name']}: depends on a later step {b} of its own tb")
                        continue
                    key = (gid, a, t)
                    m = dep_signals[key].index(b) + 1
                    while consumed[key] < m:
                        out.append(Step(Op.WAIT, sem=dep_sem[key]))
                        consumed[key] += 1
                typ, cnt = st["type"], st["cnt"]
                if typ in RECVS:
                    out.append(Step(Op.WAIT, sem=st["rsem"]))
                need = LOCAL[typ]
                for side in need:
                    if st[side] is None:
                        raise PlanError(f"{st['name']}: a {typ} step needs {side}buf and {side}off")
                src = ref(gid, st["src"], cnt) if "src" in need else None
                dst = ref(gid, st["dst"], cnt) if "dst" in need else None
                slot = st.get("slot")
                fwd = tuple(st.get("out", ()))
                if typ == "s":
                    out.append(Step(Op.PUT, (src,), fwd))
                elif typ == "r":
                    out.append(Step(Op.COPY, (slot,), (dst,)))
                elif typ == "rcs":
                    out.append(Step(Op.PUT, (slot,), (dst,) + fwd))
                elif typ == "rrc":
                    out.append(Step(Op.REDUCE, (src, slot), (dst,)))
                elif typ == "rrs":
                    out.append(Step(Op.REDUCE_PUT, (src, slot), fwd))
                elif typ == "rrcs":
                    out.append(Step(Op.REDUCE_PUT, (src, slot), (dst,) + fwd))
                elif typ == "cpy":
                    out.append(Step(Op.COPY, (src,), (dst,)))
                elif typ == "re":
                    out.append(Step(Op.REDUCE, (dst, src), (dst,)))
                if typ in SENDS:  # the data step just emitted goes over the tb's channel
                    out[-1] = dataclasses.replace(out[-1], channel=tb["chan"])
                    out.append(Step(Op.SIGNAL, peer=st["ssem"][0], sem=st["ssem"][1]))
                for key in sorted(k2 for k2 in dep_signals if k2[0] == gid and k2[1] == t):
                    if pos in dep_signals[key]:
                        out.append(Step(Op.SIGNAL, peer=gid, sem=dep_sem[key]))
            lanes_out.append(out)
        for key, xs in dep_signals.items():  # consume signals nobody waited for explicitly
            if key[0] == gid:
                while consumed[key] < len(xs):
                    lanes_out[key[2]].append(Step(Op.WAIT, sem=dep_sem[key]))
                    consumed[key] += 1
        ranks.append((lanes_out,))
    scratch = max(scratch_need.values())
    programs = tuple(RankProgram(sizes[Buffer.INPUT], sizes[Buffer.OUTPUT], scratch, sems[g],
                                 tuple(Lane(tuple(s)) for s in ranks[g][0])) for g in range(n))
    root = _int("<algo>", algo, "root", 0)
    perm = tuple(tuple(int(x) for x in p.split(":")) for p in algo.get("perm", "").split() if p)
    return Plan(coll, n, programs, name=algo.get("name", ""), in_place=in_place, in_blocks=in_blocks,
                out_blocks=out_blocks, protocol={"LL": "ll", "Simple": "simple"}.get(algo.get("proto"), "auto"),
                root=root, perm=perm)


# -- export -------------------------------------------------------------------------------------------------
class _Builder:
    """MSCCL steps per gpu, in schedule order, with their tb and the local chunks they touch."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.k = plan.chunk_factor
        self.steps: dict[int, list[dict]] = defaultdict(list)
        self.tb_of: dict[int, dict] = defaultdict(dict)  # gpu -> (send, recv, chan) -> tb id
        self.temp = {r: prog.scratch_chunks for r, prog in enumerate(plan.ranks)}

    def tb(self, gpu: int, send: int = -1, recv: int = -1, chan: int = 0) -> int:
        return self.tb_of[gpu].setdefault((send, recv, chan), len(self.tb_of[gpu]))

    def temp_slot(self, gpu: int, like: ChunkRef) -> ChunkRef:
        pos = like.index % self.k
        base = self.temp[gpu]
        self.temp[gpu] = base + -(-(pos + like.count) // self.k) * self.k
        return ChunkRef(gpu, Buffer.SCRATCH, base + pos, like.count)

    def add(self, gpu: int, tb: int, typ: str, src: ChunkRef | None, dst: ChunkRef | None, reads=(), writes=()):
        self.steps[gpu].append({"tb": tb, "type": typ, "src": src, "dst": dst, "reads": list(reads),
                                "writes": list(writes)})

    def transfer(self, src: ChunkRef, dst: ChunkRef, chan: int) -> None:
        a, b = src.rank, dst.rank
        self.add(a, self.tb(a, send=b, chan=chan), "s", src, dst, reads=[src])
        self.add(b, self.tb(b, recv=a, chan=chan), "r", src, dst, writes=[dst])

    def data_step(self, e: int, step: Step) -> None:
        srcs, dsts = step.srcs, step.dsts
        local = self.tb(e)
        chan = max(step.channel, 0)
        if step.op is Op.ZERO:
            raise PlanError(f"rank {e}: a zero step ({step!r}) has no MSCCL equivalent")
        if len(srcs) == 1:
            src = srcs[0]
            local_dsts = [d for d in dsts if d.rank == src.rank]
            for d in local_dsts:
                self.add(src.rank, self.tb(src.rank), "cpy", src, d, reads=[src], writes=[d])
            for d in dsts:
                if d.rank != src.rank:
                    self.transfer(src, d, chan)
            return
        if len(srcs) == 2 and srcs[0] in dsts and srcs[0].rank == e and srcs[1].rank == e:
            acc = srcs[0]
            self.add(e, local, "re", srcs[1], acc, reads=[acc, srcs[1]], writes=[acc])
        else:
            acc = self.temp_slot(e, dsts[0])
            for n, s in enumerate(srcs):
                if s.rank != e:
                    tmp = self.temp_slot(e, s)
                    self.transfer(s, tmp, chan)
                    s = tmp
                if n == 0:
                    self.add(e, local, "cpy", s, acc, reads=[s], writes=[acc])
                else:
                    self.add(e, local, "re", s, acc, reads=[acc, s], writes=[acc])
        for d in dsts:
            if d == acc:
                continue
            if d.rank == e:
                self.add(e, local, "cpy", acc, d, reads=[acc], writes=[d])
            else:
                self.transfer(acc, d, chan)


def to_msccl_xml(plan: Plan) -> str:
    """The plan as an MSCCL XML algorithm (msccl-tools' format): one tb per (send peer, recv peer, channel) of
    each gpu, steps in the order of the plan's schedule, dependencies between tbs of a gpu from chunk conflicts.
    A step's channel (`Step.channel`; none is channel 0) is the `chan` of the tbs that carry its transfers."""
    if plan.collective not in NAMES:
        raise PlanError(f"{plan.collective.value} has no MSCCL collective name")
    b = _Builder(plan)
    for r, l, i in schedule(plan):
        step = plan.ranks[r].lanes[l].steps[i]
        if step.op.is_data:
            b.data_step(r, step)
    algo = ET.Element("algo", {
        "name": plan.name or plan.collective.value, "proto": {"ll": "LL", "simple": "Simple"}.get(plan.protocol,
                                                                                                 "Simple"),
        "nchannels": str(1 + max((key[2] for tbs in b.tb_of.values() for key in tbs), default=0)),
        "nchunksperloop": str(max(plan.ranks[0].input_chunks, plan.ranks[0].output_chunks)), "ngpus": str(plan.nranks),
        "coll": NAMES[plan.collective], "inplace": "1" if plan.in_place else "0",
        "outofplace": "0" if plan.in_place else "1", "minBytes": "0", "maxBytes": "0"})
    if plan.collective is Collective.BROADCAST:
        algo.set("root", str(plan.root))
    if plan.collective is Collective.PPERMUTE:
        algo.set("perm", " ".join(f"{a}:{c}" for a, c in plan.perm))
    for g in range(plan.nranks):
        prog = plan.ranks[g]
        scratch = -(-b.temp[g] // b.k) * b.k
        gel = ET.SubElement(algo, "gpu", {"id": str(g), "i_chunks": str(prog.input_chunks),
                                          "o_chunks": str(prog.output_chunks), "s_chunks": str(scratch)})
        per_tb: dict[int, list[dict]] = defaultdict(list)
        last_touch: dict = {}  # local location -> list of (tb, pos, is_write) since last write
        emitted: list[tuple[int, int]] = []
        for st in b.steps[g]:
            deps: dict[int, int] = {}
            locs_r = [location(plan, c.rank, c.buffer, c.index + t) for c in st["reads"] for t in range(c.count)]
            locs_w = [location(plan, c.rank, c.buffer, c.index + t) for c in st["writes"] for t in range(c.count)]
            for loc in set(locs_r) | set(locs_w):
                for tb, pos, w in last_touch.get(loc, []):
                    if tb != st["tb"] and (w or loc in locs_w):
                        deps[tb] = max(deps.get(tb, -1), pos)
            lane = per_tb[st["tb"]]
            items = sorted(deps.items())
            for tb, pos in items[:-1]:  # MSCCL steps carry one dependency: extra ones ride on nops
                lane.append({"type": "nop", "src": None, "dst": None, "dep": (tb, pos)})
            st = dict(st, dep=items[-1] if items else None)
            lane.append(st)
            pos = len(lane) - 1
            for loc in set(locs_r) | set(locs_w):
                entry = (st["tb"], pos, loc in locs_w)
                last_touch[loc] = [entry] if loc in locs_w else last_touch.get(loc, []) + [entry]
            emitted.append((st["tb"], pos))
        has_dep = {s["dep"] for lane in per_tb.values() for s in lane if s.get("dep")}
        for (send, recv, chan), tb in sorted(b.tb_of[g].items(), key=lambda kv: kv[1]):
            tel = ET.SubElement(gel, "tb", {"id": str(tb), "send": str(send), "recv": str(recv), "chan": str(chan)})
            for pos, st in enumerate(per_tb[tb]):
                src, dst = st["src"], st["dst"]
                dep = st.get("dep")
                ET.SubElement(tel, "step", {
                    "s": str(pos), "type": st["type"],
                    "srcbuf": LETTERS[src.buffer] if src else "i", "srcoff": str(src.index) if src else "-1",
                    "dstbuf": LETTERS[dst.buffer] if dst else "o", "dstoff": str(dst.index) if dst else "-1",
                    "cnt": str((src or dst).count if (src or dst) else 0),
                    "depid": str(dep[0]) if dep else "-1", "deps": str(dep[1]) if dep else "-1",
                    "hasdep": "1" if (tb, pos) in has_dep else "0"})
    ET.indent(algo)
    return ET.tostring(algo, encoding="unicode") + "\n"
