"""Workloads: what runs on the simulated machines.

``archsim.workloads.emit`` turns operations into kernels for a target's capabilities (a Program,
its launch grid and its arguments). Following DESIGN.md's dependency rule, nothing here imports
``archsim.engine``: emitters ask only the capabilities of a resolved Machine
(``archsim.config.derived.capabilities``).
"""
