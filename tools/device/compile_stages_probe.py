"""A follow-up to measure_h200.py's compile_stages section: which kernels each torch.compile stage launches,
what a CUDA-graph replay copies when the weights are closure tensors, and the host cost of a compiled call.

    python3 tools/device/compile_stages_probe.py      # writes $OUT/compile_probe.json, prints it

Not part of the book or its tests (CI has no GPU). Same block, sizes and timing rules as measure_h200.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
import traceback

import torch

OUT = pathlib.Path(os.environ.get("OUT", "/tmp/probe_out"))
OUT.mkdir(parents=True, exist_ok=True)
DEV = torch.device("cuda")
R: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__}


def save():
    (OUT / "compile_probe.json").write_text(json.dumps(R, indent=1, default=str))


def wall_per_call(fn, x, n=300, step=False):
    for _ in range(10):
        if step:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        if step:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def kernels(fn, x, step=False):
    """(name, device microseconds) of every GPU event of one call, in order."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        if step:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if step:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x)
        torch.cuda.synchronize()
    return [(e.name[:90], round(e.device_time, 2)) for e in prof.events() if e.device_type.name == "CUDA"]


d, f, batch = 4096, 14336, 8
w1 = torch.randn(f, d, device=DEV, dtype=torch.bfloat16) * 0.02
w3 = torch.randn(f, d, device=DEV, dtype=torch.bfloat16) * 0.02
w2 = torch.randn(d, f, device=DEV, dtype=torch.bfloat16) * 0.02
g = torch.ones(d, device=DEV, dtype=torch.bfloat16)


def block(x):
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g
    u = torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)
    return x + u @ w2.T


def block_with_break(x):
    h = x.float()
    scale = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    if float(scale.max()) > 1e6:
        scale = scale.clamp(max=1e6)
    h = (h * scale).to(x.dtype) * g
    u = torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)
    return x + u @ w2.T


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2, self.g = (torch.nn.Parameter(t, requires_grad=False) for t in (w1, w3, w2, g))

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.g
        u = torch.nn.functional.silu(h @ self.w1.T) * (h @ self.w3.T)
        return x + u @ self.w2.T


x = torch.randn(batch, d, device=DEV, dtype=torch.bfloat16)
mod = Block()
cases = [
    ("eager", lambda: block, False),
    ("inductor_closure", lambda: torch.compile(block), False),
    ("inductor_module", lambda: torch.compile(mod), False),
    ("cudagraphs_closure", lambda: torch.compile(block, mode="reduce-overhead"), True),
    ("cudagraphs_module", lambda: torch.compile(mod, mode="reduce-overhead"), True),
    ("cudagraphs_closure_static", None, True),
    ("graph_break", lambda: torch.compile(block_with_break), False),
]
ONLY = os.environ.get("CASES")
for name, make, step in cases:
    if ONLY and name not in ONLY.split(","):
        continue
    torch._dynamo.reset()
    row = {}
    try:
        if name == "cudagraphs_closure_static":
            for t in (w1, w3, w2, g):
                torch._dynamo.mark_static_address(t)
            fn = torch.compile(block, mode="reduce-overhead")
        else:
            fn = make()
        t0 = time.perf_counter()
        if step:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x)
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        row["wall_s_per_call"] = [wall_per_call(fn, x, step=step) for _ in range(3)]
        row["events"] = kernels(fn, x, step=step)
    except Exception:  # noqa: BLE001
        row["error"] = traceback.format_exc(limit=3)[-600:]
    R[name] = row
    save()
    print(name, {k: v for k, v in row.items() if k != "events"}, flush=True)

if ONLY:
    raise SystemExit(0)
# the host cost of entering a compiled function: a one-element add, eager against compiled
torch._dynamo.reset()
t1 = torch.ones(1, device=DEV)


def tiny(a):
    return a + 1


row = {}
for name, fn in (("eager", tiny), ("compiled_inductor", torch.compile(tiny)),
                 ("compiled_eager_backend", torch.compile(tiny, backend="eager"))):
    row[name] = [wall_per_call(fn, t1, n=2000) for _ in range(3)]
R["tiny_call_s"] = row
R["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
save()
print(json.dumps(R, default=str)[:11000])
