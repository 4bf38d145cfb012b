"""HTTP gateway in front of the Triton server: OpenAI-compatible and seed-001 endpoints, runtime model
management, image search. Routes are thin: they validate, call plain code, and answer; every failure
is an `errors.ApiError` mapped to its HTTP status in one place."""
