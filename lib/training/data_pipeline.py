"""The pre-training data pipeline as byte flows: raw crawl -> extracted text -> English -> filtered ->
deduplicated -> token shards, and what each stage costs in CPU cores to finish in a deadline.

Every stage is (keep, core rate): it turns B input bytes into ``keep x B`` output bytes and one CPU
core processes ``core rate`` input bytes a second, so it costs ``B / rate`` core-seconds and needs
``B / (rate x deadline)`` cores to finish in the deadline. The defaults are in
``data/assumptions.yaml`` (section ``training_data``), each with a source or an argued assumption.

The token side: a tokenizer turns text into ``bytes / bytes_per_token`` tokens stored as the
smallest unsigned integer that holds the vocabulary (``token_bytes``); the rate a training job reads
them comes from :func:`lib.training.flops.training_tokens_per_s` (never a second fleet model here).

SI units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.inputs import fraction, integer, real
from lib.registry import assumptions

__all__ = [
    "DAY_S", "STAGES", "Stage", "StageLoad", "bytes_per_token", "dominant_stages", "loader_bytes_per_s",
    "minhash_core_bytes_per_s", "minhash_shuffle_bytes", "packed_token_bits", "pipeline_loads", "pipeline_stages",
    "global_batch_ids", "rank_batch_ids", "raw_bytes_for_tokens", "read_token_shard", "sample_order", "shard_bytes",
    "LOADER_FIXES", "LOADER_SINKS", "LoaderConfig", "LoaderStep", "loader_fix_ladder", "loader_step", "token_bytes", "tokenizer_core_days",
    "write_token_shard",
]

DAY_S = 86400.0
MB = 1e6
#: The stage keys in pipeline order.
STAGES = ("extract", "language", "quality", "dedup", "tokenize")
_LABELS = {"extract": "read WARC + extract text", "language": "language ID", "quality": "quality filters",
           "dedup": "MinHash dedup", "tokenize": "tokenize + write shards"}


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: output bytes per input byte (``keep``) and the input bytes one CPU core
    processes per second (``core_bytes_per_s``)."""

    key: str
    keep: float
    core_bytes_per_s: float

    @property
    def label(self) -> str:
        return _LABELS.get(self.key, self.key)


@dataclass(frozen=True)
class StageLoad:
    """A stage applied to ``bytes_in``: bytes out, core-seconds, and the cores that finish it in time."""

    stage: Stage
    bytes_in: float
    bytes_out: float
    core_s: float

    @property
    def core_days(self) -> float:
        return self.core_s / DAY_S

    def cores_for(self, deadline_s: float) -> float:
        """Cores that process ``bytes_in`` within ``deadline_s``: core_s / deadline (a real number)."""
        return self.core_s / real("deadline_s", deadline_s, 0, low_open=True, unit="seconds")

    def bytes_per_s_for(self, deadline_s: float) -> float:
        """Input bytes per second the stage must sustain to finish in ``deadline_s``."""
        return self.bytes_in / real("deadline_s", deadline_s, 0, low_open=True, unit="seconds")


def token_bytes(vocab_size: int) -> int:
    """Bytes of the smallest unsigned integer dtype (1, 2, 4 or 8 bytes) that holds token ids
    0 .. vocab_size - 1: uint16 up to 65,536 tokens, uint32 beyond (Llama 3's 128,256)."""
    v = integer("vocab_size", vocab_size, 2)
    for b in (1, 2, 4, 8):
        if v <= 1 << (8 * b):
            return b
    raise ValueError(f"vocab_size must be at most 2^64, got {vocab_size}")


def packed_token_bits(vocab_size: int) -> int:
    """Bits per token of a bit-packed shard: ceil(log2(vocab_size)) (17 for a 128K vocabulary)."""
    v = integer("vocab_size", vocab_size, 2)
    return (v - 1).bit_length()


def bytes_per_token(chars_per_token: float | None = None, bytes_per_char: float | None = None) -> float:
    """UTF-8 bytes of text per token: characters per token x bytes per character
    (defaults: Llama 3's 3.94 characters per English token, 1.0 byte per character)."""
    c = real("chars_per_token", assumptions.resolve(chars_per_token, "training_data.chars_per_token"), 0,
             low_open=True)
    b = real("bytes_per_char", assumptions.resolve(bytes_per_char, "training_data.bytes_per_char"), 1)
    return c * b


