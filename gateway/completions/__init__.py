"""OpenAI's /v1/completions over the codegen pipeline, as plain code: the checks of a request, which
resolve it once into the ResolvedCompletion that everything after reads (checks.py, resolved.py; its schema:
gateway/schemas/completions.py), the codegen tensors of one sequence (tensors.py), running sequences over
`codegen_stream` (sequences.py) and the response, chunk and SSE shapes (shapes.py). The route in
gateway/routers/completions.py only wires them together, the key's token quota included."""
