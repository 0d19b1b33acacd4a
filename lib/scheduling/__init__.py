"""Scheduling: a discrete-event simulator of one serving replica (:func:`simulate`; workloads, policies,
step costs from the book's step models, metrics) and the queueing closed forms it is checked against.
"""

from .cost import FunctionCost, LinearCost, StepCost, exact_step_s, step_cost
from .engine import KVPool, simulate
from .metrics import SLO, LittleCheck, Metrics, RequestRecord, SimResult, Summary, Timeline
from .policies import Policy
from .workloads import (
    Bimodal,
    Constant,
    Empirical,
    Geometric,
    LogNormal,
    Request,
    Uniform,
    Workload,
    mix,
    trace,
)

__all__ = [
    "SLO",
    "Bimodal",
    "Constant",
    "Empirical",
    "FunctionCost",
    "Geometric",
    "KVPool",
    "LinearCost",
    "LittleCheck",
    "LogNormal",
    "Metrics",
    "Policy",
    "Request",
    "RequestRecord",
    "SimResult",
    "StepCost",
    "Summary",
    "Timeline",
    "Uniform",
    "Workload",
    "exact_step_s",
    "mix",
    "simulate",
    "step_cost",
    "trace",
]
