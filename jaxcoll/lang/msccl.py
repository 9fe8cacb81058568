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
from jaxcoll.plan.collectives import TABLE
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, default_blocks

COLLECTIVES = {d.msccl: c for c, d in TABLE.items()}  # <algo coll=...> -> collective
NAMES = {c: d.msccl for c, d in TABLE.items()}
BUFFERS = {"i": Buffer.INPUT, "o": Buffer.OUTPUT, "s": Buffer.SCRATCH}
LETTERS = {v: k for k, v in BUFFERS.items()}
SENDS = {"s", "rcs", "rrs", "rrcs"}
RECVS = {"r", "rcs", "rrc", "rrs", "rrcs"}
TYPES = SENDS | RECVS | {"cpy", "re", "nop"}
# The chunks a step type touches on its own gpu (a receive's src and a send's dst name the peer's chunks).
LOCAL = {"s": ("src",), "r": ("dst",), "rcs": ("dst",), "rrc": ("src", "dst"), "rrs": ("src",),
         "rrcs": ("src", "dst"), "cpy": ("src", "dst"), "re": ("src", "dst"), "nop": ()}


def _int(elem_name: str, elem: ET.Element, attr: str, default: int | None = None, low: int | None = None) -> int:
    """Attribute `attr` of `elem` as an integer (`default` when it is absent; None: it must be there), at least
    `low` when that is given."""
    v = elem.get(attr)
    if v is None:
        if default is None:
            raise PlanError(f"{elem_name}: missing attribute {attr}")
        return default
    try:
        x = int(v)
    except ValueError:
        raise PlanError(f"{elem_name}: attribute {attr}={v!r} is not an integer") from None
    if low is not None and x < low:
        raise PlanError(f"{elem_name}: attribute {attr}={x} must be >= {low}")
    return x


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


# -- reading the file ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Algo:
    """What `<algo>` and its gpu 0 say about the plan as a whole."""

    collective: Collective
    nranks: int
    in_place: bool
    gpus: dict[int, ET.Element]  # by id
    in_blocks: int
    out_blocks: int
    k: int  # chunks per block
    root: int
    perm: tuple[tuple[int, int], ...]

    @property
    def sizes(self) -> dict[Buffer, int]:
        return {Buffer.INPUT: self.in_blocks * self.k, Buffer.OUTPUT: self.out_blocks * self.k}


@dataclasses.dataclass
class _MscclStep:
    """One `<step>`, as read, and what matching its connection gives it."""

    name: str  # the element, for messages: <gpu id=g><tb id=t><step s=i>
    type: str
    cnt: int
    src: tuple[Buffer, int] | None  # (buffer, chunk offset); None where the step names none
    dst: tuple[Buffer, int] | None
    deps: list[tuple[int, int]]  # (tb, step) of its gpu that it follows
    slot: ChunkRef | None = None  # a receive: the receiver's scratch chunks its matching send wrote
    rsem: int = -1  # a receive: the semaphore it waits on
    out: tuple[ChunkRef, ...] = ()  # a send: the receiver's scratch chunks it writes
    ssem: tuple[int, int] | None = None  # a send: the (receiver, semaphore) it signals

    @property
    def sent(self) -> tuple | None:
        """The local chunk whose value a sending step sends: its src, or for rcs (receive, copy, send on) its
        dst."""
        return self.src if "src" in LOCAL[self.type] else self.dst


@dataclasses.dataclass
class _Tb:
    """One `<tb>`: it sends to one peer and receives from one, over channel `chan` (-1: no peer)."""

    id: int
    send: int
    recv: int
    chan: int
    steps: list[_MscclStep]