def shard_bytes(tokens: float, vocab_size: int, docs: float = 0.0, index_bytes_per_doc: int = 8,
                packed: bool = False) -> float:
    """Bytes of the token shards: tokens x token_bytes(vocab) (or packed bits / 8) plus a document
    index of ``index_bytes_per_doc`` bytes per offset: docs + 1 offsets (each start, and the end) when
    there are documents, as :func:`write_token_shard` writes them."""
    t = real("tokens", tokens, 0)
    d = real("docs", docs, 0)
    i = integer("index_bytes_per_doc", index_bytes_per_doc, 0, unit="bytes")
    per = packed_token_bits(vocab_size) / 8 if packed else token_bytes(vocab_size)
    return t * per + (d + 1 if d > 0 else 0) * i


def minhash_core_bytes_per_s(hashes: int, hash_ns: float | None = None, bytes_per_word: float | None = None) -> float:
    """Text bytes one core signs per second: a word-n-gram shingle per word, ``hashes`` hash
    evaluations per shingle at ``hash_ns`` each: bytes_per_word / (hashes x hash_ns x 1e-9)."""
    h = integer("hashes", hashes, 1)
    ns = real("hash_ns", assumptions.resolve(hash_ns, "training_data.minhash_hash_ns"), 0, low_open=True, unit="ns")
    w = real("bytes_per_word", assumptions.resolve(bytes_per_word, "training_data.bytes_per_word"), 0,
             low_open=True)
    return w / (h * ns * 1e-9)


def pipeline_stages(vocab_size: int, minhash_hashes: int = 112, chars_per_token: float | None = None,
                    **overrides: float) -> tuple[Stage, ...]:
    """The default stages (``STAGES`` order) from ``training_data`` assumptions. ``overrides`` may
    set ``<key>_keep`` or ``<key>_core_mb_s`` for extract, language, quality, dedup, tokenize
    (``language_keep`` defaults to the English share; dedup's rate comes from
    :func:`minhash_core_bytes_per_s`; tokenize keeps token_bytes / bytes_per_token)."""
    allowed = {f"{k}_{s}" for k in STAGES for s in ("keep", "core_mb_s")}
    bad = sorted(set(overrides) - allowed)
    if bad:
        raise ValueError(f"unknown stage override(s) {bad}; allowed: {sorted(allowed)}")

    def keep(k: str) -> float:
        if f"{k}_keep" in overrides:
            return fraction(f"{k}_keep", overrides[f"{k}_keep"], allow_zero=False)
        path = "training_data.english_share" if k == "language" else f"training_data.{k}_keep"
        return assumptions.value(path)

    def rate(k: str, default: float | None = None) -> float:
        if f"{k}_core_mb_s" in overrides:
            return real(f"{k}_core_mb_s", overrides[f"{k}_core_mb_s"], 0, low_open=True, unit="MB/s") * MB
        return default if default is not None else assumptions.value(f"training_data.{k}_core_mb_s") * MB

    tok_keep = token_bytes(vocab_size) / bytes_per_token(chars_per_token)
    return (Stage("extract", keep("extract"), rate("extract")),
            Stage("language", keep("language"), rate("language")),
            Stage("quality", keep("quality"), rate("quality")),
            Stage("dedup", keep("dedup"), rate("dedup", minhash_core_bytes_per_s(minhash_hashes))),
            Stage("tokenize", tok_keep, rate("tokenize")))


def raw_bytes_for_tokens(tokens: float, stages: tuple[Stage, ...], chars_per_token: float | None = None) -> float:
    """Raw crawl bytes that yield ``tokens`` training tokens: tokens x bytes_per_token divided by the
    product of every keep fraction before the tokenizer."""
    t = real("tokens", tokens, 0, low_open=True)
    text = t * bytes_per_token(chars_per_token)
    return text / math.prod(s.keep for s in stages if s.key != "tokenize")


