"""Read the text `nvidia-smi topo -m` prints into a Topology of one box.

The matrix names, for each pair of GPUs (and NICs), how they connect: `NV#` (a bonded set of # NVLinks), `PIX`
(at most one PCIe bridge), `PXB` (several PCIe bridges), `PHB` (a PCIe host bridge), `NODE` (host bridges within a
NUMA node), `SYS` (across the inter-socket link). We build: NVLinks as direct links of # x `nvlink_GBps`; one
PCIe switch per group of devices joined by PIX/PXB; one host node per NUMA node (from the NUMA Affinity column,
else from NODE/PHB groups) holding those switches; the host nodes joined by the inter-socket link. NICs become
switch nodes (they route, they do not compute); with one box they lead nowhere, but they show in drawings.
"""

from __future__ import annotations

import re

from jaxcoll.topology.errors import TopologyError
from jaxcoll.topology.graph import Topology
from jaxcoll.topology.presets import NVLINK_LATENCY_US, PCIE_LATENCY_US

_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$")


def parse_nvidia_smi_topo(text: str, name: str = "nvidia-smi", nvlink_GBps: float = 25.0,
                          pcie_GBps: float = 16.0, sys_GBps: float = 19.2) -> Topology:
    """Topology of the box whose `nvidia-smi topo -m` output is `text`. GPUs become ranks 0..N-1 in their
    order; `nvlink_GBps` is the bandwidth of one NVLink (25 for NVLink 2, 3 and 4, per direction)."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if header_at is None:
        raise TopologyError("no `nvidia-smi topo -m` matrix found: expected a header line starting with GPU0")
    header = lines[header_at].split()
    devices = [h for h in header if _DEVICE.match(h)]
    has_numa = "NUMA" in header and "Affinity" in header[header.index("NUMA"):]
    legend = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)", text, re.M))
    rows: dict[str, list[str]] = {}
    numa: dict[str, str] = {}
    for ln in lines[header_at + 1:]:
        cells = ln.split()
        if not cells or not _DEVICE.match(cells[0]):
            if rows:
                break
            continue
        if len(cells) < len(devices) + 1:
            raise TopologyError(f"matrix row {cells[0]!r} has {len(cells) - 1} entries, expected {len(devices)}")
        rows[cells[0]] = cells[1:len(devices) + 1]
        extra = cells[len(devices) + 1:]
        if has_numa and len(extra) >= 2 and re.fullmatch(r"\d+", extra[1]):
            numa[cells[0]] = extra[1]
    missing = [d for d in devices if d not in rows]
    if missing:
        raise TopologyError(f"matrix has no row for {missing}")
    gpus = [d for d in devices if d.startswith("GPU")]
    nics = [d for d in devices if not d.startswith("GPU")]
    rank = {g: i for i, g in enumerate(gpus)}

    def node(d: str):
        return rank[d] if d in rank else f"nic:{legend.get(d, d)}"

    # Group devices into PCIe switches (PIX/PXB) and NUMA nodes (NODE/PHB or the NUMA column).
    parent = {d: d for d in devices}

    def find(d):
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    numa_parent = dict(parent)

    def find_numa(d):
        while numa_parent[d] != d:
            numa_parent[d] = numa_parent[numa_parent[d]]
            d = numa_parent[d]
        return d

    links = []
    for a in devices:
        for j, b in enumerate(devices):
            kind = rows[a][j]
            if a == b or kind == "X":
                continue
            m = re.fullmatch(r"NV(\d+)", kind)
            if m and a in rank and b in rank:
                links.append((rank[a], rank[b], int(m.group(1)) * nvlink_GBps, NVLINK_LATENCY_US))
            elif kind in ("PIX", "PXB"):
                parent[find(a)] = find(b)
                numa_parent[find_numa(a)] = find_numa(b)
            elif kind in ("PHB", "NODE"):
                numa_parent[find_numa(a)] = find_numa(b)
            elif kind not in ("SYS",) and not m:
                raise TopologyError(f"unknown connection {kind!r} between {a} and {b}")
    if numa:
        hosts = {d: f"numa{numa.get(d, '?')}" for d in devices}
        # NICs carry no NUMA column: they join the host of a GPU they share a switch or host bridge with.
        for d in nics:
            mates = [g for g in gpus if find_numa(g) == find_numa(d)]
            hosts[d] = hosts[mates[0]] if mates else f"numa-{find_numa(d)}"
    else:
        hosts = {d: f"host-{find_numa(d)}" for d in devices}
    switches, seen = [], set()
    for d in devices:
        for s in (f"pcie-{find(d)}", hosts[d]):
            if s not in seen:
                seen.add(s)
                switches.append(s)
    for d in nics:
        switches.append(node(d))
    for d in devices:
        links += [(node(d), f"pcie-{find(d)}", pcie_GBps, PCIE_LATENCY_US),
                  (f"pcie-{find(d)}", node(d), pcie_GBps, PCIE_LATENCY_US)]
    for s in {f"pcie-{find(d)}": hosts[d] for d in devices}.items():
        links += [(s[0], s[1], pcie_GBps, PCIE_LATENCY_US), (s[1], s[0], pcie_GBps, PCIE_LATENCY_US)]
    host_names = sorted(set(hosts.values()))
    for a in host_names:
        for b in host_names:
            if a != b:
                links.append((a, b, sys_GBps, PCIE_LATENCY_US))
    # A switch group of one device adds a PCIe hop that the hardware does not have; it is harmless for routing.
    links = [(a, b, bw, lat) for a, b, bw, lat in links if a != b]
    return Topology(name, len(gpus), switches, links)
