"""The CPU executor's cost model (jaxcoll.sim.machine) against closed forms: the work it reads off a plan, and the
seconds it gives for plans whose every touch is known by hand."""

import dataclasses
import math

import numpy as np
import pytest

from jaxcoll import algorithms
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
from jaxcoll.sim import machine

IN, OUT, SCRATCH = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
MiB = 1 << 20
# Round numbers, so that every expected time below is arithmetic.
MODEL = machine.MachineModel(call_s=10e-6, helpers_s=100e-6, step_s=1e-6, caches=((1 * MiB, 40e9), (8 * MiB, 20e9)),
                     memory_rate=10e9,
                     fresh_rate=5e9, fresh_bytes=64 * MiB, solo_bytes=4 * MiB, threads=2)


def shift(n: int, repeats: int = 1) -> Plan:
    def put(r):
        return Step(Op.PUT, (ChunkRef(r, IN, 0),), (ChunkRef((r + 1) % n, OUT, 0),))
    programs = [RankProgram(1, 1, lanes=(Lane(tuple(put(r) for _ in range(repeats))),)) for r in range(n)]
    return Plan(Collective.PPERMUTE, n, tuple(programs), perm=tuple((r, (r + 1) % n) for r in range(n)))


def through_scratch() -> Plan:
    """Each of 2 ranks copies its input to scratch, then scratch to its output."""
    def lane(r):
        return Lane((Step(Op.COPY, (ChunkRef(r, IN, 0),), (ChunkRef(r, SCRATCH, 0),)),
                     Step(Op.COPY, (ChunkRef(r, SCRATCH, 0),), (ChunkRef(r, OUT, 0),))))
    return Plan(Collective.PPERMUTE, 2, tuple(RankProgram(1, 1, 1, lanes=(lane(r),)) for r in range(2)),
                perm=((0, 0), (1, 1)))


@pytest.mark.parametrize("n", [2, 8])
def test_the_traffic_is_every_step_reading_its_sources_and_writing_its_destinations(n):
    # The executor's own count (csrc/plan.cc traffic_chunks): (sources + destinations) x chunks, every data step.
    direct = algorithms.builtin(Collective.ALL_REDUCE, "direct", n)  # one read_reduce of n inputs per rank
    assert machine.work(direct).traffic == n * (n + 1)
    two_shot = algorithms.builtin(Collective.ALL_REDUCE, "two_shot", n)
    expected = sum(len(s.srcs) + len(s.dsts) for _, _, _, s in two_shot.steps() if s.op.is_data) * 1
    assert machine.work(two_shot).traffic == expected
    gather = algorithms.builtin(Collective.ALL_GATHER, "direct", n)  # one put of the input to n outputs
    assert machine.work(gather).traffic == n * (1 + n)


def test_a_copy_that_outgrows_every_cache_costs_its_bytes_at_the_memory_rate():
    n, size = 8, 16 * MiB  # footprint 2 x 8 x 16 MiB: beyond the 8 MiB cache; traffic 256 MiB: two threads
    expected = MODEL.call_s + MODEL.helpers_s + n * MODEL.step_s / 2 + (2 * n * size) / MODEL.memory_rate / 2
    assert math.isclose(machine.seconds(shift(n), size, MODEL), expected, rel_tol=1e-12)


def test_a_call_whose_footprint_fits_a_cache_runs_at_its_rate_and_alone_below_the_solo_threshold():
    n, size = 4, 64 << 10  # footprint 512 KiB: the 1 MiB level; traffic 512 KiB: solo
    expected = MODEL.call_s + n * MODEL.step_s + (2 * n * size) / 40e9
    assert math.isclose(machine.seconds(shift(n), size, MODEL), expected, rel_tol=1e-12)


