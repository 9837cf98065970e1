"""The evaluator: the go/no-go review of a deployment's window (incidents, latency, divergence,
verdict) and its reports (:mod:`evaluator.render`)."""
