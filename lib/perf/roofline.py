"""Roofline arithmetic: intensity, ridge point, time bounds, decode and prefill floors.

A kernel that does F FLOPs and moves B bytes on a chip with peak P FLOP/s and memory
bandwidth W bytes/s takes at least max(F / P, B / W) seconds. Its arithmetic intensity is
I = F / B FLOP/byte; the ridge point P / W is the intensity above which compute binds.
All functions are per GPU, SI units; tensor parallelism of degree ``tp`` splits weights,
FLOPs and (up to the KV-head count) the KV cache evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.book import figures
from lib.inputs import real
from lib.perf.moe import expected_experts_touched
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model


@dataclass(frozen=True)
class RooflineTime:
    """Lower bound on a kernel's time: the larger of compute time and memory time."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """'compute' or 'memory': the roof that binds."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return arithmetic_intensity(self.flops, self.bytes)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOP per byte: F / B."""
    real("bytes_moved", bytes_moved, 0, low_open=True)
    real("flops", flops, 0)
    return flops / bytes_moved


def ridge_point(chip: str | GPU, dtype: str = "bf16") -> float:
    """Peak FLOP/s / memory bytes/s, in FLOP/byte (H100 SXM BF16 dense: 989e12 / 3.35e12 = 295)."""
    return gpu(chip).ridge_point(dtype)


def attainable_flops(intensity: float, chip: str | GPU, dtype: str = "bf16") -> float:
    """The roofline itself: min(peak, intensity x bandwidth), FLOP/s."""
    g = gpu(chip)
    if intensity < 0:
        raise ValueError(f"intensity must be >= 0 FLOP/byte, got {intensity}")
    return min(g.peak_flops(dtype), intensity * g.memory_bandwidth)


def roofline_time(flops: float, bytes_moved: float, chip: str | GPU, dtype: str = "bf16") -> RooflineTime:
    """Time bound of one op on one GPU: compute = F / peak, memory = B / bandwidth."""
    g = gpu(chip)
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes_moved must be >= 0, got {flops}, {bytes_moved}")
    return RooflineTime(flops, bytes_moved, flops / g.peak_flops(dtype), bytes_moved / g.memory_bandwidth)