def test_a_chunk_touched_again_soon_comes_from_the_cache_that_holds_what_was_touched_since():
    # Rank r puts its 4 MiB input twice: footprint 2 x 2 x 4 MiB = 16 MiB, beyond the caches. The first pass is
    # first touches (memory); in the second each chunk was last touched 16 MiB of traffic ago (every rank's pass
    # interleaves: the executor runs step i of every rank before step i+1): beyond 8 MiB, memory again.
    n, size = 2, 4 * MiB
    w = machine.work(shift(n, repeats=2))
    assert sorted(w.reuse[0][:4].tolist()) == [math.inf] * 4
    assert w.reuse[0][4:].tolist() == [4, 4, 4, 4]  # chunks of traffic since: 4 chunks of 4 MiB = 16 MiB
    expected = MODEL.call_s + MODEL.helpers_s + 2 * n * MODEL.step_s / 2 + 4 * n * size / MODEL.memory_rate / 2
    assert math.isclose(machine.seconds(shift(n, repeats=2), size, MODEL), expected, rel_tol=1e-12)
    # At 1 MiB the second pass reuses 4 MiB back: the 8 MiB level; the first pass is cold (footprint 4 MiB fits,
    # so the loop's previous call left it there too: all at 20 GB/s).
    small = 1 * MiB
    expected = MODEL.call_s + MODEL.helpers_s + 2 * n * MODEL.step_s / 2 + 4 * n * small / 20e9 / 2
    assert math.isclose(machine.seconds(shift(n, repeats=2), small, MODEL), expected, rel_tol=1e-12)


def test_large_outputs_pay_for_their_fresh_pages():
    n, size = 2, 128 * MiB
    plain = machine.MachineModel(**{**MODEL.__dict__, "fresh_bytes": 1 << 40})
    extra = machine.seconds(shift(n), size, MODEL) - machine.seconds(shift(n), size, plain)
    assert math.isclose(extra, n * size / MODEL.fresh_rate / 2, rel_tol=1e-9)


def test_chunks_of_another_process_are_copied_through_segments_and_across_hosts_sent():
    # direct all_gather over 2 processes x 2 ranks: each rank puts its input into every output block r. Process
    # 0's ranks write 2 blocks into each of process 1's 2 outputs (4 chunks of process 1's buffers), and read
    # nothing of process 1's: the crossing copies are those 4 chunks (in or out: 2 touches each) for process 1.
    plan = algorithms.builtin(Collective.ALL_GATHER, "direct", 4)
    w = machine.work(plan, (0, 0, 1, 1))
    assert w.crossing == (8.0, 8.0)
    assert w.network == (0.0, 0.0)
    over = machine.work(plan, (0, 0, 1, 1), hosts=(0, 1))
    assert over.network == (4.0, 4.0) and over.crossing == (0.0, 0.0)
    assert over.rounds == 1  # one put across, nothing waits on it


def test_a_ring_across_hosts_waits_on_every_exchange_in_turn():
    from jaxcoll.synth import ring
    from jaxcoll.topology import layout
    topo = layout((0, 1, 2, 3), hosts=(0, 1, 2, 3))
    plan = ring(topo, "all_gather")
    # 4 ranks each on a host of its own: the ring's N-1 = 3 forwarding hops, each after the previous one.
    assert machine.work(plan, (0, 1, 2, 3), hosts=(0, 1, 2, 3)).rounds == 3


def test_a_get_from_another_host_waits_for_its_request_and_its_answer():
    # Each rank fetches the other's input (a get) or sends its own (a put): over the network a get is a request
    # and an answer, two trips on the chain; through shared memory it reads the peer's segment in place, one.
    def exchange(op):
        def step(r):
            src, dst = (ChunkRef(1 - r, IN, 0), ChunkRef(r, OUT, 0)) if op is Op.GET else \
                (ChunkRef(r, IN, 0), ChunkRef(1 - r, OUT, 0))
            return Step(op, (src,), (dst,))
        return Plan(Collective.PPERMUTE, 2, tuple(RankProgram(1, 1, lanes=(Lane((step(r),)),)) for r in range(2)),
                    perm=((0, 1), (1, 0)))
    assert machine.work(exchange(Op.GET), (0, 1), hosts=(0, 1)).rounds == 2
    assert machine.work(exchange(Op.PUT), (0, 1), hosts=(0, 1)).rounds == 1
    assert machine.work(exchange(Op.GET), (0, 1)).process_rounds == 1


