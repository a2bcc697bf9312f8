"""Workloads: what runs on the simulated machines.

``archsim.workloads.model`` reads a transformer model + scenario (workloads/*.yaml)
into a frozen ``Workload``; ``ops`` builds one decoder block's op graph for the
scenario's phase (``Workload.block_ops()``) with ``flops`` and ``model_flops`` per op;
``reference`` holds the float64 numpy references (per op kind, one block, the graph op by op).

``archsim.workloads.emit`` turns operations into kernels for a target's capabilities (a Program,
its launch grid and its arguments). Following the dependency rule (docs/architecture.md), nothing here imports
``archsim.engine``: emitters ask only the capabilities of a resolved Machine
(``archsim.config.derived.capabilities``).
"""
