"""Multimodal serving memory (I083): image tokens, the vision encoder's peak, retained embeddings,
and which phase of a step (encode, prefill, decode) runs out of device memory while the KV pool
still shows free pages.

* **Image tokens** (Qwen2-VL / Qwen2.5-VL arithmetic): the processor resizes each side to a
  multiple of patch x merge = 28 px and rescales the area into [min_pixels, max_pixels]
  (:func:`smart_resize`); the encoder sees one 14 px patch per 14 x 14 pixels (merged patches x
  merge^2) and the decoder one token per 28 x 28 pixels.
* **Encoder peak** (:func:`encoder_activation_peak_bytes`): the widest point inside one vision
  block over every patch encoded in the step, the pixel input, and (without a memory-efficient
  attention kernel) the score matrix over the concatenated patches.
* **Retained embeddings** (:func:`embedding_bytes`): each image's merged tokens at the decoder's
  width, held from the encode until its prefill consumes them.
* **Phases** (:func:`phase_peaks`): each phase's transient bytes against what the budget allows a
  step to use: the activations the engine measured at start-up plus the headroom margin
  (:class:`lib.perf.memory.MemoryBudget`). The decoder side is :mod:`lib.perf.memory`.

SI units: bytes; pixels; tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer
from lib.perf import memory as mem
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.search import largest_true

__all__ = [
    "VisionTower", "vision_tower", "tower_names", "smart_resize", "image_tokens", "image_patches",
    "tower_params", "encoder_activation_peak_bytes", "pixel_bytes", "embedding_bytes", "PhasePeaks",
    "phase_peaks", "largest_fitting", "SCORE_BYTES",
]

SCORE_BYTES = 4  # attention scores materialized in FP32 by a non-fused softmax


@dataclass(frozen=True)
class VisionTower:
    """A ViT-style vision encoder and its image processor's limits (``sre.vlm_vision_towers``)."""

    name: str
    decoder: str
    depth: int
    hidden: int
    heads: int
    intermediate: int
    patch: int
    merge: int
    temporal_patch: int
    in_channels: int
    window: int
    full_attention_layers: int
    out_hidden: int
    min_pixels: int
    max_pixels: int
    card_max_pixels: int

    @property
    def factor(self) -> int:
        """Pixels per side of one decoder token: patch x merge (28 for Qwen2-VL / 2.5-VL)."""
        return self.patch * self.merge


def tower_names() -> list[str]:
    return sorted(assumptions.value("sre.vlm_vision_towers"))


def vision_tower(name: str = "qwen2.5-vl-72b") -> VisionTower:
    """The vision tower called ``name`` from ``data/assumptions.yaml`` (``sre.vlm_vision_towers``)."""
    table = assumptions.value("sre.vlm_vision_towers")
    if name not in table:
        raise ValueError(f"vision tower must be one of {', '.join(sorted(table))}, got {name!r}")
    return VisionTower(name=name, **table[name])


def smart_resize(height: int, width: int, tower: VisionTower, max_pixels: int | None = None,
                 min_pixels: int | None = None) -> tuple[int, int]:
    """The processor's resize (transformers' Qwen2-VL ``smart_resize``), pixels.

    Each side rounds to a multiple of f = patch x merge; if the area exceeds ``max_pixels`` both
    sides scale by beta = sqrt(h w / max) and floor to f; below ``min_pixels`` they scale up and ceil.
    """
    height = integer("height", height, 1)
    width = integer("width", width, 1)
    lo = tower.min_pixels if min_pixels is None else integer("min_pixels", min_pixels, 1)
    hi = tower.max_pixels if max_pixels is None else integer("max_pixels", max_pixels, lo)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {height} x {width}")
    f = tower.factor
    h = max(f, round(height / f) * f)
    w = max(f, round(width / f) * f)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return h, w