def test_a_ring_across_processes_of_one_host_waits_on_every_signal_between_them_in_turn():
    from jaxcoll.synth import ring
    from jaxcoll.topology import layout
    topo = layout((0, 1, 2, 3))
    plan = ring(topo, "all_gather")
    # The same ring over 4 processes of one host: nothing crosses a network, but each hop waits for another
    # process's signal; in one process nothing does.
    w = machine.work(plan, (0, 1, 2, 3))
    assert (w.rounds, w.process_rounds) == (0, 3)
    assert machine.work(plan).process_rounds == 0
    # Each such signal costs the crossing latency once.
    slow = machine.MachineModel(**{**MODEL.__dict__, "crossing_latency_s": 1e-3})
    assert math.isclose(machine.seconds(plan, 4096, slow, w) - machine.seconds(plan, 4096, MODEL, w),
                        3 * (1e-3 - MODEL.crossing_latency_s), rel_tol=1e-9)


def test_the_model_round_trips_through_json_and_refuses_bad_constants():
    assert machine.MachineModel.from_json(MODEL.to_json()) == MODEL
    for bad in ({"memory_rate": 0}, {"call_s": -1.0}, {"threads": 0}, {"caches": [[0, 1e9]]}, {"speed": 1.0},
                {"step_s": float("nan")}, {"caches": "fast"}):
        with pytest.raises(ValueError):
            machine.MachineModel.from_json(bad)


def test_the_fitted_constants_come_back_in_order():
    c = MODEL.coefficients()
    back = MODEL.with_coefficients(c, MODEL.call_s, MODEL.network_latency_s).to_json()
    for name, value in MODEL.to_json().items():
        assert np.allclose(back[name], value, rtol=1e-12, atol=0), name


def test_rates_follow_the_smallest_level_that_holds_a_touch():
    reach = np.array([0.0, 1.0 * MiB, 1.0 * MiB + 1, 8.0 * MiB, 9.0 * MiB, math.inf])
    assert MODEL.rate(reach).tolist() == [40e9, 40e9, 20e9, 20e9, 10e9, 10e9]


def test_partial_sums_of_16_bit_floats_take_twice_the_bytes_in_scratch():
    from jaxcoll.synth import ring
    from jaxcoll.topology import layout
    plan = ring(layout((0,) * 4), "all_reduce")  # reduces through scratch
    w = machine.work(plan)
    assert any(x.any() for x in w.scratch)
    f32 = machine.terms(w, 1024.0, MODEL, machine.widen("float32"))
    bf16 = machine.terms(w, 1024.0, MODEL, machine.widen("bfloat16"))
    scratch_bytes = sum(float(t[s].sum()) for t, s in zip(w.touched, w.scratch)) * 1024.0
    assert bf16[0, 2:5].sum() - f32[0, 2:5].sum() == pytest.approx(scratch_bytes)  # solo: one thread
    assert machine.widen("float16") == 2.0 and machine.widen(np.int32) == 1.0


def test_the_models_streaming_thresholds_are_the_runtimes_defaults():
    import pathlib
    source = (pathlib.Path(__file__).parent.parent / "csrc" / "reduce.cc").read_text()
    assert "nt_bytes.value_or(size_t{256} << 10)" in source and machine.CPU_NT_BYTES == 256 << 10
    assert "nt_call_bytes.value_or(size_t{32} << 20)" in source and machine.CPU_STREAM_BYTES == 32 << 20
    # and both judge a call by its buffers (Work.held), not by its traffic
    lanes = (pathlib.Path(__file__).parent.parent / "csrc" / "lanes.cc").read_text()
    assert "stream_call(call_footprint_bytes(" in lanes
    assert machine.cpu_runtime().nt_bytes == machine.CPU_NT_BYTES
    assert machine.MachineModel().stream_bytes > 1 << 60  # an executor without streaming stores never streams


STREAMING = machine.MachineModel(**{**MODEL.__dict__, "stream_bytes": 64 * MiB, "nt_bytes": 256 << 10,
                                    "stream_rate": 16e9})


