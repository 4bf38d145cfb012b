"""Train the demo codegen model (the small GPT-J and its byte-level BPE) on the Python standard library.

The corpus is the standard library's top-level modules, each parsed and written back by `ast.unparse`
with its docstrings left out (one uniform style, no prose), minus one module in ten (chosen by a hash
of its name) that is held out: tests/test_demo_codegen.py completes function headers from those.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from build.common import TrainLog, seed_everything

SEED = 20240501
CONTEXT, BATCH, STEPS, LR = 128, 16, 400, 3e-3
NAME = "codegen"  # .artifacts/trained/<NAME>/
SOURCES = [Path(__file__), Path(__file__).with_name("codegen.py")]


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


def train(dest: Path, steps: int = STEPS) -> None:
    import torch

    from build.codegen import demo_model, train_demo_tokenizer

    texts = corpus("train")
    tokenizer = train_demo_tokenizer(texts)
    model = demo_model(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = []
    for text in texts:
        ids += tokenizer(text).input_ids + [eos]
    data = torch.tensor(ids)
    seed_everything(SEED)
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / max(1, steps)))
    log = TrainLog(f"codegen GPT-J ({len(ids)} tokens)", steps)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=generator)
        batch = torch.stack([data[s:s + CONTEXT] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        log.step(step, loss.item())
    model.eval()
    with torch.no_grad():  # padding ids never win (the tokenizer has no text for them)
        model.lm_head.weight[len(tokenizer):] = 0
        model.lm_head.bias[len(tokenizer):] = -100
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def parse_share(model, tokenizer, headers: list[str], new_tokens: int = 64) -> tuple[float, list[str]]:
    """Share of greedy completions that parse once cut at their last complete line, and the texts."""
    import torch

    texts, ok = [], 0
    for header in headers:
        prompt = header  # as a user would type it; the model starts the body with its own newline
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        text = prompt + tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        cut = text[:text.rfind("\n") + 1]
        try:
            ast.parse(cut)
            ok += 1
        except SyntaxError:
            pass
        texts.append(text)
    return ok / len(headers), texts
