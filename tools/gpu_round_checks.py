"""The GPU round's checks that are programs rather than tests (tools/gpu_round.sh runs them on the GPU machine):

    python tools/gpu_round_checks.py import     jaxcoll imports on this machine's JAX, its CUDA executor is
                                                usable, and a jaxcoll custom call compiles for XLA's "CUDA"
                                                platform (the handler is registered there)
    python tools/gpu_round_checks.py sanitize   a bulk and a packet plan at N = 4, two calls each, against numpy:
                                                small enough to run under compute-sanitizer in seconds

Each exits non-zero with a message saying what is wrong."""

from __future__ import annotations

import argparse
import sys

import numpy as np


def import_check() -> None:
    import jax
    import jaxlib.version
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxcoll
    from jaxcoll import runtime
    from jaxcoll.lowering import custom_call

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
    # XLA resolves a custom call by (target, platform) when it compiles: an unregistered CUDA handler fails here.
    custom_call.lower_single_rank_groups = True
    mesh = jax.make_mesh((1,), ("i",), devices=gpus[:1])
    f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(np.arange(64, dtype=np.float32), NamedSharding(mesh, P("i")))
    lowered = f.lower(x)
    if "jaxcoll_all_reduce" not in lowered.as_text():
        sys.exit("the one-rank all_reduce did not lower to a jaxcoll custom call")
    lowered.compile()
    print("a jaxcoll_all_reduce custom call compiled for the CUDA platform")


def sanitize(ranks: int, chunk_elements: int, timeout_s: float) -> None:
    from jaxcoll import algorithms, runtime
    from jaxcoll.plan import Collective, encode

    usable, why = runtime.cuda_status()
    if not usable:
        sys.exit(f"the CUDA executor is not usable: {why}")
    # The two protocols' code paths: bulk (peer pointers, entry/exit rendezvous, ring signals and waits) and ll
    # (packets in the slots' mirrors); two calls each, so the second compares against advanced counters.
    cases = [("ring", "bulk", np.float32), ("direct", "ll", np.float32), ("ring", "ll", np.float16)]
    rng = np.random.default_rng(0)
    for name, protocol, dtype in cases:
        plan = algorithms.builtin(Collective.ALL_REDUCE, name, ranks)
        elements = plan.in_blocks * chunk_elements
        # Small integers: every partial sum is exact in float16, whatever order the plan reduces in.
        xs = [rng.integers(-8, 9, elements).astype(dtype) for _ in range(ranks)]
        want = np.add.reduce(np.stack(xs).astype(np.float64), axis=0).astype(dtype)
        outs, info = runtime.run_words_cuda(encode(plan), xs, xs[0].shape, runtime.REDUCE_OPS["sum"],
                                            timeout_s=timeout_s, protocol=protocol, calls=2)
        for r, got in enumerate(outs):
            np.testing.assert_array_equal(got, want, err_msg=f"rank {r}, all_reduce {name} {protocol}")
        print(f"ok: all_reduce {name}, N={ranks}, {np.dtype(dtype).name} x {elements}, 2 calls: {info}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="check", required=True)
    sub.add_parser("import", help="jaxcoll imports and its CUDA handler is registered")
    s = sub.add_parser("sanitize", help="a bulk and a packet plan, small, against numpy")
    s.add_argument("--ranks", type=int, default=4)
    s.add_argument("--chunk-elements", type=int, default=1001, help="elements per input chunk (odd: scalar tails)")
    # Under the round's step limit, so a wait that never completes under a sanitizer is reported, not killed.
    s.add_argument("--timeout", type=float, default=15.0, help="seconds a wait may spin before the call fails")
    args = ap.parse_args()
    if args.check == "import":
        import_check()
    else:
        if args.ranks < 2:
            ap.error(f"--ranks must be at least 2, got {args.ranks}")
        if args.chunk_elements < 1:
            ap.error(f"--chunk-elements must be at least 1, got {args.chunk_elements}")
        sanitize(args.ranks, args.chunk_elements, args.timeout)


if __name__ == "__main__":
    main()