def pipeline_loads(raw_bytes: float, stages: tuple[Stage, ...]) -> list[StageLoad]:
    """Each stage applied in order to ``raw_bytes``: bytes in, bytes out = keep x in, and
    core-seconds = bytes in / core rate."""
    b = real("raw_bytes", raw_bytes, 0, low_open=True, unit="bytes")
    if not stages:
        raise ValueError("stages must hold at least one Stage")
    out = []
    for s in stages:
        out.append(StageLoad(s, b, b * s.keep, b / s.core_bytes_per_s))
        b *= s.keep
    return out


def dominant_stages(loads: list[StageLoad], n: int = 2) -> list[StageLoad]:
    """The ``n`` stages with the most core-seconds, largest first."""
    n = integer("n", n, 1, len(loads))
    return sorted(loads, key=lambda ld: -ld.core_s)[:n]


def tokenizer_core_days(text_bytes: float, core_bytes_per_s: float | None = None) -> float:
    """Core-days to tokenize ``text_bytes``: bytes / (per-core rate x 86,400). The rate defaults to
    ``training_data.tokenize_core_mb_s`` (about 1 MB/s a core)."""
    b = real("text_bytes", text_bytes, 0)
    r = real("core_bytes_per_s", core_bytes_per_s if core_bytes_per_s is not None
             else assumptions.value("training_data.tokenize_core_mb_s") * MB, 0, low_open=True, unit="bytes/s")
    return b / r / DAY_S


def loader_bytes_per_s(tokens_per_s: float, vocab_size: int) -> float:
    """Bytes per second a training job reads from token shards: tokens/s x token_bytes(vocab)
    (tokens/s from :func:`lib.training.flops.training_tokens_per_s`)."""
    return real("tokens_per_s", tokens_per_s, 0) * token_bytes(vocab_size)


def minhash_shuffle_bytes(docs: float, bands: int, key_bytes: int = 8, id_bytes: int = 8) -> float:
    """Bytes the LSH stage moves across the network: one (band hash, document id) record per band per
    document, docs x bands x (key_bytes + id_bytes), all-to-all so every bucket lands on one worker."""
    d = real("docs", docs, 0)
    b = integer("bands", bands, 1)
    return d * b * (integer("key_bytes", key_bytes, 1) + integer("id_bytes", id_bytes, 1))


# ---- token shards and a resumable sample order (the tokenizer's output, the loader's input) -----


def write_token_shard(prefix, docs, vocab_size: int) -> dict:
    """Write documents (sequences of token ids) as one shard: ``prefix.bin`` the ids back to back in
    the dtype :func:`token_bytes` picks, ``prefix.idx`` the uint64 start offset of each document plus
    the end (so document d is ids[idx[d]:idx[d+1]]). Returns {"tokens", "docs", "bytes"}."""
    v = integer("vocab_size", vocab_size, 2)
    dtype = np.dtype(f"<u{token_bytes(v)}")
    arrays = [np.asarray(d, dtype=np.int64) for d in docs]
    for a in arrays:
        if a.size and (a.min() < 0 or a.max() >= v):
            raise ValueError(f"token ids must be in [0, {v - 1}] for vocab_size={v}")
    ids = np.concatenate(arrays).astype(dtype) if arrays else np.empty(0, dtype=dtype)
    offsets = np.zeros(len(arrays) + 1, dtype="<u8")
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    prefix = Path(prefix)
    ids.tofile(prefix.with_suffix(".bin"))
    offsets.tofile(prefix.with_suffix(".idx"))
    return {"tokens": int(ids.size), "docs": len(arrays), "bytes": int(ids.nbytes + offsets.nbytes)}


def read_token_shard(prefix, vocab_size: int):
    """Memory-map a shard written by :func:`write_token_shard`: (ids, offsets), no copy, no parsing."""
    prefix = Path(prefix)
    dtype = np.dtype(f"<u{token_bytes(vocab_size)}")
    ids = np.memmap(prefix.with_suffix(".bin"), dtype=dtype, mode="r") if prefix.with_suffix(".bin").stat().st_size \
        else np.empty(0, dtype=dtype)
    offsets = np.fromfile(prefix.with_suffix(".idx"), dtype="<u8")
    return ids, offsets


def sample_order(n_samples: int, seed: int, epoch: int):
    """The order samples are read in epoch ``epoch``: a permutation of 0 .. n - 1 that depends on
    (seed, epoch) only, never on the number of workers, ranks or restarts (numpy PCG64 seeded with
    [seed, epoch])."""
    n = integer("n_samples", n_samples, 1)
    rng = np.random.default_rng([integer("seed", seed, 0), integer("epoch", epoch, 0)])
    return rng.permutation(n)


