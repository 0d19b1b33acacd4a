"""A job API that stays correct under retries, cancels and concurrent inserts (N075 job-api).

Four resources::

    POST   /v1/jobs                 create (header Idempotency-Key)     201, or 422 on a reused key
    GET    /v1/jobs/{id}            read one job                        200 / 404
    POST   /v1/jobs/{id}/cancel     ask for cancellation                202 / 409 / 404
    GET    /v1/jobs?limit&cursor    list, newest first, keyset cursor   200 (items, next)

(plus ``DELETE /v1/jobs/{id}`` of a finished job, 204, which is what makes offset pagination skip).

The state machine (:data:`TRANSITIONS`)::

    queued --worker_start--> running --worker_finish--> succeeded | failed
    queued --cancel--> cancelled
    running --cancel--> cancelling --worker_stop--> cancelled
                                  \\--worker_finish--> succeeded | failed (the work won the race)

Terminal states never change. Three semantics:

* **Idempotency key**: a create carries a client key; the server keeps ``(tenant, key) ->
  (fingerprint of the body, job id)`` for ``key_ttl_s``. A retry with the same key and body gets
  the same job (status 201, the job's current state), never a second job; the same key with a
  different body is refused (422). The record and the job are written in one step (one
  transaction), so a crash cannot leave a key without its job.
* **Cancel is 202**: the API records the intent and returns at once. A queued job is cancelled
  there and then; a running one becomes ``cancelling`` until its worker reaches a step boundary and
  stops (``worker_stop``), or finishes first. Waiting for that inside the request would hold it for
  a step to a whole drain (:func:`cancel_lag_s`).
* **Keyset cursor**: a page is the ``limit`` newest jobs with a creation sequence below the cursor;
  the cursor is that sequence, opaque to the client. Inserts land above every cursor already handed
  out and deletes remove rows without shifting the others, so a walk never repeats or skips a job
  that existed throughout it. Offset pagination (:func:`offset_walk_anomalies`) does both.

Everything is in memory and single-threaded: each method is one atomic step; concurrency is an
interleaving of steps from many clients and workers, which is what the property tests draw.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["JobAPI", "STATES", "TERMINAL", "TRANSITIONS", "cancel_lag_s", "duplicates_without_keys",
           "expected_duplicates", "fingerprint", "offset_anomalies_closed_form",
           "offset_walk_anomalies"]

STATES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
TRANSITIONS = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"cancelling", "succeeded", "failed"}),
    "cancelling": frozenset({"cancelled", "succeeded", "failed"}),
    "succeeded": frozenset(), "failed": frozenset(), "cancelled": frozenset(),
}


def fingerprint(body: dict) -> str:
    """SHA-256 of the body's canonical JSON (sorted keys): what a reused key is compared on."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{seq}".encode()).decode()


def _decode_cursor(cursor: str) -> int:
    try:
        tag, seq = base64.urlsafe_b64decode(cursor.encode()).decode().split(":")
        if tag != "v1":
            raise ValueError
        return int(seq)
    except Exception as err:  # a client-made or stale-format cursor
        raise ValueError(f"cursor {cursor!r} is not a cursor this API issued") from err


@dataclass
class _Job:
    id: str
    tenant: str
    seq: int
    body: dict
    state: str = "queued"

    def view(self) -> dict:
        return {"id": self.id, "state": self.state}


