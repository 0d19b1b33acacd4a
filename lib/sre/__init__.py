"""Reliability engineering for inference and training fleets. The core: service-level objectives,
error budgets and burn-rate alerts (slo). Built on it and on the performance, scheduling and
training models: the pages' own modules (tails, canaries, incidents, hangs, observability)."""
