"""Serving and platform systems design: fleet-level arithmetic on top of the step, prefill and memory
models. The core (capacity): what one request costs a replica by phase, the fleet a load needs, GPU-hour
prices per generation, dollars per million tokens and how long a replica takes to start."""
