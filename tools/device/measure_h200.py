"""Measure the GPU facts the CUDA-kernels pages otherwise take as assumptions; run on a lent GPU machine.

    python3 tools/device/measure_h200.py            # writes $OUT/measurements.json, prints a summary

Not part of the book or its tests (CI has no GPU). Every section is independent: one that fails records its
error and the rest still run; results are written after each section, so a run cut short keeps what it measured.
Methods (the device notes' rules): CUDA events around the timed region, warm-up first, median of repeats,
random data (never zeros), working sets several times the L2 where HBM is meant, outputs checked against a
reference before a GEMM is timed. The card's clocks and settings are left as found; nvidia-smi's clock report
is recorded before and after.
"""

# ruff: noqa: B023 - every closure over a loop variable is timed inside that iteration
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import traceback

import torch

OUT = pathlib.Path(os.environ.get("OUT", "/tmp/measure_out"))
OUT.mkdir(parents=True, exist_ok=True)
HERE = pathlib.Path(__file__).resolve().parent
DEV = torch.device("cuda")
RESULTS: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
MiB = 2**20


def save() -> None:
    (OUT / "measurements.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def section(fn):
    """Run one measurement; store its dict (or its error) under the function's name; save."""
    t0 = time.perf_counter()
    try:
        RESULTS[fn.__name__] = fn()
    except Exception:  # noqa: BLE001 - a failed section must not stop the others
        RESULTS[fn.__name__] = {"error": traceback.format_exc(limit=4)}
    RESULTS.setdefault("section_seconds", {})[fn.__name__] = round(time.perf_counter() - t0, 2)
    print(f"[{fn.__name__}] {time.perf_counter() - t0:.1f} s", flush=True)
    save()
    return fn


def time_s(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median seconds of `fn` between CUDA events over `reps` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in ev)
    return ts[len(ts) // 2] * 1e-3


def time_graph_s(fn, calls: int = 20, reps: int = 10) -> float:
    """Median seconds per call of `fn`, `calls` calls captured in one CUDA graph and replayed (no launch gaps)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return time_s(g.replay, reps=reps) / calls


def nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True,
                              text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"error: {exc}"


CLOCKS = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu"

_cp = None
_modules: dict = {}


def module(unroll: int = 4):
    """The kernels of kernels.cu compiled with NVRTC for this GPU (one module per UNROLL)."""
    global _cp
    if _cp is None:
        import cupy
        _cp = cupy
    if unroll not in _modules:
        src = (HERE / "kernels.cu").read_text()
        _modules[unroll] = _cp.RawModule(code=src, options=("-std=c++17", f"-DUNROLL={unroll}"))
    return _modules[unroll]


def launch(kernel, grid, block, *args, smem: int = 0):
    kernel(grid, block, args, shared_mem=smem)


def ptr(t: torch.Tensor):
    return _cp.asarray(t) if t is not None else None


@section
def properties():
    p = torch.cuda.get_device_properties(0)
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "name": p.name,
           "multi_processor_count": p.multi_processor_count, "total_memory": p.total_memory,
           "L2_cache_size": getattr(p, "L2_cache_size", None), "major": p.major, "minor": p.minor,
           "nvidia_smi_before": nvidia_smi(CLOCKS)}
    module()
    rt = _cp.cuda.runtime
    attrs = {"persistingL2CacheMaxSize": 108, "accessPolicyMaxWindowSize": 109, "l2CacheSize": 38,
             "clockRate_kHz": 13, "memoryClockRate_kHz": 36, "globalMemoryBusWidth": 37,
             "maxSharedMemoryPerMultiprocessor": 81, "maxSharedMemoryPerBlockOptin": 97,
             "maxRegistersPerMultiprocessor": 82, "maxThreadsPerMultiProcessor": 39,
             "maxBlocksPerMultiprocessor": 106, "reservedSharedMemoryPerBlock": 111, "multiProcessorCount": 16}
    for name, code in attrs.items():
        try:
            out[name] = rt.deviceGetAttribute(code, 0)
        except Exception as exc:  # noqa: BLE001
            out[name] = f"error: {exc}"
    return out


@section
def pointer_chase():
    """Unloaded latency: ns per dependent load over a random cycle of 256-byte-spaced slots.

    "cold": one pass over slots no earlier run touched (each load misses the L2 unless the buffer fits there and
    was read before); "warm": the same buffer after one full traversal (what a buffer that fits the L2 gives).
    """
    chase = module().get_function("chase")
    out = {}
    steps = 20000
    for size_mib in (4, 16, 32, 48, 256, 2048):
        slots = size_mib * MiB // 256
        stride = 256 // 8
        nxt = torch.zeros(slots * stride, dtype=torch.int64, device=DEV)
        perm = torch.randperm(slots, device=DEV)
        nxt[perm * stride] = torch.roll(perm, -1) * stride
        res = torch.zeros(1, dtype=torch.int64, device=DEV)
        row = {}
        if slots >= 8 * steps:  # cold: each timed run starts on its own stretch of the cycle
            starts = [int(perm[j * (slots // 6)]) * stride for j in range(6)]
            launch(chase, (1,), (1,), ptr(nxt), _cp.uint64(starts[0]), _cp.int64(100), ptr(res))
            ts = []
            for st in starts[1:]:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                launch(chase, (1,), (1,), ptr(nxt), _cp.uint64(st), _cp.int64(steps), ptr(res))
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e-3)
            row["cold_ns_per_load"] = sorted(ts)[len(ts) // 2] / steps * 1e9
        else:  # fits in L2 after one traversal: warm it, then time
            launch(chase, (1,), (1,), ptr(nxt), _cp.uint64(0), _cp.int64(slots), ptr(res))
            t = time_s(lambda: launch(chase, (1,), (1,), ptr(nxt), _cp.uint64(0), _cp.int64(steps), ptr(res)),
                       reps=5, warmup=1)
            row["warm_ns_per_load"] = t / steps * 1e9
        out[f"{size_mib}MiB"] = row
    return out


def read_time(x: torch.Tensor, unroll: int, blocks: int, threads: int, passes: int = 1) -> float:
    k = module(unroll).get_function("read_stream")
    n = x.numel() // 4  # int32 -> int4
    res = torch.zeros(1, dtype=torch.int32, device=DEV)
    return time_s(lambda: launch(k, (blocks,), (threads,), ptr(x), _cp.int64(n), _cp.int32(passes), ptr(res)),
                  reps=7, warmup=2)


@section
def bytes_in_flight():
    """HBM read bandwidth against bytes in flight per SM (Little's law), 1 GiB buffer read once."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randint(-2**31, 2**31 - 1, (256 * MiB,), dtype=torch.int32, device=DEV)  # 1 GiB
    rows = []
    for warps_per_sm, threads, blocks_per_sm in ((1, 32, 1), (2, 64, 1), (4, 128, 1), (8, 256, 1), (16, 256, 2),
                                                 (32, 256, 4), (64, 256, 8)):
        for unroll in (1, 2, 4):  # the SASS of UNROLL=8 issues 4 loads before the first use: not 8 in flight
            t = read_time(x, unroll, sms * blocks_per_sm, threads)
            rows.append({"warps_per_sm": warps_per_sm, "unroll": unroll,
                         "bytes_in_flight_per_sm": warps_per_sm * 32 * 16 * unroll,
                         "read_GBps": x.numel() * 4 / t / 1e9})
    return {"buffer_bytes": x.numel() * 4, "sms": sms, "rows": rows}


@section
def copy_bandwidth():
    """Device-to-device copy of 2 GiB (bytes read + written) and torch's sum of 2 GiB (bytes read)."""
    a = torch.randn(512 * MiB, device=DEV)
    b = torch.empty_like(a)
    t_copy = time_s(lambda: b.copy_(a), reps=10)
    t_sum = time_s(lambda: a.sum(), reps=10)
    return {"copy_GBps_read_plus_write": 2 * a.numel() * 4 / t_copy / 1e9, "sum_read_GBps": a.numel() * 4 / t_sum / 1e9}


@section
def launch_overhead():
    """Per-kernel cost of tiny kernels: eager launches from Python, and the same kernels replayed from a CUDA graph."""
    x = torch.zeros(1, device=DEV)
    n = 2000
    def eager():
        for _ in range(n):
            x.add_(1.0)
    eager()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    eager()
    torch.cuda.synchronize()
    eager_s = (time.perf_counter() - t0) / n
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1.0)
    graph_s = time_s(g.replay, reps=10) / n
    empty = module().get_function("empty_kernel")
    def raw():
        for _ in range(n):
            launch(empty, (1,), (32,))
    raw()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    raw()
    torch.cuda.synchronize()
    raw_s = (time.perf_counter() - t0) / n
    return {"torch_eager_add_s": eager_s, "cuda_graph_add_s": graph_s, "cupy_empty_launch_s": raw_s, "kernels": n}


@section
def gemv():
    """Decode GEMMs y = x W^T in bf16 (torch / cuBLAS) against batch; weights rotated so they are read from HBM."""
    rows = []
    for n, k in ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (128256, 4096)):
        w_bytes = n * k * 2
        copies = max(1, -(-400 * MiB // w_bytes))
        ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(copies)]
        for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            x = torch.randn(batch, k, device=DEV, dtype=torch.bfloat16)
            i = [0]
            def step():
                i[0] = (i[0] + 1) % copies
                return x @ ws[i[0]].T
            t = time_graph_s(step, calls=2 * copies if copies > 1 else 10)
            rows.append({"n": n, "k": k, "batch": batch, "s": t, "weight_GBps": w_bytes / t / 1e9,
                         "TFLOPs": 2 * batch * n * k / t / 1e12})
        # same shape, one weight reused (L2-resident when it fits): what a careless benchmark reports
        x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
        t_hot = time_graph_s(lambda: x @ ws[0].T)
        t_events = time_s(lambda: x @ ws[0].T, reps=21)
        rows.append({"n": n, "k": k, "batch": 1, "s": t_events, "weight_GBps": w_bytes / t_events / 1e9,
                     "hot": True, "timed": "events around each call, no graph"})
        rows.append({"n": n, "k": k, "batch": 1, "s": t_hot, "weight_GBps": w_bytes / t_hot / 1e9, "hot": True})
    return {"rows": rows}


@section
def gemm_torch():
    """Large GEMMs through torch (cuBLAS): bf16, fp32 with and without TF32; and an M sweep at N = K = 8192."""
    out = {}
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    out["bf16_8192_TFLOPs"] = 2 * 8192**3 / time_s(lambda: a @ b) / 1e12
    af, bf = a.float()[:4096, :4096].contiguous(), b.float()[:4096, :4096].contiguous()
    torch.backends.cuda.matmul.allow_tf32 = False
    out["fp32_4096_TFLOPs"] = 2 * 4096**3 / time_s(lambda: af @ bf) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = True
    out["tf32_4096_TFLOPs"] = 2 * 4096**3 / time_s(lambda: af @ bf) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    sweep = []
    for m in (128, 256, 512, 1024, 2048, 4096, 4224, 4352, 6144, 8192, 8320, 8448, 16384):
        x = torch.randn(m, 8192, device=DEV, dtype=torch.bfloat16)
        t = time_graph_s(lambda: x @ b, calls=10)
        sweep.append({"m": m, "s": t, "TFLOPs": 2 * m * 8192 * 8192 / t / 1e12})
    out["m_sweep_n8192_k8192"] = sweep
    return out


@section
def sgemm_steps():
    """fp32 GEMM 4096^3: the hand-written steps of kernels.cu against cuBLAS fp32 (no TF32) and bf16."""
    m = n = k = 4096
    a = torch.randn(m, k, device=DEV)
    b = torch.randn(k, n, device=DEV)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = a.double() @ b.double()
    mod = module()
    cfg = {
        "naive_rows": (((m + 31) // 32, (n + 7) // 8), (32, 8)),
        "naive_cols": (((n + 31) // 32, (m + 7) // 8), (32, 8)),
        "smem": (((n + 31) // 32, (m + 31) // 32), (32, 32)),
        "reg2d": ((n // 128, m // 128), (256,)),
        "reg2d_vec": ((n // 128, m // 128), (256,)),
    }
    out = {}
    for name, (grid, block) in cfg.items():
        kern = mod.get_function(f"sgemm_{name}")
        c = torch.full((m, n), float("nan"), device=DEV)
        def run():
            launch(kern, grid, block, _cp.int32(m), _cp.int32(n), _cp.int32(k), ptr(a), ptr(b), ptr(c))
        run()
        torch.cuda.synchronize()
        err = float((c.double() - ref).norm() / ref.norm())
        reps = 3 if name.startswith("naive") else 10
        t = time_s(run, reps=reps, warmup=1)
        out[name] = {"s": t, "TFLOPs": 2 * m * n * k / t / 1e12, "rel_err": err,
                     "registers": kern.num_regs, "smem_bytes": kern.shared_size_bytes}
    t = time_s(lambda: a @ b)
    out["cublas_fp32"] = {"s": t, "TFLOPs": 2 * m * n * k / t / 1e12,
                          "rel_err": float(((a @ b).double() - ref).norm() / ref.norm())}
    ah, bh = a.bfloat16(), b.bfloat16()
    t = time_s(lambda: ah @ bh)
    out["cublas_bf16"] = {"s": t, "TFLOPs": 2 * m * n * k / t / 1e12,
                          "rel_err": float(((ah @ bh).double() - ref).norm() / ref.norm())}
    return out


@section
def triton_tiles():
    """A plain Triton bf16 GEMM 8192^3 at several output-tile shapes: TFLOP/s, registers, spills, shared memory."""
    import triton
    import triton.language as tl

    @triton.jit
    def mm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        gm, gn = tl.cdiv(M, BM), tl.cdiv(N, BN)
        width = GROUP * gn
        group = pid // width
        first = group * GROUP
        size = tl.minimum(gm - first, GROUP)
        pm = first + (pid % width) % size
        pn = (pid % width) // size
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, tl.cdiv(K, BK)):
            acc += tl.dot(tl.load(pa), tl.load(pb))
            pa += BK * sak
            pb += BK * sbk
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16))

    M = N = K = 8192
    a = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=DEV, dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    out = {"triton": triton.__version__, "rows": []}
    for bm, bn, bk, warps, stages in ((64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 4, 4),
                                      (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                                      (256, 256, 64, 8, 3), (128, 128, 32, 4, 2), (128, 128, 64, 8, 1)):
        row = {"tile": f"{bm}x{bn}", "bk": bk, "warps": warps, "stages": stages}
        try:
            c = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
            grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            def run():
                return mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                c.stride(0), c.stride(1), BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps,
                                num_stages=stages)
            kern = run()
            torch.cuda.synchronize()
            row["rel_err"] = float((c.float() - ref).norm() / ref.norm())
            t = time_s(run, reps=10)
            row.update({"s": t, "TFLOPs": 2 * M * N * K / t / 1e12, "registers": kern.n_regs,
                        "spills": kern.n_spills, "smem_bytes": kern.metadata.shared})
        except Exception as exc:  # noqa: BLE001 - a tile that does not fit is a result
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out["rows"].append(row)
    return out


@section
def compile_stages():
    """torch.compile on a decode-sized MLP block: eager, inductor, inductor + CUDA graphs, a graph break, recompiles."""
    import torch._dynamo as dynamo

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
        if float(scale.max()) > 1e6:  # a data-dependent Python branch: a graph break
            scale = scale.clamp(max=1e6)
        h = (h * scale).to(x.dtype) * g
        u = torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)
        return x + u @ w2.T

    class Block(torch.nn.Module):
        """The same block with its weights registered as parameters (static addresses for CUDA graphs)."""

        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2, self.g = (torch.nn.Parameter(t, requires_grad=False) for t in (w1, w3, w2, g))

        def forward(self, x):
            h = x.float()
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.g
            u = torch.nn.functional.silu(h @ self.w1.T) * (h @ self.w3.T)
            return x + u @ self.w2.T

    module_block = Block()
    x = torch.randn(batch, d, device=DEV, dtype=torch.bfloat16)
    out = {"batch": batch, "d": d, "f": f}

    def kernels_per_call(fn) -> int:
        from torch.profiler import ProfilerActivity, profile
        fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name
                   and "Memset" not in e.name)

    def wall_per_call(fn, n=200) -> float:
        for _ in range(10):
            fn(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    ref = block(x).float()
    out["eager_in_one_cuda_graph_s"] = time_graph_s(lambda: block(x), calls=10)

    def marked(fn):
        def call(x_):
            torch.compiler.cudagraph_mark_step_begin()
            return fn(x_)
        return call

    for name, fn, kw in (("eager", block, None), ("inductor", block, {}),
                         ("inductor_cudagraphs", block, {"mode": "reduce-overhead"}),
                         ("inductor_cudagraphs_marked", block, {"mode": "reduce-overhead", "marked": True}),
                         ("module_inductor", module_block, {}),
                         ("module_inductor_cudagraphs", module_block, {"mode": "reduce-overhead", "marked": True}),
                         ("inductor_graph_break", block_with_break, {})):
        dynamo.reset()
        row = {}
        try:
            t0 = time.perf_counter()
            kw = None if kw is None else dict(kw)
            mark = kw.pop("marked", False) if kw else False
            f_ = fn if kw is None else torch.compile(fn, **kw)
            if mark:
                f_ = marked(f_)
            y = f_(x)
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
            row["max_abs_err"] = float((y.float() - ref).abs().max())
            row["wall_s_per_call"] = wall_per_call(f_)
            row["gpu_s_per_call"] = time_s(lambda: f_(x), reps=20)
            if "cudagraphs" not in name:
                row["kernels_per_call"] = kernels_per_call(f_)
            if kw is not None and "cudagraphs" not in name:
                ex = dynamo.explain(fn)(x)
                row["graphs"] = ex.graph_count
                row["graph_breaks"] = ex.graph_break_count
                row["break_reasons"] = [str(r.reason)[:200] for r in ex.break_reasons]
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        out[name] = row
    # recompiles: a new batch size every call with dynamic=False, past the recompile limit
    dynamo.reset()
    try:
        out["recompile_limit"] = getattr(dynamo.config, "recompile_limit", getattr(dynamo.config, "cache_size_limit", None))
        fc = torch.compile(block, dynamic=False)
        from torch._dynamo.utils import counters
        first_calls = []
        for bsz in range(1, 13):
            xb = torch.randn(bsz, d, device=DEV, dtype=torch.bfloat16)
            t0 = time.perf_counter()
            fc(xb)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            for _ in range(5):
                fc(xb)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                fc(xb)
            torch.cuda.synchronize()
            first_calls.append({"batch": bsz, "first_call_s": first, "wall_s_per_call": (time.perf_counter() - t0) / 50})
        out["recompiles"] = {"first_calls": first_calls,
                             "counters": {k: {str(a): b for a, b in v.items()} for k, v in counters.items()}}
    except Exception as exc:  # noqa: BLE001
        out["recompiles"] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return out


RESULTS["nvidia_smi_after"] = nvidia_smi(CLOCKS)
RESULTS["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
save()
print(json.dumps(RESULTS, indent=0, default=str)[-9000:])
sys.exit(0)
