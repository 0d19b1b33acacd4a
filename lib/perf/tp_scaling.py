"""How one decode step scales with the tensor-parallel degree: a view of :mod:`lib.perf.step`.

Nothing here prices a step: every time is :func:`lib.perf.step.decode_step` on a
:class:`~lib.perf.deployment.Deployment` with a different ``tp``. This module only asks that
model the TP questions:

- :func:`speedup_curve`: the step and its speedup over a reference at each TP degree;
- :func:`tp_cost_fit`: inside one scale-up domain (CUDA graphs on, KV split by head) the
  modelled step is exactly ``T(n) = a / n + b + c n``: ``a`` the work that shards (reads,
  their bandwidth shortfall, the LM head's logits), ``b`` what does not move (kernel fixed
  time, launch gaps, host work), ``c`` the collective latency each added GPU brings (a ring
  of n GPUs takes 2 (n - 1) hops). Its continuous minimum sits at ``n_opt = sqrt(a / c)``,
  where the two moving terms are equal (``a / n = c n``);
- :func:`comm_crossover_tp`: the degree ``n_x`` where the sharded read equals the whole
  collective bill (``S(1) / n = C(n)``). That is where two costs cross, **not** where the step
  is shortest: past ``n_x`` the step still falls, because only the *growth* of the collective
  bill (``c n``), not its fixed part, trades against the read;
- :func:`best_tp`: the minimum of the modelled step over the TP degrees a real engine can
  deploy (the Deployment builds: TP shards the heads, the weights fit; groups beyond a node
  are whole nodes and pay the network, see :mod:`lib.perf.collectives`);
- :func:`plot_step_stack`, :func:`plot_speedup`: the stacked buckets and the curve (each also as
  ``build_*``/``draw_*`` for an explorer's persistent figure, :mod:`lib.book.figures`).
- :func:`require_serves`: refuse a batch the KV cache cannot hold or a context past the window;
  :func:`group_link`: the name of the link a TP group's collectives cross (NVLink, Infinity Fabric, PCIe, network).

A TP degree that cannot be deployed (a TP1 card that cannot hold the weights, a degree that
does not divide the heads) is priced as a *hypothetical* point: the same step model on the
same record without its validation, flagged ``valid=False`` with the validation's message.
SI units: seconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lib.book import figures
from lib.inputs import integer
from lib.perf.collectives import gpus_per_node
from lib.perf.deployment import Deployment, require, tp_shards
from lib.perf.step import BUCKETS, DecodeStep, StepAssumptions, decode_step

# ---- deployments at another TP degree ---------------------------------------------------------


def deployment_at(dep: Deployment, **changes) -> tuple[Deployment, str]:
    """``dep.replace(**changes)`` and ``""`` when that record is valid; otherwise the same record
    built without validation (a hypothetical setup the step model can still price) and the
    reason it is not deployable (the Deployment's own message).

    Only the fields of a Deployment may change; ``tp`` must still be an integer >= 1.
    """
    require(dep)
    unknown = set(changes) - {f.name for f in dataclasses.fields(dep)}
    if unknown:
        raise ValueError(f"unknown Deployment field(s) {sorted(unknown)}")
    if "tp" in changes:
        changes["tp"] = integer("tp", changes["tp"], 1)
    try:
        return dep.replace(**changes), ""
    except ValueError as exc:
        reason = str(exc)
    fields = {f.name: getattr(dep, f.name) for f in dataclasses.fields(dep)} | changes
    hypothetical = object.__new__(Deployment)
    for name, value in fields.items():
        object.__setattr__(hypothetical, name, value)
    hypothetical.mdl, hypothetical.chip  # noqa: B018 - an unknown model or GPU still raises
    return hypothetical, reason


def require_serves(dep: Deployment, batch: int, context: int) -> Deployment:
    """``dep`` when it can hold ``batch`` sequences of ``context`` cached tokens each; else ValueError.

    Two limits: the context fits the model's window (``max_position_embeddings``), and the KV
    cache of the memory budget (:attr:`Deployment.budget`, driver-visible memory) holds ``batch``
    such sequences (``budget.max_concurrency(context)``). The message names what to change.
    """
    require(dep)
    batch = integer("batch", batch, 1, unit="sequences")
    context = dep.mdl.check_context(context)
    if context > 0:
        room = dep.budget.max_concurrency(context)
        if room < batch:
            raise ValueError(
                f"{dep.label}: the KV cache holds {room:.3g} sequences of {context:,} tokens, not {batch}: "
                "raise tp, shrink batch or context, or quantize")
    return dep


def group_link(dep: Deployment) -> str:
    """The link a TP group's collectives cross, by name ('' at TP1).

    The node's own fabric while the group fits one node (:func:`lib.perf.collectives.intra_node_fabric`
    of ``tp`` GPUs: "NVLink", "Infinity Fabric" or "PCIe"); a larger group also crosses the network:
    "NVLink inside each node and the network between nodes".
    """
    from lib.perf.collectives import intra_node_fabric

    require(dep)
    if dep.tp == 1:
        return ""
    per_node = gpus_per_node(chip=dep.chip)
    inside = intra_node_fabric(dep.chip, min(dep.tp, per_node)).name
    return inside if dep.tp <= per_node else f"{inside} inside each node and the network between nodes"


# ---- the speedup curve ------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedupPoint:
    """One TP degree on the speedup curve."""

    tp: int
    step: DecodeStep
    speedup: float  # reference step / this step
    valid: bool  # a real engine can deploy this degree (the Deployment builds)
    reason: str = ""  # why not, when not valid

    @property
    def step_s(self) -> float:
        return self.step.total_s

    @property
    def efficiency(self) -> float:
        """speedup / tp: 1 is perfect scaling."""
        return self.speedup / self.tp

    @property
    def divides(self) -> bool:
        """tp shards the heads (vLLM's rule), whatever the memory says."""
        return tp_shards(self.step.deployment.mdl, self.tp)


def step_at(dep: Deployment, tp: int, batch: int = 1, context: int = 0,
            assume: StepAssumptions | None = None) -> tuple[DecodeStep, str]:
    """The modelled step of ``dep`` at ``tp`` and the reason it is hypothetical ('' when valid)."""
    at, reason = deployment_at(dep, tp=tp)
    return decode_step(at, batch, context, assume), reason


def speedup_curve(dep: Deployment, degrees=range(1, 9), batch: int = 1, context: int = 0,
                  assume: StepAssumptions | None = None,
                  reference: DecodeStep | None = None) -> list[SpeedupPoint]:
    """Step time and speedup at each TP degree of ``dep``'s model and GPU.

    speedup(n) = T_ref / T(n), T from :func:`lib.perf.step.decode_step`; the reference defaults
    to TP1 on the same GPU (hypothetical when one card cannot hold the model: check the first
    point's ``valid``). Degrees that cannot be deployed are priced hypothetically and flagged.
    """
    degrees = [integer("tp", n, 1) for n in degrees]
    if not degrees:
        raise ValueError("degrees must list at least one TP degree")
    ref = reference if reference is not None else step_at(dep, 1, batch, context, assume)[0]
    out = []
    for n in degrees:
        step, reason = step_at(dep, n, batch, context, assume)
        out.append(SpeedupPoint(n, step, ref.total_s / step.total_s, not reason, reason))
    return out


# ---- a / n + b + c n: the continuous optimum and the crossover --------------------------------


@dataclass(frozen=True)
class TPCostFit:
    """T(n) = a / n + b + c n, fitted exactly through the modelled step at three TP degrees."""

    a_s: float  # seconds x GPUs: the work that shards
    b_s: float  # seconds: what does not depend on n
    c_s: float  # seconds per GPU: collective latency added by each GPU in the group
    degrees: tuple[int, int, int]

    def step_s(self, n: float) -> float:
        """The fitted step at (real) degree ``n``."""
        return self.a_s / n + self.b_s + self.c_s * n

    @property
    def optimum_tp(self) -> float:
        """argmin of a / n + b + c n: n_opt = sqrt(a / c); infinite when c <= 0 < a (the step keeps
        falling); 1 when a <= 0 (nothing in the fit shards, e.g. an eager step whose launches set its
        pace: the fitted step is lowest at one GPU)."""
        if self.a_s <= 0:
            return 1.0
        return math.sqrt(self.a_s / self.c_s) if self.c_s > 0 else math.inf

    @property
    def optimum_step_s(self) -> float:
        """The fitted step at n_opt: b + 2 sqrt(a c)."""
        n = self.optimum_tp
        return self.step_s(n) if math.isfinite(n) else self.b_s


def _fit3(xs: tuple[int, int, int], ys: list[float]) -> tuple[float, float, float]:
    """Solve y = a / x + b + c x through three points (Cramer's rule)."""
    rows = [(1.0 / x, 1.0, float(x)) for x in xs]

    def det(m):
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
                - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))

    d = det(rows)
    out = []
    for col in range(3):
        m = [list(r) for r in rows]
        for i in range(3):
            m[i][col] = ys[i]
        out.append(det(m) / d)
    return out[0], out[1], out[2]


