"""Radix-tree prefix cache (SGLang RadixAttention-style).

Every token sequence whose KV is cached is a path from the root; each edge holds a run of tokens
and, per token, the KV *slot* (index into a token-granular KV pool) holding that token's K/V.
Sharing a prefix means sharing the slots on its path, so a new request only computes the tokens
past ``match_prefix``.

* Edges split when a sequence diverges in the middle of one; the lower half keeps its node object
  (so a handle to it stays valid) and the new upper node inherits its lock count.
* ``lock(node)`` pins the path root..node for a running request (a lock count on every node of
  the path); ``unlock`` releases it. Pinned tokens are never evicted.
* ``evict(num_tokens)`` frees whole leaves, least recently used first (a logical clock ticks once
  per ``match_prefix``/``insert``; ties broken by creation order), and a parent whose last child
  went becomes a leaf and a candidate in turn. Each slot goes back to the pool exactly once.

Invariants (checked by the tests): ``num_cached_tokens`` equals the sum of edge lengths;
``num_cached_tokens + num_free_slots == num_slots``; no slot is both free and cached or free twice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lib.inputs import integer

__all__ = ["OutOfSlots", "PrefixMatch", "RadixCache", "RadixNode"]


class OutOfSlots(ValueError):
    """Raised when an insert needs more KV slots than are free even after evicting."""


@dataclass(eq=False)
class RadixNode:
    """A node of the radix tree; ``tokens``/``slots`` label the edge from its parent."""

    tokens: tuple[int, ...]
    slots: list[int]
    parent: RadixNode | None
    node_id: int
    children: dict[int, RadixNode] = field(default_factory=dict)
    lock_count: int = 0  # locks of this node and of every locked descendant (what pins it)
    own_locks: int = 0  # lock() calls on exactly this node not yet undone (what unlock() may undo)
    last_access: int = 0
    evicted: bool = False

    def __repr__(self) -> str:
        return f"RadixNode(id={self.node_id}, tokens={self.tokens}, lock_count={self.lock_count})"


@dataclass(frozen=True)
class PrefixMatch:
    """Result of a lookup: the KV ``slots`` of the matched prefix and the node where it ends."""

    node: RadixNode
    slots: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        """Length of the matched prefix, in tokens."""
        return len(self.slots)


def _as_tokens(tokens: Sequence[int]) -> tuple[int, ...]:
    return tuple(integer("token", token, 0, unit="(a token id)") for token in tokens)


class RadixCache:
    """A radix-tree prefix cache over a pool of ``num_slots`` KV slots (one token each)."""

    def __init__(self, num_slots: int) -> None:
        num_slots = integer("num_slots", num_slots, 1)
        self._num_slots = num_slots
        self._free_slots: list[int] = list(range(num_slots - 1, -1, -1))  # slot 0 handed out first
        self._next_node_id = 1
        self._clock = 0
        self._num_cached_tokens = 0
        self.root = RadixNode(tokens=(), slots=[], parent=None, node_id=0)

    # ----------------------------------------------------------------- introspection
    @property
    def num_slots(self) -> int:
        """Size of the KV slot pool, in tokens."""
        return self._num_slots

    @property
    def num_free_slots(self) -> int:
        """Slots not holding any cached token."""
        return len(self._free_slots)

    @property
    def num_cached_tokens(self) -> int:
        """Tokens held in the tree (= sum of edge lengths)."""
        return self._num_cached_tokens

    def free_slots(self) -> list[int]:
        """The free-slot pool as stored (a copy)."""
        return list(self._free_slots)

    def nodes(self) -> Iterator[RadixNode]:
        """All nodes except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @property
    def num_pinned_tokens(self) -> int:
        """Tokens on locked nodes (these cannot be evicted)."""
        return sum(len(node.tokens) for node in self.nodes() if node.lock_count > 0)

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token sequence (all cached prefixes are prefixes of these)."""
        out = []
        stack: list[tuple[RadixNode, tuple[int, ...]]] = [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            prefix += node.tokens
            if not node.children and node is not self.root:
                out.append(prefix)
            stack.extend((child, prefix) for child in node.children.values())
        return sorted(out)

    # ----------------------------------------------------------------- operations
    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest cached prefix of ``tokens``: its slots and end node. Marks the path used.

        Splits an edge if the match ends inside it, so the returned node ends exactly at the
        matched length (and can be locked).
        """
        return self._walk(_as_tokens(tokens))

    def insert(self, tokens: Sequence[int]) -> PrefixMatch:
        """Cache ``tokens``: reuse the matched prefix, take new slots for the rest.

        Evicts LRU leaves (never the matched path) if the pool is short; raises
        :class:`OutOfSlots` if there is still not enough room. Returns the slots of all tokens
        and the node where ``tokens`` ends.
        """
        tokens = _as_tokens(tokens)
        match = self._walk(tokens)
        suffix = tokens[match.num_tokens :]
        if not suffix:
            return match
        shortfall = len(suffix) - len(self._free_slots)
        if shortfall > 0:
            self.lock(match.node)  # keep the prefix we are extending
            self.evict(shortfall)
            self.unlock(match.node)
            if len(suffix) > len(self._free_slots):
                raise OutOfSlots(
                    f"need {len(suffix)} free slots for {len(suffix)} new tokens, only"
                    f" {len(self._free_slots)} free after evicting every unpinned leaf"
                )
        new_slots = [self._free_slots.pop() for _ in suffix]
        leaf = self._new_node(suffix, new_slots, parent=match.node)
        match.node.children[suffix[0]] = leaf
        self._num_cached_tokens += len(suffix)
        return PrefixMatch(node=leaf, slots=match.slots + tuple(new_slots))

    def lock(self, node: RadixNode) -> None:
        """Pin the path root..``node`` (a running request reads it): lock count + 1 on each."""
        path = self._path_to_root(node)
        node.own_locks += 1
        for path_node in path:
            path_node.lock_count += 1

    def unlock(self, node: RadixNode) -> None:
        """Undo one :meth:`lock` of ``node`` (of this very node: a count it holds only because a
        locked descendant pins it cannot be unlocked here)."""
        path = self._path_to_root(node)
        if node.own_locks == 0:
            why = (f"its lock count {node.lock_count} comes from locked descendants"
                   if node.lock_count else "it is not locked")
            raise ValueError(f"{node!r} holds no lock of its own ({why}); unlock must undo a "
                             "lock() of the same node")
        node.own_locks -= 1
        for path_node in path:
            path_node.lock_count -= 1

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached tokens if possible; return how many were freed.

        Removes unlocked leaves in LRU order (oldest ``last_access`` first); a parent whose last
        child was removed becomes a leaf and a candidate. Frees whole edges, so it may free more
        than asked; frees less only when everything left is pinned.
        """
        num_tokens = integer("num_tokens", num_tokens, 0)
        candidates = [
            (node.last_access, node.node_id, node)
            for node in self.nodes()
            if not node.children and node.lock_count == 0
        ]
        heapq.heapify(candidates)
        freed = 0
        while freed < num_tokens and candidates:
            _, _, leaf = heapq.heappop(candidates)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            self._free_slots.extend(reversed(leaf.slots))
            self._num_cached_tokens -= len(leaf.tokens)
            freed += len(leaf.tokens)
            leaf.evicted, leaf.parent = True, None
            if parent is not self.root and not parent.children and parent.lock_count == 0:
                heapq.heappush(candidates, (parent.last_access, parent.node_id, parent))
        return freed

    # ----------------------------------------------------------------- internals
    def _new_node(self, tokens: tuple[int, ...], slots: list[int], parent: RadixNode) -> RadixNode:
        node = RadixNode(tokens, slots, parent, self._next_node_id, last_access=self._clock)
        self._next_node_id += 1
        return node

    def _walk(self, tokens: tuple[int, ...]) -> PrefixMatch:
        """Follow ``tokens`` down the tree, splitting the last edge at a partial match."""
        self._clock += 1
        node, matched, slots = self.root, 0, []
        while matched < len(tokens) and tokens[matched] in node.children:
            child = node.children[tokens[matched]]
            common = 0
            edge = child.tokens
            while common < len(edge) and matched + common < len(tokens):
                if edge[common] != tokens[matched + common]:
                    break
                common += 1
            if common < len(edge):
                child = self._split(child, common)
            child.last_access = self._clock
            slots.extend(child.slots)
            matched += common
            node = child
            if common < len(edge):
                break
        return PrefixMatch(node=node, slots=tuple(slots))

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child``'s edge after ``at`` tokens; return the new upper node."""
        upper = self._new_node(child.tokens[:at], child.slots[:at], parent=child.parent)
        upper.lock_count, upper.last_access = child.lock_count, child.last_access
        child.parent.children[child.tokens[0]] = upper
        child.tokens, child.slots, child.parent = child.tokens[at:], child.slots[at:], upper
        upper.children[child.tokens[0]] = child
        return upper

    def _path_to_root(self, node: RadixNode) -> list[RadixNode]:
        if not isinstance(node, RadixNode) or node.evicted:
            raise ValueError(f"node must be a live RadixNode of this cache, got {node!r}")
        path = []
        while node is not self.root:
            if node.parent is None:
                raise ValueError("node does not belong to this cache")
            path.append(node)
            node = node.parent
        return path
