"""The performance model: roofline bounds, the decode step, prefill, memory capacity, collectives
and energy, each quantity in one function that every notebook and later section calls."""