def _fit_degrees(degrees) -> tuple[int, int, int]:
    degrees = tuple(integer("tp", n, 2) for n in degrees)
    per_node = gpus_per_node()
    if len(set(degrees)) != 3 or max(degrees) > per_node:
        raise ValueError(
            f"degrees must be three different TP degrees between 2 and {per_node} (one scale-up domain, "
            f"where the a / n + b + c n form holds); got {degrees}"
        )
    return degrees


def tp_cost_fit(dep: Deployment, batch: int = 1, context: int = 0,
                assume: StepAssumptions | None = None, degrees=(2, 4, 8)) -> TPCostFit:
    """Fit T(n) = a / n + b + c n through the modelled step at three degrees inside one node.

    With CUDA graphs and the KV split by head the step model is exactly of this form there
    (reads and FLOPs per kernel scale 1/n, a ring's latency grows by a fixed amount per hop,
    its bytes term is 2 (n - 1) / n x M), so the fit reproduces the model at every degree of
    the node. Beyond the node the collectives cross the network and the form no longer holds:
    ``optimum_tp`` above the node size says how far the *fabric* would reward more GPUs, not a
    deployable degree (see :func:`best_tp`).
    """
    degrees = _fit_degrees(degrees)
    ys = [step_at(dep, n, batch, context, assume)[0].total_s for n in degrees]
    return TPCostFit(*_fit3(degrees, ys), degrees)


