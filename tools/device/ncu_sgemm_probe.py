"""Launch each fp32 SGEMM kernel of kernels.cu once at 1024^3 (for ncu; data/measured-h200-ncu-sgemm.csv); "sass" prints SASS op counts."""
import glob
import os
import re
import subprocess
import sys

import cupy as cp

src = open("tools/device/kernels.cu").read()
mod = cp.RawModule(code=src, options=("-std=c++17", "-DUNROLL=4"))
n = 1024
a = cp.random.standard_normal((n, n), dtype=cp.float32)
b = cp.random.standard_normal((n, n), dtype=cp.float32)
c = cp.zeros((n, n), dtype=cp.float32)
cfg = {"naive_rows": (((n + 31) // 32, (n + 7) // 8), (32, 8)), "naive_cols": (((n + 31) // 32, (n + 7) // 8), (32, 8)),
       "smem": (((n + 31) // 32, (n + 31) // 32), (32, 32)), "reg2d": ((n // 128, n // 128), (256,)),
       "reg2d_vec": ((n // 128, n // 128), (256,))}
for name, (grid, block) in cfg.items():
    k = mod.get_function(f"sgemm_{name}")
    k(grid, block, (cp.int32(n), cp.int32(n), cp.int32(n), a, b, c))
    cp.cuda.Device().synchronize()
    err = float(cp.linalg.norm(c - a @ b) / cp.linalg.norm(a @ b))
    print(name, "regs", k.num_regs, "err", err, file=sys.stderr)
if sys.argv[1:] == ["sass"]:
    files = sorted(glob.glob(os.path.expanduser("~/.cupy/kernel_cache/*.cubin")), key=os.path.getmtime)
    out = subprocess.run(["cuobjdump", "-sass", files[-1]], capture_output=True, text=True).stdout
    open(os.environ["OUT"] + "/sass.txt", "w").write(out)
    for part in re.split(r"\n\s*Function : ", out)[1:]:
        name = part.split("\n")[0].strip()
        ops = {}
        for line in part.splitlines():
            m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
            if m:
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        keep = {k: v for k, v in ops.items() if k.startswith(("LDS", "STS", "LDG", "STG", "FFMA"))}
        print(name, sum(ops.values()), keep)
