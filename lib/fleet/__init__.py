"""Serving and platform systems design: fleet-level arithmetic on top of the step, prefill, memory,
scheduling and SRE models. The core (capacity): a request's replica-seconds by phase, the warm
prefill, the fleet a load needs, GPU-hour prices, dollars per million tokens and a replica's start.

Built on it, one module per page group: sizing chains (walkthrough, sizing_chain, capstone, rag,
long_prompt), cost (pricing, capacity_units, ledger), what a request sees (ttft, detokenizer,
stop_strings, backpressure), parallelism and disaggregation (parallel_tp, context_parallel_split,
disaggregation, batch_fill), routing and scaling (hash_ring, routing, autoscaling, shared_pool,
diurnal, regions, broadcast), tenancy (token_bucket, rate_limits, tenancy, quotas) and platforms
(job_api, job_service, eval_pipeline, agent_sessions, sandbox); ``*_practice`` modules hold the
coding questions' skeletons and graders. simulated_capacity reads a replica's saturated rate off the
serving simulator: the independent bound the sizing pages check the capacity model against."""
