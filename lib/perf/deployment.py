"""The Deployment record: one serving replica's model, GPU, parallelism, dtypes and engine settings.

Every derivation of the performance model takes a Deployment (or the one part it needs)
instead of loose parameters; a what-if is ``dep.replace(kv_dtype="fp8")``. The record is
validated once, when built, with a message that names the input and what is allowed:
TP must shard the heads (vLLM's rule) and a group larger than a node must be whole nodes on
a chip with a network, PP cannot exceed the layers, the dtypes must exist (the compute dtype
on the chip; FP8 compute needs weights of at most one byte), the weights must leave room for a
KV cache on the driver-visible memory and the engine's pool must leave the headroom the CUDA
context needs. Expert parallelism (``ep``) is refused until the budget and step model it. Engine settings left ``None`` are resolved from
``data/`` (vLLM's defaults in ``assumptions.yaml (serving_memory)``), so a built record holds plain values.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from lib.inputs import fraction, integer
from lib.registry.dtypes import BYTES_PER_ELEMENT
from lib.registry.hardware import GPU, gpu, gpu_names
from lib.registry.models import Model, model, model_names


@dataclass(frozen=True)
class Deployment:
    """One replica of ``tp x pp`` GPUs, ``dp`` replicas; ``dcp`` splits replicated KV across TP ranks."""

    model: str
    gpu: str
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    dcp: int = 1  # decode context parallelism: KV split across the TP ranks that would replicate it
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    compute_dtype: str = "bf16"
    act_dtype: str = "bf16"
    memory_utilization: float | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        from lib.perf import memory

        set_ = functools.partial(object.__setattr__, self)
        if isinstance(self.model, Model):
            set_("model", self.model.key)
        if isinstance(self.gpu, GPU):
            set_("gpu", self.gpu.key)
        if self.model not in model_names():
            raise ValueError(f"model must be one of {', '.join(model_names())}; got {self.model!r}")
        if self.gpu not in gpu_names():
            raise ValueError(f"gpu must be one of {', '.join(gpu_names())}; got {self.gpu!r}")
        m, g = self.mdl, self.chip
        for name in ("tp", "pp", "ep", "dp", "dcp"):
            set_(name, integer(name, getattr(self, name), 1))
        if not tp_shards(m, self.tp):
            raise ValueError(
                f"tp={self.tp} cannot shard {m.key}: tp must divide its {m.num_attention_heads} query "
                f"heads and divide or be a multiple of its {m.num_kv_heads} KV heads"
            )
        if self.pp > m.num_layers:
            raise ValueError(f"pp={self.pp} cannot exceed the {m.num_layers} layers of {m.key}")
        if self.ep > 1:
            raise ValueError(
                f"ep={self.ep}: expert parallelism is not modelled yet (neither the memory budget nor "
                "the decode step splits the experts across ranks); use ep=1 (experts sharded by tp)"
            )
        for name in ("weight_dtype", "kv_dtype", "act_dtype"):
            if getattr(self, name) not in BYTES_PER_ELEMENT:
                raise ValueError(
                    f"{name} must be one of {', '.join(BYTES_PER_ELEMENT)}; got {getattr(self, name)!r}"
                )
        if self.compute_dtype not in g.dtypes:
            raise ValueError(
                f"compute_dtype must be a dtype {g.name} has a peak for ({', '.join(g.dtypes)}); "
                f"got {self.compute_dtype!r}"
            )
        b_c, b_w = BYTES_PER_ELEMENT.get(self.compute_dtype, 2.0), BYTES_PER_ELEMENT[self.weight_dtype]
        if b_c < 2 and b_w > b_c:
            raise ValueError(
                f"compute_dtype={self.compute_dtype} runs the matmuls in {b_c:g}-byte elements but "
                f"weight_dtype={self.weight_dtype} stores {b_w:g} bytes: quantize the weights too "
                f"(weight_dtype of at most {b_c:g} byte) or compute in bf16"
            )
        self._check_span(g)
        set_("memory_utilization", fraction(
            "memory_utilization", memory.default_memory_utilization(self.memory_utilization),
            allow_zero=False))
        dflt_tokens, dflt_seqs = memory.default_batch_limits(g)
        set_("max_num_batched_tokens", integer(
            "max_num_batched_tokens",
            dflt_tokens if self.max_num_batched_tokens is None else self.max_num_batched_tokens, 1))
        set_("max_num_seqs", integer(
            "max_num_seqs", dflt_seqs if self.max_num_seqs is None else self.max_num_seqs, 1))
        if self.block_size is None:
            set_("block_size", memory.default_block_size(m))
        set_("block_size", integer("block_size", self.block_size, 1))
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        budget = self.budget  # raises when the weights leave no room for a KV cache
        if budget.headroom_margin_bytes < 0:
            raise ValueError(
                f"memory_utilization={self.memory_utilization} leaves "
                f"{budget.headroom_bytes / 1e9:.2f} GB per GPU outside the engine's pool, but the CUDA "
                f"context and fragmentation need {budget.headroom_demand_bytes / 1e9:.2f} GB: the GPU "
                "would run out of memory at peak; lower memory_utilization"
            )

    def _check_span(self, g: GPU) -> None:
        """A group larger than a node must be whole nodes, on a chip with a network figure."""
        from lib.perf.collectives import gpus_per_node

        per_node = gpus_per_node(chip=g)
        for name, group in (("tp", self.tp), ("tp x pp", self.tp * self.pp)):
            if group > per_node and group % per_node:
                raise ValueError(
                    f"{name}={group} spans nodes of {per_node} GPUs on {g.key}: use at most "
                    f"{per_node} or a multiple of {per_node}"
                )
        if self.tp > per_node and not g.scaleout_bandwidth:
            raise ValueError(
                f"tp={self.tp} spans nodes but {g.key} has no network (NIC) figure in "
                f"data/hardware.yaml: use tp of at most {per_node}"
            )

    # ---- views ---------------------------------------------------------------------------
    @property
    def mdl(self) -> Model:
        return model(self.model)

    @property
    def chip(self) -> GPU:
        return gpu(self.gpu)

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        """e.g. 'llama-3.1-70b bf16 on 8x h100-sxm (TP8)'."""
        par = [f"TP{self.tp}"] + [f"{k.upper()}{v}" for k, v in
                                  (("pp", self.pp), ("ep", self.ep), ("dcp", self.dcp), ("dp", self.dp)) if v > 1]
        return f"{self.model} {self.weight_dtype} on {self.n_gpus}x {self.gpu} ({' '.join(par)})"

    @functools.cached_property
    def budget(self):
        """The memory budget of one GPU (:func:`lib.perf.memory.memory_budget`): KV capacity lives there."""
        from lib.perf import memory

        return memory.memory_budget(
            self.mdl, self.chip, self.tp, self.weight_dtype, self.kv_dtype,
            gpu_memory_utilization=self.memory_utilization,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            block_size=self.block_size, pp=self.pp, dcp=self.dcp, cuda_graphs=self.cuda_graphs,
            act_dtype=self.act_dtype,
        )

    def replace(self, **changes) -> Deployment:
        """A validated copy with some fields changed: ``dep.replace(kv_dtype="fp8")``."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Deployment field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


def require(dep: object) -> Deployment:
    """``dep`` when it is a :class:`Deployment`; else ValueError saying what to pass."""
    if not isinstance(dep, Deployment):
        raise ValueError(
            f"dep must be a lib.perf.deployment.Deployment (build one with "
            f"Deployment(model, gpu, tp=...)), got {type(dep).__name__}"
        )
    return dep


def tp_shards(mdl: str | Model, tp: int) -> bool:
    """Whether an engine can shard ``mdl`` ``tp`` ways: tp divides the query heads, and the KV
    heads divide by tp or tp by the KV heads (vLLM's rule; MLA's latent is replicated)."""
    m = model(mdl)
    tp = integer("tp", tp, 1)
    kv = m.num_kv_heads
    return m.num_attention_heads % tp == 0 and (m.is_mla or kv % tp == 0 or tp % kv == 0)


def deployment(model: str | Model, gpu: str | GPU, **fields) -> Deployment:
    """Build and validate a :class:`Deployment` (the one-line form a parameters cell uses)."""
    return Deployment(model, gpu, **fields)