def gemm_flops_bytes(m: int, n: int, k: int, dtype: str = "bf16") -> tuple[float, float]:
    """FLOPs and minimum HBM bytes of C[m,n] = A[m,k] @ B[k,n]: 2mnk and b(mk + kn + mn)."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    b = bytes_per_element(dtype)
    return 2.0 * m * n * k, b * (m * k + k * n + m * n)


def gemm_crossover_m(n: int, k: int, chip: str | GPU, dtype: str = "bf16") -> float:
    """Rows M at which an [M,K] x [K,N] GEMM reaches the ridge point R (FLOP/byte).

    2MNK = R b (MK + KN + MN)  =>  M = R b K N / (2 N K - R b (K + N)).
    Raises ValueError when no M gets there (the weight matrix is too small to amortize).
    """
    r = gpu(chip).ridge_point(dtype)
    b = bytes_per_element(dtype)
    if n < 1 or k < 1:
        raise ValueError(f"n and k must be >= 1, got {n}, {k}")
    denom = 2.0 * n * k - r * b * (k + n)
    if denom <= 0:
        raise ValueError(f"a {k}x{n} weight never reaches the ridge ({r:.0f} FLOP/byte) at any M")
    return r * b * k * n / denom


def kv_shard_fraction(mdl: str | Model, tp: int) -> float:
    """Fraction of the KV cache each TP rank holds: 1/tp while tp <= KV heads, else 1/KV heads.

    Past the KV-head count the heads are replicated; MLA's single latent is replicated on
    every rank (fraction 1).
    """
    m = model(mdl)
    return m.kv_share_per_rank(m.check_tp(tp))


def lookup_rows_read(mdl: str | Model, tokens: float) -> float:
    """Rows of the lookup tables a forward pass over ``tokens`` tokens reads (a count).

    One token-embedding row per token, at most the V rows of the table: min(T, V); with
    learned positions also min(T, P) rows of the P x d position table. A pass never streams
    a lookup table whole (the LM head does, see :func:`weight_bytes_read_per_step`).
    """
    m = model(mdl)
    if not tokens >= 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    rows = min(tokens, m.vocab_size)
    if m.position_embedding == "learned":
        rows += min(tokens, m.max_position_embeddings)
    return rows


def lookup_bytes_read(mdl: str | Model, tokens: float, dtype: str = "bf16") -> float:
    """Bytes of lookup-table rows a pass over ``tokens`` tokens reads: :func:`lookup_rows_read`
    x d x b (one token: d x b, e.g. 16 KiB for Llama 3.1 70B in BF16)."""
    m = model(mdl)
    return lookup_rows_read(m, tokens) * m.hidden_size * bytes_per_element(dtype)


def params_streamed(mdl: str | Model) -> int:
    """Parameters a forward pass reads whole, whatever its token count (a count).

    N_total - N_lookup + N_tied_head: every parameter but the lookup tables (token embedding
    V x d, learned positions P x d, which a pass reads row by row, see :func:`lookup_rows_read`),
    plus V x d when the LM head is tied to the embedding (the shared matrix is stored once, in
    N_lookup, and the head streams it whole; an untied head is already in N_total). MoE: every
    expert (the many-token limit). Llama 3.1 70B: 70.55e9 - 128,256 x 8,192 = 69.50e9.
    """
    m = model(mdl)
    tied_head = m.vocab_size * m.hidden_size if m.tie_word_embeddings else 0
    return m.params_total - m.params_embedding + tied_head


def weight_bytes_streamed(mdl: str | Model, dtype: str = "bf16") -> float:
    """Bytes of :func:`params_streamed` in ``dtype``: b x (N_total - N_lookup + N_tied_head).

    Llama 3.1 70B, BF16: 139.0 GB, not the 141.1 GB of 2 x params (the embedding table is 1.5%).
    """
    return params_streamed(mdl) * bytes_per_element(dtype)


def weight_bytes_read_per_step(mdl: str | Model, batch: float, dtype: str = "bf16") -> float:
    """Weight bytes one forward step reads for ``batch`` tokens (whole replica), bytes.

    bytes = :func:`weight_bytes_streamed` + rows x d x b, with rows the lookup-table rows the
    tokens look up (:func:`lookup_rows_read`: min(T, V), plus min(T, P) with learned positions).
    Every layer, norm and the LM head are read once; the embedding table only row by row.
    MoE: the routed experts count E[distinct experts touched] per layer, not all E (uniform
    routing, lib.perf.moe). ``batch`` may be fractional (bisection callers).
    """
    m = model(mdl)
    if not batch >= 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    b = bytes_per_element(dtype)
    read = weight_bytes_streamed(m, dtype) + lookup_bytes_read(m, batch, dtype)
    if m.is_moe:
        per_expert = m._ffn_params(m.expert_intermediate_size)
        touched = expected_experts_touched(m.num_experts, m.experts_per_token, batch)
        read -= m.num_moe_layers * (m.num_experts - touched) * per_expert * b
    return read


def decode_step(mdl: str | Model, chip: str | GPU, tp: int = 1, batch: int = 1, context: int = 0,
                weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                compute_dtype: str = "bf16") -> RooflineTime:
    """Roofline bound of one decode step on each of ``tp`` GPUs.

    bytes = weights read / tp + batch x context x KV bytes/token x shard fraction;
    FLOPs = batch x (2N + attention at ``context``) / tp.
    """
    m, g = model(mdl), gpu(chip)
    tp = m.check_tp(tp)
    if context < 0:
        raise ValueError(f"context must be >= 0 tokens, got {context}")
    weights = weight_bytes_read_per_step(m, batch, weight_dtype) / tp
    kv = batch * context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    flops = batch * m.flops_per_token(context) / tp
    return roofline_time(flops, weights + kv, g, compute_dtype)


def prefill(mdl: str | Model, chip: str | GPU, prompt_len: int, tp: int = 1, batch: int = 1,
            weight_dtype: str = "bf16", compute_dtype: str = "bf16",
            kv_dtype: str = "bf16") -> RooflineTime:
    """Roofline bound of prefilling ``batch`` prompts of ``prompt_len`` tokens on each of ``tp`` GPUs.

    FLOPs = batch x causal prefill FLOPs / tp; bytes = weights read / tp + KV written, the KV
    being batch x prompt_len x KV bytes per token in ``kv_dtype`` (the cache's dtype, which need
    not be the weights') x the shard fraction.
    """
    m, g = model(mdl), gpu(chip)
    tp = m.check_tp(tp)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    flops = batch * m.prefill_flops(prompt_len) / tp
    tokens = batch * prompt_len
    weights = weight_bytes_read_per_step(m, tokens, weight_dtype) / tp
    kv = tokens * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    return roofline_time(flops, weights + kv, g, compute_dtype)


def prefill_crossover_tokens(mdl: str | Model, chip: str | GPU, weight_dtype: str = "bf16",
                             compute_dtype: str = "bf16") -> float:
    """Tokens per forward pass at which weight-read time equals matmul time (attention ignored).

    2 N_matmul T / P = b (S + d rows(T)) / W, with S = :func:`params_streamed` (every
    weight but the lookup tables; a tied head counted whole) and rows(T) = k T lookup rows
    (k = 1, 2 with learned positions) while T is below the tables' sizes:
    T* = R b S / (2 N_matmul - R b k d),  R = P / W the ridge point. Dense, 2-byte weights: S is
    the matmul weights plus the norms, so T* is the ridge to within 0.03%.
    Past a table's size its rows stop growing (piecewise-linear bytes, solved segment by
    segment). MoE: S counts every expert (the many-token limit); for the expected experts
    touched per pass use lib.perf.prefill.weight_read_crossover_tokens.
    """
    m, g = model(mdl), gpu(chip)
    ridge, b, d = g.ridge_point(compute_dtype), bytes_per_element(weight_dtype), m.hidden_size
    fixed = params_streamed(m)
    tables = [m.vocab_size] + ([m.max_position_embeddings] if m.position_embedding == "learned" else [])
    two_n = m.weight_flops_per_token()
    done_rows, lo = 0.0, 0.0
    for edge in sorted(set(tables)) + [float("inf")]:
        growing = sum(1 for size in tables if size > lo)  # tables whose rows still grow with T
        denom = two_n - ridge * b * growing * d
        if denom > 0:
            t = ridge * b * (fixed + done_rows * d) / denom
            if t <= edge:
                return t
        done_rows += sum(size for size in tables if size == edge)
        lo = edge
    raise ValueError(f"{m.key}: weight reads outpace the matmuls at every token count")


def per_gpu_bytes(mdl: str | Model, tp: int = 1, weight_dtype: str = "bf16", kv_bytes_total: float = 0.0) -> float:
    """Bytes one GPU holds: weights / tp + the given KV bytes x its shard fraction, B.

    A size, not a verdict: whether it fits is the memory budget's question
    (:attr:`lib.perf.deployment.Deployment.budget`, :func:`lib.perf.tp_scaling.require_serves`).
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    return m.weight_bytes(weight_dtype) / tp + kv_bytes_total * kv_shard_fraction(m, tp)