def _read_algo(algo: ET.Element) -> _Algo:
    coll_name = algo.get("coll", "")
    if coll_name not in COLLECTIVES:
        raise PlanError(f"<algo coll={coll_name!r}>: unknown collective; expected one of {sorted(COLLECTIVES)}")
    coll = COLLECTIVES[coll_name]
    gpus = algo.findall("gpu")
    n = _int("<algo>", algo, "ngpus", len(gpus))
    if len(gpus) != n:
        raise PlanError(f"<algo ngpus={n}> has {len(gpus)} <gpu> elements")
    if n < 1:
        raise PlanError("<algo ngpus=0>: an algorithm needs at least one <gpu>")
    in_place = algo.get("inplace", "0")
    if in_place not in ("0", "1"):
        raise PlanError(f"<algo>: attribute inplace={in_place!r}, expected '0' or '1'")
    by_id = {}
    for g in gpus:
        gid = _int("<gpu>", g, "id")
        if not 0 <= gid < n or gid in by_id:
            raise PlanError(f"<gpu id={gid}>: id out of range or repeated (ngpus={n})")
        by_id[gid] = g
    g0 = by_id[0]
    ic0, oc0 = _int("<gpu id=0>", g0, "i_chunks", 0), _int("<gpu id=0>", g0, "o_chunks", 0)
    if TABLE[coll].plan_states:
        if not ic0 or oc0 % ic0:
            raise PlanError(f"<gpu id=0>: a custom algorithm needs o_chunks={oc0} to be a multiple of "
                            f"i_chunks={ic0}")
        in_blocks, out_blocks = 1, oc0 // ic0
    else:
        in_blocks, out_blocks = default_blocks(coll, n)
    if oc0 and oc0 % out_blocks == 0:
        k = oc0 // out_blocks
    elif ic0 and ic0 % in_blocks == 0:
        k = ic0 // in_blocks
    else:
        raise PlanError(f"<gpu id=0 i_chunks={ic0} o_chunks={oc0}>: no chunk count fits {coll_name} over {n} gpus")
    root = _int("<algo>", algo, "root", 0)
    if not 0 <= root < n:
        raise PlanError(f"<algo root={root}>: root is out of range; it must be a gpu id in 0..{n - 1}")
    return _Algo(coll, n, in_place == "1", by_id, in_blocks, out_blocks, k, root, _read_perm(algo, n))


def _read_perm(algo: ET.Element, n: int) -> tuple[tuple[int, int], ...]:
    text = algo.get("perm", "")
    pairs = []
    for pair in text.split():
        try:
            src, dst = (int(x) for x in pair.split(":"))
        except ValueError:
            raise PlanError(f"<algo perm={text!r}>: {pair!r} is not a pair source:destination of gpu ids") from None
        if not (0 <= src < n and 0 <= dst < n):
            raise PlanError(f"<algo perm={text!r}>: the pair {pair!r} names a gpu outside 0..{n - 1}")
        pairs.append((src, dst))
    return tuple(pairs)


def _read_gpu(gid: int, g: ET.Element, n: int) -> list[_Tb]:
    """The gpu's tbs in id order."""
    tbs = [_read_tb(gid, tb, n) for tb in g.findall("tb")]
    tbs.sort(key=lambda t: t.id)
    if [t.id for t in tbs] != list(range(len(tbs))):
        raise PlanError(f"<gpu id={gid}>: tb ids must be 0..{len(tbs) - 1}, got {[t.id for t in tbs]}")
    return tbs


def _read_tb(gid: int, tb: ET.Element, n: int) -> _Tb:
    tname = f"<gpu id={gid}><tb id={tb.get('id')}>"
    out = _Tb(_int(tname, tb, "id"), _int(tname, tb, "send", -1), _int(tname, tb, "recv", -1),
              _int(tname, tb, "chan", 0, low=0), [])
    for peer in (out.send, out.recv):
        if peer != -1 and not 0 <= peer < n:
            raise PlanError(f"{tname}: peer {peer} is out of range for ngpus={n}")
        if peer == gid:
            raise PlanError(f"{tname}: peer {peer} is the tb's own gpu; a tb sends to and receives from peers")
    for pos, st in enumerate(tb.findall("step")):
        out.steps.append(_read_step(f"{tname}<step s={st.get('s')}>", st, pos, out))
    return out


def _read_step(sname: str, st: ET.Element, pos: int, tb: _Tb) -> _MscclStep:
    s = _int(sname, st, "s")
    if s != pos:
        raise PlanError(f"{sname}: steps must be numbered 0, 1, ... in order; expected s={pos}")
    typ = st.get("type")
    if typ not in TYPES:
        raise PlanError(f"{sname}: unknown step type {typ!r}; supported: {sorted(TYPES)}")
    if typ in SENDS and tb.send == -1:
        raise PlanError(f"{sname}: a {typ} step in a tb with send=-1")
    if typ in RECVS and tb.recv == -1:
        raise PlanError(f"{sname}: a {typ} step in a tb with recv=-1")
    cnt = _int(sname, st, "cnt", 1, low=0 if typ == "nop" else 1)
    sides = {}
    for side in ("src", "dst"):
        letter = st.get(f"{side}buf", "i" if side == "src" else "o")
        off = _int(sname, st, f"{side}off", -1)
        if typ == "nop" or off < 0:
            sides[side] = None
            continue
        if letter not in BUFFERS:
            raise PlanError(f"{sname}: unknown buffer {side}buf={letter!r}; expected i, o or s")
        sides[side] = (BUFFERS[letter], off)
    return _MscclStep(sname, typ, cnt, sides["src"], sides["dst"], _read_deps(sname, st))


