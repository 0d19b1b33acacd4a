"""One transformer FFN layer's three costs under tensor parallelism, and which one binds.

For ``T`` tokens through an FFN of width ``d`` (model) and ``f`` (hidden) with ``k`` weight
matrices (SwiGLU: gate, up, down, k = 3; GELU: up, down, k = 2), Megatron-sharded over ``n``
GPUs (gate/up column-parallel, down row-parallel, one all-reduce of the output):

    compute  = 2 k T d f / n / P                                   (FLOP / FLOP/s)
    HBM      = [k d f b_w / n + T a(n) b_a] / W                    (weights + activations)
    comm     = alpha(n) + 2 (n - 1) / n x T d b_a / (B e)          (ring all-reduce, one node)

``a(n)`` is the activation elements per token that cross HBM: fused (each intermediate written
once and read once) ``2d + 2f/n``; unfused SwiGLU (separate SiLU-and-mul kernel) ``2d + 6f/n``;
unfused GELU ``2d + 4f/n``. ``P`` is the dense peak, ``W`` the HBM bandwidth, ``B e`` the
achieved per-direction bandwidth of the vendor's scale-up link and ``alpha`` the per-call latency,
both from :mod:`lib.perf.collectives` (the one collective model: groups larger than a node go
hierarchical over the node's NICs). Where two costs cross is not where the total is smallest:
the small-T time a/n + b + c n is lowest at n = sqrt(a/c), past the crossover a/n = b + c n. The largest of the three binds; the all-reduce waits on the down projection,
so without overlap the layer takes ``max(compute, HBM) + comm``. SI units inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.book import figures
from lib.inputs import integer, real
from lib.perf import collectives
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model

MLP_KINDS = ("swiglu", "gelu")
LINKS = ("auto",)  # the fabric follows from the group size (lib.perf.collectives); kept for the explorer
BOUNDS = ("compute", "HBM", "comm latency", "comm bandwidth")
@dataclass(frozen=True)
class FFNShape:
    """An FFN's widths and form: ``kind`` is 'swiglu' (3 matrices) or 'gelu' (2 matrices)."""

    d_model: int
    d_ff: int
    kind: str = "swiglu"

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff"):
            object.__setattr__(self, name, integer(name, getattr(self, name), 1))
        if self.kind not in MLP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(MLP_KINDS)}; got {self.kind!r}")

    @property
    def matrices(self) -> int:
        """Weight matrices: 3 for SwiGLU (gate, up, down), 2 for GELU (up, down)."""
        return 3 if self.kind == "swiglu" else 2

    @property
    def weight_params(self) -> int:
        """k x d x f (biases ignored)."""
        return self.matrices * self.d_model * self.d_ff


def ffn_shape(mdl: str | Model, kind: str | None = None) -> FFNShape:
    """The FFN of ``mdl`` (for MoE: one routed expert's FFN); ``kind`` overrides its form."""
    m = model(mdl)
    native = "gelu" if m.mlp == "gelu_2matrix" else "swiglu"
    f = m.expert_intermediate_size if m.is_moe else m.intermediate_size
    return FFNShape(m.hidden_size, f, kind or native)


def activation_elements_per_token(shape: FFNShape, tp: int, fused: bool = True) -> float:
    """Activation elements per token one GPU moves through HBM: c_d d + c_f f / tp.

    fused: input read, hidden written and read once, output written: 2d + 2f/tp.
    unfused SwiGLU: gate|up written and read, hidden written and read: 2d + 6f/tp.
    unfused GELU: pre-activation and activation each written and read: 2d + 4f/tp.
    """
    tp = integer("tp", tp, 1)
    c_f = 2 if fused else (6 if shape.kind == "swiglu" else 4)
    return 2 * shape.d_model + c_f * shape.d_ff / tp


def _check_link(link: str) -> None:
    if link not in LINKS:
        raise ValueError(
            f"link must be 'auto' (the fabric follows from the TP degree: the scale-up link inside a node "
            f"of {collectives.gpus_per_node()}, hierarchical over the node's NICs beyond); got {link!r}"
        )


def comm_fabric(chip: str | GPU, tp: int) -> str:
    """Name of the fabric(s) an all-reduce over ``tp`` GPUs of ``chip`` crosses (from lib.perf.collectives):
    e.g. 'NVLink', 'Infinity Fabric', 'PCIe', 'NVLink + network'; 'none' at tp = 1."""
    return collectives.collective("all_reduce", 1.0, integer("tp", tp, 1), chip).fabric


