"""Facts loaded from ``data/``: GPUs (:mod:`.hardware`), models (:mod:`.models`), number formats
(:mod:`.dtypes`) and the one file of modelling assumptions (:mod:`.assumptions`); and the derived tables
under ``data/derived/`` that explorers read instead of recomputing (:mod:`.derived`)."""
