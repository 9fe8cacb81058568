"""Built-in topologies: the boxes the field benchmarks on, each for k boxes joined by NIC rails.

Numbers are per direction, in GB/s (10^9 bytes/s), and their sources are named beside them. Latencies follow the
order of NCCL's hardware latency table (src/graph/tuning.cc, hwLat for the LL protocol: NVLink ~0.6 us, PCIe ~1 us,
network ~5 us per transfer); we split the network's across the NIC hops.

Multi-box fabrics are rail-optimized (as DGX SuperPOD): NIC i of every box hangs off rail switch i, so GPU i of
one box reaches GPU i of another box in one switch hop; the rails meet at a non-blocking spine, so any GPU reaches
any other through the network too (one more hop).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxcoll.topology.errors import TopologyError
from jaxcoll.topology.graph import Topology

NVLINK_LATENCY_US = 0.6  # NCCL tuning.cc hwLat[NVLINK] (LL)
PCIE_LATENCY_US = 1.0  # NCCL tuning.cc hwLat[PCI] (LL)
NIC_LATENCY_US = 1.25  # NCCL hwLat[NET] ~5 us end to end, over the 4 hops GPU-NIC-rail-NIC-GPU

NVLINK2_GBPS = 25.0  # one V100 NVLink 2 link, per direction (NVIDIA Tesla V100 whitepaper)
NVLINK3_GBPS = 25.0  # one A100 NVLink 3 link (NVIDIA A100 whitepaper: 12 links, 600 GB/s bidirectional)
NVLINK4_GBPS = 25.0  # one H100 NVLink 4 link (NVIDIA H100 whitepaper: 18 links, 900 GB/s bidirectional)
XGMI_GBPS = 50.0  # one MI250 Infinity Fabric link (AMD CDNA2 whitepaper: 50 GB/s per direction)
PCIE3_GBPS, PCIE4_GBPS, PCIE5_GBPS = 16.0, 32.0, 64.0  # x16 slots
EDR_GBPS, HDR_GBPS, NDR_GBPS = 12.5, 25.0, 50.0  # InfiniBand 100/200/400 Gb/s NICs
SLINGSHOT_GBPS = 25.0  # HPE Slingshot-11, 200 Gb/s (OLCF Frontier node)

HBM_GBPS = {"V100": 900.0, "A100": 2039.0, "H100": 3350.0, "MI250": 1600.0}  # per GPU (per GCD for MI250)

# DGX-1 (V100) hybrid cube-mesh: NVLink count between GPU pairs, as `nvidia-smi topo -m` prints it on a DGX-1V
# (NVIDIA DGX-1 with Tesla V100 system architecture whitepaper, figure 3). Every GPU has 6 links.
DGX1_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
                (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}

# MI250 box (4 MI250 packages = 8 GCDs, like an OLCF Frontier node): the two GCDs of a package share 4 links;
# GCDs of different packages are joined by 1 or 2 links. The package-internal numbers follow the OLCF Frontier user
# guide's node diagram; the exact cross-package pairing here is an approximation of it. Pairs not listed talk
# through a third GCD.
MI250_XGMI = {(0, 1): 4, (2, 3): 4, (4, 5): 4, (6, 7): 4,
              (0, 2): 1, (1, 3): 1, (4, 6): 1, (5, 7): 1,
              (1, 6): 2, (3, 4): 2, (0, 7): 1, (2, 5): 1, (0, 4): 1, (2, 6): 1, (1, 5): 1, (3, 7): 1}


class _Builder:
    def __init__(self):
        self.switches: list[str] = []
        self.links: list[tuple] = []

    def switch(self, name: str) -> str:
        self.switches.append(name)
        return name

    def duplex(self, a, b, bw: float, lat: float) -> None:
        self.links.append((a, b, bw, lat))
        self.links.append((b, a, bw, lat))


def _rails(b: _Builder, boxes: int, per_box: int, nic_of: Callable[[int], int], nics: int, pcie: float,
           nic_bw: float, shared_pcie: bool = False) -> None:
    """NIC i of each box on rail switch i. `nic_of(local_gpu)` names the NIC a GPU uses."""
    if boxes == 1:
        return
    rails = _rail_switches(b, boxes, nics, nic_bw)
    for box in range(boxes):
        for i in range(nics):
            nic = b.switch(f"b{box}.nic{i}")
            b.duplex(nic, rails[i], nic_bw, NIC_LATENCY_US)
            if shared_pcie:
                continue
            for g in range(per_box):
                if nic_of(g) == i:
                    b.duplex(box * per_box + g, nic, pcie, PCIE_LATENCY_US)


def _rail_switches(b: _Builder, boxes: int, nics: int, nic_bw: float) -> list[str]:
    rails = [b.switch(f"rail{i}") for i in range(nics)]
    spine = b.switch("spine")
    for r in rails:
        b.duplex(r, spine, boxes * nic_bw, NIC_LATENCY_US)  # non-blocking: as wide as the rail's NICs
    return rails


def _switch_box(b: _Builder, box: int, per_box: int, nvlink_bw: float, name: str = "nvswitch") -> None:
    sw = b.switch(f"b{box}.{name}")
    for g in range(per_box):
        b.duplex(box * per_box + g, sw, nvlink_bw, NVLINK_LATENCY_US)


def dgx1(boxes: int = 1) -> Topology:
    """DGX-1 / Azure NDv2: 8 V100 in a hybrid cube-mesh of NVLink 2 (25 GB/s per link), 4 EDR NICs (12.5 GB/s),
    each behind the PCIe switch of a GPU pair; PCIe switches under two CPUs."""
    b = _Builder()
    for box in range(boxes):
        o = 8 * box
        for (i, j), n in DGX1_NVLINKS.items():
            b.duplex(o + i, o + j, n * NVLINK2_GBPS, NVLINK_LATENCY_US)
        cpus = [b.switch(f"b{box}.cpu{c}") for c in range(2)]
        b.duplex(cpus[0], cpus[1], 19.2, PCIE_LATENCY_US)  # UPI/QPI 9.6 GT/s x2
        for p in range(4):
            sw = b.switch(f"b{box}.pcie{p}")
            b.duplex(sw, cpus[p // 2], PCIE3_GBPS, PCIE_LATENCY_US)
            for g in (2 * p, 2 * p + 1):
                b.duplex(o + g, sw, PCIE3_GBPS, PCIE_LATENCY_US)
    if boxes > 1:
        rails = _rail_switches(b, boxes, 4, EDR_GBPS)
        for box in range(boxes):
            for p in range(4):
                nic = b.switch(f"b{box}.nic{p}")
                b.duplex(nic, f"b{box}.pcie{p}", PCIE3_GBPS, PCIE_LATENCY_US)
                b.duplex(nic, rails[p], EDR_GBPS, NIC_LATENCY_US)
    return _finish(f"dgx1x{boxes}" if boxes > 1 else "dgx1", 8, boxes, b, "V100")


def dgx2(boxes: int = 1) -> Topology:
    """DGX-2: 16 V100 on NVSwitch, 6 NVLink 2 links each (150 GB/s per direction); 8 EDR NICs (12.5 GB/s), one per
    GPU pair behind a PCIe switch (NVIDIA DGX-2 system architecture whitepaper)."""
    b = _Builder()
    for box in range(boxes):
        _switch_box(b, box, 16, 6 * NVLINK2_GBPS)
    if boxes > 1:
        rails = _rail_switches(b, boxes, 8, EDR_GBPS)
        for box in range(boxes):
            for p in range(8):
                sw = b.switch(f"b{box}.pcie{p}")
                nic = b.switch(f"b{box}.nic{p}")
                for g in (2 * p, 2 * p + 1):
                    b.duplex(16 * box + g, sw, PCIE3_GBPS, PCIE_LATENCY_US)
                b.duplex(sw, nic, PCIE3_GBPS, PCIE_LATENCY_US)
                b.duplex(nic, rails[p], EDR_GBPS, NIC_LATENCY_US)
    return _finish(f"dgx2x{boxes}" if boxes > 1 else "dgx2", 16, boxes, b, "V100")


def dgx_a100(boxes: int = 1) -> Topology:
    """DGX A100: 8 A100 on NVSwitch, 12 NVLink 3 links each (300 GB/s per direction); 8 HDR NICs (25 GB/s), one
    per GPU on PCIe 4 (NVIDIA DGX A100 system architecture whitepaper)."""
    b = _Builder()
    for box in range(boxes):
        _switch_box(b, box, 8, 12 * NVLINK3_GBPS)
    _rails(b, boxes, 8, lambda g: g, 8, PCIE4_GBPS, HDR_GBPS)
    return _finish(f"dgx-a100x{boxes}" if boxes > 1 else "dgx-a100", 8, boxes, b, "A100")


def dgx_h100(boxes: int = 1) -> Topology:
    """DGX H100: 8 H100 on NVSwitch, 18 NVLink 4 links each (450 GB/s per direction); 8 NDR NICs (50 GB/s), one
    per GPU on PCIe 5 (NVIDIA DGX H100 user guide)."""
    b = _Builder()
    for box in range(boxes):
        _switch_box(b, box, 8, 18 * NVLINK4_GBPS)
    _rails(b, boxes, 8, lambda g: g, 8, PCIE5_GBPS, NDR_GBPS)
    return _finish(f"dgx-h100x{boxes}" if boxes > 1 else "dgx-h100", 8, boxes, b, "H100")


def mi250(boxes: int = 1) -> Topology:
    """An MI250 box: 4 MI250 packages, 8 GCDs in an Infinity Fabric (xGMI) mesh of 50 GB/s links (see
    MI250_XGMI); 4 Slingshot NICs (25 GB/s), one per package, reached by both of its GCDs over PCIe."""
    b = _Builder()
    for box in range(boxes):
        for (i, j), n in MI250_XGMI.items():
            b.duplex(8 * box + i, 8 * box + j, n * XGMI_GBPS, NVLINK_LATENCY_US)
    _rails(b, boxes, 8, lambda g: g // 2, 4, PCIE4_GBPS, SLINGSHOT_GBPS)
    return _finish(f"mi250x{boxes}" if boxes > 1 else "mi250", 8, boxes, b, "MI250")


def te_ccl_dgx2(boxes: int = 2) -> Topology:
    """TE-CCL's two-box DGX-2 model (Liu et al., "Rethinking machine learning collective communication as a
    multi-commodity flow problem", SIGCOMM 2024): 16 GPUs per box on a 125 GB/s switch; 8 IB links of 12.5 GB/s
    from the odd GPUs of one box to the even GPUs of the other, both ways. Its optimal all_gather algbw is
    129.03 GB/s (= 32 * 125 / 31: an odd GPU's ingress is the bottleneck)."""
    if boxes != 2:
        raise TopologyError(f"te-ccl-dgx2 models exactly 2 boxes, got boxes={boxes}")
    b = _Builder()
    for box in range(2):
        _switch_box(b, box, 16, 125.0, "switch")
    for box in range(2):
        other = 1 - box
        for i in range(8):
            b.links.append((16 * box + 2 * i + 1, 16 * other + 2 * i, EDR_GBPS, NIC_LATENCY_US * 4))
    return _finish("te-ccl-dgx2", 16, 2, b, "V100")


def cpu(nranks: int = 8, bandwidth_GBps: float = 8.0, latency_us: float = 0.5) -> Topology:
    """The CPU runtime: `nranks` device threads of one process sharing host memory. Each rank moves data through
    the memory system at `bandwidth_GBps` per direction (one core's memcpy rate) after `latency_us` (a
    semaphore round trip through the cache hierarchy)."""
    b = _Builder()
    mem = b.switch("memory")
    for r in range(nranks):
        b.duplex(r, mem, bandwidth_GBps, latency_us / 2)
    return Topology(f"cpu{nranks}", nranks, b.switches, b.links, memory_bandwidth_GBps=bandwidth_GBps)


def _finish(name: str, per_box: int, boxes: int, b: _Builder, gpu: str) -> Topology:
    if boxes < 1:
        raise TopologyError(f"boxes must be >= 1, got {boxes}")
    return Topology(name, per_box * boxes, b.switches, b.links,
                    [list(range(per_box * k, per_box * (k + 1))) for k in range(boxes)], HBM_GBPS[gpu])


PRESETS: dict[str, Callable[..., Topology]] = {
    "dgx1": dgx1, "ndv2": dgx1, "dgx2": dgx2, "dgx-a100": dgx_a100, "dgx-h100": dgx_h100, "mi250": mi250,
    "te-ccl-dgx2": te_ccl_dgx2, "cpu": cpu,
}


def preset(name: str, boxes: int = 1) -> Topology:
    """A built-in topology by name (see PRESETS) for `boxes` boxes (for "cpu": `boxes` is ignored; use cpu(n))."""
    key = name.lower().replace("_", "-")
    if key not in PRESETS:
        raise TopologyError(f"unknown topology preset {name!r}; known: {sorted(PRESETS)}")
    if not isinstance(boxes, int) or boxes < 1:
        raise TopologyError(f"boxes must be a positive integer, got {boxes!r}")
    if key == "cpu":
        return cpu()
    return PRESETS[key](boxes)
