"""A TTFT regression after a deploy, read from tokenized prompts and prefix-cache counters (I076).

* **Corpus** (:func:`chat_corpus`): seeded multi-turn conversations behind one system prompt,
  rendered by a chat template and tokenized (:class:`lib.decoding.tokenizer.WordTokenizer`). The
  ``"timestamp"`` template inserts the request's time right after the system prompt's first line:
  every request then differs from every other a few tokens in.
* **Prefix-boundary check** (:func:`prefix_boundary`, the coding part): the first token where two
  tokenizations differ, the first block whose chained hash (:func:`lib.kvcache.chained_hash.chain_hashes`)
  changes, and the tokens the new request can reuse (whole blocks before it).
* **Replay** (:func:`replay`): the requests through ``replicas`` prefix caches
  (:class:`lib.kvcache.chained_hash.PrefixBlockCache`) with sticky (conversation-affine) or random
  routing; the counters an engine exports are queried and hit prompt tokens.
* **Diagnosis** (:func:`diagnose`): the counter deltas before and after the deploy against what each
  hypothesis predicts: the template keeps only the blocks before the timestamp; cache-unaware
  routing keeps the system prompt and about 1/N of each conversation's history. The boundary check
  on consecutive turns says which one the prompts themselves support.

Token counts are integers; times in seconds.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lib.inputs import integer
from lib.kvcache.chained_hash import PrefixBlockCache, chain_hashes
from lib.kvcache.prefix_hits import longest_common_prefix

__all__ = [
    "TEMPLATES", "SCENARIOS", "Boundary", "prefix_boundary", "Request", "chat_corpus", "Counters", "replay",
    "Evidence", "evidence", "Diagnosis", "diagnose", "hit_rate_se",
]

TEMPLATES = ("static", "timestamp")
SCENARIOS = ("none", "template", "routing")
HEADER = "You are the support assistant of Example Corp. Answer briefly and cite the policy section."
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "pe", "da", "gu", "ho", "ri", "ze", "an", "el")


# ---- the prefix-boundary check (the coding part) ------------------------------------------------


@dataclass(frozen=True)
class Boundary:
    """Where a new request's tokens leave a cached one's: the first differing token, the first block
    whose chained hash differs (or that the cached request does not have), and the reusable tokens."""

    first_diff: int
    first_changed_block: int
    reusable_tokens: int


def prefix_boundary(cached: Sequence[int], new: Sequence[int], block_size: int) -> Boundary:
    """The prefix boundary between a cached request's tokens and a new request's.

    first_diff: the first index where they differ (the shorter length when one is a prefix of the
    other). first_changed_block: the first block of ``new`` whose chained hash is not among
    ``cached``'s at the same index (its hash differs, or ``cached`` has no full block there).
    reusable_tokens = first_changed_block x block_size: only whole blocks before the change hit.
    """
    block_size = integer("block_size", block_size, 1)
    first_diff = longest_common_prefix(cached, new)
    old_hashes = chain_hashes(cached, block_size)
    new_hashes = chain_hashes(new, block_size)
    first_changed = len(new_hashes)
    for i, h in enumerate(new_hashes):
        if i >= len(old_hashes) or old_hashes[i] != h:
            first_changed = i
            break
    reusable = first_changed * block_size
    return Boundary(first_diff, first_changed, reusable)


# ---- the corpus ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request: its conversation, turn, arrival order, time (s), template, prompt and reply tokens."""

    conversation: int
    turn: int
    time_s: float
    template: str
    prompt: tuple[int, ...]
    reply: tuple[int, ...]


def _words(rng, n: int) -> str:
    counts = rng.integers(1, 4, size=n)
    syl = rng.integers(0, len(_SYLLABLES), size=int(counts.sum()))
    ends = np.cumsum(counts)
    return " ".join("".join(_SYLLABLES[i] for i in syl[e - c:e]) for c, e in zip(counts, ends, strict=True))


def _timestamp(t_s: float) -> str:
    s = int(t_s)
    return f"2026-12-05 {9 + s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d} UTC"


