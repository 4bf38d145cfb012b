"""Train the demo codegen model (the small GPT-J and its byte-level BPE) on the Python standard library.

The corpus is the standard library's top-level modules, each parsed and written back by `ast.unparse`
with its docstrings left out (one uniform style, no prose), minus one module in ten (chosen by a hash
of its name) that is held out: tests/test_demo_codegen.py completes function headers from those.

What the model is asked to do is continue a function header at column 0 ("def name(args):"), so most
of each batch is exactly that: windows that start at a function or method of the training modules,
written back on its own at column 0 (a method's body at 4 spaces, not 8), without decorators, and
followed by a blank line and the end-of-text token, so the model learns where a function ends. The
rest of each batch is windows cut anywhere from the whole modules (imports, classes, module code), so
that prompts which are not a function header ("import os\n", a class) are continued with code.
"""
from __future__ import annotations

import ast
import hashlib
import math
from pathlib import Path

from build.common import seed_everything
from build.training import train_steps

SEED = 20240501
CONTEXT, BATCH, STEPS, LR, WARMUP = 128, 16, 1200, 6e-3, 40
MODULE_WINDOWS = 4  # of each batch's windows, cut anywhere from whole modules; the others start at a function
NAME = "codegen"  # .artifacts/trained/<NAME>/
SOURCES = [Path(__file__), Path(__file__).with_name("codegen.py"), Path(__file__).with_name("training.py")]


def held_out(module: Path) -> bool:
    return hashlib.sha256(module.stem.encode()).digest()[0] % 10 == 0


def without_docstrings(source: str) -> str | None:
    """The module as ast.unparse writes it, docstrings removed; None when it does not parse here."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def corpus(split: str) -> list[str]:
    """Normalized sources of the training modules ("train") or the held-out ones ("held_out")."""
    from build.codegen import stdlib_sources

    texts = []
    for path in stdlib_sources():
        if held_out(path) == (split == "held_out"):
            text = without_docstrings(path.read_text(encoding="utf-8", errors="replace"))
            if text:
                texts.append(text)
    return texts


def functions(module_text: str) -> list[str]:
    """The module's functions and the methods of its classes (nested classes too), in source order, each
    written back at column 0 without its decorators and followed by a blank line; a nested function
    stays inside its parent."""
    found = []

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                node.decorator_list = []
                found.append(ast.unparse(node) + "\n\n")  # the end-of-text token follows a blank line,
                # never a line such as "def f():" whose block is still to come
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(module_text).body)
    return found


def function_headers(count: int) -> list[str]:
    """'def name(args):' lines of functions in the held-out modules, in source order, at most count."""
    headers = []
    for text in corpus("held_out"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                line = text.splitlines()[node.lineno - 1].strip()
                if line.startswith("def ") and line.endswith(":") and len(line) < 100:
                    headers.append(line)
    step = max(1, len(headers) // count)
    return headers[::step][:count]


def train(dest: Path, steps: int = STEPS, lr: float = LR, batch: int = BATCH, context: int = CONTEXT) -> None:
    import torch

    from build.codegen import demo_model, train_demo_tokenizer

    modules = corpus("train")
    chunks = [f for text in modules for f in functions(text)]
    tokenizer = train_demo_tokenizer(modules)
    model = demo_model(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids, starts = [], []
    for chunk in chunks:
        starts.append(len(ids))
        ids += tokenizer(chunk).input_ids + [eos]
    ids += [eos] * context  # so that a window may start at the last function
    module_ids = []
    for text in modules:
        module_ids += tokenizer(text).input_ids + [eos]
    data, module_data, starts = torch.tensor(ids), torch.tensor(module_ids), torch.tensor(starts)
    seed_everything(SEED)
    generator = torch.Generator().manual_seed(SEED)

    def batch_loss(step: int):
        picks = starts[torch.randint(0, len(starts), (batch - MODULE_WINDOWS,), generator=generator)]
        anywhere = torch.randint(0, len(module_data) - context, (MODULE_WINDOWS,), generator=generator)
        windows = torch.stack([data[s:s + context] for s in picks.tolist()]
                              + [module_data[s:s + context] for s in anywhere.tolist()])
        return model(input_ids=windows, labels=windows).loss

    def schedule(s: int) -> float:  # linear warm-up, then a cosine down to a tenth
        return min(1.0, (s + 1) / WARMUP) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))

    name = f"codegen GPT-J ({len(chunks)} functions, {len(module_ids)} tokens of modules)"
    train_steps(model, steps, batch_loss, name, lr, schedule, betas=(0.9, 0.98), clip_norm=1.0)
    with torch.no_grad():  # padding ids never win (the tokenizer has no text for them)
        model.lm_head.weight[len(tokenizer):] = 0
        model.lm_head.bias[len(tokenizer):] = -100
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def kept_lines(completion: str) -> list[str]:
    """The header and the generated lines of a completion, cut at its last complete line; [] when no
    non-blank line was generated (a header and blank lines is not a function, and must not count)."""
    lines = completion[:completion.rfind("\n") + 1].splitlines()
    return lines if any(line.strip() for line in lines[1:]) else []


def parses(completion: str) -> bool:
    """Whether a completion, cut at its last complete line, is Python with at least one generated line."""
    lines = kept_lines(completion)
    try:
        return bool(lines) and ast.parse("\n".join(lines) + "\n") is not None
    except SyntaxError:
        return False


def parse_share(model, tokenizer, headers: list[str], new_tokens: int = 64) -> tuple[float, list[str]]:
    """Share of greedy completions (at most new_tokens, fewer when the model ends the function with its
    end-of-text token) that parse once cut at their last complete line, and the texts."""
    import torch

    texts = []
    for header in headers:
        prompt = header  # as a user would type it; the model starts the body with its own newline
        encoded = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        texts.append(prompt + tokenizer.decode(out[0, encoded.input_ids.shape[1]:], skip_special_tokens=True))
    return sum(map(parses, texts)) / len(headers), texts
