"""Tree routes: the one shape every synthesized plan takes.

Each chunk of the collective travels on trees over the ranks: it is reduced up an in-tree to its root (the
reduce_scatter half), then broadcast from the root down an out-tree (the all_gather half). A ring is a chain, a
double binary tree two trees, recursive halving and doubling binomial trees, the hierarchical algorithm a tree of
box chains, and ForestColl's packing many weighted spanning trees. `tree_plan` turns a list of `TreeRoute`s into
a plan: children put their partial sums into fresh scratch chunks of their parent, which reduces them with its own
input when it sends on (reduce_put); broadcasts put into the output chunk of each child, which forwards it.
Every reduced value is computed once, at the root, and copied, so all ranks end with identical bits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxcoll.plan import Buffer, ChunkRef, Collective, Op, Plan
from jaxcoll.synth.schedule import Schedule, paused_gc


class Tree(tuple):
    """A spanning tree as parent pointers (`tree[v]`, -1 at the root) whose edges use channels other than the
    route (`Topology.route`): `channels[v]` is the channel of v's edge to its parent. A tree whose edges all take
    the route is a plain tuple (`tree_of`); trees with equal parents and different channels are different."""

    channels: tuple[int, ...]

    def __new__(cls, parent, channels):
        tree = super().__new__(cls, parent)
        tree.channels = tuple(channels)
        return tree

    def __eq__(self, other):
        return tuple.__eq__(self, other) and self.channels == getattr(other, "channels", None)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((tuple(self), self.channels))

    def __reduce__(self):
        return Tree, (tuple(self), self.channels)

    def __repr__(self):
        return f"Tree({tuple(self)}, channels={self.channels})"


def tree_of(parent, channels) -> tuple[int, ...]:
    """The tree with these parent pointers and edge channels: a plain tuple when every edge takes the route."""
    return Tree(parent, channels) if any(c > 0 for c in channels) else tuple(parent)


def channels_of(tree) -> tuple[int, ...] | None:
    """The channel of each rank's edge to its parent, or None when every edge takes the route."""
    return getattr(tree, "channels", None)


@dataclasses.dataclass(frozen=True)
class TreeRoute:
    """How one piece travels: `count` contiguous chunks from `src` / to `dst`, moved as one step per hop.
    `reduce_parent[v]` / `bcast_parent[v]` is v's parent in the in-tree / out-tree (-1 at the root; None: no such
    phase). `src` is the first input chunk index each contributor reads (all_gather: the root only); `dst` is the
    first output chunk index each receiver writes (reduce_scatter: the root only). A piece stays inside one
    block of the plan's chunk factor. `reduce_channel[v]` / `bcast_channel[v]` is the channel (`Topology.route`)
    of v's edge to its parent (None: every edge takes the route); the steps name it and run in lanes of it."""

    root: int
    src: int
    dst: int
    reduce_parent: tuple[int, ...] | None = None
    bcast_parent: tuple[int, ...] | None = None
    lane: int = 0  # lanes are per (rank, peer, phase, lane): routes with different tags never queue behind each other
    wave: float = 0  # pipelining: lanes run moves in order of (phase, wave + level * hop, ...); see tree_plan
    hop: float = 1.0
    count: int = 1
    reduce_channel: tuple[int, ...] | None = None
    bcast_channel: tuple[int, ...] | None = None


def chain(order: Sequence[int], nranks: int) -> tuple[int, ...]:
    """Out-tree that walks `order` from its first rank: order[i]'s parent is order[i-1]."""
    parent = [-1] * nranks
    for a, b in zip(order, order[1:]):
        parent[b] = a
    return tuple(parent)


def in_chain(order: Sequence[int], nranks: int) -> tuple[int, ...]:
    """In-tree that walks `order` towards its last rank: order[i]'s parent is order[i+1]."""
    parent = [-1] * nranks
    for a, b in zip(order, order[1:]):
        parent[a] = b
    return tuple(parent)


