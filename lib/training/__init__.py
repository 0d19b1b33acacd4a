"""Training at scale. The core: training FLOPs, MFU and the fleet equation (flops); optimizer state
and activation memory (state); the training step on a parallel layout (step); failures, checkpoint
intervals and goodput (reliability). Built on it: checkpoint storage and resharding (checkpoint),
stragglers (stragglers), parallel placement (layout), long-context, MoE and run plans (plan), step
profiles and gap attribution (profiling), the data pipeline and deduplication (data_pipeline, dedup),
RL and DPO post-training (posttrain, grpo) and loss-plateau diagnosis (diagnosis)."""
