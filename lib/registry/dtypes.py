"""Number formats: bytes per element for storage and the dtype names lib accepts."""

from __future__ import annotations

BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "tf32": 4.0,  # stored as fp32; tensor cores read 19 of the 32 bits
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
}


def bytes_per_element(dtype: str) -> float:
    """Storage size of one element of ``dtype`` in bytes (``bf16 -> 2``, ``int4 -> 0.5``)."""
    try:
        return BYTES_PER_ELEMENT[dtype]
    except KeyError:
        raise ValueError(
            f"dtype must be one of {', '.join(BYTES_PER_ELEMENT)}; got {dtype!r}"
        ) from None
