"""Compressed all_reduce against jaxcoll's exact all_reduce and XLA's psum: bytes each rank sends and time per
call, all methods alternating call by call in one run; then the simulator's prediction of the same ratios on
the GPU presets (DGX H100, 1, 2 and 4 boxes).

    PYTHONPATH=. python benchmarks/compressed_collectives.py --sizes 1M,16M,64M --reps 7 --markdown /tmp/compression.md
    PYTHONPATH=$PWD python benchmarks/compressed_collectives.py --sizes 16M --processes 2 --transport tcp
    PYTHONPATH=$PWD python benchmarks/compressed_collectives.py --sizes 16M,64M --processes 2 --transport tcp \
        --mesh 2x4 --compress-axes host [--stages]

With --mesh OxL the 8 devices form a ("host", "local") mesh (in a job of O processes, "host" runs across the
processes) and every method reduces over both axes; --compress-axes host adds the hierarchical methods
(`compress_axes="host"`: exact inside a host, compressed only across hosts), and "across/rank" counts the bytes
a rank sends over the host axis (the slow hop); --stages adds stage 2's calls timed one by one.

Each cell is the median of `reps` calls after `warmup` untimed calls of each method. "sent/rank" counts the
bytes a rank sends to the others in one call (the wire form: codes, scales, indices); "speedup" is jaxcoll's
exact float32 all_reduce's time over the method's.

(Not named compression.py: a script's folder comes first on sys.path, and jax imports the standard library's
`compression` package, which such a file would shadow.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

from jaxcoll import launch

if __name__ == "__main__" and not launch.in_job():  # a job's processes take their device count from the launcher
    jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402
from jaxcoll.cli.bench import copy_bandwidth, copy_bandwidth_setting, format_size, parse_size  # noqa: E402
from jaxcoll.compress import TopK, formats, quantized  # noqa: E402
from jaxcoll.compress.sparse import Layout  # noqa: E402
from jaxcoll.lowering import groups  # noqa: E402

METHODS = {
    "XLA psum": lambda x: lax.psum(x, "i"),
    "jaxcoll exact": lambda x: jaxcoll.all_reduce(x, "i"),
    "bf16": lambda x: jaxcoll.all_reduce(x, "i", compression="bf16"),
    "fp8": lambda x: jaxcoll.all_reduce(x, "i", compression="fp8"),
    "int8": lambda x: jaxcoll.all_reduce(x, "i", compression="int8"),
    "top-k 1%": lambda x: jaxcoll.all_reduce(x, "i", compression=TopK(fraction=0.01)),
}


AXES = ("host", "local")
METHODS_2D = {
    "XLA psum": lambda x: lax.psum(x, AXES),
    "jaxcoll exact": lambda x: jaxcoll.all_reduce(x, AXES),
    "int8 flat": lambda x: jaxcoll.all_reduce(x, AXES, compression="int8"),
}
HIERARCHICAL = ("bf16", "fp8", "int8")


def hierarchical_methods(compress_axes: str, mesh_shape) -> dict:
    """The hierarchical methods, and the int8 one's stages timed alone (where its time goes): the exact hops
    over the other axis (reduce_scatter then all_gather), and the compressed all_reduce of the 1/L chunk (on an
    operand of the chunk's size: (function, operand) as in stage_2_pieces)."""
    inner = AXES[1 - AXES.index(compress_axes)]
    methods = {f"{c} hier": (lambda x, c=c: jaxcoll.all_reduce(x, AXES, compression=c, compress_axes=compress_axes))
               for c in HIERARCHICAL}
    methods[f"stages 1+3: exact over {inner}"] = lambda x: jaxcoll.all_gather(
        jaxcoll.reduce_scatter(x, inner, tiled=True), inner, tiled=True)
    methods[f"stage 2: int8 over {compress_axes}, 1/L"] = (
        lambda c: jaxcoll.all_reduce(c, compress_axes, compression="int8"),
        lambda elements: ((elements // mesh_shape[AXES.index(inner)],), np.float32))
    return methods


def stage_2_pieces(compress_axes: str, mesh_shape) -> dict:
    """Stage 2 of the int8 hier call (the compressed all_reduce of the 1/L chunk over `compress_axes`) cut into
    the calls it makes when that axis has 2 ranks (quantized._gather_and_sum: one hop), each timed alone on an
    operand of its own (what it gets inside the call: the chunk, one wire row, both wire rows): the encoding
    into the wire form, the gather of the wire row across the processes, the decoding sum; then what any call
    pays: a cross-process call that moves nothing to speak of (the transport's rendezvous and latency), and a
    program of one tiny local op (XLA's dispatch of an 8-device program). Values are (function, operand), the
    operand (shape, dtype) per rank as a function of x's elements per rank."""
    from jaxcoll.compress import codec
    inner = AXES[1 - AXES.index(compress_axes)]
    fmt = formats.parse("benchmark", "int8")

    def chunk(elements):
        return (elements // mesh_shape[AXES.index(inner)],), np.float32

    def wire(rows):
        return lambda elements: ((rows, codec.wire_row_bytes(fmt, chunk(elements)[0][0])), np.int8)

    def gather(v):
        return jaxcoll.all_gather(v, compress_axes, tiled=True)

    def codes_in(width):  # a wire row's codes (a chunk of whole 256-blocks has no zero bytes before its scales)
        return width * fmt.block_size // (fmt.block_size + 4)

    return {
        "2a: encode the chunk (wire form)": (lambda c: codec.encode_wire(fmt, c), chunk),
        f"2b: gather the wire row over {compress_axes}": (gather, wire(1)),
        "2c: decode and sum 2 wire rows": (lambda w: codec.decode_sum_wire(fmt, w, codes_in(w.shape[-1])), wire(2)),
        f"a call over {compress_axes} of 256 B (latency)": (gather, lambda elements: ((64,), np.float32)),
        "a program of one tiny op (dispatch)": (lambda v: v * 2, lambda elements: ((64,), np.float32)),
        f"exact f32 all_reduce of the chunk over {compress_axes}": (lambda c: jaxcoll.all_reduce(c, compress_axes),
                                                                    chunk),
    }


def across_bytes(method: str, elements: int, outer: int, inner: int) -> int | None:
    """Bytes one rank sends over the host axis (to ranks of other hosts) in one all_reduce on the 2D mesh."""
    n = outer * inner
    if method == "XLA psum":
        return None  # gloo's schedule is its own
    if method == "jaxcoll exact":  # hierarchical already: only each rank's 1/L chunk crosses, both halves
        return 2 * 4 * (elements // inner) * (outer - 1) // outer
    if method.startswith("stages 1+3") or method[:3] in ("2a:", "2c:") or "program" in method:
        return 0
    if method.startswith("2b:"):
        return quantized.wire_bytes(formats.parse("benchmark", "int8"), "all_reduce", elements // inner, outer)
    if method.startswith("a call over"):
        return 256 * (outer - 1)
    if method.startswith("exact f32"):
        return 2 * 4 * (elements // inner) * (outer - 1) // outer
    if method.startswith("stage 2"):
        return quantized.wire_bytes(formats.parse("benchmark", "int8"), "all_reduce", elements // inner, outer)
    if method == "int8 flat":  # every rank pair exchanges rows: those to the other hosts' ranks cross
        return sent_bytes("int8", elements, n) * (n - inner) // (n - 1)
    fmt = formats.parse("benchmark", method.split()[0])
    return quantized.wire_bytes(fmt, "all_reduce", elements // inner, outer)


def sent_bytes(method: str, elements: int, n: int) -> int:
    """Bytes one rank sends to the others in one all_reduce of `elements` float32 elements per rank."""
    if method in ("XLA psum", "jaxcoll exact"):
        return 2 * 4 * elements * (n - 1) // n  # reduce-scatter and all-gather halves (two-shot, ring)
    if method == "top-k 1%":
        return Layout.of(elements, max(1, round(0.01 * elements)), n).wire_bytes()
    return quantized.wire_bytes(formats.parse("benchmark", method), "all_reduce", elements, n)


def ranks_operand(mesh, spec, shape, dtype):
    """An array of `shape` per rank (the ranks stacked on the first axis), random bytes of `dtype`."""
    n = mesh.devices.size
    data = np.random.default_rng(1).integers(-100, 100, (n * shape[0],) + tuple(shape[1:])).astype(dtype)
    return jax.make_array_from_callback(data.shape, NamedSharding(mesh, spec), lambda index: data[index])


def measure(sizes, reps: int, warmup: int, mesh_shape=None, compress_axes=None, stages=False):
    if mesh_shape is None:
        mesh, methods, spec = jax.make_mesh((8,), ("i",)), METHODS, P("i")
    else:  # jax.devices() lists each process's devices together: row p of the grid is process p's
        mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(mesh_shape), AXES)
        methods, spec = dict(METHODS_2D), P(AXES)
        if compress_axes:
            methods.update(hierarchical_methods(compress_axes, mesh_shape))
        if stages:
            methods.update(stage_2_pieces(compress_axes, mesh_shape))
    n = 8
    rows = []
    for size in sizes:
        elements = size // 4
        data = np.random.default_rng(0).standard_normal((n * elements,), np.float32)
        # From a callback: in a job of several processes each process places only its own devices' shards.
        x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, spec), lambda index: data[index])
        # On the 2D mesh each rank's result comes back as its own shard: the stages' results are not invariant.
        out_spec = P() if mesh_shape is None else spec
        programs, operands = {}, {}
        for name, method in methods.items():  # a function of x, or (function, its own operand per rank)
            fn, operand = (method, None) if callable(method) else method
            programs[name] = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=out_spec))
            operands[name] = x if operand is None else ranks_operand(mesh, spec, *operand(elements))
        for name, prog in programs.items():
            for _ in range(warmup):
                prog(operands[name]).block_until_ready()
        times = {name: [] for name in programs}
        for _ in range(reps):  # alternate the methods call by call
            for name, prog in programs.items():
                t0 = time.perf_counter()
                prog(operands[name]).block_until_ready()
                times[name].append(time.perf_counter() - t0)
        exact = float(np.median(times["jaxcoll exact"]))
        for name in programs:
            t = float(np.median(times[name]))
            if mesh_shape is None:
                rows.append((size, name, sent_bytes(name, elements, n), t, exact / t))
            else:
                rows.append((size, name, across_bytes(name, elements, *mesh_shape), t, exact / t))
        del x, programs
    return rows


def profile(size: int, reps: int = 9):
    """CPU milliseconds of each local stage of one rank's compressed all_reduce at `size` bytes per rank (one
    device, no communication; process time, which counts every thread and is steadier than wall time on a
    shared machine; the least of `reps` calls, since a call whose output lands on fresh pages also pays the
    kernel's zeroing of them), next to one pass over the same float32 data. Each block-format stage is timed
    as formats.py's jax.numpy run by XLA:CPU and as the native codec (jaxcoll.compress.codec) with its
    bandwidth: the bytes it reads and writes over its CPU time. Returns {stage: (xla ms, native ms, GB/s)}."""
    import jax.numpy as jnp

    from jaxcoll.compress import codec, sparse
    from jaxcoll.plan import abi

    def cpu_ms(f, *args):
        f = jax.jit(f)
        jax.block_until_ready(f(*args))
        ts = []
        for _ in range(reps):
            t0 = time.process_time()
            jax.block_until_ready(f(*args))
            ts.append(time.process_time() - t0)
        return float(np.min(ts)) * 1e3  # the least: a call whose output reused warm pages

    n, e = 8, size // 4
    per = e // n
    x = jnp.asarray(np.random.default_rng(0).standard_normal(e).astype(np.float32))
    rows = {"one pass over x (x + 1)": (cpu_ms(lambda v: v + 1, x), None, 8 * e)}
    for name in ("int8", "fp8"):
        fmt = formats.parse("benchmark", name)
        wire = fmt.encode(x.reshape(n, per))
        gathered = jax.tree.map(lambda a: jnp.broadcast_to(a[:1], a.shape), wire)
        encoded = e * (1 + 4 / fmt.block_size)  # bytes of the encoded x: codes and scales

        def reduce_rows(w, fmt=fmt):
            d = fmt.decode(*w)
            part = d[0]
            for p in range(1, n):
                part = part + d[p]
            return part

        def decode_flat(w, fmt=fmt):
            return codec.decode(fmt, w[0].reshape(-1), w[1].reshape(-1))

        rows[f"{name}: encode x (hop 1)"] = (
            cpu_ms(lambda v, fmt=fmt: fmt.encode(v.reshape(n, per)), x),
            cpu_ms(lambda v, fmt=fmt: codec.encode(fmt, v), x), 4 * e + encoded)
        rows[f"{name}: decode N chunks and sum"] = (
            cpu_ms(reduce_rows, wire), cpu_ms(lambda w, fmt=fmt: codec.decode_sum(fmt, *w), wire),
            encoded + 4 * per)
        rows[f"{name}: encode the sum (hop 2)"] = (
            cpu_ms(lambda v, fmt=fmt: fmt.encode(v), x[:per]), cpu_ms(lambda v, fmt=fmt: codec.encode(fmt, v), x[:per]),
            4 * per + encoded / n)
        rows[f"{name}: decode, sum and encode the sum (fused)"] = (
            None, cpu_ms(lambda w, fmt=fmt: codec.decode_sum_encode(fmt, *w), wire), encoded + encoded / n)
        rows[f"{name}: decode the gathered sums"] = (
            cpu_ms(lambda w, fmt=fmt: fmt.decode(*w).reshape(-1), gathered), cpu_ms(decode_flat, gathered),
            encoded + 4 * e)
    lay = Layout.of(e, max(1, round(0.01 * e)), n)
    select, reduce, result, residual = abi.SPARSE_TARGETS

    def buckets_of(v):
        return sparse._kernel(select, v, n * 2 * lay.capacity, jnp.int32, v, k=lay.k, nranks=n,
                              threshold=np.float32(0))

    wire = buckets_of(x)
    gathered = jnp.tile(wire[:2 * lay.kept], n)  # hop 2's buckets: n owners' kept slots (positions ascend)
    buckets, kept = 4 * n * 2 * lay.capacity, 4 * n * 2 * lay.kept  # bytes of hop 1's and hop 2's buckets
    rows["top-k: select the buckets (kernel)"] = (None, cpu_ms(buckets_of, x), 4 * e + buckets)
    rows["top-k: owner's sum and reselection (kernel)"] = (None, cpu_ms(
        lambda w: sparse._kernel(reduce, w, 2 * lay.kept, jnp.int32, w, nranks=n, region=lay.region), wire),
        buckets + kept / n)
    rows["top-k: write the dense result (kernel)"] = (None, cpu_ms(
        lambda g: sparse._kernel(result, g, e, jnp.float32, g, nranks=n), gathered), kept + 4 * e)
    rows["top-k: write the residual (kernel)"] = (None, cpu_ms(
        lambda v, w, g: sparse._kernel(residual, v, e, jnp.float32, v, w, g, nranks=n), x, wire, gathered),
        8 * e + buckets + kept)
    return {stage: (xla, native, traffic / (native * 1e6) if native and traffic else None)
            for stage, (xla, native, traffic) in rows.items()}


def simulate(sizes, boxes_list=(1, 2, 4)):
    """Predicted times on DGX H100 boxes: the exact all_reduce plan; the compressed schemes as their two
    collectives on the wire form plus their passes over HBM (encode, decode and sum, re-encode, decode: the
    bytes each pass reads and writes over `memory_bandwidth_GBps`).

    The first hop (an all-to-all of the wire form) is simulated as the direct reduce_scatter plan on the same
    bytes: the same pairs exchange the same chunks, every peer at once, as a GPU all-to-all runs. The built-in
    direct all_to_all plan puts to one peer after the other from one lane, which the simulator serializes
    (4 MiB a rank on one DGX H100: 34 us, against 10 us for the reduce_scatter plan's concurrent reads)."""
    from jaxcoll import algorithms, sim, topology
    from jaxcoll.plan import Collective

    rows = []
    for boxes in boxes_list:
        topo = topology.preset("dgx-h100", boxes)
        n = topo.nranks
        hbm = topo.memory_bandwidth_GBps * 1e9
        for size in sizes:
            e = size // 4

            def run(collective, nbytes_in, nbytes_sim):
                return sim.simulate(algorithms.select(collective, n, nbytes_in), topo, nbytes_sim)

            exact = run(Collective.ALL_REDUCE, size, size)
            row = {"exact": exact}
            for name in ("bf16", "fp8", "int8"):
                fmt = formats.parse("benchmark", name)
                per = -(-e // (n * fmt.block_size)) * fmt.block_size
                w = fmt.wire_bytes(per)  # one chunk's wire bytes
                if name == "bf16":  # the exact plan on 2-byte data, plus one cast each way
                    t = run(Collective.ALL_REDUCE, size // 2, size // 2) + (4 + 2 + 2 + 4) * e / hbm
                else:
                    t = run(Collective.REDUCE_SCATTER, n * w, n * w) + run(Collective.ALL_GATHER, w, n * w)
                    # encode (read 4, write ~1), decode+sum (read ~1, write 4/n), re-encode, decode (read ~1, write 4)
                    t += (4 + 1 + 1 + 4 / n + 4 / n + 1 / n + 1 + 4) * e / hbm
                row[name] = t
            lay = Layout.of(e, max(1, round(0.01 * e)), n)
            hop1, hop2 = 8 * n * lay.capacity, 8 * lay.kept  # a rank's N buckets out; one owner's kept bucket
            # select (read 4), the owner's merge of O(k) slots (negligible), write the dense result (write 4)
            row["top-k 1%"] = (run(Collective.REDUCE_SCATTER, hop1, hop1)
                               + run(Collective.ALL_GATHER, hop2, n * hop2) + (4 + 4) * e / hbm)
            rows.append((topo.name, n, size, row))
    return rows


def markdown(rows, sim_rows, copy_gbps, sent_label="sent/rank") -> str:
    out = [f"Copy bandwidth measured in this run: {copy_gbps:.1f} GB/s.", "",
           f"| size/rank | method | {sent_label} | time ms | speedup vs jaxcoll exact |", "|---:|---|---:|---:|---:|"]
    for size, name, sent, t, speedup in rows:
        sent = "-" if sent is None else f"{sent / 2**20:.2f} MiB"
        out.append(f"| {format_size(size)} | {name} | {sent} | {t * 1e3:.1f} | {speedup:.2f}x |")
    if not sim_rows:
        return "\n".join(out)
    out += ["", "Simulated (jaxcoll.sim, exact all_reduce time over each method's):", "",
            "| topology | ranks | size/rank | exact us | bf16 | fp8 | int8 | top-k 1% |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, n, size, row in sim_rows:
        ex = row["exact"]
        out.append(f"| {name} | {n} | {format_size(size)} | {ex * 1e6:.0f} | " +
                   " | ".join(f"{ex / row[k]:.2f}x" for k in ("bf16", "fp8", "int8", "top-k 1%")) + " |")
    return "\n".join(out)


TRANSPORTS = {"shm": {}, "tcp": {"JAXCOLL_TRANSPORT": "tcp"}}


def launch_job(args) -> int:
    """This benchmark as a job of `args.processes` processes (jaxcoll.launch, as `jaxcoll bench --processes`):
    the copy bandwidth measured here first, while no process runs; process 0's tables printed."""
    if 8 % args.processes:
        raise SystemExit(f"--processes={args.processes} does not divide the 8 devices")
    env = {"JAXCOLL_BENCH_COPY_BW": repr(copy_bandwidth()), **TRANSPORTS[args.transport]}
    results = launch.launch(args.processes, [__file__, *sys.argv[1:]], local_devices=8 // args.processes, env=env,
                            timeout_s=3600)
    print(results[0].stdout, end="")
    for r in results:
        if r.returncode != 0:
            print(f"process {r.process} exited with {r.returncode}:\n{r.stderr[-3000:]}", file=sys.stderr)
    return 1 if any(r.returncode != 0 for r in results) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,64M", help="bytes per rank (float32), comma separated")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--sim-only", action="store_true")
    parser.add_argument("--profile", default=None, help="a size per rank: print the CPU time of each local stage")
    parser.add_argument("--processes", type=int, default=1,
                        help="run as a jax.distributed job of this many processes on this machine (jaxcoll.launch), "
                             "the 8 devices split between them")
    parser.add_argument("--transport", choices=sorted(TRANSPORTS), default="shm",
                        help="between processes: shared memory, or TCP over loopback sockets (JAXCOLL_TRANSPORT)")
    parser.add_argument("--mesh", default=None, help="OxL: a (host, local) mesh, every method over both axes")
    parser.add_argument("--compress-axes", default=None, choices=["host", "local"],
                        help="with --mesh: add the hierarchical methods, compressed over this axis only")
    parser.add_argument("--stages", action="store_true",
                        help="with --compress-axes over 2 ranks: add rows timing stage 2's calls one by one")
    args = parser.parse_args()
    mesh_shape = None
    if args.mesh:
        mesh_shape = tuple(int(v) for v in args.mesh.lower().split("x"))
        if len(mesh_shape) != 2 or mesh_shape[0] * mesh_shape[1] != 8:
            parser.error(f"--mesh={args.mesh!r} must be OxL with O * L = 8")
    elif args.compress_axes:
        parser.error("--compress-axes needs --mesh")
    if args.stages and (not args.compress_axes or mesh_shape[AXES.index(args.compress_axes)] != 2):
        parser.error("--stages needs --compress-axes over an axis of 2 ranks (the one-hop stage 2 it cuts up)")
    if args.processes > 1 and not launch.in_job():
        return launch_job(args)
    process = launch.initialize()[0] if launch.in_job() else 0
    if args.profile:
        print(f"| stage ({args.profile} per rank, one device) | XLA:CPU ms (jax.numpy) | native ms | native GB/s |\n"
              "|---|---:|---:|---:|")
        cell = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
        for stage, (xla, native, gbps) in profile(parse_size(args.profile)).items():
            print(f"| {stage} | {cell(xla, '.2f')} | {cell(native, '.2f')} | {cell(gbps, '.1f')} |")
        return
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = [] if args.sim_only else measure(sizes, args.reps, args.warmup, mesh_shape, args.compress_axes,
                                                 args.stages)
    if process:
        return
    if mesh_shape:  # the simulator's presets are the flat methods': not repeated here
        text = markdown(rows, [], copy_bandwidth_setting() / 1e9, sent_label="across/rank")
    else:
        text = markdown(rows, simulate(sizes), copy_bandwidth_setting() / 1e9)
    if launch.in_job():
        text = (f"{jax.process_count()} processes x {jax.local_device_count()} devices, transport "
                f"{os.environ.get('JAXCOLL_TRANSPORT', 'shm')} (XLA psum: gloo).\n\n" + text)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
