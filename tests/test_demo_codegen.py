"""The demo codegen GPT-J that `make model` trains (build/train_codegen.py) on the standard library:
greedy completions of function headers from modules it never saw, cut at their last complete line,
parse as Python."""
from __future__ import annotations

import ast

import pytest

from model_configs import MODEL_REPOSITORY

PARSE_SHARE_MIN = 0.6  # the goal: most completions are Python, not noise shaped like code


@pytest.fixture(scope="module")
def generator():
    import torch
    from transformers import GPTJForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(1)
    folder = MODEL_REPOSITORY / "codegen_generator" / "1"
    return GPTJForCausalLM.from_pretrained(folder).eval(), PreTrainedTokenizerFast.from_pretrained(folder)


def test_held_out_modules_are_not_trained_on():
    from build.codegen import stdlib_sources
    from build.train_codegen import held_out

    modules = stdlib_sources()
    assert 0 < sum(map(held_out, modules)) < len(modules) / 5


def test_headers_alone_do_not_parse():
    """Without a body line a header is not Python, so a completion must add at least one line."""
    from build.train_codegen import function_headers

    headers = function_headers(50)
    assert len(headers) == 50
    for header in headers:
        with pytest.raises(SyntaxError):
            ast.parse(header + "\n")


def test_only_generated_lines_that_parse_count():
    """A completion counts when, cut at its last complete line, it parses and adds a non-blank line."""
    from build.train_codegen import parses

    assert parses("def f(x):\n    return x\n    if x ==")  # the unfinished last line is cut off
    assert not parses("def f(x):\n\n    \n")  # blank lines are not a body
    assert not parses("def f(x):\n    return g(x\n")  # a bracket left open
    assert not parses("def f(x):\n        return x\n    y = 1\n")  # indentation that does not match


def test_completions_of_held_out_headers_parse(generator):
    from build.train_codegen import function_headers, parse_share

    # 50 headers of functions and methods, spread over the held-out modules
    share, texts = parse_share(*generator, function_headers(50))
    print(f"share that parses: {share:.2f}\n" + "\n-----\n".join(texts[:3]))
    assert share >= PARSE_SHARE_MIN
