"""Explorers for the paged-allocator questions (I085, I095, I015, I011).

* ``kvcache.block_allocator_ops``: step a small pool through a typed program (``parse_op`` syntax;
  :func:`run_typed_program` takes any) or up to six menu operations and see block tables,
  refcounts, the free list and both oracles; a program that runs out midway reads as partial.
* ``kvcache.defect_replay``: replay a shrunk (or seeded random) program on one of the defect
  hunt's allocators (neutral names until the reveal) and see which oracle fires at which operation.
* ``kvcache.block_sharing``: blocks with and without sharing for parallel sampling, beam search
  or a shared system prompt, with the copy-on-write copies and bytes for a real model.
* ``kvcache.paged_waste``: waste per sequence (bound, closed form, simulation) against contiguous
  reservation, for a real model's KV bytes per token and a seeded length distribution.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, Text, View, explorer
from lib.kvcache import (
    BlockAllocator,
    NaiveCowAllocator,
    Op,
    OutOfBlocks,
    content_oracle,
    ownership_oracle,
)
from lib.kvcache import allocator_grading as ag
from lib.kvcache import block_sharing as bs
from lib.kvcache import paged_waste as pw
from lib.kvcache.allocator_practice import HUNT_NAMES, hunt_allocator
from lib.registry import models
from lib.units import fmt_bytes, fmt_int, fmt_pct, sig

MODELS = tuple(models.model_names())


# ---- I085: step through operations -------------------------------------------------------------

ALLOCATORS = {
    "BlockAllocator (correct)": lambda n, b: BlockAllocator(n, b),
    "naive CoW: write in place": lambda n, b: NaiveCowAllocator(n, b, "write_in_place"),
    "naive CoW: forget decref": lambda n, b: NaiveCowAllocator(n, b, "forget_decref"),
}
OPS = (
    "-",
    "allocate A",
    "allocate B",
    "fork A->B",
    "fork A->C",
    "fork B->C",
    "append A",
    "append B",
    "append C",
    "append A x4",
    "append B x4",
    "free A",
    "free B",
    "free C",
)
MAX_BLOCKS = 12  # the step-through explorer's largest pool
_BASE = {"A": 100, "B": 200, "C": 300}  # appended tokens: A writes 100, 101, ...; B 200, ...


def _apply_named_op(alloc: BlockAllocator, shadow: dict, text: str, prompt: int) -> str:
    """Run one menu operation; return what happened (raises ValueError when it is rejected)."""
    kind, _, rest = text.partition(" ")
    if kind == "allocate":
        tokens = list(range(prompt))
        table = alloc.allocate(rest, tokens)
        shadow[rest] = tokens
        return f"{rest} gets blocks {table}"
    if kind == "fork":
        parent, child = rest.split("->")
        alloc.fork(parent, child)
        shadow[child] = list(shadow[parent])
        shared = alloc.block_table(child)
        return f"{child} shares {parent}'s blocks {shared} (no copy)"
    if kind == "append":
        seq, _, times = rest.partition(" x")
        notes = []
        wanted = int(times or 1)
        for done in range(wanted):
            if seq not in shadow:
                alloc.append_token(seq, 0)  # raises the allocator's own "not allocated" error
            token = _BASE[seq] + len(shadow[seq])
            table_before = alloc.block_table(seq)
            try:
                event = alloc.append_token(seq, token)
            except OutOfBlocks as err:
                if done == 0:
                    raise  # the whole operation failed: the caller says nothing changed
                notes.append(f"then OutOfBlocks ({err}): append {done + 1} changed nothing")
                return f"{seq} wrote {done} of {wanted} (partial); " + "; ".join(notes)
            shadow[seq].append(token)
            if event is not None:
                notes.append(f"copy-on-write block {event.src_block} -> {event.dst_block}")
            elif len(alloc.block_table(seq)) > len(table_before):
                notes.append(f"new block {alloc.block_table(seq)[-1]}")
        return f"{seq} wrote; " + ("; ".join(notes) if notes else "in place")
    released = alloc.free(rest)
    del shadow[rest]
    return f"{rest} freed; back on the free list: {released}"


MENU = "ops 1-6 below"
#: Typed programs (parse_op syntax, ops separated by "; "): the cases the copy-on-write drafts get
#: wrong, and a pool that runs out in the middle of a program (a partial failure).
PROGRAMS = (
    MENU,
    "allocate(seq=0, tokens=[0, 1, 2, 3, 4]); fork(parent=0, child=1); append(seq=0, token=7); "
    "append(seq=1, token=8)",
    "allocate(seq=0, tokens=[0, 1, 2, 3, 4]); fork(parent=0, child=1); append(seq=1, token=7); "
    "append(seq=1, token=8); free(seq=1); free(seq=0)",
    "allocate(seq=0, tokens=[0, 1, 2, 3]); fork(parent=0, child=1); append(seq=0, token=7); "
    "append(seq=1, token=8)",
    "allocate(seq=0, tokens=[0, 1, 2]); append(seq=0, token=3); append(seq=0, token=4); "
    "append(seq=0, token=5); append(seq=0, token=6)",
    "allocate(seq=0, tokens=[0, 1, 2, 3, 4]); allocate(seq=1, tokens=[0, 1, 2, 3, 4, 5, 6, 7, 8])",
    "allocate(seq=0, tokens=[0]); free(seq=0); free(seq=0)",
)


def parse_program(program) -> list[Op]:
    """Typed ops from text (``parse_op`` syntax, separated by ";" or new lines) or a list of them."""
    items = program if isinstance(program, list | tuple) else str(program).replace("\n", ";").split(";")
    ops = [item if isinstance(item, Op) else ag.parse_op(item) for item in items if str(item).strip()]
    if not ops:
        raise ValueError("the program is empty: type ops such as allocate(seq=0, tokens=[0, 1])")
    return ops


def run_typed_program(alloc, program) -> tuple[list[tuple[str, str]], dict]:
    """Apply a typed program op by op; (rows of op -> outcome, shadow of what each live sequence wrote).

    Each op is all or nothing; when one is refused the program goes on, and the last row says how
    many ops took effect, so a program that fails midway reads as partial, never as "nothing
    changed".
    """
    ops, shadow, rows, applied = parse_program(program), {}, [], 0
    for i, op in enumerate(ops, 1):
        before = {s: alloc.block_table(s) for s in shadow}
        try:
            if op.kind == "free" and op.seq not in shadow:
                alloc.free(op.seq)
                outcome = "accepted a free of a sequence that is not live (should raise)"
            else:
                snapshot = {s: list(t) for s, t in shadow.items()}
                state = _pool_state(alloc, shadow)
                op.apply(alloc, shadow)
                if shadow == snapshot and op.kind != "free":
                    outcome = ("OutOfBlocks: this op changed nothing" if _pool_state(alloc, shadow) == state
                               else "OutOfBlocks, yet the free list or refcounts changed (not all or nothing)")
                else:
                    applied += 1
                    outcome = _describe_effect(alloc, op, before)
        except ValueError as err:
            outcome = f"rejected: {err}"
        rows.append((f"{i}. {op}", outcome))
    verdict = "all applied" if applied == len(ops) else f"partial: {applied} of {len(ops)} ops took effect"
    rows.append(("program", verdict))
    return rows, shadow


def _pool_state(alloc, shadow: dict) -> tuple:
    refs = tuple(alloc.refcount(b) for b in range(alloc.num_blocks))
    return tuple(alloc.free_block_ids()), refs, {s: tuple(alloc.block_table(s)) for s in shadow}


def _describe_effect(alloc, op: Op, before: dict) -> str:
    if op.kind == "allocate":
        return f"seq {op.seq} gets blocks {alloc.block_table(op.seq)}"
    if op.kind == "fork":
        return f"seq {op.arg} shares blocks {alloc.block_table(op.arg)} (no copy)"
    if op.kind == "free":
        return f"seq {op.seq} freed; free list now {alloc.free_block_ids()}"
    old, new = before[op.seq], alloc.block_table(op.seq)
    if len(new) > len(old):
        return f"new block {new[-1]}"
    if new[-1:] != old[-1:]:
        return f"copy-on-write block {old[-1]} -> {new[-1]}"
    return f"in place (block {new[-1]})"


@explorer(
    "kvcache.block_allocator_ops",
    allocator=Choice(tuple(ALLOCATORS), label="allocator"),
    num_blocks=IntRange(2, MAX_BLOCKS, label="blocks in the pool"),
    block_size=IntRange(1, 8, label="tokens per block"),
    program=Text(PROGRAMS, label="program (ops separated by ';', or 'ops 1-6 below' for the menus)"),
    prompt_tokens=IntRange(0, 24, label="prompt tokens (allocate)"),
    op1=Choice(OPS, label="op 1"),
    op2=Choice(OPS, label="op 2"),
    op3=Choice(OPS, label="op 3"),
    op4=Choice(OPS, label="op 4"),
    op5=Choice(OPS, label="op 5"),
    op6=Choice(OPS, label="op 6"),
)
def block_allocator_ops(
    allocator: str,
    num_blocks: int,
    block_size: int,
    prompt_tokens: int,
    op1: str,
    op2: str,
    op3: str,
    op4: str,
    op5: str,
    op6: str,
    program: str = MENU,
) -> View:
    """I085: run a typed program (or the chosen menu operations) on a fresh pool; show each
    outcome and the final state. ``program`` is any text in ``parse_op`` syntax, ops separated by
    ";" or new lines (the text box starts with the page's program; :data:`PROGRAMS` are examples),
    or :data:`MENU` for the six menu operations."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}")
    alloc = ALLOCATORS[allocator](num_blocks, block_size)
    if program != MENU:
        rows, shadow = run_typed_program(alloc, program)
        return _allocator_view(alloc, shadow, rows, allocator, num_blocks, block_size)
    shadow: dict[str, list[int]] = {}
    rows = []
    for i, text in enumerate((op1, op2, op3, op4, op5, op6), start=1):
        if text == "-":
            continue
        if text not in OPS:
            raise ValueError(f"op {i} must be one of {', '.join(OPS)}")
        try:
            outcome = _apply_named_op(alloc, shadow, text, prompt_tokens)
        except OutOfBlocks as err:
            outcome = f"OutOfBlocks ({err}); nothing changed"
        except ValueError as err:
            outcome = f"rejected: {err}"
        rows.append((f"{i}. {text}", outcome))
    return _allocator_view(alloc, shadow, rows, allocator, num_blocks, block_size)