def comm_crossover_tp(dep: Deployment, batch: int = 1, context: int = 0,
                      assume: StepAssumptions | None = None, degrees=(2, 4, 8)) -> float:
    """The (real) TP degree n_x where the sharded part of the step equals its collective bill.

    S(1) / n = C(n), with S(1) the reads and their shortfall at TP1 (``DecodeStep.sharded_s``)
    and C(n) = alpha0 + alpha1 n + beta / n the collective time of the step (latency grows per
    hop, the ring's bytes term is 2 (n - 1) / n x M), fitted exactly through the model at three
    degrees of one node. Positive root of alpha1 n^2 + alpha0 n - (S(1) - beta) = 0.

    This is a *crossover*, not an optimum: the step keeps falling past it until
    a / n = c n (:attr:`TPCostFit.optimum_tp`).
    """
    degrees = _fit_degrees(degrees)
    s1 = step_at(dep, 1, batch, context, assume)[0].sharded_s
    cs = [step_at(dep, n, batch, context, assume)[0].collective_s for n in degrees]
    beta, alpha0, alpha1 = _fit3(degrees, cs)
    if alpha1 <= 0:
        if alpha0 <= 0:
            raise ValueError("the collectives cost no latency here: there is no crossover")
        return (s1 - beta) / alpha0
    disc = alpha0 * alpha0 + 4 * alpha1 * (s1 - beta)
    return (-alpha0 + math.sqrt(max(disc, 0.0))) / (2 * alpha1)


