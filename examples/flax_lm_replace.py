"""A flax NNX transformer language model, Megatron tensor parallel (TP4) x data parallel (DP2) on 8 CPU devices,
trained with optax AdamW on a synthetic corpus three ways:

1. "lax":     the model inside `jax.shard_map`, with jax.lax collectives (psum after the row-parallel layers,
              pmax/psum in the vocab-parallel cross-entropy, pmean of the loss, and the psums jax's autodiff
              puts in the backward pass). The program a flax user has today.
2. "replace": the same program through `jaxcoll.replace_collectives`: every one of those collectives runs on
              jaxcoll. Nothing in the model is edited.
3. "jit":     the same model and parameters under `jax.jit` with shardings (no shard_map): its layers are
              jaxcoll's custom_partitioning ops, `jaxcoll.nn.dense` (column-parallel), `jaxcoll.nn.dense_norm`
              (row-parallel product, residual add and the next RMSNorm: the fused reduce-scatter, norm,
              all-gather), `jaxcoll.nn.norm`, `jaxcoll.nn.cross_entropy` (vocabulary-parallel),
              `jaxcoll.nn.embed`, and the optimizer is `jaxcoll.nn.adamw` (ZeRO-1). XLA sums only the scalar
              loss.

Prints a table of the three loss curves and plots them to --out (default: flax_lm_replace-loss.png in the
temporary directory; docs/replace-flax-loss.png is `--out docs/replace-flax-loss.png`).

    python examples/flax_lm_replace.py [--steps 300] [--out loss.png]

The model is one set of flax modules; a *parallel style* object (`ShardMapTP` or `JitTP`) supplies the few
operations where the two forms differ (the embedding lookup, the column- and row-parallel products, the norm,
the cross-entropy over the vocabulary shards). The corpus is a Markov chain over the vocabulary with a few likely successors per token, so
the loss falls from log(vocab) towards the chain's entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcoll
from jaxcoll import nn

DP, TP = "dp", "tp"
SUCCESSOR_PROBS = np.array([0.4, 0.3, 0.2, 0.1])  # of a corpus token's 4 possible successors


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 128
    d_model: int = 64
    heads: int = 4
    d_ff: int = 256
    layers: int = 2
    seq: int = 32
    batch: int = 16
    lr: float = 3e-3
    weight_decay: float = 1e-2
    eps: float = 1e-6


# -- the model (flax NNX) -----------------------------------------------------------------------------------------


def _kernel(rngs, shape, sharding):
    return nnx.Param(nnx.initializers.normal(shape[0] ** -0.5)(rngs.params(), shape), out_sharding=sharding)


class ColumnParallelLinear(nnx.Module):
    """y = x @ kernel, kernel split over TP by output columns: each rank computes its slice of the outputs."""

    def __init__(self, d_in, d_out, rngs):
        self.kernel = _kernel(rngs, (d_in, d_out), (None, TP))

    def __call__(self, x, tp):
        return tp.column(x, self.kernel[...])


class RowParallelLinear(nnx.Module):
    """h = x @ kernel + residual, kernel split over TP by input rows (each rank holds a partial sum), followed by
    the next RMSNorm: returns (norm(h), h)."""

    def __init__(self, d_in, d_out, rngs):
        self.kernel = _kernel(rngs, (d_in, d_out), (TP, None))

    def __call__(self, x, residual, norm_scale, tp):
        return tp.row_norm(x, self.kernel[...], residual, norm_scale)


class RMSNormScale(nnx.Module):
    """An RMSNorm's learned scale. The norm is applied by the layer in front of it (`tp.norm`, or a row-parallel
    layer's `tp.row_norm`), where jit's form fuses it into that layer's sum."""

    def __init__(self, d):
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32))