def global_batch_ids(step: int, global_batch: int, n_samples: int, seed: int):
    """Sample ids of training step ``step``: positions step x B .. (step + 1) x B - 1 of the endless
    sequence epoch 0's order, epoch 1's order, ... A run resumed at any step reads exactly the batches
    an uninterrupted run would: the loader's state is the step number."""
    s, b = integer("step", step, 0), integer("global_batch", global_batch, 1)
    n = integer("n_samples", n_samples, 1)
    out, pos = [], s * b
    while len(out) < b:
        epoch, i = divmod(pos, n)
        take = min(b - len(out), n - i)
        out.extend(sample_order(n, seed, epoch)[i:i + take].tolist())
        pos += take
    return np.asarray(out, dtype=np.int64)


def rank_batch_ids(step: int, rank: int, world: int, global_batch: int, n_samples: int, seed: int):
    """The slice of step ``step``'s global batch that data-parallel rank ``rank`` of ``world`` reads:
    a contiguous B / world block, so the union over ranks is the global batch for any world size."""
    w = integer("world", world, 1)
    r = integer("rank", rank, 0, w - 1)
    b = integer("global_batch", global_batch, 1)
    if b % w:
        raise ValueError(f"global_batch ({b}) must be a multiple of world ({w})")
    per = b // w
    return global_batch_ids(step, b, n_samples, seed)[r * per:(r + 1) * per]


# ---- the text data loader: what consumes its time ------------------------------------------------------

#: The four things a text loader spends time on, in the order the naive loader usually ranks them.
LOADER_SINKS = ("tokenize", "read", "python", "copy")


@dataclass(frozen=True)
class LoaderConfig:
    """How a training job's loader gets one GPU's batch: ``tokenized`` shards of ids (else JSON lines
    of text decompressed, parsed and tokenized in the loader); ``storage`` the tier it reads from
    (``"network_storage"`` or ``"local_nvme"``, :func:`lib.kvcache.recompute_fetch.storage_tier`);
    ``batched_reads`` one sequential read per batch from a memory-mapped shard (else one random read
    per sample); ``workers`` loader processes per GPU (0: in the training loop); ``pinned`` batches in
    pinned memory copied with non_blocking one step ahead (else a synchronous pageable copy)."""

    tokenized: bool = False
    storage: str = "network_storage"
    batched_reads: bool = False
    workers: int = 0
    pinned: bool = False


@dataclass(frozen=True)
class LoaderStep:
    """One GPU's loader per training step: seconds of each sink, the step it must keep up with, and
    the stall the step sees (``exposed_s``)."""

    sinks: dict
    step_s: float
    exposed_s: float
    workers: int

    @property
    def worker_s(self) -> float:
        """Seconds of loader work per step outside the copy (tokenize, read, python)."""
        return sum(v for k, v in self.sinks.items() if k != "copy")

    @property
    def busy_fraction(self) -> float:
        """The share of wall-clock the GPU computes: step / (step + stall)."""
        return self.step_s / (self.step_s + self.exposed_s)