def _children(parent: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p >= 0:
            kids[p].append(v)
    return kids


def _levels(parent: Sequence[int], root: int) -> tuple[list[int], list[int], list[int]]:
    """(children-first order, depth, height) of a spanning tree given by parent pointers."""
    kids = _children(parent)
    order, depth = [root], [0] * len(parent)
    for v in order:
        for c in kids[v]:
            depth[c] = depth[v] + 1
            order.append(c)
    if len(order) != len(parent):
        raise ValueError(f"tree rooted at {root} does not span the ranks: {parent}")
    height = [0] * len(parent)
    for v in reversed(order):
        for c in kids[v]:
            height[v] = max(height[v], height[c] + 1)
    return order, depth, height


def tree_plan(collective: Collective, nranks: int, chunk_factor: int, routes: Sequence[TreeRoute],
              name: str = "", topology=None, lane_of=None, chunk_bytes: float = 1 << 20, shared: bool = False) -> Plan:
    """The plan that moves every chunk along its `TreeRoute`.

    Lanes: one per (rank, peer, phase), plus a local one. A lane runs its moves in order of (phase, wave, tree
    level, item). The wave is when the chunk would leave its root in a fluid schedule (its position in the run):
    chunks are software-pipelined, a link carries the first hop of one chunk while an earlier one makes its
    second hop, and every link sees its load spread evenly over the run rather than in bursts. With a
    `topology`, the lanes are list-scheduled (`Schedule.list_schedule`) for chunks of `chunk_bytes`; `shared` adds a
    last forward pass at the links' shared rates, as the simulator has them."""
    with paused_gc():
        return _tree_plan(Collective(collective), nranks, chunk_factor, routes, name, topology, lane_of,
                          chunk_bytes, shared)


def _tree_plan(collective, nranks, chunk_factor, routes, name, topology, lane_of, chunk_bytes, shared) -> Plan:
    sched = Schedule(collective, nranks, chunk_factor, name)
    # Routes share a few trees (a packing has a handful per root): the shape of each is worked out once.
    shapes: dict[tuple[tuple[int, ...], int], tuple] = {}

    def shape(parent: tuple[int, ...], root: int) -> tuple:
        """(children-first order, depth, height, children) of the tree."""
        key = (tuple(parent), root)
        if key not in shapes:
            order, depth, height = _levels(parent, root)
            shapes[key] = order, depth, height, _children(parent)
        return shapes[key]

    # Lane ids, looked up per move: local[v], and to[phase, tag, channel][v][p] (-1 until the lane has a move).
    # Channel 0 is the route, whose steps name none. The steps on another channel to a peer run in one lane of
    # their own, of both phases and every tag: the checker keeps a channel to one lane (an ordered connection);
    # the lane runs the reduction's moves before the broadcast's (priorities start with the phase).
    local = [sched.lane(v, "local") for v in range(nranks)]
    to: dict[tuple[int, int, int], list[list[int]]] = {}

    def lanes_to(phase: int, tag: int, channel: int = 0) -> list[list[int]]:
        if (phase, tag, channel) not in to:
            to[phase, tag, channel] = [[-1] * nranks for _ in range(nranks)]
        return to[phase, tag, channel]

    def new_lane(phase: int, tag: int, v: int, p: int, channel: int = 0) -> int:
        if channel > 0:
            lane = sched.lane(v, ("to", p, "channel", channel), p, channel)
        else:
            lane = sched.lane(v, ("to", p, phase, lane_of(v, p, phase) if lane_of else tag), p)
        to[phase, tag, channel][v][p] = lane
        return lane

    ref = ChunkRef.unchecked
    INPUT, OUTPUT = Buffer.INPUT, Buffer.OUTPUT
    move, scratch = sched.move, sched.scratch
    for item, route in enumerate(routes):
        root, wave, hop, tag, count = route.root, route.wave, route.hop, route.lane, route.count
        produced = None  # the move that leaves the final value in root's output chunk (None: read input)
        if route.reduce_parent is not None:
            parent, src, channel = route.reduce_parent, route.src, route.reduce_channel
            order, togo, height, kids = shape(parent, root)
            up = lanes_to(0, tag)
            slot = [None] * nranks  # child -> the scratch chunk at its parent it delivers into
            sent = [None] * nranks  # child -> its move
            for v in reversed(order):
                kv = kids[v]
                if kv:
                    srcs = (ref(v, INPUT, src, count), *[slot[c] for c in kv])
                    deps = tuple([sent[c] for c in kv])
                else:
                    srcs, deps = (ref(v, INPUT, src, count),), ()
                # among moves of a wave and level, those whose chunk has further to go run first
                prio = (0, wave + height[v] * hop, height[v], -togo[v], item)
                if v == root:
                    produced = move(local[v], prio, Op.READ_REDUCE if kv else Op.COPY, srcs,
                                    (ref(v, OUTPUT, route.dst, count),), deps)
                else:
                    p = parent[v]
                    ch = channel[v] if channel is not None else 0
                    lane = (up if ch == 0 else lanes_to(0, tag, ch))[v][p]
                    if lane < 0:
                        lane = new_lane(0, tag, v, p, ch)
                    slot[v] = scratch(p, src, count)
                    sent[v] = move(lane, prio, Op.REDUCE_PUT if kv else Op.PUT, srcs, (slot[v],), deps)
        if route.bcast_parent is not None:
            order, depth, below, kids = shape(route.bcast_parent, root)
            channel = route.bcast_channel
            if produced is None:
                move(local[root], (0, 0, item), Op.COPY, (ref(root, INPUT, route.src, count),),
                     (ref(root, OUTPUT, route.dst, count),))
            # each rank's output chunk is written by its parent's put and read by its own: one ref serves both
            out = [(ref(v, OUTPUT, route.dst, count),) for v in range(nranks)]
            down = lanes_to(1, tag)
            # A tree's last piece leaves its root at wave 1 and reaches its deepest rank d hops later: the waves
            # of a tree of depth d run over 1 - d hop, so that every tree's last hop comes at about 1 and the run
            # ends with the last levels of all trees at once, not with the deep trees' tails (dgx-h100x4
            # all_gather at 1 GiB: 97.9% -> 98.4% of the bound; dgx-h100x2 99.6% -> 99.7%). With few pieces d
            # hops can exceed the run: the waves then coincide, and levels order the moves.
            start = wave * max(0.0, 1 - depth[order[-1]] * hop)  # order is by depth
            arrived = [()] * nranks  # rank -> the move its own put waits for, as deps
            if produced is not None:
                arrived[root] = (produced,)
            for v in order:
                kv = kids[v]
                if not kv:
                    continue
                srcs = (ref(v, INPUT, route.src, count),) if v == root and produced is None else out[v]
                deps, level = arrived[v], depth[v]
                when = start + level * hop
                lanes = down[v]
                for c in kv:
                    ch = channel[c] if channel is not None else 0
                    lane = lanes[c] if ch == 0 else lanes_to(1, tag, ch)[v][c]
                    if lane < 0:
                        lane = new_lane(1, tag, v, c, ch)
                    arrived[c] = (move(lane, (1, when, level, -below[c], item), Op.PUT, srcs, out[c], deps),)
    if topology is not None:
        # Three passes, the last in the direction the trees run: reduce_scatter's in-trees are packed from the
        # end, the broadcasts from the start; the middle pass reorders the other end (dgx-h100x2 at 1 GiB:
        # all_gather 97.9% -> 98.8% of the bound, reduce_scatter 95.0% -> 98.4%). all_reduce, whose moves are
        # both and twice as many, gets two: its reductions packed from the end, then its broadcasts from the
        # start. That saves a third of the list schedule (16-rank generation 1.02 -> 0.92 s) at about the same
        # quality: % of the bound "bf" / "fbf": dgx-h100x2 99.18 / 98.95, mi250 99.18 / 98.87, mi250x2
        # 99.27 / 99.20, dgx-a100x2 98.41 / 98.61, dgx1 92.79 / 94.30 ("fb": dgx-h100x2 98.27).
        passes = {Collective.REDUCE_SCATTER: "bfb", Collective.ALL_REDUCE: "bf"}.get(collective, "fbf")
        # `shared`: a last forward pass at the links' shared rates ("F"), whose order the simulator then runs
        # exactly as the pass did (`Schedule.list_schedule`).
        sched.list_schedule(topology, chunk_bytes, passes=passes + ("F" if shared else ""))
    return sched.build()


def tree_per_root(collective, nranks: int, tree_at, name: str) -> Plan:
    """The plan in which block r is reduced up `tree_at(r)` to its root r and broadcast down the same tree (the
    tree serves as in-tree and out-tree alike: recursive halving/doubling's binomial trees, the direct plan's
    stars). all_reduce cuts the buffer into N blocks; the halves move one block per root."""
    collective = Collective(collective)
    routes = []
    for r in range(nranks):
        t = tree_at(r)
        if collective is Collective.ALL_REDUCE:
            routes.append(TreeRoute(r, r, r, reduce_parent=t, bcast_parent=t))
        elif collective is Collective.ALL_GATHER:
            routes.append(TreeRoute(r, 0, r, bcast_parent=t))
        elif collective is Collective.REDUCE_SCATTER:
            routes.append(TreeRoute(r, r, 0, reduce_parent=t))
        else:
            raise ValueError(f"{name} covers all_gather, reduce_scatter and all_reduce, got {collective.value!r}")
    k = nranks if collective is Collective.ALL_REDUCE else 1
    return tree_plan(collective, nranks, k, routes, name=name)