class Block(nnx.Module):
    """Pre-norm transformer block: causal self-attention (heads split over TP) and a GELU MLP (hidden split over
    TP), each ending in a row-parallel layer that adds the residual and applies the next norm."""

    def __init__(self, cfg: Config, rngs):
        self.head_dim = cfg.d_model // cfg.heads
        self.qkv = ColumnParallelLinear(cfg.d_model, 3 * cfg.d_model, rngs)  # columns: (head, q|k|v, head_dim)
        self.out = RowParallelLinear(cfg.d_model, cfg.d_model, rngs)
        self.up = ColumnParallelLinear(cfg.d_model, cfg.d_ff, rngs)
        self.down = RowParallelLinear(cfg.d_ff, cfg.d_model, rngs)
        self.norm1 = RMSNormScale(cfg.d_model)  # applied by the layer before this block
        self.norm2 = RMSNormScale(cfg.d_model)

    def __call__(self, n, h, next_scale, tp):
        b, s, _ = n.shape
        qkv = self.qkv(n, tp)
        heads = qkv.shape[-1] // (3 * self.head_dim)  # the rank's heads inside shard_map, all of them under jit
        q, k, v = jnp.moveaxis(qkv.reshape(b, s, heads, 3, self.head_dim), 3, 0)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self.head_dim)
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e9)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v).reshape(b, s, -1)
        n, h = self.out(ctx, h, self.norm2.scale[...], tp)
        return self.down(jax.nn.gelu(self.up(n, tp)), h, next_scale, tp)


class TransformerLM(nnx.Module):
    def __init__(self, cfg: Config, rngs):
        self.embed = nnx.Embed(cfg.vocab, cfg.d_model, embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.final_norm = RMSNormScale(cfg.d_model)
        self.head = ColumnParallelLinear(cfg.d_model, cfg.vocab, rngs)  # vocabulary split over TP

    def __call__(self, tokens, targets, tp):
        """Mean next-token cross-entropy of `targets` given `tokens` (both (batch, seq))."""
        h = tp.embed(self.embed, tokens)
        n = tp.norm(h, self.blocks[0].norm1.scale[...])
        for i, block in enumerate(self.blocks):
            last = i + 1 == len(self.blocks)
            next_scale = (self.final_norm if last else self.blocks[i + 1].norm1).scale[...]
            n, h = block(n, h, next_scale, tp)
        return tp.cross_entropy(n, self.head.kernel[...], targets)


def rms_norm(h, scale, eps):
    h32 = h.astype(jnp.float32)
    return (h32 * lax.rsqrt(jnp.mean(h32 * h32, axis=-1, keepdims=True) + eps) * scale).astype(h.dtype)


# -- the two parallel styles --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardMapTP:
    """Inside `jax.shard_map` over (dp, tp): weights are this rank's slices, the collectives are jax.lax's."""
    eps: float

    def embed(self, embed: nnx.Embed, tokens):
        return embed(tokens)  # flax's lookup; jax's autodiff psums the table's gradient over dp

    def column(self, x, w):
        return x @ w  # x is the same on every TP rank; jax's autodiff psums its gradient over tp

    def row_norm(self, x, w, residual, scale):
        h = lax.psum(x @ w, TP) + residual
        return rms_norm(h, scale, self.eps), h

    def norm(self, h, scale):
        return rms_norm(h, scale, self.eps)

    def cross_entropy(self, x, w, targets):
        """Megatron's vocabulary-parallel cross-entropy: a rank holds logits of its slice of the vocabulary."""
        logits = (x @ w).astype(jnp.float32)
        shift = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), TP)
        z = logits - shift[..., None]
        log_sum = jnp.log(lax.psum(jnp.sum(jnp.exp(z), axis=-1), TP))
        local = targets - lax.axis_index(TP) * w.shape[-1]
        mine = (local >= 0) & (local < w.shape[-1])
        picked = jnp.take_along_axis(z, jnp.clip(local, 0, w.shape[-1] - 1)[..., None], axis=-1)[..., 0]
        target_logit = lax.psum(jnp.where(mine, picked, 0.0), TP)
        return lax.pmean(jnp.mean(log_sum - target_logit), DP)


@dataclasses.dataclass(frozen=True)
class JitTP:
    """Under `jax.jit` with shardings: global weights, layers partitioned by jaxcoll's custom_partitioning ops."""
    eps: float

    def embed(self, embed: nnx.Embed, tokens):
        return nn.embed(embed.embedding[...], tokens)

    def column(self, x, w):
        return nn.dense(x, w)

    def row_norm(self, x, w, residual, scale):
        return nn.dense_norm(x, w, scale, residual=residual, eps=self.eps, return_residual=True)

    def norm(self, h, scale):
        return nn.norm(h, scale, eps=self.eps)

    def cross_entropy(self, x, w, targets):
        return jnp.mean(nn.cross_entropy(nn.dense(x, w), targets))


# -- data ---------------------------------------------------------------------------------------------------------