def test_a_call_that_moves_enough_writes_its_large_destinations_at_the_streaming_rate():
    n, size = 8, 16 * MiB  # buffers of 256 MiB: streams; each put writes 16 MiB (>= 256 KiB): streamed
    expected = (MODEL.call_s + MODEL.helpers_s + n * MODEL.step_s / 2 + n * size / MODEL.memory_rate / 2
                + n * size / 16e9 / 2)
    assert math.isclose(machine.seconds(shift(n), size, STREAMING), expected, rel_tol=1e-12)
    small = 2 * MiB  # buffers of 32 MiB < 64 MiB: ordinary stores, as without streaming
    assert math.isclose(machine.seconds(shift(n), small, STREAMING), machine.seconds(shift(n), small, MODEL),
                        rel_tol=1e-12)


def test_a_chunk_written_by_streaming_stores_is_read_back_from_memory():
    # Each of 2 ranks copies its input to scratch, then scratch to its output: 4 touches of 1 MiB a rank, a
    # footprint of 6 MiB (the 8 MiB level). Streaming (from 1 MiB of buffers), both writes stream and the read of
    # scratch comes from memory; without, every touch is at the 8 MiB level's rate.
    solo = {"solo_bytes": 1 << 40}
    streams = machine.MachineModel(**{**STREAMING.__dict__, **solo, "stream_bytes": 1 * MiB})
    plain = machine.MachineModel(**{**MODEL.__dict__, **solo})
    size, n = 1 * MiB, 2
    fixed = MODEL.call_s + 2 * n * MODEL.step_s
    assert math.isclose(machine.seconds(through_scratch(), size, plain), fixed + 4 * n * size / 20e9, rel_tol=1e-12)
    expected = fixed + n * size / 20e9 + n * size / MODEL.memory_rate + 2 * n * size / 16e9
    assert math.isclose(machine.seconds(through_scratch(), size, streams), expected, rel_tol=1e-12)


def test_the_sources_of_a_reduction_pay_the_reduce_rate_on_top_of_their_touches():
    # The direct all_reduce: each rank's one step reduces all n inputs into its output. A copy (the shift) has one
    # source and pays nothing more.
    n, size = 4, 64 << 10  # footprint 4 x 64 KiB x 2 = 512 KiB: the 1 MiB level; traffic 4 x 5 x 64 KiB: solo
    reducing = machine.MachineModel(**{**MODEL.__dict__, "reduce_rate": 5e9})
    direct = algorithms.builtin(Collective.ALL_REDUCE, "direct", n)
    extra = machine.seconds(direct, size, reducing) - machine.seconds(direct, size, MODEL)
    assert math.isclose(extra, n * n * size * (1 / 5e9 - 1 / MODEL.reduce_rate), rel_tol=1e-9)
    assert machine.seconds(shift(n), size, reducing) == machine.seconds(shift(n), size, MODEL)


@pytest.mark.parametrize("threshold", [2 * MiB, 32 * MiB])
def test_calibration_finds_where_the_allocator_starts_handing_out_fresh_pages(threshold):
    # Times from a model whose outputs come fresh from `threshold` a rank up, as measured: each program's launch
    # shared among the calls it runs. The fit, started from another threshold, finds it (the calibration set has
    # outputs on both sides of each) and then every constant, the launch apart from the calls.
    from jaxcoll.tune import calibration, measure

    truth = machine.MachineModel(**{**MODEL.__dict__, "fresh_bytes": threshold, "launch_s": 150e-6})
    calls = [(plan, size) for _, size, plans in calibration.training((0,) * 8) for plan in plans.values()]
    times = [machine.seconds(plan, size, truth) + truth.launch_s / measure.iterations(size) for plan, size in calls]
    fitted = calibration.fit_calls(machine.MachineModel(**{**MODEL.__dict__, "fresh_bytes": 1 * MiB}), calls, times)
    assert fitted.fresh_bytes == threshold
    assert np.allclose(calibration.vector(fitted), calibration.vector(truth), rtol=1e-6)