def _allocator_view(alloc, shadow: dict, rows: list, allocator: str, num_blocks: int, block_size: int) -> View:
    """The final block tables, refcounts, free list, both oracles, and the pool drawn block by block."""
    for seq in alloc.seq_ids():
        rows.append(
            (f"{seq}: block table", f"{alloc.block_table(seq)} ({alloc.num_tokens(seq)} tokens)")
        )
        rows.append((f"{seq}: reads", str(alloc.tokens(seq))))
    refs = [alloc.refcount(b) for b in range(num_blocks)]
    rows.append(("refcounts by block", str(refs)))
    rows.append(("free list (next out last)", str(alloc.free_block_ids())))
    rows.append(
        (
            "free + used / total",
            f"{alloc.num_free_blocks} + {alloc.num_used_blocks} / {alloc.num_blocks}",
        )
    )
    rows.append(("copy-on-write copies", str(len(alloc.copy_events))))
    own, con = ownership_oracle(alloc, shadow), content_oracle(alloc, shadow)
    rows.append(("ownership oracle", "ok" if not own else "; ".join(own)))
    rows.append(("content oracle", "ok" if not con else "; ".join(con)))

    holders: dict[int, list[str]] = {}
    for seq in alloc.seq_ids():
        for block in alloc.block_table(seq):
            holders.setdefault(block, []).append(str(seq))
    blocks = [(refs[b], holders.get(b, []), alloc.read_block(b)) for b in range(num_blocks)]
    fig = _POOL_FIGURE(blocks)
    shared = sum(r > 1 for r in refs)
    wrong = sum(r != len(h) for r, h, _ in blocks)
    oracles = ("both oracles pass" if not own and not con else
               f"the {' and '.join(n for n, f in (('ownership', own), ('content', con)) if f)} oracle"
               f"{'s fire' if own and con else ' fires'}")
    caption = (f"Each box is one block: above it the sequences holding it, inside the tokens it stores, below its id "
               f"and refcount. Here {alloc.num_free_blocks} of {num_blocks} blocks are free, {shared} shared and "
               f"{wrong} have a refcount that disagrees with their holders (red edge); {oracles}.")
    return View(
        f"{allocator}: {num_blocks} blocks x {block_size} tokens",
        rows,
        fig,
        "grey = free, blue = one owner, orange = shared; a red edge means refcount != holders.",
        caption=caption,
        values={
            "free": float(alloc.num_free_blocks),
            "used": float(alloc.num_used_blocks),
            "copies": float(len(alloc.copy_events)),
            "ownership_problems": float(len(own)),
            "content_problems": float(len(con)),
        },
    )


