"""Practice mode for the job API (N075): write the API, graded against a model of the contract.

The candidate writes a class with :class:`Skeleton`'s interface. A case is a program of operations,
run on a fresh ``factory(key_ttl_s)`` (first operation ``("config", key_ttl_s)``) and on
:class:`Oracle`, a small model of the contract written apart from the reference:

* ``("create", tenant, body, key, now)``: a new key (or none) makes a job (201); a live key with
  the same body returns the same job (201, same id); with another body 422; a key is per tenant;
* ``("get"|"cancel"|"delete", tenant, k)`` on the k-th job created (by creation order);
* ``("start"|"stop", k)``, ``("finish", k, ok)``: the worker's reports, True only for a legal move;
* ``("page", tenant, limit, walk)``: the next page of pagination walk ``walk`` (walks interleave
  with everything else). Each page must be the ``limit`` newest live jobs below the walk's cursor;
  no job may come twice, and a walk that ends must have shown every job that existed when it
  started and was not deleted before it ended.

After every operation the grader also reads every live job (state as the model says, 404 across
tenants) and lists each tenant in one page (no job more or fewer than the model: a retried POST
that made a second job shows here). The drafts (:data:`VARIANTS`) are the reference with one
classic mistake each; the grader must fail every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .job_api import TERMINAL, JobAPI

__all__ = ["QUESTION", "VARIANTS", "Oracle", "Skeleton", "cases", "check", "random_ops", "run", "variant"]

QUESTION = "Job API with idempotency keys, 202 cancel and keyset cursors (N075)"


class Skeleton:
    """A job API kept in memory. Every HTTP method returns ``(status, body)``; a job's body is
    ``{"id": str, "state": str}`` with state one of queued, running, cancelling, succeeded, failed,
    cancelled."""

    def __init__(self, key_ttl_s: float):
        """Idempotency records live ``key_ttl_s`` seconds after the create that wrote them: a record
        written at ``t`` answers while ``now < t + key_ttl_s`` and is gone from ``t + key_ttl_s`` on."""
        raise NotImplementedError

    def create(self, tenant: str, body: dict, key: str | None = None, now: float = 0.0) -> tuple[int, dict]:
        """POST /jobs. New job: 201. Same tenant, same live key, same body: 201 and the same job.
        Same live key, another body: 422. ``now`` never decreases between calls."""
        raise NotImplementedError

    def get(self, tenant: str, job_id: str) -> tuple[int, dict | None]:
        """GET /jobs/{id}: 200 and the job; 404 if absent or another tenant's."""
        raise NotImplementedError

    def cancel(self, tenant: str, job_id: str) -> tuple[int, dict | None]:
        """POST /jobs/{id}/cancel: 202 and the job (queued -> cancelled; running -> cancelling;
        cancelling/cancelled unchanged); 409 if it succeeded or failed; 404 if absent."""
        raise NotImplementedError

    def delete(self, tenant: str, job_id: str) -> tuple[int, None]:
        """DELETE /jobs/{id}: 204 if finished (succeeded, failed, cancelled), else 409; 404 if absent."""
        raise NotImplementedError

    def list(self, tenant: str, limit: int, cursor: str | None = None) -> tuple[int, dict]:
        """GET /jobs: 200 and {"items": [job, ...], "next": cursor or None}, newest first, at most
        ``limit`` items; ``next`` is None on the last page. Must not repeat or skip under inserts
        and deletes between pages."""
        raise NotImplementedError

    def worker_start(self, job_id: str) -> bool:
        """queued -> running; False and no change otherwise."""
        raise NotImplementedError

    def worker_finish(self, job_id: str, ok: bool) -> bool:
        """running or cancelling -> succeeded (ok) / failed; False and no change otherwise."""
        raise NotImplementedError

    def worker_stop(self, job_id: str) -> bool:
        """cancelling -> cancelled (the worker honoured the cancel); False and no change otherwise."""
        raise NotImplementedError