def chat_corpus(template: str, conversations: int, turns: int, system_words: int, user_words: int,
                reply_words: int, seed: int = 0, start_s: float = 0.0, gap_s: float = 7.0,
                tokenizer=None, first_conversation: int = 0) -> list[Request]:
    """Seeded multi-turn chats behind one system prompt, tokenized, in arrival order (turn by turn,
    conversations shuffled within a turn, one request every ``gap_s`` seconds).

    The system prompt is the same for every seed (it is the deployment's); conversations depend on
    ``seed``. ``template="timestamp"`` puts "Current time: <request time>" after its first line.
    Pass one ``tokenizer`` to several calls so token ids agree across them.
    """
    from lib.decoding.tokenizer import WordTokenizer

    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    conversations = integer("conversations", conversations, 1)
    turns = integer("turns", turns, 1)
    system_words = integer("system_words", system_words, 1)
    user_words = integer("user_words", user_words, 1)
    reply_words = integer("reply_words", reply_words, 1)
    tok = WordTokenizer() if tokenizer is None else tokenizer
    body = _words(np.random.default_rng(12345), system_words)
    rng = np.random.default_rng(seed)
    users = [[_words(rng, user_words) for _ in range(turns)] for _ in range(conversations)]
    replies = [[_words(rng, reply_words) for _ in range(turns)] for _ in range(conversations)]
    out, k = [], 0
    for t in range(turns):
        for c in rng.permutation(conversations):
            time_s = start_s + k * gap_s
            k += 1
            system = HEADER + "\n" + ("" if template == "static" else f"Current time: {_timestamp(time_s)}\n") + body
            history = "".join(f"\n<user> {users[c][i]}\n<assistant> {replies[c][i]}" for i in range(t))
            prompt = f"<system> {system}{history}\n<user> {users[c][t]}\n<assistant>"
            out.append(Request(first_conversation + int(c), t, time_s, template, tuple(tok.encode(prompt)),
                               tuple(tok.encode(" " + replies[c][t]))))
    return out


# ---- replay through the caches -------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """Prefix-cache counters over a window: prompt tokens queried and hit, per replica and in total,
    and each request's hit tokens (what a request log with cached-token counts shows)."""

    queried: np.ndarray
    hit: np.ndarray
    per_request_hit: tuple[int, ...]
    per_request_prompt: tuple[int, ...]

    @property
    def hit_rate(self) -> float:
        q = float(self.queried.sum())
        return float(self.hit.sum()) / q if q else 0.0