def loader_step(cfg: LoaderConfig, chip, samples: int, sample_tokens: int, step_s: float,
                chars_per_token: float | None = None, tokenize_core_mb_s: float | None = None) -> LoaderStep:
    """The four sinks for one GPU's batch of ``samples`` sequences of ``sample_tokens`` tokens:

    * tokenize: text bytes / tokenizer rate + text bytes / parse rate (0 when ``tokenized``);
    * read: per sample (or once per batch when ``batched_reads``) the tier's latency + bytes / bandwidth,
      bytes being text (raw) or ids (shards);
    * python: ``training_data.loader_python_us_per_sample`` per sample (once per batch when the batch
      is one slice of a memory-mapped shard);
    * copy: inputs and labels as int64 to the GPU, :func:`lib.kernels.elementwise.host_copy_s`.

    Exposed stall per step: with no workers everything but a pinned copy is serial with the step;
    with W workers the work runs W-wide under the step, exposed only beyond it: max(0, work / W - step);
    a pageable copy is synchronous either way."""
    from lib.kernels.elementwise import host_copy_s
    from lib.kvcache.recompute_fetch import storage_tier

    if cfg.storage not in ("network_storage", "local_nvme"):
        raise ValueError(f"storage must be 'network_storage' or 'local_nvme', got {cfg.storage!r}")
    w = integer("workers", cfg.workers, 0, 64)
    n = integer("samples", samples, 1)
    t = integer("sample_tokens", sample_tokens, 1, unit="tokens")
    step = real("step_s", step_s, 0, low_open=True, unit="seconds")
    tier = storage_tier(cfg.storage, chip)
    text_bytes = n * t * bytes_per_token(chars_per_token)
    tok_rate = real("tokenize_core_mb_s", assumptions.resolve(tokenize_core_mb_s, "training_data.tokenize_core_mb_s"),
                    0, low_open=True) * MB
    parse_rate = assumptions.value("training_data.loader_parse_mb_s") * MB
    tokenize = 0.0 if cfg.tokenized else text_bytes / tok_rate + text_bytes / parse_rate
    payload = n * t * 4 if cfg.tokenized else text_bytes  # uint32 ids or the text itself
    reads = 1 if cfg.batched_reads else n
    read = reads * tier.latency_s + payload / tier.bandwidth
    python = (1 if cfg.batched_reads and cfg.tokenized else n) * \
        assumptions.value("training_data.loader_python_us_per_sample") * 1e-6
    copy = host_copy_s(2 * n * t * 8, chip, "pinned" if cfg.pinned else "pageable")
    sinks = {"tokenize": tokenize, "read": read, "python": python, "copy": copy}
    work = tokenize + read + python
    exposed = (work if w == 0 else max(0.0, work / w - step)) + (0.0 if cfg.pinned else copy)
    return LoaderStep(sinks, step, exposed, w)


#: The fix for each sink: what to change, and the measurement that shows the sink before the fix.
LOADER_FIXES = {
    "tokenize": ("pre-tokenize into shards of ids (a batch job, N044)",
                 "py-spy top on a loader process shows the time in the tokenizer's encode and json.loads; "
                 "time them on one batch's text against the step"),
    "read": ("memory-map local shards and read each batch as one sequential slice",
             "a loader-only loop (model removed) timing next(); iostat shows thousands of small reads with "
             "millisecond await"),
    "python": ("loader worker processes with prefetch, and a batch fetched as one slice instead of per sample",
               "the data-wait timer around next(iterator) in the training loop, as a share of the step"),
    "copy": ("pinned host memory and a non_blocking copy issued a step ahead",
             "an Nsight Systems trace: Memcpy HtoD (Pageable) on the compute stream before each step's first kernel"),
}


def _apply_fix(cfg: LoaderConfig, sink: str) -> LoaderConfig:
    from dataclasses import replace

    if sink == "tokenize":
        return replace(cfg, tokenized=True)
    if sink == "read":
        return replace(cfg, storage="local_nvme", batched_reads=True)
    if sink == "python":
        return replace(cfg, workers=max(cfg.workers, 2))
    if sink == "copy":
        return replace(cfg, pinned=True)
    raise ValueError(f"sink must be one of {', '.join(LOADER_SINKS)}, got {sink!r}")


def loader_fix_ladder(cfg: LoaderConfig, chip, samples: int, sample_tokens: int, step_s: float,
                      chars_per_token: float | None = None,
                      tokenize_core_mb_s: float | None = None) -> list[tuple[str, LoaderConfig, LoaderStep]]:
    """The fixes in the order a profile of the loader ranks the sinks: largest serial time first (ties
    in :data:`LOADER_SINKS` order), each applied on top of the previous ones. Returns
    [("start", cfg, step), (sink fixed, new cfg, new step), ...]. Removing work beats hiding it:
    workers hide a sink's mean, not its tail across thousands of ranks."""
    def at(c):
        return loader_step(c, chip, samples, sample_tokens, step_s, chars_per_token, tokenize_core_mb_s)

    first = at(cfg)
    order = sorted(LOADER_SINKS, key=lambda k: (-first.sinks[k], LOADER_SINKS.index(k)))
    out = [("start", cfg, first)]
    for sink in order:
        c = _apply_fix(out[-1][1], sink)
        out.append((sink, c, at(c)))
    return out
