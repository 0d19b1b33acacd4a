"""Decoding: what happens between the logits and the next token. Sampling (temperature and
filters), speculative decoding (drafters, verification, its step time) and constrained decoding."""