def _read_deps(sname: str, st: ET.Element) -> list[tuple[int, int]]:
    """The (tb, step) pairs of `depid` and `deps` (-1: none)."""
    depid, deps_text = st.get("depid", "-1"), st.get("deps", "-1")
    dep_ids = [x for x in depid.split(",") if x.strip()]
    dep_steps = [x for x in deps_text.split(",") if x.strip()]
    given = f"depid={depid!r} deps={deps_text!r}"
    if len(dep_ids) != len(dep_steps):
        raise PlanError(f"{sname}: {given} list different numbers of dependencies")
    deps = []
    for a, b in zip(dep_ids, dep_steps):
        try:
            a, b = int(a), int(b)
        except ValueError:
            raise PlanError(f"{sname}: {given} are not comma-separated integers") from None
        if a >= 0:
            deps.append((a, b))
    return deps


def _check_chunks(algo: _Algo, tbs: dict[int, list[_Tb]], scratch0: dict[int, int]) -> None:
    """Every step's chunks lie in their buffers and every dependency names a step of its gpu."""
    sizes = algo.sizes
    for gid, lanes in tbs.items():
        for tb in lanes:
            for st in tb.steps:
                for side in LOCAL[st.type]:
                    where = getattr(st, side)
                    if where is None:
                        continue
                    buf, off = where
                    if buf is Buffer.SCRATCH:
                        if off + st.cnt > scratch0[gid]:
                            raise PlanError(f"{st.name}: {side} chunks {off}..{off + st.cnt - 1} of the "
                                            f"scratch buffer are out of range (s_chunks holds {scratch0[gid]})")
                    elif off + st.cnt > sizes[buf] and not (algo.in_place and buf is Buffer.INPUT and
                                                             off + st.cnt <= sizes[Buffer.OUTPUT]):
                        raise PlanError(f"{st.name}: {side} chunks {off}..{off + st.cnt - 1} of the "
                                        f"{buf.value} buffer are out of range (it holds {sizes[buf]} chunks)")
                for a, b in st.deps:
                    if a >= len(lanes) or b >= len(lanes[a].steps):
                        raise PlanError(f"{st.name}: depends on tb {a} step {b}, which does not exist")


# -- connections: the n-th send meets the n-th receive --------------------------------------------------------
Connection = tuple[int, int, int]  # (sending gpu, receiving gpu, channel)


def _connections(tbs: dict[int, list[_Tb]]) -> dict[Connection, list[tuple[_MscclStep, _MscclStep]]]:
    """For each connection, its (send, receive) step pairs in order. A connection has one tb at each end."""
    senders: dict[Connection, int] = {}
    receivers: dict[Connection, int] = {}
    for gid, lanes in tbs.items():
        for t, tb in enumerate(lanes):
            for role, table, peer in (("send", senders, tb.send), ("recv", receivers, tb.recv)):
                if peer == -1 or not any(st.type in (SENDS if role == "send" else RECVS) for st in tb.steps):
                    continue
                key = (gid, peer, tb.chan) if role == "send" else (peer, gid, tb.chan)
                if key in table:
                    raise PlanError(f"<gpu id={gid}><tb id={t}>: a second tb {role}s on channel {tb.chan} "
                                    f"with gpu {peer}; a connection has one tb at each end")
                table[key] = t
    pairs: dict[Connection, list[tuple[_MscclStep, _MscclStep]]] = {}
    for key in sorted(set(senders) | set(receivers)):
        a, b, ch = key
        if key not in senders or key not in receivers:
            side = f"<gpu id={a}> sends" if key in senders else f"<gpu id={b}> receives"
            raise PlanError(f"{side} on channel {ch} between gpu {a} and gpu {b} but the other end has no tb")
        s_steps = [st for st in tbs[a][senders[key]].steps if st.type in SENDS]
        r_steps = [st for st in tbs[b][receivers[key]].steps if st.type in RECVS]
        if len(s_steps) != len(r_steps):
            raise PlanError(f"<gpu id={a}><tb id={senders[key]}> sends {len(s_steps)} times to gpu {b} on channel "
                            f"{ch}, but <gpu id={b}><tb id={receivers[key]}> receives {len(r_steps)} times")
        for s_st, r_st in zip(s_steps, r_steps):
            if s_st.cnt != r_st.cnt:
                raise PlanError(f"{r_st.name}: receives cnt={r_st.cnt} but the matching send "
                                f"{s_st.name} sends cnt={s_st.cnt}")
        pairs[key] = list(zip(s_steps, r_steps))
    return pairs


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

    def ref(self, where: tuple, cnt: int) -> ChunkRef:
        return ChunkRef(self.gid, where[0], self.index(where, cnt), cnt)