# ---- the best deployable TP -------------------------------------------------------------------


@dataclass(frozen=True)
class BestTP:
    """The TP degree with the shortest modelled step among those a real engine can deploy."""

    tp: int
    step_s: float
    steps: dict  # tp -> modelled step seconds, deployable degrees only
    refused: dict  # tp -> why that degree cannot be deployed

    @property
    def runner_up(self) -> tuple[int, float] | None:
        """The second-best deployable degree and its step, or None."""
        rest = sorted((s, n) for n, s in self.steps.items() if n != self.tp)
        return (rest[0][1], rest[0][0]) if rest else None


def candidate_degrees(dep: Deployment, max_tp: int = 64) -> list[int]:
    """TP degrees worth trying: 1 .. node size, then whole nodes, up to ``max_tp``."""
    max_tp = integer("max_tp", max_tp, 1)
    per_node = gpus_per_node()
    return [n for n in range(1, max_tp + 1) if n <= per_node or n % per_node == 0]


def best_tp(dep: Deployment, batch: int = 1, context: int = 0,
            assume: StepAssumptions | None = None, max_tp: int = 64) -> BestTP:
    """argmin over deployable TP degrees (up to ``max_tp``) of the modelled decode step.

    A degree is deployable when ``dep.replace(tp=n)`` builds (TP shards the heads, the weights
    leave room for a KV cache on driver-visible memory) and its collectives can be priced
    (groups beyond a node are whole nodes with a network). Ties go to the smaller degree.
    """
    steps, refused = {}, {}
    for n in candidate_degrees(dep, max_tp):
        try:
            steps[n] = decode_step(dep.replace(tp=n), batch, context, assume).total_s
        except ValueError as exc:
            refused[n] = str(exc)
    if not steps:
        raise ValueError(f"no TP degree up to {max_tp} can deploy {dep.label}: " + next(iter(refused.values())))
    best = min(steps, key=lambda n: (steps[n], n))
    return BestTP(best, steps[best], steps, refused)


# ---- plots --------------------------------------------------------------------------------------

_COLORS = {
    "weights": "#1f77b4",
    "kv_cache": "#6baed6",
    "weight_bandwidth_shortfall": "#9ecae1",
    "kv_bandwidth_shortfall": "#c6dbef",
    "compute_excess": "#9467bd",
    "kernel_fixed": "#ff7f0e",
    "launch_gaps": "#ffbb78",
    "allreduce_latency": "#d62728",
    "allreduce_bandwidth": "#ff9896",
    "sampling": "#2ca02c",
    "scheduler": "#98df8a",
}
LABELS = {
    "allreduce_latency": "collective latency",
    "allreduce_bandwidth": "collective bandwidth",
}


def build_step_stack(ax, rows: int = 1) -> dict:
    """The artists of :func:`plot_step_stack` on ``ax``: one bar per bucket on each of ``rows``
    rows, drawn by :func:`draw_step_stack` (a persistent figure builds them once)."""
    bars = {}
    for name in BUCKETS:
        bars[name] = ax.barh(range(rows), [0.0] * rows, color=_COLORS[name],
                             label=LABELS.get(name, name.replace("_", " ")))
    ax.invert_yaxis()
    return {"ax": ax, "bars": bars}


