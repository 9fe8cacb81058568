"""The GPU round's checks that are programs rather than tests (tools/gpu_round.sh runs them on the GPU machine):

    python tools/gpu_round_checks.py import     jaxcoll imports on this machine's JAX, its CUDA executor is
                                                usable, and a jaxcoll custom call compiles for XLA's "CUDA"
                                                platform (the handler is registered there)
    python tools/gpu_round_checks.py sanitize   all_reduce at N = 4 on the bulk protocol and on packets, and on
                                                bulk at misaligned offsets, two calls each, against numpy: small
                                                enough for compute-sanitizer
    python tools/gpu_round_checks.py network    the network step of collectives across GPU hosts
                                                (`jaxcoll_network`, XLA's NCCL communicator lent through the FFI
                                                collectives extension) for every collective, over a group of this
                                                one GPU, against numpy: attribute decoding in both stages, the
                                                extension, NCCL's entry points (grouped send/recv to itself,
                                                broadcast, the zeros of a ppermute rank no pair targets). Where
                                                the jaxlib has no extension it prints `skipped: <why>` and exits 0

Each exits non-zero with a message saying what is wrong. The pieces take the device or the executor as an
argument, so tests/test_gpu_round.py runs them on the CPU, where no GPU is."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import numpy as np

# (algorithm, protocol, dtype, misaligned): the two protocols' code paths. bulk: peer pointers, the entry/exit
# rendezvous, the ring's signals and waits; ll: packets in the slots' mirrors, one-shot (direct) and multi-step
# (ring), 16-bit elements widened to float32 and rounded once. misaligned: every rank's buffers at a different
# offset below 16 bytes, where a vector access the kernel should not make is a misaligned address memcheck reports.
SANITIZE_CASES = [("ring", "bulk", np.float32, False), ("direct", "ll", np.float32, False),
                  ("ring", "ll", np.float16, False), ("ring", "bulk", np.float16, True)]


def one_rank_all_reduce(device):
    """(lowered, compiled, x): jaxcoll.all_reduce on a one-device mesh, lowered to jaxcoll's custom call (the
    lowering is told to keep one-rank groups), and compiled for `device`'s platform. XLA resolves a custom call
    by (target, platform) when it compiles, so an unregistered handler fails here."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxcoll
    from jaxcoll.lowering import custom_call

    custom_call.lower_single_rank_groups = True
    mesh = jax.make_mesh((1,), ("i",), devices=[device])
    f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(np.arange(64, dtype=np.float32), NamedSharding(mesh, P("i")))
    lowered = f.lower(x)
    return lowered, lowered.compile(), x


def import_check() -> None:
    import jax
    import jaxlib.version

    from jaxcoll import runtime

    native = runtime._jaxcoll
    print(f"jax {jax.__version__}, jaxlib {jaxlib.version.__version__}; jaxcoll's module built against jaxlib "
          f"{native.jaxlib_version}, with CUDA: {getattr(native, 'with_cuda', False)}")
    usable, why = runtime.cuda_status()
    print(f"runtime.cuda_status(): usable={usable}{', ' + why if why else ''}")
    if not usable:
        sys.exit(f"the CUDA executor is not usable: {why}")
    targets = sorted(native.cuda_registrations())
    print(f"{len(targets)} targets for platform CUDA: {', '.join(targets)}")
    gpus = jax.devices("cuda")
    print(f"jax CUDA devices: {gpus}")
    lowered, _, _ = one_rank_all_reduce(gpus[0])
    if "jaxcoll_all_reduce" not in lowered.as_text():
        sys.exit("the one-rank all_reduce did not lower to a jaxcoll custom call")
    print("a jaxcoll_all_reduce custom call compiled for the CUDA platform")


# run(words, inputs, output_shape, reduce_op, protocol, offsets) -> (outputs, info): the executor under test;
# offsets is None or (input_offsets, output_offsets), elements per rank.
Executor = Callable[[np.ndarray, list, tuple, int, str], tuple]


def check_all_reduce(run: Executor, ranks: int, chunk_elements: int) -> list[str]:
    """Every case of SANITIZE_CASES through `run`, compared with numpy; one line per case. AssertionError names
    the rank and the case that differ."""
    from jaxcoll import algorithms
    from jaxcoll.plan import Collective, encode
    from jaxcoll.plan.abi import REDUCE_OP_CODES

    rng = np.random.default_rng(0)
    lines = []
    for name, protocol, dtype, misaligned in SANITIZE_CASES:
        plan = algorithms.builtin(Collective.ALL_REDUCE, name, ranks)
        per_vector = 16 // np.dtype(dtype).itemsize
        offsets = ([r % per_vector for r in range(ranks)], [(3 * r + 1) % per_vector for r in range(ranks)]) \
            if misaligned else None
        elements = plan.in_blocks * chunk_elements
        # Small integers: every partial sum is exact in float16, whatever order the plan reduces in.
        xs = [rng.integers(-8, 9, elements).astype(dtype) for _ in range(ranks)]
        want = np.add.reduce(np.stack(xs).astype(np.float64), axis=0).astype(dtype)
        outs, info = run(encode(plan), xs, xs[0].shape, REDUCE_OP_CODES["sum"], protocol, offsets)
        where = f" at offsets {offsets}" if offsets else ""
        for r, got in enumerate(outs):
            np.testing.assert_array_equal(got, want, err_msg=f"rank {r}, all_reduce {name} on {protocol}{where}")
        lines.append(f"ok: all_reduce {name} on {protocol}{where}, N={ranks}, {np.dtype(dtype).name} x {elements}: "
                     f"{info}")
    return lines