def test_calibration_has_a_pair_of_probes_that_differ_only_in_streaming_stores():
    # The calibration set has a shift that streams its writes and the same copies in steps too small to stream:
    # the same bytes from the same footprint, written through the caches. Without the pair, only differences
    # between plans (which noise swamps) part a streamed write from a read served by memory.
    from jaxcoll.tune import calibration

    model = machine.cpu_runtime(**{**MODEL.__dict__, "stream_bytes": machine.CPU_STREAM_BYTES})
    sizes = {size: plans for _, size, plans in calibration.training((0,) * 8) if "shift-cached" in plans}
    size = 16 * MiB
    assert list(sizes) == [size]  # 8 ranks' inputs and outputs: 256 MiB of buffers, past the 32 MiB that stream
    plans = sizes[size]
    streamed, cached = (machine.terms(machine.work(plans[k]), machine.chunk_bytes(plans[k], size), model)[0]
                        for k in ("shift", "shift-cached"))
    stream = 4 + len(model.caches)  # [helpers, steps, *caches, memory, reduce, stream, ...]
    assert streamed[stream] == 8 * size / model.threads and cached[stream] == 0  # every write, or none
    assert streamed[2:stream].sum() + streamed[stream] == pytest.approx(cached[2:stream].sum())  # the same bytes


def test_a_plan_that_rereads_its_chunks_streams_by_what_its_buffers_hold_not_by_what_it_moves():
    # The runtime streams by a call's buffers (csrc/lanes.cc, call_footprint_bytes): a plan reading each input
    # eight times moves eight times what it holds, and below the threshold its writes stay in the caches.
    n = 8
    model = machine.cpu_runtime(**{**MODEL.__dict__, "stream_bytes": machine.CPU_STREAM_BYTES})
    reread = shift(n, repeats=8)
    stream = 4 + len(model.caches)
    held = 2 * MiB  # 8 ranks x (2 MiB in + 2 MiB out) = 32 MiB held: streams; 256 MiB moved
    small = 1 * MiB  # 16 MiB held, 128 MiB moved: does not
    for size, streams in ((held, True), (small, False)):
        row = machine.terms(machine.work(reread), machine.chunk_bytes(reread, size), model)[0]
        assert (row[stream] > 0) == streams, size
    # 16-bit floats hold their scratch as float32: twice the bytes of the data type's
    w = machine.work(through_scratch())
    assert (w.held, w.held_scratch) == (4.0, 2.0)
    edge = machine.CPU_STREAM_BYTES / 8  # 2 ranks x (in + out + scratch x 2) = 8 chunks in 16-bit floats
    assert machine.terms(w, edge, model, widen=2.0)[0][stream] > 0
    assert machine.terms(w, edge, model, widen=1.0)[0][stream] == 0


def test_calibration_finds_every_constant_with_streaming_stores_priced():
    # Times from a model that prices the runtime's streaming stores, each program's launch shared among its calls;
    # the fit, started from other rates and no launch, finds every constant.
    from jaxcoll.tune import calibration, measure

    truth = machine.cpu_runtime(**{**MODEL.__dict__, "stream_bytes": machine.CPU_STREAM_BYTES,
                                   "stream_rate": 11e9, "memory_rate": 7e9, "launch_s": 230e-6})
    calls = [(plan, size) for _, size, plans in calibration.training((0,) * 8) for plan in plans.values()]
    times = [machine.seconds(plan, size, truth) + truth.launch_s / measure.iterations(size) for plan, size in calls]
    start = dataclasses.replace(truth, stream_rate=30e9, memory_rate=20e9, launch_s=0.0)
    fitted = calibration.fit_calls(start, calls, times)
    assert np.allclose(calibration.vector(fitted), calibration.vector(truth), rtol=1e-6)


def test_calibration_across_processes_times_many_small_messages():
    # Plans that cross in many small chunks (the synthesized forests) are priced by what a message costs; across
    # processes the calibration set times the shift to the next process split into ACROSS_CHUNKS puts, each of
    # them to a rank of the other process.
    from jaxcoll.plan import Op
    from jaxcoll.tune import calibration

    processes = (0, 0, 0, 0, 1, 1, 1, 1)
    probes = [plans["across-steps"] for _, _, plans in calibration.training(processes) if "across-steps" in plans]
    assert len(probes) == 1
    (plan,) = probes
    for r, program in enumerate(plan.ranks):
        puts = [s for lane in program.lanes for s in lane.steps]
        assert len(puts) == calibration.ACROSS_CHUNKS and all(s.op is Op.PUT for s in puts)
        assert {processes[d.rank] for s in puts for d in s.dsts} == {1 - processes[r]}
    w = machine.work(plan, processes, (0, 1))
    assert w.messages == (4 * calibration.ACROSS_CHUNKS,) * 2
    assert not any("across-steps" in plans for _, _, plans in calibration.training((0,) * 8))


