"""The FP8 practice grader: the reference passes, every defective quantizer fails (I012)."""

from __future__ import annotations

import numpy as np
import pytest

from lib.numerics import fp8
from lib.numerics import fp8_practice as practice


class Candidate:
    """A standalone implementation (not a subclass of the reference): what a candidate writes."""

    def round_e4m3(self, x):
        return fp8.e4m3_round_reference(np.asarray(x, dtype=np.float64))

    def scales(self, kv, per_head):
        amax = np.abs(kv).max(axis=(1, 2) if per_head else None, keepdims=True).astype(np.float64)
        return np.where(amax > 0, amax / 448.0, 1.0)

    def quantize(self, kv, scale):
        return fp8.e4m3_encode(np.asarray(kv, np.float64) / np.asarray(scale, np.float64))

    def dequantize(self, codes, scale):
        return fp8.e4m3_decode(codes) * np.asarray(scale, np.float64)


class TiesAway(Candidate):
    def round_e4m3(self, x):
        x = np.asarray(x, np.float64)
        q = fp8.e4m3_ulp(x)
        return np.sign(x) * np.minimum(np.floor(np.abs(x) / q + 0.5) * q, 448.0)


class NoSaturation(Candidate):
    def round_e4m3(self, x):
        r = fp8.e4m3_round_reference(np.asarray(x, np.float64), overflow="nan")
        return r

    def quantize(self, kv, scale):
        return fp8.e4m3_encode(np.asarray(kv, np.float64) / np.asarray(scale, np.float64), overflow="nan")


class FlushSubnormals(Candidate):
    def round_e4m3(self, x):
        r = fp8.e4m3_round_reference(np.asarray(x, np.float64))
        return np.where(np.abs(r) < fp8.E4M3_MIN_NORMAL, 0.0 * r, r)


class PerTensorOnly(Candidate):
    def scales(self, kv, per_head):
        s = super().scales(kv, False)
        return np.broadcast_to(s, (kv.shape[0], 1, 1)) if per_head else s


class Int8Limit(Candidate):
    def scales(self, kv, per_head):
        return super().scales(kv, per_head) * 448.0 / 127.0


class ZeroHeadNaN(Candidate):
    def scales(self, kv, per_head):
        return np.abs(kv).max(axis=(1, 2) if per_head else None, keepdims=True).astype(np.float64) / 448.0


class ForgetsScale(Candidate):
    def dequantize(self, codes, scale):
        return fp8.e4m3_decode(codes)


class ClipsBeforeDividing(Candidate):
    def quantize(self, kv, scale):
        return fp8.e4m3_encode(np.clip(np.asarray(kv, np.float64), -448, 448) / np.asarray(scale, np.float64))


DEFECTIVE = [TiesAway, NoSaturation, FlushSubnormals, PerTensorOnly, Int8Limit, ZeroHeadNaN, ForgetsScale,
             ClipsBeforeDividing]


def test_reference_and_a_standalone_candidate_pass():
    assert practice.check(practice.Reference).passed
    assert practice.check(lambda: Candidate()).passed


@pytest.mark.parametrize("defect", DEFECTIVE, ids=lambda c: c.__name__)
def test_every_defective_quantizer_fails_with_a_small_case(defect):
    report = practice.check(defect)
    assert report.status == "failed", repr(report)
    shrunk = int(report.failure.split("shrunk to ")[1].split(" ")[0])
    assert shrunk <= 2, report.failure


def test_skeleton_reports_not_implemented():
    class Skeleton:
        def round_e4m3(self, x):
            raise NotImplementedError

        scales = quantize = dequantize = round_e4m3

    report = practice.check(Skeleton)
    assert report.status == "not implemented" and "round_e4m3" in repr(report)


def test_oracle_is_torch_and_agrees_with_the_brute_force_reference():
    values = fp8.e4m3_values()
    ties = ((values[1:] + values[:-1]) / 2).astype(np.float32)
    np.testing.assert_array_equal(practice.torch_round(ties), fp8.e4m3_round_reference(ties))
    np.testing.assert_array_equal(practice.torch_encode(np.float32([1e6, -1e6])), np.uint8([0x7E, 0xFE]))


def test_context_ladder_starts_at_the_calibration_length_and_refuses_short_contexts():
    assert fp8.context_ladder(2048, [131072, 2048, 8192, 8192]) == [2048, 8192, 131072]
    with pytest.raises(ValueError, match="2 x calib_tokens"):
        fp8.context_ladder(4096, [1024, 6000])
