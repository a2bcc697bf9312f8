"""Many devices, above the device engine (the engine never imports this package): clusters
(spec.py), their links and routes (topology.py), the flow-level network and the event clock
(network.py), collectives as the steps of their algorithms (collectives.py), bandwidths measured on
the network (derived.py), validation against published collectives (validate.py), parallel plans
and their memory (plan.py), the step as discrete events (step.py), run --cluster (run.py) and the
plan search (search.py)."""