def image_tokens(height: int, width: int, tower: VisionTower, max_pixels: int | None = None) -> int:
    """Decoder tokens of one image: (h / f) x (w / f) after :func:`smart_resize` (f = 28 px)."""
    h, w = smart_resize(height, width, tower, max_pixels)
    return (h // tower.factor) * (w // tower.factor)


def image_patches(tokens: int, tower: VisionTower) -> int:
    """Encoder patches behind ``tokens`` decoder tokens: tokens x merge^2 (one temporal patch per image)."""
    return integer("tokens", tokens, 0) * tower.merge**2


def tower_params(tower: VisionTower) -> int:
    """Parameters of the vision tower: patch embedding, ``depth`` blocks, the merger.

    Patch embedding c t p^2 h (no bias); block: qkv 3h^2 + 3h, proj h^2 + h, SwiGLU 3 h I + 2I + h,
    two RMSNorms 2h; merger: norm h, (4h)^2 + 4h, 4h x out + out (m^2 = 4 patches merged).
    """
    h, i, m2 = tower.hidden, tower.intermediate, tower.merge**2
    embed = tower.in_channels * tower.temporal_patch * tower.patch**2 * h
    block = (3 * h * h + 3 * h) + (h * h + h) + (3 * h * i + 2 * i + h) + 2 * h
    merger = h + (m2 * h) ** 2 + m2 * h + m2 * h * tower.out_hidden + tower.out_hidden
    return embed + tower.depth * block + merger


def pixel_bytes(patches: int, tower: VisionTower, dtype: str = "bf16") -> float:
    """The pixel input of ``patches`` patches: patches x c x t x p^2 values, bytes."""
    patches = integer("patches", patches, 0)
    return patches * tower.in_channels * tower.temporal_patch * tower.patch**2 * bytes_per_element(dtype)


def encoder_activation_peak_bytes(tower: VisionTower, patches_per_image: int, images: int, tp: int = 1,
                                  flash: bool = True, act_dtype: str = "bf16") -> float:
    """Peak live activations of one encoder pass over ``images`` images on one of ``tp`` GPUs, bytes.

    The same widest-point rule as :func:`lib.perf.memory.activation_peak_bytes`, per patch:
    b N (2h + max((3h + h) / tp, 3 I / tp)) with N = images x patches. Without a memory-efficient
    kernel (``flash`` False) the full-attention blocks also hold the scores over the concatenated
    patches (a block-diagonal mask, as the reference implementation builds it):
    heads / tp x N^2 x 4 B, plus an N^2 boolean mask.
    """
    patches_per_image = integer("patches_per_image", patches_per_image, 1)
    images = integer("images", images, 1)
    tp = integer("tp", tp, 1)
    if tower.heads % tp:
        raise ValueError(f"tp={tp} must divide the vision tower's {tower.heads} heads")
    b = bytes_per_element(act_dtype)
    n = patches_per_image * images
    h = tower.hidden
    linear = b * n * (2 * h + max(4 * h / tp, 3 * tower.intermediate / tp))
    if flash:
        return linear
    return linear + (tower.heads / tp) * n * n * SCORE_BYTES + n * n


def embedding_bytes(tokens: int, tower: VisionTower, dtype: str = "bf16") -> float:
    """Retained image embeddings: merged tokens x decoder width x bytes (whole on every TP rank)."""
    tokens = integer("tokens", tokens, 0)
    return tokens * tower.out_hidden * bytes_per_element(dtype)


@dataclass(frozen=True)
class PhasePeaks:
    """Transient bytes of each phase of a step on one GPU, what a step may use (``allowance``: the
    activations the engine measured plus the headroom margin), and the encoder's own numbers."""

    encode: float
    prefill: float
    decode: float
    allowance: float
    encoder_activation: float
    pixels: float
    embeddings_step: float
    embeddings_waiting: float

    @property
    def phases(self) -> dict[str, float]:
        return {"encode": self.encode, "prefill": self.prefill, "decode": self.decode}

    @property
    def over(self) -> dict[str, float]:
        """Bytes each phase needs beyond the allowance (negative: it fits)."""
        return {k: v - self.allowance for k, v in self.phases.items()}

    @property
    def oom_phase(self) -> str | None:
        """The phase that runs out first (the largest overrun), None when all fit."""
        worst = max(self.over, key=self.over.get)
        return worst if self.over[worst] > 0 else None


def phase_peaks(budget: mem.MemoryBudget, tower: VisionTower, tokens_per_image: int, images_per_step: int,
                images_waiting: int = 0, flash: bool = True, decode_batch: int | None = None,
                act_dtype: str = "bf16") -> PhasePeaks:
    """Transient bytes of the encode, prefill and decode phases on one GPU of ``budget``'s replica.

    encode = encoder peak (``images_per_step`` images) + their pixels + embeddings of those images and
    of ``images_waiting`` images encoded earlier and not yet prefilled; prefill = decoder activation
    peak at max_num_batched_tokens (:func:`lib.perf.memory.activation_peak_bytes`) + the waiting and
    new embeddings; decode = decoder activation peak at ``decode_batch`` tokens (default
    max_num_seqs). The allowance is budget.activations + budget.headroom_margin_bytes: what a step
    may hold beyond the fixed memory before an allocation fails.
    """
    tokens_per_image = integer("tokens_per_image", tokens_per_image, 1)
    images_per_step = integer("images_per_step", images_per_step, 1)
    images_waiting = integer("images_waiting", images_waiting, 0)
    patches = image_patches(tokens_per_image, tower)
    act = encoder_activation_peak_bytes(tower, patches, images_per_step, budget.tp, flash, act_dtype)
    pix = pixel_bytes(patches * images_per_step, tower, act_dtype)
    emb_step = embedding_bytes(tokens_per_image * images_per_step, tower, act_dtype)
    emb_wait = embedding_bytes(tokens_per_image * images_waiting, tower, act_dtype)
    dec_batch = budget.max_num_seqs if decode_batch is None else integer("decode_batch", decode_batch, 1)
    prefill = mem.activation_peak_bytes(budget.model_key, budget.max_num_batched_tokens, budget.tp, act_dtype)
    decode = mem.activation_peak_bytes(budget.model_key, dec_batch, budget.tp, act_dtype)
    allowance = budget.components["activations"] + budget.headroom_margin_bytes
    return PhasePeaks(act + pix + emb_step + emb_wait, prefill + emb_step + emb_wait, decode, allowance, act, pix,
                      emb_step, emb_wait)


def largest_fitting(fits, low: int, high: int) -> int:
    """The largest integer n in [low, high] with ``fits(n)`` True, for a ``fits`` that is True up to
    some n and False after (:func:`lib.search.largest_true` once ``fits(low)`` is checked); low - 1 when
    even ``low`` does not fit."""
    low = integer("low", low, 0)
    high = integer("high", high, low)
    if not fits(low):
        return low - 1
    return largest_true(fits, low + 1, high)

