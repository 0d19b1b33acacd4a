"""Numerics: BF16 and FP8 bit-exact (formats, fp8), reduction order, determinism and running sums (reduction,
determinism, accumulation), scales per tensor, row, block and GPU pool (scales, pools), eval statistics (evals, needle)."""