def comm_params(chip: str | GPU, tp: int, d_model: int, act_dtype: str = "bf16") -> tuple[float, float]:
    """(latency s, bandwidth s per token) of the FFN's all-reduce of T x d activations over ``tp`` GPUs.

    Both from :func:`lib.perf.collectives.collective` (ring; hierarchical past one node): the
    bandwidth term is linear in the message, so one token's d x b_a bytes give the slope.
    """
    tp = integer("tp", tp, 1)
    if tp == 1:
        return 0.0, 0.0
    one = collectives.collective("all_reduce", d_model * bytes_per_element(act_dtype), tp, chip)
    return one.latency_s, one.bandwidth_s


@dataclass(frozen=True)
class FFNCost:
    """The three costs of one FFN layer on one of ``tp`` GPUs (seconds, FLOPs, bytes)."""

    shape: FFNShape
    tokens: float
    tp: int
    link: str
    flops: float
    weight_bytes: float
    activation_bytes: float
    comm_bytes: float
    compute_s: float
    hbm_s: float
    comm_latency_s: float
    comm_bandwidth_s: float

    @property
    def comm_s(self) -> float:
        return self.comm_latency_s + self.comm_bandwidth_s

    @property
    def times(self) -> dict[str, float]:
        return {"compute": self.compute_s, "HBM": self.hbm_s, "comm": self.comm_s}

    @property
    def bound(self) -> str:
        """The binding cost: compute, HBM, comm latency or comm bandwidth (the larger comm part)."""
        name = max(self.times, key=self.times.get)
        if name != "comm":
            return name
        return "comm latency" if self.comm_latency_s >= self.comm_bandwidth_s else "comm bandwidth"

    @property
    def serial_s(self) -> float:
        """max(compute, HBM) + comm: the all-reduce waits for the down projection."""
        return max(self.compute_s, self.hbm_s) + self.comm_s

    @property
    def overlapped_s(self) -> float:
        """max of the three: the best case with communication hidden behind other work."""
        return max(self.compute_s, self.hbm_s, self.comm_s)

    @property
    def intensity(self) -> float:
        """FLOP per HBM byte on one GPU."""
        return self.flops / (self.weight_bytes + self.activation_bytes)


@dataclass(frozen=True)
class CostLines:
    """The three costs as straight lines in T (seconds): compute = c T, HBM = h0 + h T,
    comm = alpha + m T. Every boundary of the regime map is where two of them cross."""

    compute_slope: float
    hbm_intercept: float
    hbm_slope: float
    comm_latency: float
    comm_slope: float

    def at(self, tokens: float) -> tuple[float, float, float, float]:
        """(compute, HBM, comm latency, comm bandwidth) seconds at ``tokens``."""
        return (
            self.compute_slope * tokens,
            self.hbm_intercept + self.hbm_slope * tokens,
            self.comm_latency,
            self.comm_slope * tokens,
        )


def cost_lines(
    shape: FFNShape,
    chip: str | GPU,
    tp: int = 1,
    link: str = "auto",
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    fused: bool = True,
    allreduce_latency_override_s: float | None = None,
) -> CostLines:
    """Slopes and intercepts of the three costs on one of ``tp`` GPUs.

    c = 2 k d f / (n P); h0 = k d f b_w / (n W); h = a(n) b_a / W; alpha and m: the latency and
    per-token bandwidth seconds of the all-reduce from :func:`comm_params` (lib.perf.collectives:
    the vendor's scale-up link inside a node, hierarchical over the node's NICs beyond).
    """
    if not isinstance(shape, FFNShape):
        raise ValueError(f"shape must be an FFNShape (see ffn_shape), got {type(shape).__name__}")
    _check_link(link)
    g = gpu(chip)
    tp = integer("tp", tp, 1)
    if tp > shape.d_ff:
        raise ValueError(f"tp={tp} exceeds the FFN width {shape.d_ff}")
    b_w, b_a = bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    alpha, slope = comm_params(g, tp, shape.d_model, act_dtype)
    if allreduce_latency_override_s is not None:
        real("allreduce_latency_override_s", allreduce_latency_override_s, 0, unit="seconds")
        alpha = allreduce_latency_override_s if tp > 1 else 0.0
    k, d, f = shape.matrices, shape.d_model, shape.d_ff
    w = g.memory_bandwidth
    return CostLines(
        compute_slope=2.0 * k * d * f / (tp * g.peak_flops(compute_dtype)),
        hbm_intercept=k * d * f * b_w / (tp * w),
        hbm_slope=activation_elements_per_token(shape, tp, fused) * b_a / w,
        comm_latency=alpha,
        comm_slope=slope,
    )