def _scratch_places(tbs: dict[int, list[_Tb]], pairs: dict, k: int,
                    scratch0: dict[int, int]) -> dict[int, _ScratchPlaces]:
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
            for st in tb.steps:
                sides = [getattr(st, side) for side in LOCAL[st.type] if getattr(st, side) is not None]
                if len(sides) == 2:
                    link(gid, sides[0], gid, sides[1], st.cnt)
    for (a, b, _), matched in pairs.items():
        for s_st, r_st in matched:
            for side in LOCAL[r_st.type]:
                if s_st.sent is not None and getattr(r_st, side) is not None:
                    link(a, s_st.sent, b, getattr(r_st, side), s_st.cnt)
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


def _place_receives(pairs: dict, place: dict[int, _ScratchPlaces], k: int, sems: list[int]) -> dict[int, int]:
    """Give every send a fresh slot in its receiver's scratch, after the places of the file's own scratch chunks
    (so no slot is reused and no write-after-read hazard arises), and every connection a semaphore on its
    receiver (counted in `sems`). Returns the scratch chunks each gpu then needs."""
    scratch = {gid: p.size for gid, p in place.items()}
    for (a, b, _), matched in pairs.items():
        sem = sems[b]
        sems[b] += 1
        for s_st, r_st in matched:
            pos = place[a].position(s_st.sent)
            base = scratch[b]
            scratch[b] = base + -(-(pos + s_st.cnt) // k) * k
            r_st.slot = ChunkRef(b, Buffer.SCRATCH, base + pos, s_st.cnt)
            s_st.out += (r_st.slot,)
            s_st.ssem, r_st.rsem = (b, sem), sem
    return scratch


# -- dependencies within a gpu ---------------------------------------------------------------------------------
class _Dependencies:
    """`depid`/`deps` between tbs of a gpu as signals: one semaphore per (gpu, signalling tb, waiting tb), whose
    signals follow the depended-on steps in their tb's order, so the n-th wait on it meets the n-th of them."""

    def __init__(self, tbs: dict[int, list[_Tb]], sems: list[int]):
        self.signals: dict[tuple[int, int, int], list[int]] = defaultdict(list)  # key -> depended step positions
        for gid, lanes in tbs.items():
            for t, tb in enumerate(lanes):
                for st in tb.steps:
                    for a, b in st.deps:
                        if a != t and b not in self.signals[gid, a, t]:
                            self.signals[gid, a, t].append(b)
        self.sem = {}
        for key in sorted(self.signals):
            self.signals[key].sort()
            self.sem[key] = sems[key[0]]
            sems[key[0]] += 1

    def waits_before(self, gid: int, t: int, pos: int, st: _MscclStep, consumed: dict) -> list[Step]:
        """The waits tb t runs before its step `pos` so that the steps it depends on have signalled; `consumed`
        counts the signals each semaphore's waits have taken so far."""
        out = []
        for a, b in st.deps:
            if a == t:
                if b >= pos:
                    raise PlanError(f"{st.name}: depends on a later step {b} of its own tb")
                continue
            key = (gid, a, t)
            m = self.signals[key].index(b) + 1
            while consumed[key] < m:
                out.append(Step(Op.WAIT, sem=self.sem[key]))
                consumed[key] += 1
        return out

    def signals_after(self, gid: int, t: int, pos: int) -> list[Step]:
        """The signals tb t sends after its step `pos`, to the tbs that depend on it."""
        return [Step(Op.SIGNAL, peer=gid, sem=self.sem[key]) for key in sorted(self.signals)
                if key[0] == gid and key[1] == t and pos in self.signals[key]]

    def leftover_waits(self, gid: int, lanes: list[list[Step]], consumed: dict) -> None:
        """Waits, at the end of the waiting tbs, for the signals no step waited for explicitly, so that every
        signal has its wait."""
        for key, xs in self.signals.items():
            if key[0] == gid:
                while consumed[key] < len(xs):
                    lanes[key[2]].append(Step(Op.WAIT, sem=self.sem[key]))
                    consumed[key] += 1


# -- emitting the plan's steps ----------------------------------------------------------------------------------
# The data step of each step type, from its local chunks (src, dst), the slot a receive reads and the slots a
# send writes (fwd).
_DATA_STEP = {
    "s": lambda src, dst, slot, fwd: Step(Op.PUT, (src,), fwd),
    "r": lambda src, dst, slot, fwd: Step(Op.COPY, (slot,), (dst,)),
    "rcs": lambda src, dst, slot, fwd: Step(Op.PUT, (slot,), (dst,) + fwd),
    "rrc": lambda src, dst, slot, fwd: Step(Op.REDUCE, (src, slot), (dst,)),
    "rrs": lambda src, dst, slot, fwd: Step(Op.REDUCE_PUT, (src, slot), fwd),
    "rrcs": lambda src, dst, slot, fwd: Step(Op.REDUCE_PUT, (src, slot), (dst,) + fwd),
    "cpy": lambda src, dst, slot, fwd: Step(Op.COPY, (src,), (dst,)),
    "re": lambda src, dst, slot, fwd: Step(Op.REDUCE, (dst, src), (dst,)),
}


def _lane(gid: int, t: int, tb: _Tb, place: _ScratchPlaces, deps: _Dependencies, consumed: dict) -> list[Step]:
    """The plan's steps for tb t of gpu `gid`: per MSCCL step, the waits for its dependencies and its
    receive, its data step, and the signals of its send and of the tbs that depend on it."""
    out: list[Step] = []
    for pos, st in enumerate(tb.steps):
        out += deps.waits_before(gid, t, pos, st, consumed)
        if st.type in RECVS:
            out.append(Step(Op.WAIT, sem=st.rsem))
        need = LOCAL[st.type]
        for side in need:
            if getattr(st, side) is None:
                raise PlanError(f"{st.name}: a {st.type} step needs {side}buf and {side}off")
        if st.type in _DATA_STEP:
            src = place.ref(st.src, st.cnt) if "src" in need else None
            dst = place.ref(st.dst, st.cnt) if "dst" in need else None
            out.append(_DATA_STEP[st.type](src, dst, st.slot, st.out))
        if st.type in SENDS:  # the data step just emitted goes over the tb's channel
            out[-1] = dataclasses.replace(out[-1], channel=tb.chan)
            out.append(Step(Op.SIGNAL, peer=st.ssem[0], sem=st.ssem[1]))
        out += deps.signals_after(gid, t, pos)
    return out


def load_msccl_xml(path_or_text) -> Plan:
    """Import an MSCCL XML algorithm (a path or the XML text) as a plan. Raises PlanError naming the element
    and attribute for anything unsupported or malformed. The plan is structurally valid; prove it with
    `check`."""
    root = _parse(path_or_text)
    algo = _read_algo(root)
    k, n = algo.k, algo.nranks
    tbs = {gid: _read_gpu(gid, g, n) for gid, g in algo.gpus.items()}
    scratch0 = {gid: -(-_int(f"<gpu id={gid}>", g, "s_chunks", 0, low=0) // k) * k for gid, g in algo.gpus.items()}
    _check_chunks(algo, tbs, scratch0)
    pairs = _connections(tbs)
    place = _scratch_places(tbs, pairs, k, scratch0)
    sems = [0] * n
    scratch = _place_receives(pairs, place, k, sems)
    deps = _Dependencies(tbs, sems)
    ranks = []
    for gid in range(n):
        consumed: dict = defaultdict(int)
        lanes = [_lane(gid, t, tb, place[gid], deps, consumed) for t, tb in enumerate(tbs[gid])]
        deps.leftover_waits(gid, lanes, consumed)
        ranks.append(lanes)
    sizes, chunks = algo.sizes, max(scratch.values())
    programs = tuple(RankProgram(sizes[Buffer.INPUT], sizes[Buffer.OUTPUT], chunks, sems[g],
                                 tuple(Lane(tuple(s)) for s in ranks[g])) for g in range(n))
    return Plan(algo.collective, n, programs, name=root.get("name", ""), in_place=algo.in_place,
                in_blocks=algo.in_blocks, out_blocks=algo.out_blocks,
                protocol={"LL": "ll", "Simple": "simple"}.get(root.get("proto"), "auto"), root=algo.root,
                perm=algo.perm)


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
    params = TABLE[plan.collective].params
    if "root" in params:
        algo.set("root", str(plan.root))
    if "perm" in params:
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