def _chunks(items: list[str], width: int = 2) -> list[str]:
    return [" ".join(items[i : i + width]) for i in range(0, len(items), width)]


# ---- I095: replay a program on a defective allocator --------------------------------------------

VARIANTS = HUNT_NAMES  # neutral names: what each gets wrong is the defect hunt's answer
SHRUNK = {
    "shrunk capacity program": [Op("allocate", 0, tuple(range(5))), Op("allocate", 1, tuple(range(9)))],
    "shrunk sibling-token program": [
        Op("allocate", 0, (0,)),
        Op("fork", 0, 1),
        Op("append", 0, 0),
        Op("append", 1, 1),
    ],
}


@explorer(
    "kvcache.defect_replay",
    variant=Choice(tuple(VARIANTS), label="allocator"),
    program=Choice((*SHRUNK, "random program"), label="program"),
    num_blocks=IntRange(2, 8, label="blocks in the pool"),
    block_size=IntRange(1, 8, label="tokens per block"),
    num_ops=IntRange(1, 30, label="ops (random program)"),
    seed=IntRange(0, 999, label="seed (random program)"),
)
def defect_replay(
    variant: str, program: str, num_blocks: int, block_size: int, num_ops: int, seed: int
) -> View:
    """I095: apply a program op by op; both oracles after every op; free + used over time."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}")
    alloc = hunt_allocator(variant, num_blocks, block_size)
    shadow: dict = {}
    rows, free_used = [], [(alloc.num_free_blocks, alloc.num_used_blocks)]
    first = {"ownership": None, "content": None}
    rng, next_id = random.Random(seed), 0
    ops = SHRUNK.get(program)
    count = len(ops) if ops is not None else num_ops
    for i in range(count):
        if ops is not None:
            op = ops[i]
        else:
            op = ag.random_program(
                rng,
                list(shadow),
                [],
                next_id,
                max_prompt_tokens=num_blocks * block_size // 2 + 2,
            )
            next_id += op.kind in ("allocate", "fork")
        try:
            op.apply(alloc, shadow)
        except ValueError as err:  # e.g. the shrunk program's ops on a pool where they don't fit
            rows.append((f"{i + 1}. {op}", f"rejected: {err}"))
            continue
        own, con = ownership_oracle(alloc, shadow), content_oracle(alloc, shadow)
        for name, found in (("ownership", own), ("content", con)):
            if found and first[name] is None:
                first[name] = i + 1
        verdict = f"ownership {'ok' if not own else own[0]}; content {'ok' if not con else con[0]}"
        rows.append((f"{i + 1}. {op}", verdict))
        free_used.append((alloc.num_free_blocks, alloc.num_used_blocks))
    for name in ("ownership", "content"):
        at = first[name]
        rows.append(
            (f"{name} oracle", "never fired" if at is None else f"first fires after op {at}")
        )
    fu = np.array(free_used)
    fig = _REPLAY_FIGURE(fu, num_blocks)
    end = int(fu[-1].sum())
    if end < num_blocks:
        tally = f"here it ends {num_blocks - end} below: blocks leaked"
    elif end > num_blocks:
        tally = f"here it ends {end - num_blocks} above: a block is counted twice"
    else:
        tally = "here it ends on it"
    fired = "; ".join(f"the {name} oracle " + ("never fires" if first[name] is None else
                                                f"first fires after op {first[name]}")
                      for name in ("ownership", "content"))
    caption = (f"Free plus used (thick) must stay on the dashed total of {num_blocks} blocks after every operation, "
               f"and {tally}. {fired[0].upper()}{fired[1:]}.")
    return View(
        f"{variant}: {program} on {num_blocks} x {block_size}",
        rows,
        fig,
        caption=caption,
        values={
            "ownership_first": float(first["ownership"] or 0),
            "content_first": float(first["content"] or 0),
            "leaked": float(num_blocks - int(fu[-1].sum())),
        },
    )


# ---- I015: sharing ------------------------------------------------------------------------------

WORKLOADS = ("parallel sampling", "beam search", "shared system prompt")
_BEAM_BUDGET = 1 << 15  # beams x steps the beam-search lineage may cover in an explorer update


@explorer(
    "kvcache.block_sharing",
    workload=Choice(WORKLOADS, label="workload"),
    model=Choice(MODELS),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    width=IntRange(1, 64, label="samples / beams / requests"),
    prompt_tokens=IntRange(1, 32768, label="shared prompt tokens"),
    own_tokens=IntRange(0, 8192, label="own prompt tokens (system prompt only)"),
    output_tokens=IntRange(1, 8192, label="output tokens each"),
    block_size=IntRange(1, 256, log=True, label="block size"),
    seed=IntRange(0, 999, label="seed (beam lineage)"),
)
def block_sharing(
    workload: str,
    model: str,
    kv_dtype: str,
    width: int,
    prompt_tokens: int,
    own_tokens: int,
    output_tokens: int,
    block_size: int,
    seed: int,
) -> View:
    """I015: blocks with and without sharing over time, copies, and bytes for ``model``."""
    per_token = models.model(model).kv_bytes_per_token(kv_dtype)
    p, g, n, b = prompt_tokens, output_tokens, width, block_size
    if workload == "parallel sampling":
        x, shared, unshared = bs.parallel_sampling_curve(p, g, n, b)
        end = bs.parallel_sampling_blocks(p, g, n, b)
        xlabel = "tokens generated per sample"
    elif workload == "beam search":
        if n * g > _BEAM_BUDGET:
            raise ValueError(
                f"beam search here is limited to beams x output tokens <= {_BEAM_BUDGET:,}; "
                f"got {n} x {g}: lower one of them"
            )
        parents = bs.beam_search_parents(n, g, seed)
        x = np.unique(np.linspace(0, g, 17).astype(int))
        counts = bs.beam_search_blocks(p, parents, b, at_steps=x.tolist())
        shared = np.array([c.blocks_shared for c in counts])
        unshared = np.array([c.blocks_unshared for c in counts])
        end = counts[-1]
        xlabel = "beam steps"
    elif workload == "shared system prompt":
        end = bs.shared_prefix_blocks(p, own_tokens, g, n, b)
        x = np.arange(n + 1)
        tail = -(-(p % b + own_tokens + g) // b)
        shared = -(-p // b) + x * tail
        unshared = x * (-(-(p + own_tokens + g) // b))
        xlabel = "requests admitted (each fully written)"
    else:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}")
    fig = _SHARING_FIGURE(x, unshared, shared, xlabel)
    avg = bs.time_averaged_saving(shared, unshared) if np.sum(unshared) else 0.0
    cost = bs.misaligned_prompt_cost(p, n, b, per_token)
    rows = [
        (
            "blocks at the end: without / with sharing",
            f"{end.blocks_unshared:,} / {end.blocks_shared:,}",
        ),
        ("saving at the end", fmt_pct(end.saving)),
        ("saving over the run (block-steps)", fmt_pct(avg)),
        ("bytes saved at the end", fmt_bytes(end.saved_blocks * b * per_token)),
        (
            "copy-on-write copies",
            f"{end.copies:,} ({fmt_bytes(end.copies * b * per_token)} copied)",
        ),
        ("prompt tokens in the partial block (P mod B)", str(cost["remainder_tokens"])),
    ]
    caption = (f"Blocks in use over the run ({workload}), without sharing and with copy-on-write sharing; the gap between "
               f"the lines is the saving: {fmt_pct(end.saving)} at the end, {fmt_pct(avg)} over the run, for "
               f"{fmt_int(end.copies)} copy-on-write copies.")
    return View(
        f"{workload}: {n} x {model}, P={p}, G={g}, B={b}",
        rows,
        fig,
        caption=caption,
        values={
            "shared": float(end.blocks_shared),
            "unshared": float(end.blocks_unshared),
            "copies": float(end.copies),
            "saving": end.saving,
        },
    )


# ---- I011: waste ----------------------------------------------------------------------------------

_SIM_SEQUENCES = 5000


@explorer(
    "kvcache.paged_waste",
    model=Choice(MODELS),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    block_size=IntRange(1, 256, log=True, label="block size"),
    max_tokens=IntRange(256, 131072, log=True, label="max tokens (reservation)"),
    median_tokens=IntRange(8, 32768, label="median sequence tokens"),
    sigma=FloatRange(0.1, 2.0, 0.05, label="length spread (lognormal sigma)"),
    seed=IntRange(0, 999, label="seed"),
)
def paged_waste(
    model: str,
    kv_dtype: str,
    block_size: int,
    max_tokens: int,
    median_tokens: int,
    sigma: float,
    seed: int,
) -> View:
    """I011: paged waste (bound, (B-1)/2, simulated) vs contiguous max / pow2 reservation."""
    m = models.model(model)
    per_token = m.kv_bytes_per_token(kv_dtype)
    lengths = pw.sample_lognormal_lengths(_SIM_SEQUENCES, median_tokens, sigma, max_tokens, seed)
    s = pw.waste_summary(lengths, block_size, max_tokens)
    sizes = [2**i for i in range(9)]
    sim = [pw.waste_summary(lengths, bs, max_tokens).mean_waste_tokens("paged") for bs in sizes]
    schemes = ["paged", "contiguous_pow2", "contiguous_max"]
    fig = _WASTE_FIGURE(sizes, sim, block_size, [s.utilization(k) for k in schemes])
    rows = [
        ("KV bytes per token", fmt_bytes(per_token, "KiB")),
        ("mean sequence (simulated)", f"{sig(s.mean_tokens)} tokens"),
        (
            "paged waste bound (B-1)",
            f"{block_size - 1} tokens = {fmt_bytes((block_size - 1) * per_token, 'MB')}",
        ),
        (
            "paged waste, closed form (B-1)/2",
            f"{sig(pw.uniform_residue_waste_tokens(block_size))} tokens",
        ),
        (
            "paged waste, simulated mean / max",
            f"{sig(s.mean_waste_tokens('paged'))} / {s.paged_max_waste} tokens",
        ),
        (
            "contiguous (reserve max) waste",
            f"{sig(s.mean_waste_tokens('contiguous_max'))} tokens = "
            f"{fmt_bytes(s.mean_waste_tokens('contiguous_max') * per_token)}",
        ),
        ("slots used: paged / pow2 / max", " / ".join(fmt_pct(s.utilization(k)) for k in schemes)),
        (
            "sequences per GB of KV: paged / max",
            f"{sig(1e9 / ((s.mean_tokens + s.mean_waste_tokens('paged')) * per_token))} / "
            f"{sig(1e9 / (max_tokens * per_token))}",
        ),
    ]
    caption = (f"Left: a paged sequence wastes at most B-1 slots (dotted) and about (B-1)/2 on average (dashed); at "
               f"B = {block_size} (red) the simulation gives {sig(s.mean_waste_tokens('paged'))} tokens. Right: the "
               f"share of reserved slots that hold a token, {fmt_pct(s.utilization('paged'))} paged against "
               f"{fmt_pct(s.utilization('contiguous_max'))} when each sequence reserves {fmt_int(max_tokens)}.")
    return View(
        f"{model} KV ({kv_dtype}), B={block_size}, lengths ~ LogNormal(median {median_tokens}, sigma {sig(sigma)})",
        rows,
        fig,
        caption=caption,
        values={
            "waste_sim": s.mean_waste_tokens("paged"),
            "waste_max": float(s.paged_max_waste),
            "util_paged": s.utilization("paged"),
            "util_max": s.utilization("contiguous_max"),
        },
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------

_REF_COLORS = {0: "#dddddd", 1: "#9ecae1"}  # refcount 0 free, 1 one owner; more: shared (orange)


def _pool_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Patch, Rectangle

    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.98)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, blocks=[])
    for b in range(MAX_BLOCKS):
        a.blocks.append(SimpleNamespace(
            rect=ax.add_patch(Rectangle((b + 0.05, 0.05), 0.9, 1.0, lw=1.2)),
            slots=ax.text(b + 0.5, 0.62, "", ha="center", va="center", fontsize=6),
            ref=ax.text(b + 0.5, -0.15, "", ha="center", va="top", fontsize=7),
            holders=ax.text(b + 0.5, 1.12, "", ha="center", fontsize=7)))
    ax.set_ylim(-1.05, 1.35)
    ax.axis("off")
    kinds = [Patch(facecolor=_REF_COLORS[0], edgecolor="k", label="free"),
             Patch(facecolor=_REF_COLORS[1], edgecolor="k", label="one owner"),
             Patch(facecolor="#fdae6b", edgecolor="k", label="shared"),
             Patch(facecolor="white", edgecolor="red", label="refcount != holders")]
    ax.legend(handles=kinds, fontsize=7, ncol=4, loc="lower center", frameon=False)
    return a


def _pool_draw(a: SimpleNamespace, blocks: list) -> None:
    """``blocks``: (refcount, holders, token slots) per block of the pool."""
    for i, art in enumerate(a.blocks):
        shown = i < len(blocks)
        for item in (art.rect, art.slots, art.ref, art.holders):
            item.set_visible(shown)
        if not shown:
            continue
        ref, holders, slots = blocks[i]
        art.rect.set_facecolor(_REF_COLORS.get(ref, "#fdae6b"))
        art.rect.set_edgecolor("red" if ref != len(holders) else "k")
        art.slots.set_text("\n".join(_chunks([str(t) if t is not None else "." for t in slots])))
        art.ref.set_text(f"#{i}\nrc={ref}")
        art.holders.set_text(",".join(holders) or "free")
    a.ax.set_xlim(-0.1, len(blocks) + 0.1)


_POOL_FIGURE = figures.LiveFigure(6.4, 2.4, _pool_build, _pool_draw)


def _replay_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.2, top=0.96)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.free, = ax.step([], [], where="post", label="free")
    a.used, = ax.step([], [], where="post", label="used")
    a.both, = ax.step([], [], where="post", label="free + used", lw=2)
    a.total = ax.axhline(1.0, color="grey", ls="--", lw=1, label="total")
    ax.set_xlabel("operations applied")
    ax.set_ylabel("blocks")
    ax.legend(handles=[a.free, a.used, a.both, a.total], fontsize=7, ncol=4, loc="lower left")
    return a


def _replay_draw(a: SimpleNamespace, free_used, num_blocks: int) -> None:
    xs = np.arange(len(free_used))
    a.free.set_data(xs, free_used[:, 0])
    a.used.set_data(xs, free_used[:, 1])
    a.both.set_data(xs, free_used.sum(axis=1))
    a.total.set_ydata([num_blocks, num_blocks])
    a.ax.set_xlim(-0.2, max(len(free_used) - 1, 1) + 0.2)
    a.ax.set_ylim(-0.3, num_blocks + 0.8)


_REPLAY_FIGURE = figures.LiveFigure(6.0, 2.4, _replay_build, _replay_draw)


def _sharing_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.17, top=0.96)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.unshared, = ax.plot([], [], label="without sharing")
    a.shared, = ax.plot([], [], label="with sharing (CoW)")
    ax.set_ylabel("blocks in use")
    ax.legend(handles=[a.unshared, a.shared], fontsize=7)
    return a


def _sharing_draw(a: SimpleNamespace, x, unshared, shared, xlabel: str) -> None:
    a.unshared.set_data(x, unshared)
    a.shared.set_data(x, shared)
    a.ax.set_xlabel(xlabel)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()


_SHARING_FIGURE = figures.LiveFigure(6.0, 2.8, _sharing_build, _sharing_draw)


def _waste_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.17, top=0.96, wspace=0.3)
    ax1, ax2 = fig.subplots(1, 2)
    figures.log_scale(ax1)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.closed, = ax1.plot([], [], "--", label="(B-1)/2")
    a.sim, = ax1.plot([], [], "o", ms=3, label="simulated")
    a.bound, = ax1.plot([], [], ":", label="bound B-1")
    a.block = ax1.axvline(1.0, color="red", lw=0.8, label="this block size")
    ax1.set_xlabel("block size (tokens)")
    ax1.set_ylabel("waste per sequence (tokens)")
    ax1.legend(handles=[a.closed, a.sim, a.bound, a.block], fontsize=7)
    a.util = ax2.bar(["paged", "pow2", "max"], [0, 0, 0], color=["C0", "C1", "C3"])
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("slots holding a token")
    return a


def _waste_draw(a: SimpleNamespace, sizes: list[int], simulated: list[float], block_size: int,
                utilization: list[float]) -> None:
    a.closed.set_data(sizes, [max(pw.uniform_residue_waste_tokens(b), 0.1) for b in sizes])
    a.sim.set_data(sizes, [max(v, 0.1) for v in simulated])
    a.bound.set_data(sizes, [max(b - 1, 0.1) for b in sizes])
    a.block.set_xdata([block_size, block_size])
    a.ax1.relim(visible_only=True)
    a.ax1.autoscale_view()
    for bar, u in zip(a.util, utilization, strict=True):
        bar.set_height(u)


_WASTE_FIGURE = figures.LiveFigure(7.2, 2.8, _waste_build, _waste_draw)
