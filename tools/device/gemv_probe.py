"""Time the decode GEMV of chapters/05-cuda-kernels/gemv-bytes-in-flight (tools/device/gemv_probe.cu) on a lent GPU:
the three places its bytes in flight fall short (threads per row for a small N, bytes per load and unroll, the batch).

    python3 tools/device/gemv_probe.py      # writes $OUT/gemv_probe.json, prints one JSON line per configuration

Not part of the book or its tests (CI has no GPU). Same rules as measure_h200.py: each configuration compiled with
NVRTC (CuPy) for this GPU, checked against a float32 reference before it is timed (rel_err), then timed as one CUDA
graph of repeated calls (no host launch gaps) with the weights rotated over 1 GiB so each call reads HBM; CUDA events,
median of 7 replays. ``registers`` is what the compiled kernel uses (``num_regs``).
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import cupy as cp

OUT = pathlib.Path(os.environ.get("OUT", "/tmp/gemv_probe_out"))
OUT.mkdir(parents=True, exist_ok=True)
SRC = (pathlib.Path(__file__).resolve().parent / "gemv_probe.cu").read_text()
POOL = 1 << 30  # bytes of weights the calls rotate over
THREADS = 256


def bf16_bits(n: int) -> cp.ndarray:
    """Random bf16 bit patterns of magnitude 0.5-2 (never zeros), as uint16."""
    return ((cp.random.randint(0, 1 << 16, n, dtype=cp.uint32) & 0x3FFF) | 0x3000).astype(cp.uint16)


def as_f32(u16: cp.ndarray) -> cp.ndarray:
    return (u16.astype(cp.uint32) << 16).view(cp.float32)


WEIGHTS = bf16_bits(POOL // 2)


def run(t: int, v: int, u: int, b: int, n: int, k: int) -> dict:
    mod = cp.RawModule(code=SRC, options=("-std=c++17", f"-DGV_T={t}", f"-DGV_V={v}", f"-DGV_U={u}", f"-DGV_B={b}"))
    ker = mod.get_function("gemv")
    smem = b * k * 2 + ((THREADS // t) * (t // 32) * b * 4 if t > 32 else 0)
    if smem > 48 * 1024:
        ker.max_dynamic_shared_size_bytes = smem
    wbytes = n * k * 2
    copies = max(1, POOL // wbytes)
    x = bf16_bits(b * k)
    y = cp.zeros(b * n, dtype=cp.float32)
    grid = (n // (THREADS // t),)

    def call(i: int) -> None:
        j = i % copies
        ker(grid, (THREADS,), (WEIGHTS[j * n * k:(j + 1) * n * k], x, y, cp.int32(n), cp.int32(k)), shared_mem=smem)

    call(0)
    cp.cuda.runtime.deviceSynchronize()
    ref = as_f32(x).reshape(b, k) @ as_f32(WEIGHTS[:n * k]).reshape(n, k).T
    err = float(cp.abs(y.reshape(b, n) - ref).max() / cp.abs(ref).max())
    calls = min(copies, 64) if copies > 1 else 20
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for i in range(3):
            call(i)
        s.begin_capture()
        for i in range(calls):
            call(i)
        g = s.end_capture()
    g.launch(s)
    s.synchronize()
    ts = []
    for _ in range(7):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        g.launch(s)
        e1.record(s)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / calls)
    med = sorted(ts)[3]
    return {"n": n, "k": k, "threads_per_row": t, "bytes_per_load": v, "unroll": u, "batch": b,
            "registers": int(ker.num_regs), "smem_bytes": smem, "s": med, "weight_GBps": wbytes / med / 1e9,
            "rel_err": err}


PLAN = (
    # bytes per thread at a large N: the O projection of Llama 3.1 8B
    [(32, 16, u, 1, 4096, 4096) for u in (1, 2, 4, 8)]
    + [(32, v, u, 1, 4096, 4096) for v, u in ((4, 1), (4, 4), (8, 1), (8, 2))]
    # rows: the QKV shard of Llama 3.1 8B at TP 8 (N = 768), threads per row
    + [(t, 16, 1, 1, 768, 4096) for t in (8, 16, 32, 64, 128, 256)]
    + [(t, 16, 4, 1, 768, 4096) for t in (8, 16, 32, 64, 128)]
    + [(t, v, u, 1, 768, 4096) for t, v, u in ((32, 4, 1), (32, 4, 4), (32, 8, 1), (32, 8, 2), (64, 4, 1), (128, 4, 1))]
    # the batch, three load widths (shared-memory bank conflicts of the x reads: 4-way, 2-way, none)
    + [(32, 16, 4, b, 4096, 4096) for b in (2, 4, 8, 12, 16, 20, 24, 28)]
    + [(32, v, u, b, 4096, 4096) for v, u in ((4, 4), (8, 2)) for b in (2, 4, 8, 16)]
    # the shapes cuBLAS was timed at in measure_h200.py's gemv section
    + [(32, 16, 4, 1, n, k) for n, k in ((1024, 4096), (14336, 4096), (4096, 14336), (28672, 8192))]
)


def main() -> None:
    out = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": []}
    for cfg in PLAN:
        try:
            row = run(*cfg)
        except Exception as exc:  # noqa: BLE001 - a failed configuration must not stop the others
            row = {"config": cfg, "error": str(exc)[:300]}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        (OUT / "gemv_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
