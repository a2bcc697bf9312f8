"""Many devices: clusters (spec.py), their links and routes (topology.py), the flow-level network
(network.py) and collectives as the steps of their algorithms (collectives.py). A cluster sits
above the device engine; the engine never imports this package."""
