"""Decoding: what happens between the logits and the next token. Sampling and calibrated label
probabilities (sampling, classify); speculative decoding: its cost on the step model, drafters,
verification, token bookkeeping, FP8 and losslessness, adaptive draft lengths, acceptance counters
(speculative, drafters, verify, bookkeeping, quantized, adaptive, counters); constrained decoding
(grammar, tokenizer)."""