def _roofline_build(fig, npoints: int) -> dict:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    roof, = ax.plot([], [], color="black", lw=2)
    ridge = ax.axvline(1.0, color="grey", ls="--", lw=1, label="ridge point (peak / bandwidth)")
    ridge_text = ax.text(1.0, 1.0, "", rotation=90, fontsize=8, ha="right", va="center")
    points = [ax.plot([], [], "o", color=f"C{i}")[0] for i in range(npoints)]
    names = [ax.annotate("", (1.0, 1.0), textcoords="offset points", xytext=(4, -10), fontsize=8)
             for _ in range(npoints)]
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.grid(True)
    return {"ax": ax, "roof": roof, "ridge": ridge, "ridge_text": ridge_text, "points": points, "names": names}


def _roofline_draw(art: dict, label: str, x, y, ridge: float, points: list[tuple[str, float, float]]) -> None:
    art["roof"].set_data(x, y)
    art["roof"].set_label(label)
    art["ridge"].set_xdata([ridge, ridge])
    art["ridge_text"].set_position((ridge, y.max() * 0.03))  # below the names of dots under the flat roof
    art["ridge_text"].set_text(f"ridge {ridge:.0f}")
    for (name, intensity, perf), dot, text in zip(points, art["points"], art["names"], strict=True):
        dot.set_data([intensity], [perf])
        dot.set_label(name)
        text.xy = (intensity, perf)
        text.set_text(name)
        right = intensity > ridge  # under the flat roof: the name goes left of its dot, inside the axes
        text.xyann = (-4, -10) if right else (4, -10)
        text.set_horizontalalignment("right" if right else "left")
    ax = art["ax"]
    ax.relim(visible_only=True)
    ax.autoscale_view()
    figures.legend(ax, [art["roof"], art["ridge"], *art["points"]], loc="lower right", fontsize=8)


