"""The HTTP endpoints, one module per family, as thin adapters: a route takes its body (gateway/schemas/)
and its services (gateway/dependencies.py), calls plain code, and shapes the answer."""
