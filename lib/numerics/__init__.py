"""Number formats as arithmetic: FP8 (E4M3) rounding, scales and the error they leave in attention."""