def plot_roofline(chip: str | GPU, dtype: str = "bf16", points: dict[str, float] | None = None):
    """Log-log roofline of ``chip`` (attainable TFLOP/s against FLOP/byte) with labelled kernels at
    their intensities; returns a :class:`lib.book.figures.Drawing`."""
    import numpy as np

    g = gpu(chip)
    ridge = g.ridge_point(dtype)
    x = np.logspace(-1, np.log10(max(ridge * 20, 10)), 200)
    y = np.minimum(g.peak_flops(dtype), x * g.memory_bandwidth) / 1e12
    pts = [(name, i, attainable_flops(i, g, dtype) / 1e12) for name, i in (points or {}).items()]
    return _ROOFLINE(f"{g.key} {dtype}", x, y, ridge, pts, layout=(len(pts),))


def torch_counted_flops_per_token(mdl: str | Model, context: int = 0) -> float:
    """FLOPs of one token's forward pass at ``context`` cached keys, counted by torch, FLOP.

    An oracle independent of :meth:`Model.flops_per_token`: it builds the layers the config
    describes as torch operations on the ``meta`` device (shapes only, no memory) and lets
    ``torch.utils.flop_counter.FlopCounterMode`` count the matmuls it actually dispatches:
    Q/K/V/O projections (MLA: the low-rank down/up projections), scores against ``context``
    cached keys and the weighted sum of as many values (per query head; K/V heads broadcast for
    GQA), the FFN (SwiGLU gate/up/down, or two GELU matrices; MoE: the router, the top-k routed
    and the shared experts), and the output head. The embedding lookup, norms, softmax and
    activations dispatch no matmul, so they count 0, as in the "2N + attention" rule. Biases
    are added after the matmul (0 FLOPs here, 2 per bias in lib's count: a relative gap of
    about 1e-5). Imports torch, so call it from checks, not from ``import lib``.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    m = model(mdl)
    if context < 0:
        raise ValueError(f"context must be >= 0 tokens, got {context}")
    meta = {"device": "meta", "dtype": torch.bfloat16}

    def w(*shape):
        return torch.empty(*shape, **meta)

    d, h = m.hidden_size, m.num_attention_heads
    x = w(1, d)

    def ffn(x, inner):
        if m.mlp == "gelu_2matrix":
            return torch.nn.functional.gelu(x @ w(d, inner)) @ w(inner, d)
        return (torch.nn.functional.silu(x @ w(d, inner)) * (x @ w(d, inner))) @ w(inner, d)

    def attend(q, n_kv, dqk, dv):
        # q: (heads, 1, dqk) against the `context` keys and values in the cache (this token's own
        # K/V, just projected, is written there and counted among them, as lib counts it)
        g = h // n_kv
        keys, vals = w(n_kv, dqk, context), w(n_kv, context, dv)
        scores = torch.softmax(q.reshape(n_kv, g, dqk) @ keys, dim=-1)  # (n_kv, g, context)
        return (scores @ vals).reshape(1, h * dv)

    with FlopCounterMode(display=False) as counter:
        for layer in range(m.num_layers):
            if m.is_mla:
                dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
                q_in = (x @ w(d, m.q_lora_rank)) if m.q_lora_rank else x
                q = q_in @ w(q_in.shape[1], h * dqk)
                latent = x @ w(d, m.kv_lora_rank + m.qk_rope_head_dim)
                _kv = latent[:, : m.kv_lora_rank] @ w(m.kv_lora_rank, h * (m.qk_nope_head_dim + dv))
                x_att = attend(q, h, dqk, dv) @ w(h * dv, d)  # unabsorbed: per-head K and V
            else:
                dh, n_kv = m.head_dim, m.num_kv_heads
                q = x @ w(d, h * dh)
                _k, _v = x @ w(d, n_kv * dh), x @ w(d, n_kv * dh)
                x_att = attend(q, n_kv, dh, dh) @ w(h * dh, d)
            if m.is_moe and layer >= m.first_dense_layers:
                _router = x_att @ w(d, m.num_experts)
                for _ in range(m.experts_per_token + m.shared_experts):
                    ffn(x_att, m.expert_intermediate_size)
            else:
                ffn(x_att, m.intermediate_size)
        x @ w(d, m.vocab_size)  # output head (tied or not, it is a matmul)
    return float(counter.get_total_flops())


_ROOFLINE = figures.LiveFigure(6.0, 3.4, _roofline_build, _roofline_draw)
