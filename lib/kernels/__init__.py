"""Kernel-level models and reference kernels: one SM's resources and occupancy (:mod:`.sm`), and
the sections' kernels and their memory traffic (modules named by what they model; import them explicitly)."""
