"""Training at scale: training FLOPs, MFU and the fleet equation (flops); optimizer state and
activation memory (state); the training step on a parallel layout (step); failures and checkpoints
(reliability)."""
