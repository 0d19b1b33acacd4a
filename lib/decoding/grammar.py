"""Constrained decoding: a grammar as a character-level DFA, and the token bitmask it allows.

The model never sees the grammar. Before each sampling step the sampler receives a bitmask of
``ceil(V / 32)`` 32-bit words (XGrammar's layout; ``V / 8`` bytes) with bit ``t`` set when token
``t`` may come next. A token is allowed from automaton state ``q`` when the automaton can consume
the token's whole string from ``q``.

What lives here:

- :class:`DFA`, a table-driven automaton over bytes (``table[state, byte]`` = next state, -1 dead),
  each state tagged with the grammar *rule* it belongs to and whether the rule may end there.
- :func:`compile_schema`: a fixed-schema JSON object (keys in order, compact, no whitespace; value
  types string, integer, boolean, enum, const and nested objects) compiled to a :class:`DFA`.
  :data:`SCHEMAS` names a few.
- :class:`TokenTable`: a vocabulary as a padded byte matrix, for vectorized walks.
- :func:`walk_tokens`: every token walked from one state; :func:`naive_mask` and the work it
  costs (:class:`MaskWork`: character transitions, and the trie-shared count).
- :func:`classify_tokens`: XGrammar's split of the vocabulary at a state into context-independent
  accepted / rejected tokens (decided inside the state's own rule, precomputable) and
  context-dependent tokens (the walk leaves the rule, so the answer depends on what follows it);
  :func:`precompiled_mask` rebuilds the exact mask from the cached part plus run-time checks.
- :func:`bitmask_bytes`, :func:`pack_bitmask`: the mask's size and packed form.
- :func:`schema_costs`: all of the above at every state of a schema against the toy vocabulary (one walk
  per state serves them all); :func:`document_steps`: its counts along one decode of the example document.

Work is counted (transitions, tokens), not timed: the notebooks price counts with a stated cost
per operation (``constrained_decoding.*`` in ``data/assumptions.yaml``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from lib.inputs import integer

__all__ = [
    "DFA", "MaskWork", "SCHEMAS", "TokenClasses", "TokenTable", "bitmask_bytes", "classify_tokens",
    "compile_schema", "document_steps", "example_document", "forced_runs", "mask_work", "naive_mask", "pack_bitmask",
    "JumpForward", "MaskedSpeculativeStep", "MaskedStep", "forced_text", "jump_forward", "PLACEMENTS", "largest_hidden_batch", "masked_speculative_step", "SchemaCosts", "mask_time_s", "masked_step", "precompiled_mask", "rule_phrase", "schema_costs", "schema_dfa", "state_trace", "token_table",
    "walk_tokens",
]

#: Fixed-schema JSON objects (key -> type). Types: "string", "integer", "boolean", ("enum", (...)),
#: ("const", "text") and nested dicts (objects).
SCHEMAS: dict[str, dict] = {
    "person": {"name": "string", "age": "integer", "member": "boolean"},
    "tool_call": {"name": ("const", "get_weather"),
                  "arguments": {"city": "string", "unit": ("enum", ("celsius", "fahrenheit")), "days": "integer"}},
    "enum_only": {"unit": ("enum", ("celsius", "fahrenheit", "kelvin")), "precise": "boolean"},
}

_STRING_BODY = np.array([c for c in range(0x20, 256) if c not in (0x22, 0x5C, 0x7F)])
_ESCAPES = b'"\\/bfnrt'


@dataclass(frozen=True)
class DFA:
    """A deterministic automaton over bytes.

    ``table[q, c]``: the next state from ``q`` on byte ``c`` (-1: dead). ``accepting[q]``: the
    document may end at ``q``. ``rule[q]``: index into ``rules`` of the grammar rule (one field value
    or one literal run) state ``q`` belongs to. ``rule_end[q]``: the rule may end at ``q`` (what
    follows is the parent's business). ``start`` is state 0.
    """

    table: np.ndarray
    accepting: np.ndarray
    rule: np.ndarray
    rule_end: np.ndarray
    rules: tuple[str, ...]

    @property
    def states(self) -> int:
        return self.table.shape[0]

    def walk(self, state: int, text: str) -> tuple[int, int]:
        """(state after ``text``, characters consumed); state -1 when a character is rejected
        (consumed counts the characters before it)."""
        q = state
        for i, ch in enumerate(text):
            c = ord(ch)
            if c > 255:
                raise ValueError("text must be bytes-as-characters (code points < 256)")
            q = int(self.table[q, c])
            if q < 0:
                return -1, i
        return q, len(text)

    def accepts(self, text: str) -> bool:
        """Whether the whole document ``text`` is in the language."""
        q, _ = self.walk(0, text)
        return q >= 0 and bool(self.accepting[q])


class _Builder:
    def __init__(self):
        self.rows: list[np.ndarray] = []
        self.rule: list[int] = []
        self.end: list[bool] = []
        self.rules: list[str] = []

    def new(self, rule: int, end: bool = False) -> int:
        self.rows.append(np.full(256, -1, dtype=np.int32))
        self.rule.append(rule)
        self.end.append(end)
        return len(self.rows) - 1

    def new_rule(self, name: str) -> int:
        self.rules.append(name)
        return len(self.rules) - 1

    def literal(self, text: str, nxt: int) -> int:
        """States spelling ``text`` then going to ``nxt``; returns the entry state."""
        if not text:
            return nxt
        r = self.new_rule(f"literal {text!r}")
        states = [self.new(r) for _ in text]
        for i, ch in enumerate(text):
            self.rows[states[i]][ord(ch)] = states[i + 1] if i + 1 < len(text) else nxt
        return states[0]

    def copy_exit(self, q: int, nxt: int) -> None:
        """Rule end at ``q``: add ``nxt``'s transitions (the follow set) to ``q``."""
        row, follow = self.rows[q], self.rows[nxt]
        clash = (row >= 0) & (follow >= 0)
        if clash.any():
            raise ValueError(f"ambiguous grammar: a rule's end and what follows it both take byte {int(np.argmax(clash))}")
        row[follow >= 0] = follow[follow >= 0]

    def value(self, kind, nxt: int, field: str) -> int:
        """Entry state of one value of ``kind`` followed by ``nxt`` (built back to front)."""
        if isinstance(kind, dict):
            return self.obj(kind, nxt)
        if kind == "string":  # '"' body* '"'  (escapes \" \\ \/ \b \f \n \r \t; no \\uXXXX)
            r = self.new_rule(f"{field}: string")
            body, esc = self.new(r), self.new(r)
            self.rows[body][_STRING_BODY] = body
            self.rows[body][0x5C] = esc
            for c in _ESCAPES:
                self.rows[esc][c] = body
            self.rows[body][0x22] = nxt
            open_q = self.new(r)
            self.rows[open_q][0x22] = body
            return open_q
        if kind == "integer":  # -?(0|[1-9][0-9]*)
            r = self.new_rule(f"{field}: integer")
            entry, minus, zero, digits = self.new(r), self.new(r), self.new(r, True), self.new(r, True)
            for q in (entry, minus):
                self.rows[q][ord("0")] = zero
                self.rows[q][ord("1"):ord("9") + 1] = digits
            self.rows[entry][ord("-")] = minus
            self.rows[digits][ord("0"):ord("9") + 1] = digits
            self.copy_exit(zero, nxt)
            self.copy_exit(digits, nxt)
            return entry
        if kind == "boolean":
            return self.choice(("true", "false"), nxt, f"{field}: boolean")
        if isinstance(kind, tuple) and len(kind) == 2 and kind[0] == "enum":
            return self.choice(tuple(f'"{v}"' for v in kind[1]), nxt, f"{field}: enum")
        if isinstance(kind, tuple) and len(kind) == 2 and kind[0] == "const":
            return self.choice((f'"{kind[1]}"',), nxt, f"{field}: const")
        raise ValueError(f"field {field!r}: type must be 'string', 'integer', 'boolean', ('enum', (...)), "
                         f"('const', text) or a dict, got {kind!r}")

    def choice(self, options: tuple[str, ...], nxt: int, name: str) -> int:
        """A trie over ``options`` whose leaves go to ``nxt``."""
        if not options or any(not o for o in options):
            raise ValueError(f"{name}: options must be non-empty strings, got {options!r}")
        if any(a != b and b.startswith(a) for a in options for b in options):
            raise ValueError(f"{name}: no option may be a prefix of another, got {options!r}")
        r = self.new_rule(name)
        entry = self.new(r)
        for o in options:
            q = entry
            for i, ch in enumerate(o):
                c = ord(ch)
                if i + 1 == len(o):
                    self.rows[q][c] = nxt
                elif self.rows[q][c] >= 0:
                    q = int(self.rows[q][c])
                else:
                    q2 = self.new(r)
                    self.rows[q][c] = q2
                    q = q2
        return entry

    def obj(self, schema: dict, nxt: int) -> int:
        if not isinstance(schema, dict) or not schema:
            raise ValueError(f"an object schema must be a non-empty dict of key -> type, got {schema!r}")
        items = list(schema.items())
        q = self.literal("}", nxt)
        for i in range(len(items) - 1, -1, -1):
            key, kind = items[i]
            if not isinstance(key, str) or not key or any(ch in key for ch in '"\\'):
                raise ValueError(f"keys must be non-empty strings without quotes or backslashes, got {key!r}")
            q = self.value(kind, q, key)
            q = self.literal(("{" if i == 0 else ",") + f'"{key}":', q)
        return q


def compile_schema(schema: dict) -> DFA:
    """Compile a fixed-schema JSON object to a :class:`DFA` (compact JSON: no whitespace).

    Keys appear in the schema's order, all required. The automaton is built back to front so each
    value's exit states know what follows them. Raises ValueError on an unknown type, an empty
    object, an enum whose options are prefixes of each other, or an ambiguous rule end.
    """
    b = _Builder()
    end_rule = b.new_rule("end")
    final = b.new(end_rule)
    entry = b.obj(schema, final)
    n = len(b.rows)
    order = [entry] + [q for q in range(n) if q != entry]  # renumber: the entry is state 0
    new_id = np.empty(n, dtype=np.int32)
    new_id[order] = np.arange(n, dtype=np.int32)
    table = np.stack([b.rows[q] for q in order])
    table = np.where(table >= 0, new_id[np.maximum(table, 0)], -1).astype(np.int32)
    accepting = np.zeros(n, dtype=bool)
    accepting[new_id[final]] = True
    rule = np.array([b.rule[q] for q in order], dtype=np.int32)
    rule_end = np.array([b.end[q] for q in order], dtype=bool)
    return DFA(table, accepting, rule, rule_end, tuple(b.rules))


@lru_cache(maxsize=16)
def schema_dfa(name: str) -> DFA:
    """The compiled :class:`DFA` of ``SCHEMAS[name]`` (cached)."""
    if name not in SCHEMAS:
        raise ValueError(f"schema must be one of {sorted(SCHEMAS)}, got {name!r}")
    return compile_schema(SCHEMAS[name])


def example_document(schema: dict) -> str:
    """A deterministic valid document of ``schema`` (strings "Paris"-like, integers 3, first enum option)."""
    names = iter(("Paris", "Alice", "London", "Tokyo", "Berlin", "Bob"))

    def val(kind):
        if isinstance(kind, dict):
            return "{" + ",".join(f'"{k}":{val(v)}' for k, v in kind.items()) + "}"
        if kind == "string":
            return f'"{next(names, "x")}"'
        if kind == "integer":
            return "3"
        if kind == "boolean":
            return "true"
        if kind[0] == "enum":
            return f'"{kind[1][0]}"'
        return f'"{kind[1]}"'

    return val(schema)


# ---- the vocabulary as arrays --------------------------------------------------------------


@dataclass(frozen=True)
class TokenTable:
    """A vocabulary as arrays: ``bytes_[t, j]`` the j-th byte of token t (0-padded), ``lengths[t]``,
    and ``lcp[i]``: the longest common prefix of the i-th token in sorted order with the one before it
    (``order`` sorts the token ids; a trie over the vocabulary has sum(lengths[order] - lcp) edges)."""

    tokens: tuple[str, ...]
    bytes_: np.ndarray
    lengths: np.ndarray
    order: np.ndarray
    lcp: np.ndarray
    first_start: np.ndarray  # order[first_start[b]:first_start[b + 1]]: the tokens whose first byte is b

    @property
    def size(self) -> int:
        return len(self.tokens)

    @cached_property
    def columns(self) -> np.ndarray:
        """``bytes_`` transposed (``columns[j, t]``), contiguous per byte position: what a walk reads."""
        return np.ascontiguousarray(self.bytes_.T)

    @cached_property
    def sorted_first(self) -> np.ndarray:
        """The first byte of each token in sorted order (``bytes_[order, 0]``)."""
        return self.bytes_[self.order, 0]


@lru_cache(maxsize=6)
def token_table(tokens: tuple[str, ...]) -> TokenTable:
    """:class:`TokenTable` of ``tokens`` (cached). Tokens must be non-empty byte strings (code points < 256)."""
    if not tokens:
        raise ValueError("tokens must be a non-empty tuple of strings")
    lengths = np.fromiter(map(len, tokens), dtype=np.int32, count=len(tokens))
    if lengths.min() < 1:
        raise ValueError("every token must be a non-empty string")
    width = int(lengths.max())
    codes = np.array(tokens, dtype=f"U{width}").view(np.uint32).reshape(len(tokens), width)  # 0-padded code points
    if codes.max() > 255:
        raise ValueError("tokens must be byte strings (every code point < 256)")
    bytes_ = codes.astype(np.uint8)
    # sorted order of the strings: the 0-padded bytes compared as big-endian words, then the length (a string sorts
    # before any longer one it is a prefix of, even when the rest is 0 bytes); stable, like sorted()
    words = np.zeros((len(tokens), -(-width // 8) * 8), dtype=np.uint8)
    words[:, :width] = bytes_
    words = words.view(">u8")
    order = np.lexsort([lengths] + [words[:, k] for k in range(words.shape[1] - 1, -1, -1)]).astype(np.int64)
    sb, sl = bytes_[order], lengths[order]
    lcp = np.zeros(len(tokens), dtype=np.int32)
    same = np.ones(len(tokens) - 1, dtype=bool)
    for j in range(width):
        same &= (sb[1:, j] == sb[:-1, j]) & (sl[1:] > j) & (sl[:-1] > j)
        lcp[1:] += same
    first_start = np.searchsorted(sb[:, 0], np.arange(257), side="left").astype(np.int64)
    return TokenTable(tuple(tokens), bytes_, lengths, order, lcp, first_start)


@dataclass(frozen=True)
class _Walk:
    """Tokens walked from ``state`` through the whole automaton (see :func:`_walk`); arrays aligned with
    ``pos``, the walked tokens' positions in sorted order (ascending)."""

    state: int
    pos: np.ndarray       # int64, positions in table.order of the walked tokens
    end: np.ndarray       # int32, the state after the whole token, -1 if a byte was rejected
    consumed: np.ndarray  # int32, bytes consumed before the walk ended
    exit_at: np.ndarray   # int32, index of the first byte that moves into another rule's state (-1: none)
    dead_end: np.ndarray  # bool, a byte was rejected inside the state's rule at a state where the rule may end
    all_tokens: bool      # every token not in pos has a dead first byte (consumed 0, rejected)

    def full(self, table: TokenTable, dfa: DFA) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(end, consumed, exit_at, dead_end) over the whole vocabulary, indexed by token id."""
        n, ids = table.size, table.order[self.pos]
        end, consumed = np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int32)
        exit_at = np.full(n, -1, dtype=np.int32)
        dead_end = np.full(n, self.all_tokens and bool(dfa.rule_end[self.state]))  # dead first byte at a rule end
        end[ids], consumed[ids], exit_at[ids], dead_end[ids] = self.end, self.consumed, self.exit_at, self.dead_end
        return end, consumed, exit_at, dead_end


def _walk(dfa: DFA, table: TokenTable, state: int, pos: np.ndarray | None = None) -> _Walk:
    """One vectorized walk, byte column by byte column, of the tokens at sorted positions ``pos`` (default:
    every token whose first byte is alive at ``state``; the others stop at once), recording where each
    token first leaves the state's rule; every per-state count derives from it. Tokens are walked longest
    first, so those that end at a byte position are the tail of the active set."""
    integer("state", state, 0, dfa.states - 1)
    every = pos is None
    if every:
        alive = np.flatnonzero(dfa.table[state] >= 0)
        fs = table.first_start
        if alive.size <= 8:
            pos = np.concatenate([np.arange(fs[b], fs[b + 1]) for b in alive]) if alive.size else np.zeros(0, np.int64)
        else:
            pos = np.flatnonzero((dfa.table[state] >= 0)[table.sorted_first])
    m = pos.size
    end = np.full(m, -1, dtype=np.int32)
    consumed = np.zeros(m, dtype=np.int32)
    exit_at = np.full(m, -1, dtype=np.int32)
    dead_end = np.zeros(m, dtype=bool)
    lens = table.lengths[table.order[pos]]
    # walk order, longest first (indices into pos); lengths below 256 sort as bytes (a radix sort)
    at = np.argsort(lens.astype(np.uint8) if table.bytes_.shape[1] < 256 else lens, kind="stable")[::-1]
    tok = table.order[pos[at]]
    neg = -lens[at]  # ascending: -length
    home = dfa.rule[state]
    nxt = dfa.table.astype(np.intp).ravel()  # [q * 256 + byte]
    leaves = ((dfa.table >= 0) & (dfa.rule[np.maximum(dfa.table, 0)] != home)).ravel()  # into another rule
    q = np.full(m, state, dtype=np.intp)
    inside = np.ones(m, dtype=bool)  # not yet out of the state's rule
    cols = table.columns
    for j in range(cols.shape[0]):
        k = int(np.searchsorted(neg, -j, side="left"))  # tokens longer than j
        if k < at.size:
            end[at[k:]] = q[k:]
            consumed[at[k:]] = j
            at, tok, q, inside, neg = at[:k], tok[:k], q[:k], inside[:k], neg[:k]
        if k == 0:
            break
        f = q * 256 + cols[j, tok]
        nq = nxt[f]
        dead = nq < 0
        if inside.any():
            out = inside & leaves[f]
            exit_at[at[out]] = j
            dead_end[at[inside & dead & dfa.rule_end[q]]] = True
            inside &= ~out
        if dead.any():
            consumed[at[dead]] = j
            keep = ~dead
            at, tok, q, inside, neg = at[keep], tok[keep], nq[keep], inside[keep], neg[keep]
        else:
            q = nq
    if at.size:
        end[at] = q
        consumed[at] = -neg
    return _Walk(state, pos, end, consumed, exit_at, dead_end, all_tokens=every)


def _left_rule(w: _Walk, expand: bool) -> np.ndarray:
    """Tokens (aligned with ``w.pos``) whose rule-local walk stops at the rule's boundary (see :func:`walk_tokens`)."""
    left = w.exit_at >= 0
    return left if expand else left | w.dead_end


def _runtime(table: TokenTable, pos: np.ndarray, end: np.ndarray, consumed: np.ndarray) -> tuple[int, int]:
    """(transitions token by token, transitions over a trie) of walking the tokens at sorted positions ``pos``
    (ascending) whose walks ended at ``end`` after ``consumed`` bytes. Each token shares with the previous one
    the minimum of the adjacent common prefixes (``table.lcp``) between them in sorted order (0 for the first)."""
    if pos.size == 0:
        return 0, 0
    looked = consumed.astype(np.int64) + (end < 0)
    shared = np.zeros(pos.size, dtype=np.int64)
    if pos.size > 1:
        shared[1:] = np.minimum.reduceat(table.lcp[:pos[-1] + 1], pos[:-1] + 1)
    return int(looked.sum()), int(np.maximum(looked - shared, 0).sum())


def walk_tokens(dfa: DFA, table: TokenTable, state: int, rule_local: bool = False, expand: bool = True):
    """Walk every token from ``state``; returns (end_state, consumed, left_rule).

    end_state[t]: the state after the whole token, -1 if a byte was rejected. consumed[t]: bytes
    consumed before the walk ended. With ``rule_local`` the walk stops (left_rule[t] = True) at the
    first transition into a state of another rule without taking it: what follows the rule decides such
    tokens (see :func:`classify_tokens`). A dead byte where the rule may end also stops the walk there
    unless ``expand`` (context expansion: the byte cannot start anything that may follow the rule, so
    the token is rejected already at compile time).
    """
    end, consumed, exit_at, dead_end = _walk(dfa, table, state).full(table, dfa)
    if not rule_local:
        return end, consumed, np.zeros(end.size, dtype=bool)
    exited = exit_at >= 0
    end[exited] = -1  # the rule-local walk stops before the exit
    consumed[exited] = exit_at[exited]
    return end, consumed, exited if expand else exited | dead_end


def naive_mask(dfa: DFA, table: TokenTable, state: int) -> np.ndarray:
    """Boolean mask over the vocabulary: token t allowed when the DFA consumes all of it from ``state``."""
    w = _walk(dfa, table, state)
    mask = np.zeros(table.size, dtype=bool)
    mask[table.order[w.pos]] = w.end >= 0
    return mask


@dataclass(frozen=True)
class MaskWork:
    """Work of one mask at one state, counted.

    ``transitions``: byte transitions a token-by-token walk looks up (every consumed byte, plus the
    rejected one). ``trie_transitions``: the same walk over a trie of the vocabulary (a shared prefix
    is walked once; a rejected edge prunes its subtree). ``allowed``: tokens in the mask.
    """

    state: int
    transitions: int
    trie_transitions: int
    allowed: int


def mask_work(dfa: DFA, table: TokenTable, state: int) -> MaskWork:
    """Count the work of :func:`naive_mask` at ``state`` (see :class:`MaskWork`)."""
    return _mask_work(table, _walk(dfa, table, state))


def _mask_work(table: TokenTable, w: _Walk) -> MaskWork:
    """:class:`MaskWork` of a walk of every token. A token whose first byte is dead costs one look-up; over the
    trie, one per first byte (its group in sorted order shares that byte). The walked tokens are whole
    first-byte groups, so the first of each has an lcp of 0 with its predecessor, as in the full sorted order."""
    looked = w.consumed.astype(np.int64) + (w.end < 0)  # bytes looked up per walked token
    sizes = np.diff(table.first_start)
    walked = np.zeros(256, dtype=bool)
    walked[table.sorted_first[w.pos]] = True
    unwalked = sizes[~walked]
    lcp = table.lcp[w.pos]
    trie = int(np.count_nonzero(unwalked)) + int(np.maximum(looked - np.minimum(lcp, looked), 0).sum())
    return MaskWork(w.state, int(unwalked.sum()) + int(looked.sum()), trie, int((w.end >= 0).sum()))


@dataclass(frozen=True)
class TokenClasses:
    """XGrammar's split of the vocabulary at one state (see :func:`classify_tokens`)."""

    state: int
    accepted: np.ndarray   # bool, decided inside the rule: allowed whatever follows
    rejected: np.ndarray   # bool, decided inside the rule: never allowed
    dependent: np.ndarray  # bool, the walk reaches the rule's end: needs the context at run time

    @property
    def n_dependent(self) -> int:
        return int(self.dependent.sum())


def classify_tokens(dfa: DFA, table: TokenTable, state: int, expand: bool = True) -> TokenClasses:
    """Split the vocabulary at ``state`` into context-independent accepted / rejected tokens and
    context-dependent ones (Dong et al., XGrammar, arXiv:2411.15100, sec. 3).

    A token is walked inside the state's own rule only. If it ends inside the rule it is accepted;
    if a byte is rejected where the rule cannot end it is rejected; if the walk reaches a point where
    the rule ends and the token goes on, its validity depends on what follows the rule (in a CFG, the
    stack): context-dependent, checked at run time. Accepted and rejected are precomputed once per
    rule position and reused by every schema and request that uses the rule.

    ``expand`` (XGrammar's context expansion, sec. 3.3): a token whose byte after the rule's end cannot
    begin anything that may follow the rule is rejected at compile time instead of checked at run time.
    """
    end, _, left = walk_tokens(dfa, table, state, rule_local=True, expand=expand)
    accepted = (end >= 0) & ~left
    return TokenClasses(state, accepted, ~accepted & ~left, left)


def precompiled_mask(dfa: DFA, table: TokenTable, classes: TokenClasses) -> tuple[np.ndarray, int, int]:
    """The exact mask from a precomputed split: the cached accepted tokens plus the context-dependent
    ones walked through the whole automaton now. Returns (mask, run-time transitions token by token,
    run-time transitions over a trie of the context-dependent tokens, shared prefixes walked once)."""
    w = _walk(dfa, table, classes.state, np.flatnonzero(classes.dependent[table.order]))
    mask = classes.accepted.copy()
    mask[table.order[w.pos]] = w.end >= 0
    return (mask, *_runtime(table, w.pos, w.end, w.consumed))


def state_trace(dfa: DFA, table: TokenTable, ids) -> list[int]:
    """The state before each token of a token-id sequence (the states a decode visits). Raises
    ValueError if the sequence leaves the language."""
    q, out = 0, []
    for t in ids:
        out.append(q)
        q, _ = dfa.walk(q, table.tokens[t])
        if q < 0:
            raise ValueError(f"token {t} ({table.tokens[t]!r}) is not allowed after {len(out) - 1} tokens")
    return out


def forced_runs(dfa: DFA) -> list[tuple[int, str]]:
    """Maximal runs of forced bytes: (state, text) where every state on the way has exactly one
    allowed byte and is not accepting. Jump-forward decoding appends such text without a forward pass."""
    single = ((dfa.table >= 0).sum(axis=1) == 1) & ~dfa.accepting
    preds = np.zeros(dfa.states, dtype=int)
    for q in range(dfa.states):
        for nq in set(int(x) for x in dfa.table[q] if x >= 0):
            preds[nq] += 1 if single[q] else 0
    runs = []
    for q in range(dfa.states):
        if not single[q] or preds[q]:
            continue
        text, p = "", q
        while p >= 0 and single[p]:
            c = int(np.flatnonzero(dfa.table[p] >= 0)[0])
            text += chr(c)
            p = int(dfa.table[p, c])
        runs.append((q, text))
    return runs


def bitmask_bytes(vocab_size: int, word_bits: int = 32) -> int:
    """Bytes of one request's token bitmask: ceil(V / word_bits) words of word_bits / 8 bytes
    (XGrammar allocates int32[batch, ceil(V / 32)])."""
    v = integer("vocab_size", vocab_size, 1, unit="tokens")
    w = integer("word_bits", word_bits, 8)
    if w not in (8, 16, 32, 64):
        raise ValueError(f"word_bits must be 8, 16, 32 or 64, got {w}")
    return math.ceil(v / w) * w // 8


def pack_bitmask(mask: np.ndarray) -> np.ndarray:
    """Pack a boolean mask into int32 words, bit t % 32 of word t // 32 (little-endian bit order)."""
    m = np.asarray(mask, dtype=bool)
    pad = (-m.size) % 32
    bits = np.packbits(np.concatenate([m, np.zeros(pad, dtype=bool)]), bitorder="little")
    return bits.view(np.int32)


def mask_time_s(transitions: float, vocab_size: int, transition_ns: float | None = None,
                copy_gbps: float | None = None) -> float:
    """Host time of one request's mask, seconds: transitions x transition_ns + bitmask bytes / copy rate.

    ``transitions``: byte transitions walked at run time (all of them for the naive mask, only the
    context-dependent tokens' for a precompiled one, 0 for a DFA whose per-state masks are stored).
    Defaults: ``constrained_decoding.transition_ns`` and ``mask_copy_gbps`` (data/assumptions.yaml).
    """
    from lib.inputs import real
    from lib.registry import assumptions

    real("transitions", transitions, 0)
    ns = real("transition_ns", assumptions.resolve(transition_ns, "constrained_decoding.transition_ns"), 0,
              low_open=True)
    gbps = real("copy_gbps", assumptions.resolve(copy_gbps, "constrained_decoding.mask_copy_gbps"), 0,
                low_open=True)
    return transitions * ns * 1e-9 + bitmask_bytes(vocab_size) / (gbps * 1e9)


@dataclass(frozen=True)
class SchemaCosts:
    """Every state of one schema's automaton against one vocabulary, counted (arrays indexed by state).

    ``transitions`` / ``trie``: the naive mask's byte transitions token by token / over a trie;
    ``allowed``: tokens in the mask; ``dependent`` / ``dependent_unexpanded``: context-dependent tokens
    with / without context expansion; ``runtime`` / ``runtime_trie``: transitions the precompiled mask
    still walks at run time (the dependent tokens, with expansion); ``rule``: each state's rule name;
    ``document``, ``tokens`` and ``trace``: the example document, its canonical token ids and the state
    before each of them (the states a decode of that document visits).
    """

    schema: str
    vocab_size: int
    dfa: DFA
    transitions: np.ndarray
    trie: np.ndarray
    allowed: np.ndarray
    dependent: np.ndarray
    dependent_unexpanded: np.ndarray
    runtime: np.ndarray
    runtime_trie: np.ndarray
    rule: tuple[str, ...]
    document: str
    tokens: tuple[int, ...]
    trace: tuple[int, ...]

    @property
    def states(self) -> int:
        return self.dfa.states

    @property
    def worst_state(self) -> int:
        """The state whose naive mask walks the most transitions (inside a string when the schema has one;
        :func:`rule_phrase` of ``rule[worst_state]`` says where)."""
        return int(np.argmax(self.transitions))


def rule_phrase(rule: str) -> str:
    """Where a state of rule ``rule`` (a :attr:`DFA.rules` name) sits, in plain words for prose:
    ``"city: string"`` -> "inside the city string", ``"unit: enum"`` -> "inside the unit enum",
    a literal run -> "inside a fixed key or punctuation run", ``"end"`` -> "at the end of the document"."""
    if not isinstance(rule, str) or not rule:
        raise ValueError(f"rule must be a rule name of a compiled schema, got {rule!r}")
    if rule == "end":
        return "at the end of the document"
    if rule.startswith("literal "):
        return "inside a fixed key or punctuation run"
    field, sep, kind = rule.rpartition(": ")
    names = {"string": "string", "integer": "integer", "boolean": "boolean", "enum": "enum", "const": "constant"}
    if not sep or kind not in names:
        raise ValueError(f"rule must be 'end', 'literal ...' or 'FIELD: KIND' with KIND in {sorted(names)}, got {rule!r}")
    return f"inside the {field} {names[kind]}"


@lru_cache(maxsize=16)
def schema_costs(schema: str, vocab_size: int = 128_256, seed: int = 0) -> SchemaCosts:
    """:class:`SchemaCosts` of ``SCHEMAS[schema]`` against :func:`lib.decoding.tokenizer.toy_vocabulary`
    (vocab_size, seed); cached. One walk of the vocabulary per automaton state gives every count (tens of
    milliseconds per schema at 128K tokens, after the vocabulary and its table are built)."""
    from lib.decoding.tokenizer import toy_tokenizer

    dfa = schema_dfa(schema)
    tok = toy_tokenizer(vocab_size, seed)
    table = token_table(tok.vocab)
    n = dfa.states
    cols = {k: np.zeros(n, dtype=np.int64) for k in
            ("transitions", "trie", "allowed", "dependent", "dependent_unexpanded", "runtime", "runtime_trie")}
    for q in range(n):  # one walk per state serves the naive mask, both splits and the run-time checks
        walk = _walk(dfa, table, q)
        w = _mask_work(table, walk)
        cols["transitions"][q], cols["trie"][q], cols["allowed"][q] = w.transitions, w.trie_transitions, w.allowed
        dep = walk.exit_at >= 0  # context-dependent with expansion (their first byte is alive, so all walked)
        cols["dependent"][q] = int(dep.sum())
        unwalked = table.size - walk.pos.size  # dead first byte: context-dependent without expansion at a rule end
        cols["dependent_unexpanded"][q] = int(_left_rule(walk, expand=False).sum()) + unwalked * bool(dfa.rule_end[q])
        cols["runtime"][q], cols["runtime_trie"][q] = _runtime(table, walk.pos[dep], walk.end[dep], walk.consumed[dep])
    doc = example_document(SCHEMAS[schema])
    ids = tuple(tok.encode(doc))
    trace = tuple(state_trace(dfa, table, ids))
    rule = tuple(dfa.rules[r] for r in dfa.rule)
    return SchemaCosts(schema, len(tok.vocab), dfa, rule=rule, document=doc, tokens=ids, trace=trace, **cols)


def document_steps(schema: str, vocab_size: int = 128_256, seed: int = 0) -> dict:
    """One decode of the schema's example document, step by step, from :func:`schema_costs` (schema,
    vocab_size, seed), as plain JSON values (what :mod:`lib.registry.derived` stores).

    ``pieces``: the canonical token strings; ``trace``: the state before each; ``transitions`` / ``trie`` /
    ``runtime_trie``: at each step, the naive mask's byte transitions token by token / over a trie and the
    precompiled mask's run-time transitions over a trie; ``worst_*``: the same counts and the context-dependent
    tokens at :attr:`SchemaCosts.worst_state`; ``states``: automaton states; ``document``: its text.
    """
    from lib.decoding.tokenizer import toy_tokenizer

    c = schema_costs(schema, vocab_size, seed)
    trace = list(c.trace)
    w = c.worst_state
    return {"document": c.document, "pieces": toy_tokenizer(vocab_size, seed).pieces(c.tokens), "states": c.states,
            "trace": trace, "transitions": c.transitions[trace].tolist(), "trie": c.trie[trace].tolist(),
            "runtime_trie": c.runtime_trie[trace].tolist(), "worst_state": w,
            "worst_transitions": int(c.transitions[w]), "worst_dependent": int(c.dependent[w]),
            "worst_runtime_trie": int(c.runtime_trie[w])}


PLACEMENTS = ("serial", "scheduler", "pool")


@dataclass(frozen=True)
class MaskedStep:
    """One decode step with grammar masks (seconds). ``mask_s``: the masks' CPU time on the critical
    thread(s); ``copy_s``: moving the batch's bitmasks to the GPU before sampling; ``exposed_s``: what the
    masks add to the step beyond ``host_s + forward_s``."""

    placement: str
    forward_s: float
    host_s: float
    mask_s: float
    copy_s: float
    step_s: float

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.host_s - self.forward_s

    @property
    def slowdown(self) -> float:
        """step_s / (host_s + forward_s)."""
        return self.step_s / (self.host_s + self.forward_s)


def masked_step(forward_s: float, host_s: float, mask_per_request_s: float, batch: int, placement: str = "scheduler",
                threads: int = 1, positions: int = 1, vocab_size: int = 128_256, efficiency: float | None = None,
                h2d_gbps: float | None = None, copy_fixed_us: float | None = None) -> MaskedStep:
    """Step time when every request needs ``positions`` grammar masks before the step's sampling.

    The batch's mask work is W = batch x positions x mask_per_request_s on one thread, or
    W / (threads x efficiency) on a pool (efficiency: ``constrained_decoding.parallel_fill_efficiency``);
    a request's positions are sequential (each advances its matcher through one more drafted token), so a
    pool cannot go below positions x mask_per_request_s. The bitmasks (batch x positions x
    :func:`bitmask_bytes`) then cross PCIe (``storage.node.host.pcie_h2d_gbps_per_gpu``, plus
    ``kernels_elementwise.copy_fixed_us``). Placements:

    - ``serial``: computed on the scheduler thread outside the forward (before the launch or after the
      previous sample): step = host + W + copy + forward;
    - ``scheduler`` / ``pool``: computed while the GPU runs the forward (on the scheduler thread / on
      ``threads`` workers), needed only before sampling: step = host + max(forward, W) + copy.
    """
    from lib.inputs import fraction, real
    from lib.registry import assumptions

    real("forward_s", forward_s, 0)
    real("host_s", host_s, 0)
    real("mask_per_request_s", mask_per_request_s, 0)
    b = integer("batch", batch, 1, unit="sequences")
    p = integer("positions", positions, 1, 64)
    t = integer("threads", threads, 1, 256)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement != "pool" and t != 1:
        raise ValueError(f"threads must be 1 unless placement is 'pool' (got {t} with {placement!r})")
    eff = fraction("efficiency", assumptions.resolve(efficiency, "constrained_decoding.parallel_fill_efficiency"),
                   allow_zero=False)
    bw = real("h2d_gbps", assumptions.resolve(h2d_gbps, "storage.node.host.pcie_h2d_gbps_per_gpu"), 0, low_open=True)
    fixed = real("copy_fixed_us", assumptions.resolve(copy_fixed_us, "kernels_elementwise.copy_fixed_us"), 0)
    work = b * p * mask_per_request_s
    if placement == "pool" and t > 1:
        work = max(work / (t * eff), p * mask_per_request_s)
    copy = b * p * bitmask_bytes(vocab_size) / (bw * 1e9) + fixed * 1e-6
    if placement == "serial":
        step = host_s + work + copy + forward_s
    else:
        step = host_s + max(forward_s, work) + copy
    return MaskedStep(placement, forward_s, host_s, work, copy, step)


@dataclass(frozen=True)
class MaskedSpeculativeStep:
    """A speculative step with grammar masks: ``draft`` (one :class:`MaskedStep` per drafted token, the
    drafter's sampling needs a mask per sequence) and ``verify`` (k + 1 masks per sequence, computable only
    once the drafts are on the CPU, so they can hide behind the verification pass alone). Seconds."""

    draft: tuple[MaskedStep, ...]
    verify: MaskedStep
    plain_s: float  # the same speculative step without masks (draft_s + verify_s)
    tokens_per_step: float

    @property
    def step_s(self) -> float:
        return sum(d.step_s for d in self.draft) + self.verify.step_s

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.plain_s


def masked_speculative_step(dep, draft_dep, draft_tokens: int, acceptance: float, batch: int, context: int,
                            mask_per_request_s: float, placement: str = "scheduler", threads: int = 1,
                            constrain_drafts: bool = True, **kw) -> MaskedSpeculativeStep:
    """:func:`lib.decoding.speculative.speculative_step` with masks (:func:`masked_step` for each phase).

    The step model's host time (sampling and scheduling, ``DecodeStep.host_s``) is kept serial; the
    forward is the rest of :func:`lib.perf.step.decode_step`'s total. The draft model's k steps each
    need one mask per sequence when ``constrain_drafts`` (otherwise they run unmasked and drafts that break
    the grammar are simply rejected); the verification pass needs k + 1 per sequence.
    """
    from lib.decoding.speculative import model_drafter, speculative_step
    from lib.perf.step import decode_step

    k = integer("draft_tokens", draft_tokens, 1, 16)
    s = speculative_step(dep, model_drafter(draft_dep), k, acceptance, batch, context)
    vs = decode_step(dep, batch, context, query_tokens=k + 1)
    verify = masked_step(vs.total_s - vs.host_s, vs.host_s, mask_per_request_s, batch, placement, threads, k + 1,
                         dep.mdl.vocab_size, **kw)
    ds = decode_step(draft_dep, batch, context)
    if constrain_drafts:
        one = masked_step(ds.total_s - ds.host_s, ds.host_s, mask_per_request_s, batch, placement, threads, 1,
                          draft_dep.mdl.vocab_size, **kw)
    else:
        one = MaskedStep("unmasked", ds.total_s - ds.host_s, ds.host_s, 0.0, 0.0, ds.total_s)
    return MaskedSpeculativeStep((one,) * k, verify, s.draft_s + s.verify_s, s.tokens_per_step)


def largest_hidden_batch(dep, context: int, mask_per_request_s: float) -> int:
    """Largest batch B (up to the replica's KV ceiling at ``context``) whose masks on one thread,
    B x mask_per_request_s, fit inside the forward of :func:`lib.perf.step.decode_step` at B (its total
    minus its host time). The forward per sequence falls with B (weights amortized), so the condition
    holds below one crossing and bisection finds it; 0 when even one request's mask does not fit."""
    from lib.inputs import real
    from lib.perf.step import decode_step
    from lib.perf.throughput import kv_batch_ceiling
    from lib.search import largest_true

    m = real("mask_per_request_s", mask_per_request_s, 0)
    top = int(kv_batch_ceiling(dep, context))
    if top < 1:
        raise ValueError(f"no request of {context} tokens fits the replica's KV cache")

    def fits(b: int) -> bool:
        s = decode_step(dep, b, context)
        return b * m <= s.total_s - s.host_s

    if not fits(1):
        return 0
    if fits(top):
        return top
    return largest_true(fits, 2, top - 1)  # fits(1), not fits(top): 1 when no batch between fits


# ---- I052: jump-forward decoding and the model's own tokenization ----------------------------------------------


def forced_text(dfa: DFA, state: int) -> str:
    """The bytes the grammar forces from ``state``: follow states with exactly one allowed byte that are
    not accepting; '' when the next byte is a real choice."""
    integer("state", state, 0, dfa.states - 1)
    out, q = [], state
    while not dfa.accepting[q]:
        allowed = np.flatnonzero(dfa.table[q] >= 0)
        if allowed.size != 1:
            break
        out.append(chr(int(allowed[0])))
        q = int(dfa.table[q, allowed[0]])
    return "".join(out)


@dataclass(frozen=True)
class JumpForward:
    """A document decoded with jump-forward (see :func:`jump_forward`). ``pieces``: (token id, forced?)
    in order; ``canonical``: the tokenizer's own ids of the whole document; ``model_steps``: tokens the
    model sampled (decode steps); ``forced_runs``: runs appended without sampling (each one extend pass);
    ``off_canonical``: tokens of ``pieces`` whose (start, end) span is not a token span of ``canonical``."""

    pieces: tuple[tuple[int, bool], ...]
    canonical: tuple[int, ...]
    model_steps: int
    forced_runs: int
    forced_tokens: int
    off_canonical: int


def _off_canonical(tok, ids, canonical) -> int:
    """Two-pointer count of tokens of ``ids`` that do not coincide with a token of ``canonical``."""
    i = j = a = b = 0  # a, b: start offsets of ids[i], canonical[j]
    off = 0
    while i < len(ids):
        la = len(tok.vocab[ids[i]])
        while j < len(canonical) and b < a:
            b += len(tok.vocab[canonical[j]])
            j += 1
        same = j < len(canonical) and b == a and len(tok.vocab[canonical[j]]) == la
        off += not same
        a += la
        i += 1
    return off


def jump_forward(dfa: DFA, tok, document: str, heal: bool = False) -> JumpForward:
    """Decode ``document`` (which the grammar must accept) with jump-forward decoding.

    Where the grammar forces the next bytes (:func:`forced_text`), the engine appends them without a
    forward pass, tokenized on their own (``tok.encode``). Elsewhere the model samples one token; it is
    taken to emit what it was trained on, the longest vocabulary token that matches the rest of the
    document and that the mask allows. With ``heal`` (token healing), the last token of each forced run is
    held back and the model's next token must start with its text, so a boundary the tokenizer would have
    merged across is merged again.
    """
    if not dfa.accepts(document):
        raise ValueError("document must be accepted by the grammar")
    pieces: list[tuple[int, bool]] = []
    pos, q, steps, runs, forced_n = 0, 0, 0, 0, 0
    held = ""
    n = len(document)
    while pos < n:
        run = forced_text(dfa, q) if not held else ""
        if run and pos + len(run) <= n:
            ids = tok.encode(run)
            if heal and len(ids) > 1 or heal and pos + len(run) < n:
                held = tok.vocab[ids[-1]]
                ids = ids[:-1]
            else:
                held = ""
            for t in ids:
                pieces.append((t, True))
            forced_n += len(ids)
            runs += 1 if ids else 0
            adv = sum(len(tok.vocab[t]) for t in ids)
            q, _ = dfa.walk(q, document[pos:pos + adv])
            pos += adv
            continue
        # the model samples: the longest allowed token matching the rest (and starting with the held text)
        best = None
        for L in range(min(tok.max_len, n - pos), 0, -1):
            piece = document[pos:pos + L]
            t = tok.ids.get(piece)
            if t is None or not piece.startswith(held):
                continue
            nq, _ = dfa.walk(q, piece)
            if nq >= 0:
                best = (t, nq, L)
                break
        if best is None:
            raise ValueError(f"no allowed token continues the document at byte {pos}")
        t, q, L = best
        pieces.append((t, False))
        steps += 1
        pos += L
        held = ""
    canonical = tuple(tok.encode(document))
    ids = [t for t, _ in pieces]
    return JumpForward(tuple(pieces), canonical, steps, runs, forced_n, _off_canonical(tok, ids, canonical))