def ffn_cost(
    shape: FFNShape,
    chip: str | GPU,
    tokens: float,
    tp: int = 1,
    link: str = "auto",
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    fused: bool = True,
    allreduce_latency_override_s: float | None = None,
) -> FFNCost:
    """Compute, HBM and communication time of one FFN layer for ``tokens`` tokens on each of ``tp`` GPUs.

    flops = 2 k T d f / n; weight bytes = k d f b_w / n; activation bytes = T a(n) b_a;
    comm bytes = 2 (n - 1) / n T d b_a (ring all-reduce, per GPU), priced by lib.perf.collectives.
    Datasheet roofs for compute and HBM.
    """
    lines = cost_lines(
        shape,
        chip,
        tp,
        link,
        weight_dtype,
        act_dtype,
        compute_dtype,
        fused,
        allreduce_latency_override_s,
    )
    real("tokens", tokens, 1)
    b_w, b_a = bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    k, d, f = shape.matrices, shape.d_model, shape.d_ff
    compute_s, hbm_s, lat_s, bw_s = lines.at(tokens)
    return FFNCost(
        shape,
        tokens,
        tp,
        comm_fabric(chip, tp),
        2.0 * k * tokens * d * f / tp,
        k * d * f * b_w / tp,
        tokens * activation_elements_per_token(shape, tp, fused) * b_a,
        2.0 * (tp - 1) / tp * tokens * d * b_a,
        compute_s,
        hbm_s,
        lat_s,
        bw_s,
    )


# ---- closed-form boundaries (tokens T at which two costs are equal, for a fixed n) ---------------


def compute_hbm_boundary_tokens(
    shape: FFNShape,
    chip: str | GPU,
    tp: int = 1,
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    fused: bool = True,
) -> float:
    """T where compute = HBM: T* = k d f b_w / (2 k d f / R - n a(n) b_a), R = P / W.

    Without activations this is R b_w / 2, independent of n. ``inf`` when activations alone
    keep the layer memory-bound at any T.
    """
    g = gpu(chip)
    k, d, f = shape.matrices, shape.d_model, shape.d_ff
    ridge = g.peak_flops(compute_dtype) / g.memory_bandwidth
    denom = 2 * k * d * f / ridge - tp * activation_elements_per_token(
        shape, tp, fused
    ) * bytes_per_element(act_dtype)
    return k * d * f * bytes_per_element(weight_dtype) / denom if denom > 0 else math.inf