@pytest.mark.parametrize("processes", [(0,) * 4 + (1,) * 4, (0, 0, 1, 1, 2, 2, 3, 3)])
def test_calibration_across_processes_prices_a_signal_between_them_by_a_chain_of_them(processes):
    # After the shift to the next process, each rank signals the rank it sent to and waits for the one that sent to
    # it, EXCHANGES times: every wait but the first waits on a signal sent after the other process's last wait.
    from jaxcoll.tune import calibration, measure

    training = calibration.training(processes)
    probes = {name: plan for _, _, plans in training for name, plan in plans.items()}
    plan = probes["exchanges"]
    perm = dict(plan.perm)
    for r, program in enumerate(plan.ranks):
        signals = [s for lane in program.lanes for s in lane.steps if s.op is Op.SIGNAL]
        assert [s.peer for s in signals] == [perm[r]] * calibration.EXCHANGES
        assert processes[perm[r]] != processes[r]
    assert machine.work(plan, processes).process_rounds == calibration.EXCHANGES
    assert machine.work(probes["across"], processes).process_rounds == 1
    assert not any("exchanges" in plans for _, _, plans in calibration.training((0,) * 8))
    # Times from a model whose signal between processes costs 25 us, each off by up to 10% as a busy machine's are:
    # the fit finds the signal's cost within 15% in every draw (without the chain, 20-31 us).
    truth = machine.cpu_runtime(crossing_latency_s=25e-6, launch_s=200e-6, threads=1)
    calls = [(plan, size) for _, size, plans in training for plan in plans.values()]
    times = np.array([machine.seconds(plan, size, truth, processes=processes)
                      + truth.launch_s / measure.iterations(size) for plan, size in calls])
    rng = np.random.default_rng(0)
    start = dataclasses.replace(truth, crossing_latency_s=0.0)
    for _ in range(10):
        noisy = times * rng.uniform(0.9, 1.1, len(times))
        fitted = calibration.fit_calls(start, calls, noisy, (processes, None))
        assert fitted.crossing_latency_s == pytest.approx(25e-6, rel=0.15)


def test_the_tuning_run_refits_the_model_to_the_cells_it_timed():
    # Calibration measured at a moment the machine ran 30% slow (its probes are minutes apart from the cells, and
    # this machine's speed drifts that much); the cells, hundreds of calls later, at its usual speed. The model
    # the tuning file keeps is fitted to both: a size the run never measured is priced at the usual speed, where
    # calibration's model is 30% off.
    from jaxcoll.tune import calibration, measure, registry
    from jaxcoll.tune import run as tuning_run

    truth = machine.cpu_runtime(**{**MODEL.__dict__, "stream_bytes": machine.CPU_STREAM_BYTES,
                                   "launch_s": 200e-6})

    def timed(plan, size, slow=1.0):
        return slow * (machine.seconds(plan, size, truth) + truth.launch_s / measure.iterations(size))

    n, processes = 8, (0,) * 8
    measured = [(plan, size, timed(plan, size, 1.3)) for _, size, plans in calibration.training(processes)
                for plan in plans.values()]
    calibrated = calibration.refit(truth, measured)
    cells, plans = [], {}
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        found = registry.candidates(collective, n)
        plans.update({(collective, name): plan for name, plan in found.items()})
        for size in (4 << 10, 64 << 10, 1 * MiB, 16 * MiB):
            cells.append(tuning_run.Cell(collective, n, size, "float32", "direct", "direct", "direct",
                                         {name: [timed(plan, size)] for name, plan in found.items()}, {}))
    kept = tuning_run.refined(calibrated, measured, cells, plans, processes, None)
    unmeasured = [(plan, 256 << 10) for (_, _), plan in plans.items()]
    off = [machine.seconds(p, s, calibrated) / machine.seconds(p, s, truth) - 1 for p, s in unmeasured]
    kept_off = [machine.seconds(p, s, kept) / machine.seconds(p, s, truth) - 1 for p, s in unmeasured]
    assert np.median(off) > 0.25
    assert np.median(np.abs(kept_off)) < 0.05
