"""Run by the Python of .clients-venv (not the project's): executes one snippet of docs/clients.md and
writes what it computed (the names the page's snippets use for their results) to a JSON file."""
import json
import sys

RESULTS = ("vectors", "query_vector", "text", "streamed", "tokens", "token_logprobs", "top_logprobs")
PLAIN = ("tokens", "token_logprobs", "top_logprobs")  # JSON values already


def main(snippet: str, out: str) -> None:
    namespace = {"__name__": "__main__"}
    with open(snippet, encoding="utf-8") as f:
        exec(compile(f.read(), snippet, "exec"), namespace)  # noqa: S102 - the documented snippet, as written
    results = {}
    for name in RESULTS:
        if name in namespace:
            value = namespace[name]
            results[name] = [list(map(float, v)) for v in value] if name == "vectors" else (
                list(map(float, value)) if name == "query_vector" else value if name in PLAIN else str(value))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
