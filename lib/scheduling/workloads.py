"""Requests and the seeded workloads that produce them.

A :class:`Request` is what a client sends: when it arrives (seconds), how long its prompt is
and how many tokens it will generate (tokens), its priority class (lower = more urgent) and the
``max_tokens`` it declares (the cap a server sees at admission; the real output length is only
known when the request finishes). A :class:`Workload` draws requests from length
distributions and an arrival process with one seed; :func:`mix` merges several (an interactive
class and a batch class); :func:`trace` builds requests from explicit rows.

Length distributions are over positive integers (tokens): :class:`Constant`, :class:`Uniform`,
:class:`Geometric` (the integer exponential), :class:`LogNormal`, :class:`Bimodal` and
:class:`Empirical`. Each has ``sample(rng, n)`` and, where it exists, the exact ``mean`` and
``second_moment`` the queueing closed forms take (:mod:`lib.scheduling.queueing`).
SI units: seconds, requests per second; lengths in tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = [
    "Bimodal",
    "Constant",
    "Empirical",
    "Geometric",
    "LogNormal",
    "Request",
    "Uniform",
    "Workload",
    "as_length",
    "mix",
    "trace",
]


# ---- length distributions -------------------------------------------------------------------


@dataclass(frozen=True)
class Constant:
    """Every draw is ``value`` tokens. Mean v, second moment v^2."""

    value: int

    def __post_init__(self) -> None:
        integer("value", self.value, 1, unit="tokens")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return float(self.value)

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        return float(self.value) ** 2


@dataclass(frozen=True)
class Uniform:
    """Integers ``low..high`` inclusive, equally likely.

    Mean (a + b) / 2; second moment = Var + mean^2 with Var = ((b - a + 1)^2 - 1) / 12.
    """

    low: int
    high: int

    def __post_init__(self) -> None:
        integer("low", self.low, 1, unit="tokens")
        integer("high", self.high, self.low, unit="tokens (>= low)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return (self.low + self.high) / 2

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        width = self.high - self.low + 1
        return (width * width - 1) / 12 + self.mean**2


@dataclass(frozen=True)
class Geometric:
    """The integer exponential: P(k) = p (1 - p)^(k - 1), k >= 1, p = 1 / mean.

    Mean 1 / p; second moment (2 - p) / p^2 (an exponential of the same mean has 2 / p^2: they
    agree to a relative p / 2, so a long mean is exponential service for queueing purposes).
    """

    mean_tokens: float

    def __post_init__(self) -> None:
        real("mean_tokens", self.mean_tokens, 1, unit="tokens")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        return rng.geometric(1.0 / self.mean_tokens, size=n).astype(np.int64)

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return float(self.mean_tokens)

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        p = 1.0 / self.mean_tokens
        return (2 - p) / (p * p)


@dataclass(frozen=True)
class LogNormal:
    """round(exp(N(ln median, sigma^2))), at least 1 and at most ``cap`` tokens.

    The heavy tail of real prompt and reply lengths (ShareGPT-like traces). ``mean`` and
    ``second_moment`` are those of the continuous, uncapped distribution (median e^(s^2/2) and
    median^2 e^(2 s^2)): rounding and the cap move them slightly; use the sample's moments when
    an exact value matters.
    """

    median: float
    sigma: float
    cap: int | None = None

    def __post_init__(self) -> None:
        real("median", self.median, 1, unit="tokens")
        real("sigma", self.sigma, 0, 5)
        if self.cap is not None:
            integer("cap", self.cap, 1, unit="tokens")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        x = np.rint(rng.lognormal(math.log(self.median), self.sigma, size=n))
        return np.clip(x, 1, self.cap or np.iinfo(np.int64).max).astype(np.int64)

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return self.median * math.exp(self.sigma**2 / 2)

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        return self.median**2 * math.exp(2 * self.sigma**2)


@dataclass(frozen=True)
class Bimodal:
    """A mixture: ``long`` with probability ``p_long``, else ``short`` (each a distribution or an int).

    Mean and second moment mix linearly: m = (1 - p) m_s + p m_l (same for the second moment).
    """

    short: object
    long: object
    p_long: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "short", as_length("short", self.short))
        object.__setattr__(self, "long", as_length("long", self.long))
        fraction("p_long", self.p_long)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        pick = rng.random(n) < self.p_long
        return np.where(pick, self.long.sample(rng, n), self.short.sample(rng, n))

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return (1 - self.p_long) * self.short.mean + self.p_long * self.long.mean

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        return (1 - self.p_long) * self.short.second_moment + self.p_long * self.long.second_moment


@dataclass(frozen=True)
class Empirical:
    """Draws with replacement from ``values`` (tokens): a measured length histogram."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        vals = tuple(integer("values[i]", v, 1, unit="tokens") for v in self.values)
        if not vals:
            raise ValueError("values must hold at least one length")
        object.__setattr__(self, "values", vals)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws from ``rng`` (int64 tokens)."""
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]

    @property
    def mean(self) -> float:
        """E[X], tokens."""
        return float(np.mean(self.values))

    @property
    def second_moment(self) -> float:
        """E[X^2], tokens^2."""
        return float(np.mean(np.square(np.asarray(self.values, dtype=float))))


_DISTS = (Constant, Uniform, Geometric, LogNormal, Bimodal, Empirical)


def as_length(name: str, dist: object):
    """``dist`` as a length distribution: an int becomes :class:`Constant`; anything with
    ``sample(rng, n)`` and ``mean`` is accepted; else ValueError naming ``name``."""
    if isinstance(dist, int) and not isinstance(dist, bool):
        return Constant(integer(name, dist, 1, unit="tokens"))
    if isinstance(dist, _DISTS) or (callable(getattr(dist, "sample", None)) and hasattr(dist, "mean")):
        return dist
    raise ValueError(
        f"{name} must be a positive int or a length distribution "
        f"({', '.join(d.__name__ for d in _DISTS)}), got {dist!r}"
    )


# ---- requests -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One request: arrival (s), prompt and output lengths (tokens), priority class, declared cap.

    ``max_tokens`` (None: ``output_len``) is what the client declares; ``output_len`` <=
    ``max_tokens`` is how many tokens it really generates (a server learns it at the end).
    """

    rid: int
    arrival_s: float
    prompt_len: int
    output_len: int
    priority: int = 0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        integer("rid", self.rid, 0)
        real("arrival_s", self.arrival_s, 0, unit="seconds")
        integer("prompt_len", self.prompt_len, 1, unit="tokens")
        integer("output_len", self.output_len, 1, unit="tokens")
        integer("priority", self.priority, 0)
        if self.max_tokens is None:
            object.__setattr__(self, "max_tokens", self.output_len)
        integer("max_tokens", self.max_tokens, self.output_len, unit="tokens (>= output_len)")


