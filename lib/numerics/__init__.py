"""Number formats as arithmetic: the largest finite value and exp's overflow edge per dtype
(:mod:`.formats`), FP8 (E4M3) rounding, scales and the error they leave in attention (:mod:`.fp8`)."""