def compute_comm_boundary_tokens(
    shape: FFNShape,
    chip: str | GPU,
    tp: int,
    link: str = "auto",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """T where compute = comm: T* = alpha / (c - m) (c, m: compute and all-reduce seconds per token).

    ``inf`` when the all-reduce's bandwidth term grows at least as fast as compute: then
    comm exceeds compute at every T (see :func:`comm_compute_ratio`).
    """
    _check_link(link)
    if tp == 1:
        return 0.0
    g = gpu(chip)
    alpha, m = comm_params(g, tp, shape.d_model, act_dtype)
    k, d, f = shape.matrices, shape.d_model, shape.d_ff
    denom = 2 * k * d * f / (tp * g.peak_flops(compute_dtype)) - m
    return alpha / denom if denom > 0 else math.inf


def hbm_comm_boundary_tokens(
    shape: FFNShape,
    chip: str | GPU,
    tp: int,
    link: str = "auto",
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    fused: bool = True,
) -> float:
    """T where HBM = comm: k d f b_w/(n W) + T a b_a / W = alpha + T m.

    T* = (alpha - k d f b_w / (n W)) / (a b_a / W - m). ``nan`` when the two lines never cross at
    T >= 0 (one is above the other everywhere).
    """
    _check_link(link)
    if tp == 1:
        return math.nan
    g = gpu(chip)
    alpha, m = comm_params(g, tp, shape.d_model, act_dtype)
    k, d, f = shape.matrices, shape.d_model, shape.d_ff
    b_a = bytes_per_element(act_dtype)
    num = alpha - k * d * f * bytes_per_element(weight_dtype) / (tp * g.memory_bandwidth)
    den = activation_elements_per_token(shape, tp, fused) * b_a / g.memory_bandwidth - m
    if den == 0:
        return math.nan
    t = num / den
    return t if t >= 0 else math.nan


def comm_latency_bandwidth_tokens(
    shape: FFNShape, chip: str | GPU, tp: int, link: str = "auto", act_dtype: str = "bf16"
) -> float:
    """T where the all-reduce's latency equals its bandwidth term: T* = alpha / m."""
    _check_link(link)
    if tp == 1:
        return math.nan
    alpha, m = comm_params(chip, tp, shape.d_model, act_dtype)
    return alpha / m


def comm_compute_ratio(
    shape: FFNShape,
    chip: str | GPU,
    tp: int,
    link: str = "auto",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """Large-T limit of comm / compute time: m / c = m n P / (2 k d f).

    Inside a node (ring on the scale-up link, B per direction, bus efficiency e) this is
    (n - 1) b_a P / (k f B e), independent of T and d.
    """
    _check_link(link)
    if tp == 1:
        return 0.0
    g = gpu(chip)
    _, m = comm_params(g, tp, shape.d_model, act_dtype)
    c = 2.0 * shape.matrices * shape.d_model * shape.d_ff / (tp * g.peak_flops(compute_dtype))
    return m / c


def comm_binds_tp(
    shape: FFNShape,
    chip: str | GPU,
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """TP degree (real) past which a ring all-reduce on the scale-up link outlasts the matmuls at
    any T: n = 1 + k f B e / (b_a P), B the link's per-direction bytes/s and e its bus efficiency
    (lib.perf.collectives.intra_node_fabric). On a full mesh (Infinity Fabric) the group's
    bandwidth grows as n - 1 links, so the ratio does not move with n: 1.0 if the link binds at
    every n > 1, ``inf`` if never. Meaningful only up to a node's GPUs; past a node see
    :func:`comm_binds_from_tp`."""
    g = gpu(chip)
    fab = collectives.intra_node_fabric(g)
    headroom = shape.matrices * shape.d_ff * fab.peer_bandwidth * fab.bus_efficiency / (
        bytes_per_element(act_dtype) * g.peak_flops(compute_dtype)
    )
    if fab.mesh:
        return 1.0 if headroom <= 1 else math.inf
    return 1 + headroom


def group_sizes(max_tp: int = 64) -> list[int]:
    """TP degrees a group can take: 1 .. gpus_per_node, then whole nodes up to ``max_tp``."""
    per_node = collectives.gpus_per_node()
    max_tp = integer("max_tp", max_tp, 1)
    return [n for n in range(1, max_tp + 1) if n <= per_node or n % per_node == 0]


def comm_binds_from_tp(
    shape: FFNShape,
    chip: str | GPU,
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    max_tp: int = 64,
) -> float:
    """Smallest group size (of :func:`group_sizes`) at which the all-reduce outlasts the matmuls at
    large T (:func:`comm_compute_ratio` >= 1, hierarchical past a node); ``inf`` if none up to ``max_tp``."""
    for n in group_sizes(max_tp):
        if n <= shape.d_ff and comm_compute_ratio(shape, chip, n, "auto", act_dtype, compute_dtype) >= 1:
            return float(n)
    return math.inf


def _decode_ring_terms(shape: FFNShape, chip: str | GPU, weight_dtype: str) -> tuple[float, float, float]:
    """(a, b, c) of the small-T FFN time on the scale-up ring: a / n + b + c n, seconds.

    a = k d f b_w / W (the weight read on one GPU); the ring latency alpha(n) = base + 2 (n - 1) s
    gives b = base - 2 s and c = 2 s (``collectives.<fabric>.ring_ll``). PCIe and network
    latencies are flat: c = 0.
    """
    from lib.registry import assumptions as assume
    from lib.units import US

    g = gpu(chip)
    a = shape.weight_params * bytes_per_element(weight_dtype) / g.memory_bandwidth
    fab = collectives.intra_node_fabric(g)
    if fab.key in ("nvlink", "infinity_fabric"):
        ll = assume.entry(f"collectives.{fab.key}.ring_ll")
        return a, (ll["base_us"] - 2 * ll["per_step_us"]) * US, 2 * ll["per_step_us"] * US
    return a, fab.alpha_s(2, 2), 0.0


def decode_comm_crossover_tp(shape: FFNShape, chip: str | GPU, weight_dtype: str = "bf16") -> float:
    """TP degree (real) at which the ring all-reduce latency equals the per-GPU weight read as T -> 0.

    a / n = b + c n, positive root n = (-b + sqrt(b^2 + 4 a c)) / (2 c) (n = a / b for a flat
    latency). This is a CROSSOVER (two costs equal), not the best TP: the time a / n + b + c n
    still falls past it, down to :func:`decode_optimal_tp`.
    """
    a, b, c = _decode_ring_terms(shape, chip, weight_dtype)
    if c == 0:
        return a / b
    return (-b + math.sqrt(b * b + 4 * a * c)) / (2 * c)


def decode_optimal_tp(shape: FFNShape, chip: str | GPU, weight_dtype: str = "bf16") -> float:
    """TP degree (real) that minimises the small-T FFN time a / n + b + c n on the scale-up ring:
    n* = sqrt(a / c) (``inf`` for a flat latency: then more GPUs always help on this link).

    A continuous value on one link model: a real group stops at the node (see
    :func:`decode_best_tp`, which prices larger groups hierarchically)."""
    a, _, c = _decode_ring_terms(shape, chip, weight_dtype)
    return math.sqrt(a / c) if c > 0 else math.inf


def decode_best_tp(
    shape: FFNShape,
    chip: str | GPU,
    tokens: float = 1,
    max_tp: int = 64,
    **kwargs,
) -> int:
    """Group size (of :func:`group_sizes`, each priced by :func:`ffn_cost`, hierarchical past a node)
    with the smallest un-overlapped layer time max(compute, HBM) + comm at ``tokens``."""
    sizes = [n for n in group_sizes(max_tp) if n <= shape.d_ff]
    return min(sizes, key=lambda n: ffn_cost(shape, chip, tokens, n, "auto", **kwargs).serial_s)


def _bound_codes(lines: CostLines, tokens):
    """Index into BOUNDS of the binding cost at each of ``tokens`` (numpy array)."""
    import numpy as np

    compute, hbm, lat, bw = lines.at(np.asarray(tokens, dtype=float))
    comm = lat + bw
    stacked = np.stack([compute, hbm, comm])
    best = np.argmax(stacked, axis=0)  # ties go to the first: compute, then HBM
    return np.where(best == 2, np.where(lat >= bw, 2, 3), best)


def regime_grid(
    shape: FFNShape, chip: str | GPU, tokens: list, tps: list, link: str = "auto", **kwargs
) -> list[list[str]]:
    """Binding cost at every (tp, tokens) pair: rows follow ``tps``, columns ``tokens``."""
    for t in tokens:
        real("tokens", t, 1)
    return [
        [BOUNDS[c] for c in _bound_codes(cost_lines(shape, chip, n, link, **kwargs), tokens)]
        for n in tps
    ]


_REGIME_COLORS = ("#d62728", "#1f77b4", "#ff7f0e", "#ffbb78")  # one per entry of BOUNDS


def _regime_axes(max_tokens: int, max_tp: int) -> tuple[list[int], list[int]]:
    """The map's columns (about 49 token counts, log-spaced from 1) and rows (TP powers of two)."""
    import numpy as np

    tokens = np.unique(np.round(np.geomspace(1, max_tokens, 49)).astype(int)).tolist()
    return tokens, [2**i for i in range(int(math.log2(max_tp)) + 1)]


def build_regime_map(ax, max_tokens: int = 65536, max_tp: int = 64) -> dict:
    """The artists of :func:`plot_regime_map` on ``ax`` for one grid, drawn by :func:`draw_regime_map`:
    one collection of rectangles per binding cost (runs of cells along each row; edges in the
    face colour hide the seams a browser leaves between abutting shapes)."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    tokens, tps = _regime_axes(max_tokens, max_tp)
    x_edges = np.concatenate([[tokens[0] / 1.5], np.sqrt(np.array(tokens[:-1]) * np.array(tokens[1:])),
                              [tokens[-1] * 1.5]])
    regions = [ax.add_collection(PolyCollection([], facecolors=color, edgecolors="face", linewidths=0.5, label=bound),
                                 autolim=False) for color, bound in zip(_REGIME_COLORS, BOUNDS, strict=True)]
    boundaries = [ax.plot([], [], color="black", lw=1, label="compute = HBM (closed form)")[0] for _ in tps]
    point, = ax.plot([], [], "k*", ms=10, label="this T and n")
    figures.log_scale(ax, "x", base=2)
    ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_ylim(-0.5, len(tps) - 0.5)
    ax.set_yticks(range(len(tps)), [str(n) for n in tps])
    ax.set_xlabel("tokens in the forward pass (T)")
    ax.set_ylabel("TP degree n")
    return {"ax": ax, "tokens": tokens, "tps": tps, "x_edges": x_edges, "regions": regions,
            "boundaries": boundaries, "point": point}


def regime_map(shape: FFNShape, chip: str | GPU, link: str = "auto", max_tokens: int = 65536,
               max_tp: int = 64, **kwargs) -> dict:
    """What :func:`plot_regime_map` shows: ``tokens`` (columns), ``tps`` (rows), ``codes`` (the
    index into :data:`BOUNDS` of the binding cost in each cell) and ``boundaries`` (each row's
    closed-form compute/HBM boundary in tokens, None where it is off the map or off the roofline)."""
    import numpy as np

    integer("max_tokens", max_tokens, 2)
    integer("max_tp", max_tp, 1)
    tokens, tps = _regime_axes(max_tokens, max_tp)
    codes = np.array([_bound_codes(cost_lines(shape, chip, n, link, **kwargs), tokens) for n in tps])
    boundaries = []
    for i, n in enumerate(tps):
        t_star = compute_hbm_boundary_tokens(
            shape, chip, n, kwargs.get("weight_dtype", "bf16"), kwargs.get("act_dtype", "bf16"),
            kwargs.get("compute_dtype", "bf16"), kwargs.get("fused", True))
        on_roofline = codes[i, int(np.searchsorted(tokens, min(t_star, tokens[-1])))] <= 1
        shown = math.isfinite(t_star) and tokens[0] <= t_star <= tokens[-1] and on_roofline
        boundaries.append(t_star if shown else None)
    return {"tokens": tokens, "tps": tps, "codes": codes, "boundaries": boundaries}


def draw_regime_map(art: dict, regimes: dict, point: tuple[float, int] | None = None) -> None:
    """Colour the map built by :func:`build_regime_map` with ``regimes`` (:func:`regime_map` on
    the same grid): black ticks at each row's compute/HBM boundary, a star at ``point`` =
    (tokens, TP degree)."""
    import numpy as np

    tps, x = art["tps"], art["x_edges"]
    for code, region in enumerate(art["regions"]):
        rects = []
        for i, row in enumerate(regimes["codes"]):
            inside = np.concatenate([[False], row == code, [False]])
            starts, ends = np.flatnonzero(inside[1:] & ~inside[:-1]), np.flatnonzero(~inside[1:] & inside[:-1])
            rects += [[(x[a], i - 0.5), (x[b], i - 0.5), (x[b], i + 0.5), (x[a], i + 0.5)]
                      for a, b in zip(starts, ends, strict=True)]
        region.set_verts(rects)
    for i, (t_star, tick) in enumerate(zip(regimes["boundaries"], art["boundaries"], strict=True)):
        tick.set_data([] if t_star is None else [t_star, t_star], [] if t_star is None else [i - 0.45, i + 0.45])
    t, n = point if point is not None else (None, None)
    if n in tps:
        art["point"].set_data([t], [tps.index(n)])
    else:
        art["point"].set_data([], [])
    ticks = [tick for t_star, tick in zip(regimes["boundaries"], art["boundaries"], strict=True) if t_star is not None]
    figures.legend(art["ax"], [*art["regions"], *ticks[:1], *([art["point"]] if n in tps else [])], fontsize=7,
                   ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))


def _regime_build(fig, max_tokens: int, max_tp: int) -> dict:
    fig.subplots_adjust(bottom=0.3)
    return build_regime_map(fig.add_subplot(), max_tokens, max_tp)


def plot_regime_map(
    shape: FFNShape,
    chip: str | GPU,
    link: str = "auto",
    max_tokens: int = 65536,
    max_tp: int = 64,
    point: tuple[float, int] | None = None,
    **kwargs,
):
    """Regime map: x = tokens (log2), y = TP degree (powers of two), colour = binding cost.

    Closed-form compute/HBM boundaries are drawn as black ticks on each row. Returns a
    :class:`lib.book.figures.Drawing`.
    """
    regimes = regime_map(shape, chip, link, max_tokens, max_tp, **kwargs)
    return _REGIME_MAP(regimes, point, layout=(max_tokens, max_tp))


_REGIME_MAP = figures.LiveFigure(6.0, 3.25, _regime_build, draw_regime_map)