def draw_step_stack(art: dict, steps: dict, unit_s: float = 1e-3, legend_kw: dict | None = None) -> None:
    """Set the bars built by :func:`build_step_stack` to ``steps`` (label -> DecodeStep, one per
    row, at most the rows built); buckets that are zero on every row leave the legend."""
    ax, labels = art["ax"], list(steps)
    left = [0.0] * len(labels)
    for name, bars in art["bars"].items():
        widths = [max(steps[label][name], 0.0) / unit_s for label in labels]
        for i, bar in enumerate(bars):  # rows past len(steps) stay hidden
            bar.set_visible(i < len(labels) and any(w > 0 for w in widths))
            if i < len(labels):
                bar.set_x(left[i])
                bar.set_width(widths[i])
                left[i] += widths[i]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    # room for the longest row label on the left (about 0.6 em a character at 8 pt, plus the ticks)
    label_in = (0.6 * 8 * max(len(label) for label in labels) + 14) / 72
    ax.figure.subplots_adjust(left=max(0.12, label_in / ax.figure.get_figwidth()))
    ax.set_xlim(0.0, 1.05 * max(max(left), 1e-12))
    ax.set_xlabel("ms per decode step" if unit_s == 1e-3 else "time")
    figures.legend(ax, art["bars"].values(), **(legend_kw or {"fontsize": 7, "ncol": 3, "loc": "upper center",
                                                                 "bbox_to_anchor": (0.5, -0.3)}))


def _step_stack_build(fig, rows: int):
    fig.set_size_inches(6.5, 0.5 * rows + 1.5)
    fig.subplots_adjust(bottom=0.42)
    return build_step_stack(fig.add_subplot(), rows)


def plot_step_stack(steps: dict, unit_s: float = 1e-3):
    """Horizontal stacked bars of the step buckets, one row per labelled DecodeStep (first on
    top); returns a :class:`lib.book.figures.Drawing`."""
    if not steps:
        raise ValueError("steps must hold at least one labelled DecodeStep")
    return _STEP_STACK(steps, unit_s, layout=(len(steps),))


def build_speedup(ax) -> dict:
    """The artists of :func:`plot_speedup` on ``ax``, drawn by :func:`draw_speedup`."""
    ideal, = ax.plot([], [], color="grey", ls="--", lw=1, label="ideal (n x)")
    model, = ax.plot([], [], color="#d62728", lw=1.5)
    valid, = ax.plot([], [], "o", color="#d62728", label="deployable")
    hypothetical, = ax.plot([], [], "o", color="#d62728", mfc="white", label="not deployable")
    ax.set_xlabel("tensor-parallel degree n")
    ax.set_ylabel("speedup over the reference")
    ax.grid(True)
    return {"ax": ax, "ideal": ideal, "model": model, "valid": valid, "hypothetical": hypothetical}


def draw_speedup(art: dict, curve: list[SpeedupPoint], label: str = "modelled") -> None:
    """Set the lines built by :func:`build_speedup` to ``curve``."""
    xs = [p.tp for p in curve]
    art["ideal"].set_data(xs, xs)
    art["model"].set_data(xs, [p.speedup for p in curve])
    art["model"].set_label(label)
    for key, valid in (("valid", True), ("hypothetical", False)):
        pts = [p for p in curve if p.valid == valid]
        art[key].set_data([p.tp for p in pts], [p.speedup for p in pts])
        art[key].set_visible(bool(pts))
    ax = art["ax"]
    ax.relim(visible_only=True)
    ax.autoscale_view()
    figures.legend(ax, [art[k] for k in ("ideal", "model", "valid", "hypothetical")], fontsize=7, loc="upper left")


def _speedup_build(fig):
    return build_speedup(fig.add_subplot())


def plot_speedup(curve: list[SpeedupPoint], label: str = "modelled"):
    """Speedup against TP degree with the ideal line; deployable degrees filled, hypothetical
    open; returns a :class:`lib.book.figures.Drawing`."""
    if not curve:
        raise ValueError("curve must hold at least one point")
    return _SPEEDUP(curve, label)


_STEP_STACK = figures.LiveFigure(6.5, 2.5, _step_stack_build, draw_step_stack)
_SPEEDUP = figures.LiveFigure(5.0, 3.25, _speedup_build, draw_speedup)