_DRAFTS = {
    "idempotency key ignored": (
        "the key is accepted but never looked up: a retried POST makes a second job",
        {"create": [("rec = self.keys.get((tenant, key))", "rec = None")]}),
    "key not scoped to the tenant": (
        "keys are global: tenant b's first POST with key '1' gets tenant a's job back",
        {"create": [("rec = self.keys.get((tenant, key))",
                     "rec = next((r for (t, k), r in self.keys.items() if k == key), None)")]}),
    "reused key with another body replays": (
        "the body's fingerprint is not compared: a different request with a reused key silently gets the "
        "old job instead of 422",
        {"create": [("if fp != fingerprint(body):", "if False:")]}),
    "offset pagination": (
        "the cursor is an offset into the newest-first list: an insert between pages repeats a job, a "
        "delete skips one",
        {"list": [("below = _decode_cursor(cursor) if cursor is not None else self.seq + 1",
                   "start = _decode_cursor(cursor) if cursor is not None else 0"),
                  ("mine = sorted((j for j in self.jobs.values() if j.tenant == tenant and j.seq < below),\n"
                   "key=lambda j: j.seq, reverse=True)",
                   "mine = sorted((j for j in self.jobs.values() if j.tenant == tenant),\n"
                   "              key=lambda j: j.seq, reverse=True)"),
                  ("page = mine[:n]", "page = mine[start:start + n]"),
                  ("nxt = _encode_cursor(page[-1].seq) if len(mine) > n else None",
                   "nxt = _encode_cursor(start + n) if len(mine) > start + n else None")]}),
    "synchronous cancel": (
        "cancel marks a running job cancelled at once while its worker still runs: the API reports a state "
        "the worker has not reached, and the worker's real outcome is lost",
        {"cancel": [('self._move(job, "cancelling")', 'job.state = "cancelled"')]}),
    "cancel overwrites a finished job": (
        "cancel of a job that already succeeded sets it cancelled: a terminal state changes and the result "
        "is hidden",
        {"cancel": [('elif job.state in ("succeeded", "failed"):\nreturn 409, job.view()',
                     'elif job.state in ("succeeded", "failed"):\n    job.state = "cancelled"')]}),
    "worker resurrects a cancelled job": (
        "the worker's start does not check the state: a job cancelled while queued is picked up and runs",
        {"worker_start": [('if job is None or job.state != "queued":\nreturn False\nself._move(job, "running")',
                           'if job is None:\n    return False\njob.state = "running"')]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return JobAPI
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(JobAPI, "Draft", f"Draft: {doc}.", **methods)


class Oracle:
    """The contract as a model: jobs by creation index, keys per tenant, walks' cursors."""

    MOVES = {"start": ({"queued"}, "running"), "stop": ({"cancelling"}, "cancelled")}

    def __init__(self, key_ttl_s: float):
        self.ttl = key_ttl_s
        self.jobs: list[dict] = []  # {"tenant", "state", "alive"}
        self.keys: dict[tuple[str, str], tuple[str, int, float]] = {}
        self.walks: dict[int, dict] = {}

    def create(self, tenant, body, key, now) -> tuple[int, int | None]:
        """(status, creation index of the job answered, or None)."""
        body_s = repr(sorted(body.items()))
        if key is not None and (tenant, key) in self.keys:
            b, k, exp = self.keys[(tenant, key)]
            if exp > now:
                return (201, k) if b == body_s else (422, None)
        self.jobs.append({"tenant": tenant, "state": "queued", "alive": True})
        if key is not None:
            self.keys[(tenant, key)] = (body_s, len(self.jobs) - 1, now + self.ttl)
        return 201, len(self.jobs) - 1

    def visible(self, tenant, k) -> bool:
        return self.jobs[k]["alive"] and self.jobs[k]["tenant"] == tenant

    def cancel(self, tenant, k) -> int:
        if not self.visible(tenant, k):
            return 404
        j = self.jobs[k]
        if j["state"] in ("succeeded", "failed"):
            return 409
        j["state"] = {"queued": "cancelled", "running": "cancelling"}.get(j["state"], j["state"])
        return 202

    def delete(self, tenant, k) -> int:
        if not self.visible(tenant, k):
            return 404
        if self.jobs[k]["state"] not in TERMINAL:
            return 409
        self.jobs[k]["alive"] = False
        return 204

    def worker(self, kind, k, ok=True) -> bool:
        j = self.jobs[k]
        if not j["alive"]:
            return False
        if kind == "finish":
            if j["state"] not in ("running", "cancelling"):
                return False
            j["state"] = "succeeded" if ok else "failed"
            return True
        frm, to = self.MOVES[kind]
        if j["state"] not in frm:
            return False
        j["state"] = to
        return True

    def live(self, tenant) -> list[int]:
        """Creation indices of the tenant's live jobs, newest first."""
        return [k for k in range(len(self.jobs) - 1, -1, -1) if self.visible(tenant, k)]


def run(factory: Callable, ops: Sequence) -> None:
    """Run ``ops`` on ``factory(key_ttl_s)`` and on the oracle; raise AssertionError at the first
    difference (module docstring)."""
    ops = list(ops)
    if not ops or ops[0][0] != "config":
        ops = [("config", 100.0)] + ops
    ttl = ops[0][1]
    api, oracle = factory(ttl), Oracle(ttl)
    ids: list[str] = []  # creation index -> the candidate's job id
    tenants: set[str] = set()
    last_now = 0.0
    for op in ops[1:]:
        kind = op[0]
        if kind == "create":
            _, tenant, body, key, now = op
            now = max(now, last_now)
            last_now = now
            tenants.add(tenant)
            status, got = api.create(tenant, dict(body), key, now)
            want, k = oracle.create(tenant, dict(body), key, now)
            if status != want:
                raise AssertionError(f"{op}: status {status}, expected {want}"
                                     + (" (a live key with a different body must be refused)" if want == 422 else
                                        " (a live key with the same body replays the same job)" if k is not None
                                        and k < len(ids) else ""))
            if k is not None:
                if k < len(ids):
                    if got.get("id") != ids[k]:
                        raise AssertionError(f"{op}: returned job {got.get('id')!r}; the key was first used for "
                                             f"{ids[k]!r}, so a retry must get that job, not a new one")
                else:
                    if got.get("id") in ids:
                        raise AssertionError(f"{op}: a new request got the existing job {got.get('id')!r}"
                                             " (no live key matches: is the key scoped to the tenant, and does "
                                             "it expire after its TTL?)")
                    ids.append(got["id"])
            continue
        if kind == "page":
            _, tenant, limit, walk = op
            tenants.add(tenant)
            w = oracle.walks.get(walk)
            if w is None:
                w = oracle.walks[walk] = {"tenant": tenant, "cursor": None, "below": None, "seen": [],
                                          "owed": set(oracle.live(tenant))}
            status, page = api.list(w["tenant"], limit, w["cursor"])
            if status != 200:
                raise AssertionError(f"{op}: status {status}, expected 200")
            got = [ids.index(it["id"]) if it["id"] in ids else -1 for it in page["items"]]
            live = oracle.live(w["tenant"])
            want = [k for k in live if w["below"] is None or k < w["below"]][:limit]
            again = [ids[k] for k in got if k in w["seen"]]
            if again:
                raise AssertionError(f"{op}: walk {walk} was shown {again} again (a repeat: the cursor moved "
                                     "with the rows, not with the data)")
            if got != want:
                raise AssertionError(f"{op}: page {[ids[k] if k >= 0 else '?' for k in got]}, expected the {limit} "
                                     f"newest live jobs below the cursor: {[ids[k] for k in want]}")
            w["seen"] += got
            if got:
                w["below"] = got[-1]
            w["cursor"] = page["next"]
            more = len([k for k in live if w["below"] is None or k < w["below"]]) > 0 and len(got) == limit
            if page["next"] is None:
                if more:
                    raise AssertionError(f"{op}: next is None but live jobs remain below the cursor")
                missed = [ids[k] for k in w["owed"] if oracle.jobs[k]["alive"] and k not in w["seen"]]
                if missed:
                    raise AssertionError(f"{op}: walk {walk} ended without showing {missed}, which existed "
                                         "throughout it (a skip)")
                del oracle.walks[walk]
            elif not got:
                raise AssertionError(f"{op}: an empty page with a next cursor: the walk never ends")
            continue
        k = op[-1] if kind in ("start", "stop") else (op[1] if kind == "finish" else op[2])
        if not 0 <= k < len(ids):
            continue  # the program (shrunk) refers to a job it never created
        if kind in ("get", "cancel", "delete"):
            tenant = op[1]
            status, body = getattr(api, kind)(tenant, ids[k])
            before = oracle.jobs[k]["state"]
            want = 200 if kind == "get" and oracle.visible(tenant, k) else 404 if kind == "get" else \
                oracle.cancel(tenant, k) if kind == "cancel" else oracle.delete(tenant, k)
            if status != want:
                why = {409: f"the job is {before}", 404: "absent or another tenant's", 202: f"the job is {before}",
                       204: f"the job is {before}", 200: "the job is live"}[want]
                raise AssertionError(f"{op}: status {status}, expected {want} ({why})")
            if kind == "cancel" and want == 202 and body.get("state") != oracle.jobs[k]["state"]:
                raise AssertionError(f"{op}: cancel of a {before} job answered state {body.get('state')!r}, expected "
                                     f"{oracle.jobs[k]['state']!r} (a running job is only cancelling until its "
                                     "worker stops)")
        else:
            got = (api.worker_finish(ids[k], op[2]) if kind == "finish" else
                   getattr(api, f"worker_{kind}")(ids[k]))
            before = oracle.jobs[k]["state"]
            want = oracle.worker(kind, k, op[2] if kind == "finish" else True)
            if bool(got) != want:
                raise AssertionError(f"{op}: worker_{kind} returned {got} on a {before} job, expected {want}")
        for t in sorted(tenants):  # every live job reads back in the model's state; nothing extra exists
            for j in range(len(ids)):
                status, body = api.get(t, ids[j])
                if oracle.visible(t, j):
                    if status != 200 or body.get("state") != oracle.jobs[j]["state"]:
                        raise AssertionError(f"after {op}: GET {ids[j]} as {t!r} gave {status} "
                                             f"{body.get('state') if body else None!r}, expected 200 "
                                             f"{oracle.jobs[j]['state']!r}")
                elif status != 404:
                    raise AssertionError(f"after {op}: GET {ids[j]} as {t!r} gave {status}, expected 404")
    for t in sorted(tenants):
        status, page = api.list(t, 1000, None)
        have = sorted(it["id"] for it in page["items"])
        want = sorted(ids[k] for k in oracle.live(t))
        if have != want:
            extra = sorted(set(have) - set(want))
            raise AssertionError(f"at the end, tenant {t!r} lists {len(have)} jobs, the model {len(want)}"
                                 + (f": extra {extra} (a duplicate from a retried POST?)" if extra else ""))


def random_ops(seed: int, n: int = 50, tenants: int = 2, ttl: float = 30.0) -> tuple:
    """A random interleaving: creates (retries with the same key, keys reused with other bodies, no
    key, keys outliving the TTL), worker moves, cancels, deletes, gets and interleaved page walks."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = [("config", ttl)]
    now, made = 0.0, 0
    names = [chr(ord("a") + i) for i in range(tenants)]
    for _ in range(n):
        r = rng.random()
        t = names[int(rng.integers(tenants))]
        now += float(rng.choice([0.0, 1.0, 5.0, ttl]))  # sometimes a jump past the key's TTL
        if r < 0.3 or made == 0:
            key = None if rng.random() < 0.15 else str(int(rng.integers(4)))
            ops.append(("create", t, (("task", int(rng.integers(3))),), key, now))
            made += 1
        elif r < 0.55:
            k = int(rng.integers(made))
            kind = str(rng.choice(["start", "start", "finish", "stop"]))
            ops.append(("finish", k, bool(rng.random() < 0.8)) if kind == "finish" else (kind, k))
        elif r < 0.7:
            ops.append(("cancel", t, int(rng.integers(made))))
        elif r < 0.78:
            ops.append(("delete", t, int(rng.integers(made))))
        elif r < 0.83:
            ops.append(("get", t, int(rng.integers(made))))
        else:
            ops.append(("page", t, int(rng.integers(1, 4)), int(rng.integers(2))))
    return tuple((op[0], op[1], dict(op[2]), *op[3:]) if op[0] == "create" else op for op in ops)


def _create(t, task, key, now=0.0):
    return ("create", t, {"task": task}, key, now)


def cases() -> list[Case]:
    """Hand-made cases (each shows one classic defect), then random interleavings."""
    c = ("config", 100.0)
    return [
        Case("create, read, list", (c, _create("a", 1, "k1"), ("get", "a", 0), ("page", "a", 5, 0))),
        Case("a retried POST with the same key", (c, _create("a", 1, "k1"), _create("a", 1, "k1", 1.0),
                                                  ("page", "a", 10, 0))),
        Case("the same key from two tenants", (c, _create("a", 1, "1"), _create("b", 1, "1"), ("get", "b", 1))),
        Case("a reused key with another body", (c, _create("a", 1, "k"), _create("a", 2, "k"))),
        Case("a key past its TTL", (c, _create("a", 1, "k"), _create("a", 1, "k", 150.0), ("page", "a", 10, 0))),
        Case("cancel a queued job, then the worker picks it", (c, _create("a", 1, "k"), ("cancel", "a", 0),
                                                              ("start", 0), ("get", "a", 0))),
        Case("cancel a running job", (c, _create("a", 1, "k"), ("start", 0), ("cancel", "a", 0), ("stop", 0),
                                      ("get", "a", 0))),
        Case("cancel loses the race to the finish", (c, _create("a", 1, "k"), ("start", 0), ("cancel", "a", 0),
                                                     ("finish", 0, True), ("cancel", "a", 0), ("get", "a", 0))),
        Case("cancel a finished job", (c, _create("a", 1, "k"), ("start", 0), ("finish", 0, True),
                                       ("cancel", "a", 0))),
        Case("an insert between pages", (c, *[_create("a", i, f"k{i}") for i in range(5)], ("page", "a", 2, 0),
                                         _create("a", 9, "k9"), ("page", "a", 2, 0), ("page", "a", 2, 0))),
        Case("a delete between pages", (c, *[_create("a", i, f"k{i}") for i in range(5)],
                                        *[op for i in range(5) for op in (("start", i), ("finish", i, True))],
                                        ("page", "a", 2, 0), ("delete", "a", 4), ("page", "a", 2, 0),
                                        ("page", "a", 2, 0))),
        *[Case(f"random interleaving {k}", random_ops(k)) for k in range(16)],
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {op}" for op in ops)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first
    failing program, shrunk (a program shrunk past its config line runs with a 100 s key TTL)."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