def markov_corpus(cfg: Config, tokens: int, seed: int = 0) -> np.ndarray:
    """A token stream from a Markov chain whose every state has 4 possible successors (SUCCESSOR_PROBS): entropy
    1.28 nats per token (markov_entropy) against log(vocab) for a model that knows nothing."""
    rng = np.random.default_rng(seed)
    successors = np.stack([rng.choice(cfg.vocab, len(SUCCESSOR_PROBS), replace=False) for _ in range(cfg.vocab)])
    probs = SUCCESSOR_PROBS
    out = np.empty(tokens, np.int32)
    out[0] = 0
    choice = rng.choice(len(probs), size=tokens, p=probs)
    for i in range(1, tokens):
        out[i] = successors[out[i - 1], choice[i]]
    return out


def batches(cfg: Config, corpus: np.ndarray, steps: int, seed: int = 1):
    """(tokens, targets) per step: `batch` windows of `seq + 1` tokens at random offsets."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(corpus) - cfg.seq - 1, cfg.batch)
        window = np.stack([corpus[s:s + cfg.seq + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


# -- training -----------------------------------------------------------------------------------------------------


def make_mesh():
    return jax.make_mesh((2, 4), (DP, TP), axis_types=(AxisType.Auto,) * 2)


def init_model(cfg: Config, mesh, seed: int = 0):
    """The model with its parameters placed by their sharding annotations (tp-split kernels, the rest
    replicated): (graphdef, params)."""
    with jax.set_mesh(mesh):
        model = TransformerLM(cfg, nnx.Rngs(seed))
    return nnx.split(model, nnx.Param)


def shard_map_step(cfg: Config, mesh, graphdef, params, replace: bool):
    """The training step of styles "lax" and "replace": loss and gradients in a shard_map, optax AdamW on the
    sharded parameters (elementwise, so XLA partitions it without communication)."""
    specs = nnx.get_partition_spec(params)
    tp = ShardMapTP(cfg.eps)

    def loss_and_grad(params, tokens, targets):
        return jax.value_and_grad(lambda p: nnx.merge(graphdef, p)(tokens, targets, tp))(params)

    loss_and_grad = jax.shard_map(loss_and_grad, mesh=mesh, in_specs=(specs, P(DP), P(DP)),
                                  out_specs=(P(), specs))
    if replace:
        loss_and_grad = jaxcoll.replace_collectives(loss_and_grad)
    tx = optax.adamw(cfg.lr, weight_decay=cfg.weight_decay)

    @jax.jit
    def step(params, opt_state, tokens, targets):
        loss, grads = loss_and_grad(params, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, tx.init(params), loss_and_grad


def jit_step(cfg: Config, mesh, graphdef, params):
    """The training step of style "jit": no shard_map; jaxcoll.nn layers and ZeRO-1 AdamW."""
    tp = JitTP(cfg.eps)
    batch = NamedSharding(mesh, P(DP))

    @jax.jit
    def step(params, opt_state, tokens, targets):
        tokens, targets = (lax.with_sharding_constraint(t, batch) for t in (tokens, targets))
        loss, grads = jax.value_and_grad(lambda p: nnx.merge(graphdef, p)(tokens, targets, tp))(params)
        params, opt_state = nn.adamw(grads, params, opt_state, lr=cfg.lr, axis_name=DP,
                                     weight_decay=cfg.weight_decay)
        return params, opt_state, loss

    return step, nn.adamw_init(params, mesh, DP)


def train(cfg: Config, style: str, steps: int, mesh=None, seed: int = 0):
    """One style's losses per step, median step time (after the first) and, for "replace", the transform's
    report: (losses, seconds, report or None)."""
    mesh = make_mesh() if mesh is None else mesh
    graphdef, params = init_model(cfg, mesh, seed)
    transformed = None
    if style == "jit":
        step, opt_state = jit_step(cfg, mesh, graphdef, params)
    else:
        step, opt_state, transformed = shard_map_step(cfg, mesh, graphdef, params, replace=style == "replace")
    corpus = markov_corpus(cfg, 20_000, seed)
    data = NamedSharding(mesh, P(DP))
    losses, times = [], []
    for tokens, targets in batches(cfg, corpus, steps, seed + 1):
        tokens, targets = jax.device_put(tokens, data), jax.device_put(targets, data)
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens, targets)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    report = transformed.report if style == "replace" else None  # set when the step is traced
    return np.array(losses), (float(np.median(times[1:])) if steps > 1 else float("nan")), report


def plot(curves: dict, path: str, title: str, floor: float):
    """The curves over each other, with the corpus's entropy (the loss a perfect model reaches), and below them
    each curve's distance from the first (a zero distance, bitwise equality, is named in the legend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw=dict(height_ratios=(2, 1)))
    names = list(curves)
    base = curves[names[0]]
    for (name, losses), style in zip(curves.items(), ("-", "--", ":")):
        ax.plot(np.arange(len(losses)), losses, style, label=name, linewidth=1.5)
    ax.axhline(floor, color="gray", linewidth=0.8, linestyle="-.", label=f"corpus entropy {floor:.2f}")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    for name, color in zip(names[1:], ("C1", "C2")):
        diff = np.abs(curves[name] - base) / base
        if np.any(diff > 0):
            dx.semilogy(np.arange(len(diff)), np.where(diff > 0, diff, np.nan), ".", color=color, markersize=3,
                        label=f"{name} (max {diff.max():.1e})")
        else:
            dx.plot([], [], ".", color=color, label=f"{name}: bitwise equal at every step")
    dx.set_xlabel("step")
    dx.set_ylabel(f"|loss - {names[0].split(' ')[0]}| / loss")
    dx.legend(fontsize=8)
    dx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markov_entropy() -> float:
    """Nats per token of `markov_corpus` (its successor probabilities)."""
    probs = SUCCESSOR_PROBS
    return float(-np.sum(probs * np.log(probs)))


