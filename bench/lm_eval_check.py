"""EleutherAI's lm-evaluation-harness against the gateway, with its defaults (local-completions,
tokenized_requests=True: token-id prompts, echo, logprobs 1, max_tokens 1), on a local task
(bench/lm_eval_task/: Python continuations from a jsonl file, nothing downloaded), each sample's
log-likelihood and greedy flag compared with transformers' in process on the same weights.

    python -m bench.lm_eval_check                      (starts its own Triton + gateway on free ports)
    python -m bench.lm_eval_check --url http://127.0.0.1:8080   (a running gateway, e.g. `make triton`'s)

Its own stack runs the generator at `precision` f32, the exact mode; a gateway given with --url is compared as it
runs (the shipped `auto` is bf16 where the CPU computes it natively, and then differs by up to ~2e-2).

The harness runs from its own venv (.eval-tools, made on first use by tools/eval_tools_venv.sh). Exits 1 when a
sample differs by more than the tolerance.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.completions_stack import completions_stack

ROOT = Path(__file__).resolve().parent.parent
GENERATOR_DIR = ROOT / "model_repository" / "codegen_generator" / "1"  # the demo model's HF folder (make model)
TASK_DIR = ROOT / "bench" / "lm_eval_task"
TASK = "codegen_python_continuations"
MAX_LENGTH = 1024  # the demo model's context window (n_positions in its config.json)
# per sample (a continuation of a few tokens): the order of issue 55's figure for text prompts (7.4e-6); the
# per-token tests hold each logprob to 1e-4 (tests/test_completions_token_ids_server.py)
TOLERANCE = 1e-5


def lm_eval_command(base_url: str, output: Path) -> list[str]:
    model_args = (f"model=codegen,base_url={base_url}/v1/completions,tokenizer_backend=huggingface,"
                  f"tokenizer={os.path.relpath(GENERATOR_DIR, ROOT)},max_length={MAX_LENGTH},"
                  f"num_concurrent=1,max_retries=1")
    return [str(ROOT / ".eval-tools" / "bin" / "lm_eval"), "--model", "local-completions", "--model_args", model_args,
            "--include_path", os.path.relpath(TASK_DIR, ROOT), "--tasks", TASK, "--log_samples",
            "--output_path", str(output)]


def run_harness(base_url: str, output: Path) -> list[dict]:
    """The harness's per-sample records: arguments (context, continuation) and its (loglikelihood, is_greedy)."""
    subprocess.run(["bash", str(ROOT / "tools" / "eval_tools_venv.sh")], check=True)
    command = lm_eval_command(base_url, output)
    print("$ " + " ".join(Path(c).name if i == 0 else c for i, c in enumerate(command)), flush=True)
    # offline: the task's data is the local jsonl; the tokenizer is a local folder
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    samples = sorted(output.rglob(f"samples_{TASK}_*.jsonl"))
    if not samples:
        raise SystemExit(f"lm_eval wrote no samples under {output}")
    return [json.loads(line) for line in samples[-1].read_text().splitlines() if line.strip()]


def reference(pairs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
    """transformers in process: lm_eval's own split of context and continuation into tokens
    (TemplateAPI._encode_pair: trailing spaces move to the continuation; the whole is encoded, then cut)."""
    import torch
    from transformers import AutoTokenizer, GPTJForCausalLM

    torch.set_num_threads(1)
    model = GPTJForCausalLM.from_pretrained(str(GENERATOR_DIR), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(GENERATOR_DIR))
    out = []
    for context, continuation in pairs:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = tokenizer(context + continuation)["input_ids"]
        ctxlen = len(tokenizer(context)["input_ids"])
        with torch.inference_mode():
            logits = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
        rows = range(ctxlen, len(whole))
        out.append((sum(float(logits[i - 1, whole[i]]) for i in rows),
                    all(int(logits[i - 1].argmax()) == whole[i] for i in rows)))
    return out


def compare(samples: list[dict]) -> int:
    pairs = [(s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]) for s in samples]
    served = [(float(s["resps"][0][0][0]), str(s["resps"][0][0][1]) == "True") for s in samples]
    local = reference(pairs)
    worst = 0.0
    bad = 0
    print(f"\n{'#':>3} {'lm_eval (gateway)':>18} {'transformers':>13} {'|diff|':>9} greedy  continuation")
    for i, ((context, continuation), (got, got_greedy), (want, want_greedy)) in enumerate(zip(pairs, served, local)):
        diff = abs(got - want)
        worst = max(worst, diff)
        ok = diff <= TOLERANCE and got_greedy == want_greedy
        bad += not ok
        print(f"{i:3d} {got:18.6f} {want:13.6f} {diff:9.2e} {str(got_greedy):>5}{'' if ok else ' MISMATCH'}  "
              f"{continuation!r}")
    print(f"\n{len(samples)} samples, largest |difference| {worst:.2e} (tolerance {TOLERANCE:g}), "
          f"{bad} mismatched", flush=True)
    return 1 if bad or not samples else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running gateway (default: start Triton and a gateway here)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as output:
        if args.url:
            samples = run_harness(args.url.rstrip("/"), Path(output))
        else:
            # the exact mode: the shipped precision auto is bf16 where the CPU computes it natively
            with completions_stack(generator_parameters={"precision": "f32"}) as url:
                samples = run_harness(url, Path(output))
        return compare(samples)


if __name__ == "__main__":
    sys.exit(main())