# ---- workloads -------------------------------------------------------------------------------

ARRIVALS = ("poisson", "uniform", "burst")


@dataclass(frozen=True)
class Workload:
    """A seeded stream of requests.

    Arrivals: ``"poisson"`` at ``rate`` requests/s (exponential gaps, mean 1 / rate), or
    piecewise with ``rate_schedule`` = ((duration_s, rate), ...) (a spike: ((60, 5), (60, 20),
    (120, 5))); ``"uniform"``: one every 1 / rate seconds; ``"burst"``: all at ``start_s``
    (offline batch). ``n_requests`` bounds the count (required unless a schedule ends it).
    Lengths: ``prompt`` and ``output`` are distributions (or ints); ``max_tokens`` (None: each
    request's own output) is the declared cap, and outputs are clipped to it. ``priority`` is the
    class every request of this workload carries.
    """

    prompt: object = 512
    output: object = 128
    rate: float | None = 1.0
    n_requests: int | None = 1000
    arrival: str = "poisson"
    rate_schedule: tuple | None = None
    priority: int = 0
    max_tokens: int | None = None
    start_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", as_length("prompt", self.prompt))
        object.__setattr__(self, "output", as_length("output", self.output))
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}; got {self.arrival!r}")
        if self.rate_schedule is not None:
            if self.arrival != "poisson":
                raise ValueError("rate_schedule needs arrival='poisson'")
            segs = tuple(
                (real("rate_schedule duration", d, 0, low_open=True, unit="seconds"),
                 real("rate_schedule rate", r, 0, unit="requests/s"))
                for d, r in self.rate_schedule
            )
            if not segs:
                raise ValueError("rate_schedule must hold at least one (duration_s, rate) segment")
            object.__setattr__(self, "rate_schedule", segs)
        elif self.arrival != "burst":
            real("rate", self.rate, 0, low_open=True, unit="requests/s")
        if self.n_requests is None:
            if self.rate_schedule is None:
                raise ValueError("n_requests is required unless a rate_schedule ends the stream")
        else:
            integer("n_requests", self.n_requests, 0)
        integer("priority", self.priority, 0)
        if self.max_tokens is not None:
            integer("max_tokens", self.max_tokens, 1, unit="tokens")
        real("start_s", self.start_s, 0, unit="seconds")

    def arrival_times(self, rng: np.random.Generator) -> np.ndarray:
        """Arrival instants (s), sorted: Poisson gaps, a fixed spacing, or one burst."""
        n = self.n_requests
        if self.rate_schedule is not None:
            out, t0 = [], self.start_s
            for duration, rate in self.rate_schedule:
                if rate > 0:
                    k = rng.poisson(rate * duration)  # Poisson count, uniform order statistics
                    out.append(t0 + np.sort(rng.random(k)) * duration)
                t0 += duration
            times = np.concatenate(out) if out else np.zeros(0)
            return times if n is None else times[:n]
        if self.arrival == "burst":
            return np.full(n, self.start_s)
        if self.arrival == "uniform":
            return self.start_s + np.arange(n) / self.rate
        return self.start_s + np.cumsum(rng.exponential(1.0 / self.rate, size=n))

    def generate(self, seed: int = 0, first_rid: int = 0) -> tuple[Request, ...]:
        """The requests, drawn with ``numpy.random.default_rng(seed)`` (arrivals, then prompts,
        then outputs): the same seed gives the same requests."""
        integer("seed", seed, 0)
        rng = np.random.default_rng(seed)
        times = self.arrival_times(rng)
        n = len(times)
        prompts = self.prompt.sample(rng, n)
        outputs = self.output.sample(rng, n)
        if self.max_tokens is not None:
            outputs = np.minimum(outputs, self.max_tokens)
        return tuple(
            Request(first_rid + i, float(t), int(p), int(o), self.priority, self.max_tokens)
            for i, (t, p, o) in enumerate(zip(times, prompts, outputs, strict=True))
        )

    def replace(self, **changes) -> Workload:
        """A validated copy with some fields changed."""
        import dataclasses

        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Workload field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


