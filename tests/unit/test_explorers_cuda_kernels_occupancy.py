"""The explorers of lib.explorers.cuda_kernels_occupancy: their numbers are lib's, their figures
are reused between updates, and inputs that cannot work give a message."""

from __future__ import annotations

import random
from xml.etree import ElementTree

import numpy as np
import pytest

from lib.book import widgets
from lib.explorers import cuda_kernels_occupancy as ex
from lib.kernels import gemm_waves as gw
from lib.kernels import latency_hiding as lh
from lib.kernels.sm import occupancy

OCC = dict(gpu="h100-sxm", threads=256, registers=96, smem_kib=0, loads_in_flight=4, bytes_per_load=16)
WAVE = dict(model="llama-3.1-70b", projection="qkv_proj", tp=4, tokens=896, tile="128x128", gpu="h100-sxm",
            dtype="bf16")


def test_occupancy_view_reports_lib_numbers():
    v = ex.occupancy_view(**OCC)
    rows = dict(v.rows)
    assert rows["Block Limit Registers"] == "2 blocks  <- binds"
    assert rows["resident blocks / warps per SM"] == "2 / 16 of 64"
    assert rows["theoretical occupancy"] == "25.0%"
    assert v.values["bandwidth_fraction"] == 1.0  # 16 warps x 2 KiB in flight > 15.2 kB needed
    loop = lh.streaming_loop("h100-sxm", 256, 96, 0, 4, 16)
    assert v.values["bytes_in_flight"] == loop.bytes_in_flight
    ElementTree.fromstring(v.svg())
    assert v.caption


def test_the_staircase_is_the_occupancy_of_each_register_count():
    stairs = ex.occupancy_by_registers("l4", 256, 0)
    assert len(stairs) == 255 and stairs[31] == 1.0  # 32 registers: 48 warps of 48
    assert stairs[95] == pytest.approx(16 / 48)
    assert np.all(np.diff(stairs) <= 0)  # more registers never raise occupancy
    for r in (1, 40, 64, 65, 128, 200, 255):
        assert stairs[r - 1] == occupancy("l4", 256, r).occupancy


def test_wave_view_reports_lib_numbers():
    v = ex.wave_quantization_view(**WAVE)
    rows = dict(v.rows)
    assert rows["tiles"].startswith("7 x 20 = 140 on 132 SMs")
    assert rows["waves"] == "2 (last one holds 8 tiles)"
    w = gw.gemm_waves(896, 2560, 8192, "h100-sxm")
    assert v.values["waste_s"] == w.waste_s and v.values["grow_tokens"] == 1664
    ElementTree.fromstring(v.svg())


def test_figures_are_reused():
    ex.occupancy_view(**OCC).svg()
    ex.wave_quantization_view(**WAVE).svg()
    before = (ex._OCC_FIGURE.builds, ex._WAVE_FIGURE.builds)
    ex.occupancy_view(**{**OCC, "registers": 128, "gpu": "l4", "smem_kib": 40}).svg()
    ex.wave_quantization_view(**{**WAVE, "tokens": 20000, "gpu": "b200", "tile": "64x64"}).svg()
    assert (ex._OCC_FIGURE.builds, ex._WAVE_FIGURE.builds) == before


def test_impossible_inputs_give_messages():
    with pytest.raises(ValueError, match="at most 64 registers"):
        ex.occupancy_view(**{**OCC, "threads": 1024, "registers": 255})
    with pytest.raises(ValueError, match="smem_per_block_bytes"):
        ex.occupancy_view(**{**OCC, "gpu": "l4", "smem_kib": 200})
    with pytest.raises(ValueError, match="fp8"):
        ex.wave_quantization_view(**{**WAVE, "gpu": "a100-sxm", "dtype": "fp8"})
    with pytest.raises(ValueError, match="tp=3"):
        ex.wave_quantization_view(**{**WAVE, "tp": 3})


@pytest.mark.parametrize("name, func", [("cuda_kernels.occupancy", ex.occupancy_view),
                                        ("cuda_kernels.wave_quantization", ex.wave_quantization_view)])
def test_random_valid_inputs_give_a_view_or_a_message(name, func):
    domains = widgets._REGISTRY[name].domains
    rng = random.Random(1)
    views = 0
    for _ in range(40):
        kwargs = {arg: dom.sample(rng) for arg, dom in domains.items()}
        try:
            v = func(**kwargs)
        except ValueError as err:
            assert str(err)
            continue
        views += 1
        assert all(isinstance(a, str) and isinstance(b, str) for a, b in v.rows)
    assert views >= 20