def replay(requests: Sequence[Request], replicas: int, routing: str, block_size: int = 16, seed: int = 0,
           caches: list[PrefixBlockCache] | None = None, num_blocks: int | None = None) -> tuple[Counters, list]:
    """Each request through the prefix cache of the replica routing picks: ``"sticky"`` (a
    conversation always on replica conversation mod N, a cache-aware router's effect) or
    ``"random"`` (cache-unaware). Its prompt and reply are allocated and freed, so the next turn can
    hit both. Returns the window's counters and the caches (pass them on to the next window)."""
    replicas = integer("replicas", replicas, 1)
    if routing not in ("sticky", "random"):
        raise ValueError(f"routing must be 'sticky' or 'random', got {routing!r}")
    if caches is None:
        if num_blocks is None:
            num_blocks = 2 * sum(-(-(len(r.prompt) + len(r.reply)) // block_size) for r in requests) + 1
        caches = [PrefixBlockCache(num_blocks, block_size) for _ in range(replicas)]
    if len(caches) != replicas:
        raise ValueError(f"caches holds {len(caches)} replicas, expected {replicas}")
    rng = np.random.default_rng(seed)
    queried, hit = np.zeros(replicas, dtype=np.int64), np.zeros(replicas, dtype=np.int64)
    hits, prompts = [], []
    for k, r in enumerate(requests):
        rep = r.conversation % replicas if routing == "sticky" else int(rng.integers(replicas))
        cache = caches[rep]
        alloc = cache.allocate(("req", k, id(requests)), r.prompt + r.reply)
        got = min(alloc.num_hit_tokens, len(r.prompt))
        cache.free(("req", k, id(requests)))
        queried[rep] += len(r.prompt)
        hit[rep] += got
        hits.append(got)
        prompts.append(len(r.prompt))
    return Counters(queried, hit, tuple(hits), tuple(prompts)), caches


# ---- the evidence and the diagnosis --------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Before and after the deploy: the corpora, the counters, and the boundary checks between
    consecutive turns of each conversation in the after window (previous prompt + reply vs. next prompt)."""

    before: list
    after: list
    counters_before: Counters
    counters_after: Counters
    boundaries_after: list
    system_tokens: int
    header_tokens: int
    replicas: int
    block_size: int
    scenario: str
    tokenizer: object = None


@lru_cache(maxsize=4)
def _windows(replicas: int, conversations: int, turns: int, system_words: int, user_words: int, reply_words: int,
             block_size: int, seed: int):
    """What every scenario of one setup shares, computed once: the before window (corpus, counters, the
    caches it leaves, pickled) and both templates' after corpora with the tokenizer each leaves
    (pickled). The caches hold both windows without evicting (2 x the blocks of the larger), so a
    scenario's hits are those of a replay from scratch; callers unpickle fresh copies."""
    from lib.decoding.tokenizer import WordTokenizer

    tok = WordTokenizer()
    kw = dict(turns=turns, system_words=system_words, user_words=user_words, reply_words=reply_words)
    before = chat_corpus("static", conversations, seed=seed, tokenizer=tok, **kw)
    state = pickle.dumps(tok)
    after, toks = {}, {}
    for template in TEMPLATES:
        t = pickle.loads(state)
        after[template] = tuple(chat_corpus(template, conversations, seed=seed + 1, start_s=before[-1].time_s + 60,
                                            first_conversation=conversations, tokenizer=t, **kw))
        toks[template] = pickle.dumps(t)

    def blocks_of(reqs):
        return sum(-(-(len(r.prompt) + len(r.reply)) // block_size) for r in reqs)

    blocks = 2 * (blocks_of(before) + max(blocks_of(a) for a in after.values())) + 1
    c_before, caches = replay(before, replicas, "sticky", block_size, seed=seed, num_blocks=blocks)
    return tuple(before), after, toks, c_before, pickle.dumps(caches)


def evidence(scenario: str, replicas: int = 4, conversations: int = 12, turns: int = 5, system_words: int = 600,
             user_words: int = 50, reply_words: int = 250, block_size: int = 16, seed: int = 0) -> Evidence:
    """Seeded evidence for one scenario: a window before the deploy (static template, sticky routing)
    and one after it with the injected change: ``"template"`` (timestamp template), ``"routing"``
    (random routing) or ``"none"``. Different conversations in the two windows; caches carry over.
    The before window and the corpora are shared by the scenarios of one setup (:func:`_windows`)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    args = (integer("replicas", replicas, 1), integer("conversations", conversations, 1), integer("turns", turns, 1),
            integer("system_words", system_words, 1), integer("user_words", user_words, 1),
            integer("reply_words", reply_words, 1), integer("block_size", block_size, 1), integer("seed", seed, 0))
    before_t, afters, toks, c_b, caches_state = _windows(*args)
    template = "timestamp" if scenario == "template" else "static"
    before, after, tok = list(before_t), list(afters[template]), pickle.loads(toks[template])
    c_before = Counters(c_b.queried.copy(), c_b.hit.copy(), c_b.per_request_hit, c_b.per_request_prompt)
    c_after, _ = replay(after, replicas, "random" if scenario == "routing" else "sticky", block_size, seed=seed + 1,
                        caches=pickle.loads(caches_state))
    last = {}
    bounds = []
    for r in after:
        if r.conversation in last:
            prev = last[r.conversation]
            bounds.append(prefix_boundary(prev.prompt + prev.reply, r.prompt, block_size))
        last[r.conversation] = r
    sys_tokens = len(tok.encode("<system> " + HEADER + "\n" + _words(np.random.default_rng(12345), system_words)))
    header_tokens = len(tok.encode("<system> " + HEADER + "\n"))
    return Evidence(before, after, c_before, c_after, bounds, sys_tokens, header_tokens, replicas, block_size,
                    scenario, tok)


@dataclass(frozen=True)
class Diagnosis:
    """Measured hit rates, what each hypothesis predicts for the after window, the boundary check's
    median first difference, and the hypothesis the evidence supports (None: no regression)."""

    rate_before: float
    rate_after: float
    predicted: dict
    median_first_diff: float
    early_divergence: bool
    named: str | None

    @property
    def drop(self) -> float:
        return self.rate_before - self.rate_after


REGRESSION = 0.05  # a hit-rate drop of more than this (absolute) is a regression worth explaining
AGREE = 0.06  # a prediction within this (absolute), or a quarter of the drop, explains the measurement


def predictions(ev: Evidence) -> dict:
    """Hit rate each hypothesis predicts for the after window, from its logged prompts.

    template: every request reuses only the whole blocks before the timestamp, floor(header / B) x B
    tokens. routing (cache-unaware, N replicas): turn t lands where turn t - j last went with
    probability p_j = (1/N)(1 - 1/N)^(j-1) and then reuses that turn's prompt and reply (whole
    blocks); with probability (1 - 1/N)^t no earlier turn is there and only the system prompt's
    whole blocks hit (a replica idle before the deploy misses it once): the leading term is the 1/N
    of the history. none: what sticky routing reuses, every previous turn's prompt and reply.
    """
    b = ev.block_size
    q = float(sum(len(r.prompt) for r in ev.after))
    sys_blocks = (ev.system_tokens // b) * b
    n = ev.replicas
    cached: dict[int, list[int]] = {}
    routed = sticky = 0.0
    for r in sorted(ev.after, key=lambda x: (x.conversation, x.turn)):
        prev = cached.setdefault(r.conversation, [])
        t = len(prev)
        if t:
            sticky += min(prev[-1], len(r.prompt))
            routed += sum((1 / n) * (1 - 1 / n) ** (j - 1) * min(prev[t - j], len(r.prompt)) for j in range(1, t + 1))
            routed += (1 - 1 / n) ** t * min(sys_blocks, len(r.prompt))
        else:
            sticky += min(sys_blocks, len(r.prompt))
            routed += min(sys_blocks, len(r.prompt))
        prev.append(((len(r.prompt) + len(r.reply)) // b) * b)
    # a replica that served nothing before the deploy misses the system prompt once under random routing
    cold = int(np.sum(ev.counters_before.queried == 0))
    routed -= cold * (1 - (1 - 1 / n) ** len(ev.after)) * sys_blocks
    template = sum(min((ev.header_tokens // b) * b, len(r.prompt)) for r in ev.after)
    return {"none": sticky / q, "template": template / q, "routing": routed / q}


def hit_rate_se(c: Counters) -> float:
    """Standard error of a window's hit rate from its requests: the sd of the per-request hit share over
    sqrt(requests) (0 for one request). Random routing makes the shares bimodal (the whole history or the
    system prompt alone), so a window of a few conversations pins its rate only this well."""
    share = np.array(c.per_request_hit, dtype=float) / np.maximum(np.array(c.per_request_prompt, dtype=float), 1.0)
    return float(np.std(share)) / float(np.sqrt(len(share))) if len(share) > 1 else 0.0


def diagnose(ev: Evidence) -> Diagnosis:
    """Which hypothesis the evidence supports.

    No regression when the hit rate fell by less than 0.05. Otherwise the boundary check decides what
    the prompts say (consecutive turns that differ before the end of the system prompt: the prompts
    changed), and the counters must agree: the named hypothesis is the one whose predicted hit rate
    is closest to the measured one, among those the boundary check allows, and it must be within 0.06
    (or a quarter of the drop, or three standard errors of the window's hit rate, :func:`hit_rate_se`)
    of it; otherwise none is named (something else changed).
    """
    pred = predictions(ev)
    before, after = ev.counters_before.hit_rate, ev.counters_after.hit_rate
    diffs = [bd.first_diff for bd in ev.boundaries_after]
    med = float(np.median(diffs)) if diffs else float("nan")
    early = bool(diffs) and med < ev.system_tokens
    if before - after <= REGRESSION:
        named = None
    else:
        allowed = ["template"] if early else ["routing"]
        named = min(allowed, key=lambda k: abs(pred[k] - after))
        if abs(pred[named] - after) > max(AGREE, 0.25 * (before - after), 3 * hit_rate_se(ev.counters_after)):
            named = None  # neither prediction is near: something else changed
    return Diagnosis(before, after, pred, med, early, named)


# ---- practice: grade any prefix-boundary check -----------------------------------------------------

QUESTION = "prefix_boundary(cached, new, block_size)"


def skeleton(cached, new, block_size):
    """Return (first_diff, first_changed_block, reusable_tokens) for a cached request's tokens and a
    new request's: the first differing token index; the first block of ``new`` whose chained hash is
    not the cached one's at that index; the tokens the new request reuses (whole blocks only)."""
    raise NotImplementedError


_DRAFTS = {
    "token-level reuse": (
        "reuses every token up to the first difference, ignoring that only whole blocks are cached",
        [("reusable = first_changed * block_size", "reusable = first_diff")]),
    "unchained hashes": (
        "hashes each block alone and counts every block that matches, so a block equal by chance after the "
        "divergence counts as reusable",
        [("old_hashes = chain_hashes(cached, block_size)",
          "old_hashes = [hash(tuple(cached[i:i + block_size])) for i in range(0, len(cached) - block_size + 1, block_size)]"),
         ("new_hashes = chain_hashes(new, block_size)",
          "new_hashes = [hash(tuple(new[i:i + block_size])) for i in range(0, len(new) - block_size + 1, block_size)]"),
         ("for i, h in enumerate(new_hashes):\n"
          "    if i >= len(old_hashes) or old_hashes[i] != h:\n"
          "        first_changed = i\n"
          "        break",
          "first_changed = sum(1 for i, h in enumerate(new_hashes) if i < len(old_hashes) and old_hashes[i] == h)")]),
    "partial block counted": (
        "counts the new request's last, partly filled block as cached when everything before matches",
        [("first_changed = len(new_hashes)", "first_changed = -(-len(new) // block_size)")]),
    "block after the difference": (
        "names the block after the one holding the first difference",
        [("first_changed = i\n", "first_changed = i + 1\n")]),
    "short comparison window": (
        "compares only the first 128 tokens (a debugging cap left in), so a change deep in a chat prompt is missed",
        [("first_diff = longest_common_prefix(cached, new)",
          "first_diff = longest_common_prefix(cached[:128], new[:128])"),
         ("old_hashes = chain_hashes(cached, block_size)", "old_hashes = chain_hashes(cached[:128], block_size)"),
         ("new_hashes = chain_hashes(new, block_size)", "new_hashes = chain_hashes(new[:128], block_size)")]),
    "first_diff from zip": (
        "stops at the shorter sequence but reports the new one's length when the cached one is a shorter prefix",
        [("first_diff = longest_common_prefix(cached, new)",
          "first_diff = next((i for i, (x, y) in enumerate(zip(cached, new)) if x != y), len(new))")]),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str):
    """The reference (``"reference"``) or a draft (one of ``VARIANTS``), with the skeleton's interface."""
    from lib.book.drafts import edited

    if name == "reference":
        return prefix_boundary
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return edited(prefix_boundary, _DRAFTS[name][1], name=name)


def _pair(n_cached: int, n_new: int, diff_at: int, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    cached = rng.integers(0, 50, n_cached).tolist()
    new = cached[:n_new] + rng.integers(0, 50, max(0, n_new - n_cached)).tolist()
    if 0 <= diff_at < len(new):
        new[diff_at] = 50 + int(rng.integers(0, 50))  # a token the cached request never has
    return cached, new


def _oracle(cached: list[int], new: list[int], block_size: int) -> tuple[int, int, int]:
    """First difference by a loop; reuse by a real prefix cache holding the cached request."""
    n = min(len(cached), len(new))
    first = next((i for i in range(n) if cached[i] != new[i]), n)
    cache = PrefixBlockCache(2 * (len(cached) + len(new)) // block_size + 4, block_size)
    cache.allocate("cached", cached)
    cache.free("cached")
    hit = cache.allocate("new", new).num_hit_tokens if new else 0
    return first, hit // block_size, hit


def cases():
    """The graded pairs: (cached length, new length, index changed in new or -1, block size, seed)."""
    from lib.book.practice import Case

    return [
        Case("identical, whole blocks", (("pair", 32, 32, -1, 16, 1),)),
        Case("identical, partial last block", (("pair", 40, 40, -1, 16, 2),)),
        Case("new extends the cached request", (("pair", 48, 70, -1, 16, 3),)),
        Case("difference mid-block", (("pair", 64, 64, 21, 16, 4),)),
        Case("difference on a block boundary", (("pair", 64, 64, 32, 16, 5),)),
        Case("difference in the first token", (("pair", 64, 64, 0, 16, 6),)),
        Case("cached shorter than a block", (("pair", 10, 40, -1, 16, 7),)),
        Case("new is a prefix of the cached", (("pair", 64, 20, -1, 16, 8),)),
        Case("one-token blocks", (("pair", 20, 20, 7, 1, 9),)),
        Case("several pairs", (("pair", 100, 120, 70, 8, 10), ("pair", 33, 33, 16, 4, 11), ("pair", 5, 50, -1, 4, 12))),
        Case("chat-length prompts, change past token 1,000", (("pair", 1500, 1600, 1203, 16, 13),
                                                              ("pair", 2000, 2000, -1, 16, 14))),
    ]


def _run(impl, ops) -> None:
    for op in ops:
        _, n_cached, n_new, diff_at, b, seed = op
        cached, new = _pair(n_cached, n_new, diff_at, seed)
        got = impl(list(cached), list(new), b)
        if isinstance(got, Boundary):
            got = (got.first_diff, got.first_changed_block, got.reusable_tokens)
        got = tuple(int(x) for x in got)
        want = _oracle(cached, new, b)
        assert got == want, (f"(first_diff, first_changed_block, reusable_tokens) = {got}, expected {want} "
                             f"for {n_cached} cached and {n_new} new tokens, block size {b}"
                             + (f", changed at {diff_at}" if diff_at >= 0 else ", no change"))


def check(candidate):
    """Grade any ``prefix_boundary(cached, new, block_size)``; the oracle is a real prefix cache."""
    from lib.book.practice import grade

    return grade(QUESTION, lambda: candidate, cases(), _run,
                 lambda ops: "\n".join(f"  cached {o[1]} tokens, new {o[2]} tokens, change at {o[3]}, block {o[4]}"
                                       for o in ops))