def mix(workloads: Sequence[Workload], seed: int = 0) -> tuple[Request, ...]:
    """Requests of several workloads merged by arrival time and renumbered 0..n-1.

    Workload i draws with seed ``seed * 1000 + i``, so adding a workload does not change the
    others' draws.
    """
    if not workloads or not all(isinstance(w, Workload) for w in workloads):
        raise ValueError("workloads must be a non-empty sequence of Workload")
    integer("seed", seed, 0)
    reqs = [r for i, w in enumerate(workloads) for r in w.generate(seed * 1000 + i)]
    reqs.sort(key=lambda r: (r.arrival_s, r.priority, r.rid))
    return tuple(_renumber(reqs))


def _renumber(reqs: Iterable[Request]) -> list[Request]:
    return [Request(i, r.arrival_s, r.prompt_len, r.output_len, r.priority, r.max_tokens)
            for i, r in enumerate(reqs)]


def trace(rows: Iterable) -> tuple[Request, ...]:
    """Requests from rows ``(arrival_s, prompt_len, output_len[, priority[, max_tokens]])`` or
    dicts with those keys, sorted by arrival and numbered 0..n-1 (a replayed trace)."""
    reqs = []
    for i, row in enumerate(rows):
        if isinstance(row, dict):
            reqs.append(Request(i, row["arrival_s"], row["prompt_len"], row["output_len"],
                                row.get("priority", 0), row.get("max_tokens")))
        else:
            reqs.append(Request(i, *row))
    reqs.sort(key=lambda r: (r.arrival_s, r.rid))
    return tuple(_renumber(reqs))