def main(argv=None):
    """Runs the three styles, prints the table, writes the plot; returns {style: (losses, seconds, report)}."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", metavar="PNG", default=os.path.join(tempfile.gettempdir(), "flax_lm_replace-loss.png"),
                    help="PNG of the loss curves, '' for none (default: %(default)s)")
    args = ap.parse_args(argv)
    try:  # a standalone run: 8 CPU devices (a test has already set them)
        jax.config.update("jax_num_cpu_devices", 8)
    except RuntimeError:
        pass
    cfg = Config()
    results = {style: train(cfg, style, args.steps) for style in ("lax", "replace", "jit")}
    curves = {s: r[0] for s, r in results.items()}
    print(f"flax NNX transformer LM, TP4 x DP2 on 8 CPU devices, {args.steps} steps, {cfg}")
    print(" step   lax          replace      jit          |replace-lax|  |jit-lax|")
    shown = sorted(set(range(0, args.steps, max(1, args.steps // 15))) | {args.steps - 1})
    for i in shown:
        lx, rp, jt = (curves[s][i] for s in ("lax", "replace", "jit"))
        print(f"{i:5d}  {lx:11.6f}  {rp:11.6f}  {jt:11.6f}  {abs(rp - lx):12.3e}  {abs(jt - lx):9.3e}")
    d_rep = np.abs(curves["replace"] - curves["lax"])
    d_jit = np.abs(curves["jit"] - curves["lax"]) / curves["lax"]
    print(f"replace vs lax: max |difference| {d_rep.max():.3e} (bitwise equal steps: "
          f"{int(np.sum(curves['replace'] == curves['lax']))}/{args.steps})")
    print(f"jit vs lax: max relative difference {d_jit.max():.3e}")
    print("step time (median after the first): " + ", ".join(f"{s} {r[1] * 1e3:.1f} ms" for s, r in results.items()))
    report = results["replace"][2]
    kinds = {}
    for e in report.entries:
        kinds.setdefault(e.collective, [0, 0])[0 if e.replaced else 1] += 1
    print(f"replace_collectives: {len(report.replaced)} collective sites on jaxcoll, {len(report.left_to_xla)} left "
          "to XLA (" + ", ".join(f"{k} {v[0]}" + (f"+{v[1]} XLA" if v[1] else "") for k, v in sorted(kinds.items()))
          + "; print(step.report) for the table)")
    if args.out:
        plot({"jax.lax collectives (shard_map)": curves["lax"],
              "jaxcoll.replace_collectives (same program)": curves["replace"],
              "jit with shardings, jaxcoll.nn ops": curves["jit"]}, args.out,
             f"flax NNX LM, TP4 x DP2 on 8 CPU devices, {args.steps} steps", markov_entropy())
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