def sanitize(ranks: int, chunk_elements: int, timeout_s: float) -> None:
    from jaxcoll import runtime

    usable, why = runtime.cuda_status()
    if not usable:
        sys.exit(f"the CUDA executor is not usable: {why}")

    def run(words, xs, shape, reduce_op, protocol, offsets):
        # Two calls on one group: the second compares against counters the first advanced.
        input_offsets, output_offsets = offsets or (None, None)
        return runtime.run_words_cuda(words, xs, shape, reduce_op, timeout_s=timeout_s, protocol=protocol, calls=2,
                                      input_offsets=input_offsets, output_offsets=output_offsets)

    for line in check_all_reduce(run, ranks, chunk_elements):
        print(line)


def network_cases() -> list[tuple[str, object, np.ndarray, np.ndarray]]:
    """(label, phase, x, want): every collective's network phase over a group of one rank (device 0), with what
    it must give: the identity, except a ppermute that sends rank 0 nowhere, which gives zeros (lax's contract)."""
    from jaxcoll.algorithms.across_hosts import NETWORK, Phase
    from jaxcoll.plan import Collective

    one = ((0,),)
    x = np.arange(-6, 18, dtype=np.float32)
    return [(c.value, Phase(NETWORK, c, one), x, x)
            for c in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER, Collective.ALL_TO_ALL)
            ] + [("broadcast from rank 0", Phase(NETWORK, Collective.BROADCAST, one, root=0), x, x),
                 ("ppermute (0, 0)", Phase(NETWORK, Collective.PPERMUTE, one, pairs=((0, 0),)), x, x),
                 ("ppermute without pairs", Phase(NETWORK, Collective.PPERMUTE, one), x, np.zeros_like(x))]


def one_rank_network_call(phase, x: np.ndarray):
    """A jitted function running `phase`'s `jaxcoll_network` call on x, on one device (flattened id 0), with the
    attributes the lowering gives it (jaxcoll.lowering.host_phases.network_attributes)."""
    import jax

    import jaxcoll.runtime  # noqa: F401 - registers the targets
    from jaxcoll.lowering.host_phases import network_attributes
    from jaxcoll.plan.abi import NETWORK_TARGET

    call = jax.ffi.ffi_call(NETWORK_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))
    attributes = network_attributes(phase, "sum", np.zeros(1, np.int64))
    return jax.jit(lambda v: call(v, **attributes))


def network_check() -> None:
    import jax

    from jaxcoll import runtime

    usable, why = runtime.cuda_status()
    if not usable:
        sys.exit(f"the CUDA executor is not usable: {why}")
    ok, why = runtime._jaxcoll.network_steps()
    if not ok:
        print(f"skipped: the network steps cannot run with this build: {why}")
        return
    gpu = jax.devices("cuda")[0]
    for label, phase, x, want in network_cases():
        got = np.asarray(one_rank_network_call(phase, x)(jax.device_put(x, gpu)))
        np.testing.assert_array_equal(got, want, err_msg=f"network step {label}")
        print(f"ok: network step {label} over one GPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="check", required=True)
    sub.add_parser("import", help="jaxcoll imports and its CUDA handler is registered")
    sub.add_parser("network", help="the network step of every collective over a group of one GPU, against numpy")
    s = sub.add_parser("sanitize", help="all_reduce on both protocols, small, against numpy")
    s.add_argument("--ranks", type=int, default=4)
    s.add_argument("--chunk-elements", type=int, default=1001, help="elements per input chunk (odd: scalar tails)")
    # Under the round's step limit, so a wait that never completes under a sanitizer is reported, not killed.
    s.add_argument("--timeout", type=float, default=15.0, help="seconds a wait may spin before the call fails")
    args = ap.parse_args()
    if args.check == "import":
        import_check()
    elif args.check == "network":
        network_check()
    else:
        if args.ranks < 2:
            ap.error(f"--ranks must be at least 2, got {args.ranks}")
        if args.chunk_elements < 1:
            ap.error(f"--chunk-elements must be at least 1, got {args.chunk_elements}")
        sanitize(args.ranks, args.chunk_elements, args.timeout)


if __name__ == "__main__":
    main()