class JobAPI:
    """The reference implementation (module docstring). Responses are ``(status, body)``."""

    def __init__(self, key_ttl_s: float = 86400.0):
        self.key_ttl_s = real("key_ttl_s", key_ttl_s, 0, low_open=True, unit="s")
        self.jobs: dict[str, _Job] = {}
        self.keys: dict[tuple[str, str], tuple[str, str, float]] = {}  # (tenant, key) -> (fingerprint, id, expiry)
        self.seq = 0
        self.transitions: list[tuple[str, str, str]] = []  # (job id, from, to): the audit log

    # ---- the HTTP surface ------------------------------------------------------------------
    def create(self, tenant: str, body: dict, key: str | None = None, now: float = 0.0) -> tuple[int, dict]:
        """POST /v1/jobs: 201 and the job; a live key with the same body: 201 and the same job;
        a live key with another body: 422."""
        if key is not None:
            rec = self.keys.get((tenant, key))
            if rec is not None and rec[2] > now:
                fp, job_id, _ = rec
                if fp != fingerprint(body):
                    return 422, {"error": "idempotency key reused with a different body"}
                return 201, self.jobs[job_id].view() if job_id in self.jobs else {"id": job_id, "state": "deleted"}
        self.seq += 1
        job = _Job(f"job-{self.seq}", tenant, self.seq, dict(body))
        self.jobs[job.id] = job
        if key is not None:
            self.keys[(tenant, key)] = (fingerprint(body), job.id, now + self.key_ttl_s)
        return 201, job.view()

    def get(self, tenant: str, job_id: str) -> tuple[int, dict | None]:
        """GET /v1/jobs/{id}: 200, or 404 (also for another tenant's job: no existence leak)."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return 404, None
        return 200, job.view()

    def cancel(self, tenant: str, job_id: str) -> tuple[int, dict | None]:
        """POST /v1/jobs/{id}/cancel: 202 with the state now (queued -> cancelled, running ->
        cancelling; cancelling or cancelled: unchanged, the retry is harmless); 409 once it
        succeeded or failed; 404 if absent."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return 404, None
        if job.state == "queued":
            self._move(job, "cancelled")
        elif job.state == "running":
            self._move(job, "cancelling")
        elif job.state in ("succeeded", "failed"):
            return 409, job.view()
        return 202, job.view()

    def delete(self, tenant: str, job_id: str) -> tuple[int, None]:
        """DELETE /v1/jobs/{id}: 204 for a finished job, 409 while it can still change, 404 if absent."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return 404, None
        if job.state not in TERMINAL:
            return 409, None
        del self.jobs[job_id]
        return 204, None

    def list(self, tenant: str, limit: int, cursor: str | None = None) -> tuple[int, dict]:
        """GET /v1/jobs: the ``limit`` newest of ``tenant``'s jobs created before the cursor, and the
        next cursor (None on the last page). 400 on a bad limit or cursor."""
        try:
            n = integer("limit", limit, 1, 1000)
            below = _decode_cursor(cursor) if cursor is not None else self.seq + 1
        except ValueError as err:
            return 400, {"error": str(err)}
        mine = sorted((j for j in self.jobs.values() if j.tenant == tenant and j.seq < below),
                      key=lambda j: j.seq, reverse=True)
        page = mine[:n]
        nxt = _encode_cursor(page[-1].seq) if len(mine) > n else None
        return 200, {"items": [j.view() for j in page], "next": nxt}

    # ---- the worker side (not HTTP: the queue consumer reports progress) ----------------------
    def worker_start(self, job_id: str) -> bool:
        """A worker picked the job: queued -> running. False (nothing changes) if it was cancelled
        (or deleted) meanwhile: the worker must drop it."""
        job = self.jobs.get(job_id)
        if job is None or job.state != "queued":
            return False
        self._move(job, "running")
        return True

    def worker_finish(self, job_id: str, ok: bool) -> bool:
        """The work ended: running or cancelling -> succeeded / failed. False if it was not running."""
        job = self.jobs.get(job_id)
        if job is None or job.state not in ("running", "cancelling"):
            return False
        self._move(job, "succeeded" if ok else "failed")
        return True

    def worker_stop(self, job_id: str) -> bool:
        """The worker saw the cancel at a step boundary and stopped: cancelling -> cancelled."""
        job = self.jobs.get(job_id)
        if job is None or job.state != "cancelling":
            return False
        self._move(job, "cancelled")
        return True

    def expire_keys(self, now: float) -> int:
        """Drop idempotency records past their TTL; the number dropped."""
        dead = [k for k, rec in self.keys.items() if rec[2] <= now]
        for k in dead:
            del self.keys[k]
        return len(dead)

    def _move(self, job: _Job, to: str) -> None:
        if to not in TRANSITIONS[job.state]:
            raise AssertionError(f"illegal transition {job.state} -> {to} for {job.id}")
        self.transitions.append((job.id, job.state, to))
        job.state = to


# ---- the arithmetic the page prices ---------------------------------------------------------


def expected_duplicates(p_lost: float, max_retries: int) -> float:
    """Extra jobs per submission without a key when each attempt reaches the server, but its
    response is lost with probability ``p_lost`` and the client retries up to ``max_retries``
    times: E[attempts] - 1 = sum_{k=1..R} p^k = p (1 - p^R) / (1 - p)."""
    p = real("p_lost", p_lost, 0, 1, high_open=True)
    r = integer("max_retries", max_retries, 0)
    return sum(p ** k for k in range(1, r + 1))


def duplicates_without_keys(api_factory, n_submits: int, p_lost: float, max_retries: int, seed: int,
                            use_keys: bool) -> tuple[int, int]:
    """Simulate ``n_submits`` submissions through ``api_factory()`` with lost responses and retries;
    return (jobs created, submissions). With ``use_keys`` each submission sends one key on every try."""
    import numpy as np

    rng = np.random.default_rng(integer("seed", seed, 0))
    api = api_factory()
    for i in range(integer("n_submits", n_submits, 1)):
        body = {"prompt_set": f"batch-{i}", "model": "m"}
        for _ in range(max_retries + 1):
            api.create("t", body, f"k-{i}" if use_keys else None, now=float(i))
            if rng.random() >= p_lost:  # the response arrived: the client stops retrying
                break
    return len(api.jobs), n_submits


def _walk_bounds(page: int, inserts: int, deletes: int) -> None:
    if inserts >= page:
        raise ValueError(f"inserts_per_page must be below the page size {page} (else an offset walk never ends), "
                         f"got {inserts}")
    if deletes > page:
        raise ValueError(f"deletes_per_page must be at most the page size {page}, got {deletes}")


def offset_anomalies_closed_form(n_items: int, page: int, inserts_per_page: int, deletes_per_page: int) -> int:
    """Repeats (net shift s = inserts - deletes > 0) or skips (s < 0) of an offset walk, by arithmetic.

    Rows shift by s at each boundary. After page k (from 0) rows remain, so the walk goes on, while
    n + k s > (k + 1) page: it crosses F = ceil((n - page) / (page - s)) boundaries (0 if n <= page). A shift s > 0 brings back the page's last s rows (s repeats at
    each); s < 0 carries min(|s|, rows left) past the offset unseen at boundary j:
    left_j = n + (j - 1) s - j page."""
    n = integer("n_items", n_items, 1)
    size = integer("page", page, 1)
    ins = integer("inserts_per_page", inserts_per_page, 0)
    dels = integer("deletes_per_page", deletes_per_page, 0)
    _walk_bounds(size, ins, dels)
    s = ins - dels
    full = -(-(n - size) // (size - s)) if n > size else 0
    if s >= 0:
        return s * full
    return sum(min(-s, max(0, n + (j - 1) * s - j * size)) for j in range(1, full + 1))


def offset_walk_anomalies(n_items: int, page: int, inserts_per_page: int, deletes_per_page: int) -> dict:
    """Walk a newest-first list by offset while, between page reads, ``inserts_per_page`` new rows
    arrive at the top and ``deletes_per_page`` already-seen rows are deleted; and walk it by keyset.

    Returns counts of repeats and skips for each, found by replaying the walk on a list (no formula).
    An insert above the offset shifts every row down one: the last row of the page just read comes
    back as the first of the next (a repeat). A delete of a row above the offset shifts rows up: the
    next page starts one row late (a skip)."""
    n = integer("n_items", n_items, 1)
    size = integer("page", page, 1)
    ins = integer("inserts_per_page", inserts_per_page, 0)
    dels = integer("deletes_per_page", deletes_per_page, 0)
    _walk_bounds(size, ins, dels)

    def walk(keyset: bool) -> tuple[int, int, int]:
        rows = list(range(n, 0, -1))  # newest first; values are creation sequences
        original = set(rows)
        top = n
        seen: list[int] = []
        offset, cursor = 0, None
        while True:
            if keyset:
                below = [r for r in rows if cursor is None or r < cursor]
                got = below[:size]
            else:
                got = rows[offset:offset + size]
            if not got:
                break
            seen += got
            offset += len(got)
            cursor = got[-1]
            if (not any(r < cursor for r in rows)) if keyset else offset >= len(rows):
                break  # nothing left after this page: the API answers next = None
            for _ in range(ins):  # new rows at the top
                top += 1
                rows.insert(0, top)
            seen_set = set(seen)
            victims = [r for r in rows if r in seen_set][:dels]  # finished jobs the user already saw
            for v in victims:
                rows.remove(v)
                original.discard(v)  # deleted before the end: not owed to the walk
        repeats = len(seen) - len(set(seen))
        skipped = len(original - set(seen))
        return repeats, skipped, len(seen)

    rep_o, skip_o, read_o = walk(False)
    rep_k, skip_k, read_k = walk(True)
    return {"offset_repeats": rep_o, "offset_skips": skip_o, "offset_rows_read": read_o,
            "keyset_repeats": rep_k, "keyset_skips": skip_k, "keyset_rows_read": read_k}


def cancel_lag_s(dep, prompt_len: int, output_len: int, tpot_target_s: float) -> dict:
    """How long a running LLM job takes to stop after a cancel, from :func:`lib.fleet.capacity.request_cost`:
    aborting at the next engine step waits at most one prefill of ``prompt_len`` (the longest
    step, unless it is chunked) or one decode step; draining the in-flight requests waits for their
    remaining output, up to ``output_len`` x TPOT."""
    from lib.fleet.capacity import request_cost

    cost = request_cost(dep, prompt_len, output_len, tpot_target_s)
    return {"abort_s": max(cost.prefill_s, cost.decode_step_s), "decode_step_s": cost.decode_step_s,
            "prefill_s": cost.prefill_s, "drain_s": output_len * cost.decode_step_s, "batch": cost.batch}
