"""The editor workload (issue 53): a code-completion plugin sends the file up to the cursor on every pause in
typing, asking for 32 tokens; the next pause adds a few lines. Consecutive requests of one client share all but
their last lines, which the OpenVINO engine's prefix caching serves from KV blocks it kept.

Files: held-out real Python, the interpreter's own library modules inside packages (json/, email/, asyncio/, ...:
the demo's tokenizer and model were trained on the top-level modules alone, build/codegen.py stdlib_sources). Each
client walks its own files: the cursor starts where the prompt reaches --min-tokens and moves --lines lines down
each request, up to --max-tokens (600 to 1,800 tokens at the 350M shape, the demo tokenizer's).

Variants (engine options over the shipped config's, in process, the stage's engine alone): cache-on (the
default: prefix caching, precision auto: bf16 where the CPU has it natively), cache-off, lookup (cache-on with prompt
lookup, --lookup-tokens draft ids), f32 and bf16 (cache-on with f32, or bf16, inference and KV cache). Every
variant is loaded once; rounds are interleaved (each round runs every variant at every level, who goes first
rotates) and each (round, level) walks files of its own, the same for every variant, so that no variant finds
another round's prefixes cached. Levels: c1 and c4 of the editor workload (bench/load.py's closed loop, each
client its own walk), and "plain c16": 16 clients, 16 short prompts with no shared prefix, 64 tokens each (the
codegen-engines bench's workload: what the cache costs the requests it does not help).

Printed per variant and level: time to first token (TTFT) p50/p95 (the first request of each walk, cold for every
variant, apart), end-to-end latency p50/p95, generated tokens/s over the level's wall time (and this process's
CPU milliseconds per generated token: on a shared box, less swayed by other work than wall time), and the
prefix-cache hit rate. The pipeline (OpenVINO GenAI 2026.4) counts no hits: the hit rate printed is the share of prompt
tokens a block-aligned match with the same client's previous prompt covers (what the workload offers the cache),
and whether the engine takes it shows in the follow-ups' TTFT against the same prompts cold (cache-off). Then the
issue's goals, met or missed. Percentiles: bench/stats.py.

    python -m bench.editor [--model 350m|demo] [--weights fp32|int8] [--rounds 1] [--variants cache-on cache-off]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import load, stats
from bench.bench_codegen_engines import PROMPTS as PLAIN_PROMPTS  # the engine bench's short prompts

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 32
PLAIN_TOKENS = 64
BLOCK = 32  # the CPU plugin's KV block (backends/gptj_generator/openvino_engine.py KV_BLOCK_TOKENS)
# held out: modules inside stdlib packages (not stdlib_sources' top-level ones), long enough for a walk
FILES = ("json/decoder.py", "email/feedparser.py", "asyncio/locks.py", "concurrent/futures/_base.py",
         "logging/handlers.py", "http/cookies.py", "urllib/parse.py", "xml/dom/pulldom.py", "unittest/case.py",
         "importlib/metadata/__init__.py", "email/message.py", "asyncio/queues.py", "json/encoder.py",
         "http/client.py", "email/_policybase.py", "asyncio/streams.py", "unittest/mock.py", "logging/config.py",
         "xml/etree/ElementPath.py", "email/utils.py", "asyncio/tasks.py", "collections/__init__.py",
         "multiprocessing/pool.py", "sqlite3/dump.py")
VARIANTS = {"cache-on": {}, "cache-off": {"prefix_caching": False}, "lookup": {"prompt_lookup_tokens": 4},
            "bf16": {"precision": "bf16"},  # bf16: cache on, bf16 inference and KV cache (AVX512_BF16 or AMX CPUs)
            "f32": {"precision": "f32"}}  # the exact mode (the shipped auto is bf16 where the CPU has it)


# ---- the model -------------------------------------------------------------------------------------------------

def model_folder(model: str, weights: str) -> tuple[Path, Path]:
    """The generator's version folder and its IR: the demo's (model_repository/, `make model`), or a GPT-J of
    codegen-350M-mono's shape (random weights, the demo tokenizer) saved once into bench-results/editor-350m/ with
    its IR (exported through build/openvino_export.py's cache, as the fidelity test's)."""
    from build import openvino_export

    if model == "demo":
        folder = ROOT / "model_repository" / "codegen_generator" / "1"
        if weights != "fp32":
            ir = ROOT / "bench-results" / f"editor-demo-openvino-{weights}"
            if not (ir / "openvino_model.xml").exists():
                openvino_export.export(folder, ir, weights)
            return folder, ir
        return folder, folder / openvino_export.IR_FOLDER
    from build import codegen as codegen_build

    folder = ROOT / "bench-results" / f"editor-{model}"
    ir = folder / f"openvino-{weights}"
    if not (ir / "openvino_model.xml").exists():
        print(f"bench: building a GPT-J of the {model} shape into {folder.relative_to(ROOT)}/", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer = codegen_build.train_demo_tokenizer()
        network = codegen_build.demo_model(tokenizer, model)
        network.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        del network
        openvino_export.export(folder, ir, weights)
    return folder, ir


def load_variant(folder: Path, ir: Path, options: dict):
    """The engine as the shipped config sets it (parameters read as the served stage reads them), `options`
    over them."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from gptj_generator.loading import engine_options, load_engine
    from stage_common.params import config_param

    config = text_format.Parse((ROOT / "model_repository" / "codegen_generator" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    config = json_format.MessageToDict(config, preserving_proto_field_name=True)
    threads = config_param(config, "openvino_threads", int, 0)
    return load_engine("openvino", folder, **{**engine_options(config), **options}, threads=threads, ir_dir=ir)


# ---- the workload ----------------------------------------------------------------------------------------------

def walks(tokenize, files: list[str], min_tokens: int, max_tokens: int, lines: int) -> list[list[int]]:
    """Each file's cursor walk: the file up to the cursor, from the first line where it reaches min_tokens, `lines`
    lines further each time, while it stays within max_tokens."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in files:
        text_lines = (stdlib / name).read_text(encoding="utf-8").splitlines(keepends=True)
        walk, cursor = [], 1
        while cursor <= len(text_lines):
            ids = tokenize("".join(text_lines[:cursor]))
            if len(ids) > max_tokens:
                break
            if len(ids) >= min_tokens:
                walk.append(ids)
                cursor += lines
            else:
                cursor += max(1, lines)
        if len(walk) >= 2:
            out.append(walk)
    return out


def offered_hits(prompt: list[int], previous: list[int] | None) -> int:
    """Prompt tokens a block-aligned prefix match with `previous` covers (the last token is always computed)."""
    if previous is None:
        return 0
    same = 0
    for a, b in zip(prompt, previous):
        if a != b:
            break
        same += 1
    return min(same, len(prompt) - 1) // BLOCK * BLOCK


@dataclass
class Sample:
    tokens: int  # prompt
    cold: bool  # the first of its walk
    hit: int  # offered prefix-cache tokens
    ttft: float = float("nan")
    e2e: float = float("nan")
    generated: int = 0


@dataclass
class Level:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0
    cpu_seconds: float = 0.0  # this process's CPU time over the level (the engine's threads): less swayed by the
    # other work of a shared box than wall time


class _Sink:
    def __init__(self, sample: Sample, sent: float):
        self.sample, self.sent, self.done, self.error = sample, sent, threading.Event(), None

    def send(self, token_ids, logprobs=None):
        if token_ids and self.sample.ttft != self.sample.ttft:
            self.sample.ttft = time.perf_counter() - self.sent
        self.sample.generated += len(token_ids)

    def finish(self, reason, token_ids, logprobs=None):
        self.send(token_ids)
        self.sample.e2e = time.perf_counter() - self.sent
        self.done.set()

    def fail(self, error):
        self.error = error
        self.done.set()

    def cancelled(self):
        return False


def generate(engine, ids: list[int], max_tokens: int, sample: Sample) -> Sample:
    from gptj_generator.seam import GenerationRequest

    sink = _Sink(sample, time.perf_counter())
    engine.submit(GenerationRequest(ids, max_tokens), sink)
    if not sink.done.wait(1800) or sink.error is not None:
        raise load.Failed(f"generation failed: {sink.error!r}")
    return sample


def editor_level(engine, client_walks: list[list[list[int]]], steps: int) -> Level:
    """len(client_walks) clients, each sending its walk's first `steps` prompts back to back (a closed loop)."""
    def request(call: load.Call) -> Sample:
        walk = client_walks[call.worker]
        turn = call.turn % len(walk)  # the count is shared: a fast client may take a turn more than `steps`
        previous = walk[turn - 1] if turn else None
        return generate(engine, walk[turn], NEW_TOKENS, Sample(len(walk[turn]), turn == 0,
                                                                offered_hits(walk[turn], previous)))

    cpu = time.process_time()
    run = load.run_threads(request, len(client_walks), count=len(client_walks) * steps)
    return Level([r.value for r in run.every if r.ok], run.ended - run.started, run.errors, time.process_time() - cpu)


def plain_level(engine, tokenize, clients: int = 16) -> Level:
    prompts = [tokenize(p) for p in PLAIN_PROMPTS]

    def request(call: load.Call) -> Sample:
        ids = prompts[call.index % len(prompts)]
        return generate(engine, ids, PLAIN_TOKENS, Sample(len(ids), True, 0))

    cpu = time.process_time()
    run = load.run_threads(request, clients, count=clients)
    return Level([r.value for r in run.every if r.ok], run.ended - run.started, run.errors, time.process_time() - cpu)


# ---- figures ---------------------------------------------------------------------------------------------------

def figures(level: Level) -> dict:
    follow = [s for s in level.samples if not s.cold]
    prompt = sum(s.tokens for s in level.samples)
    ttft, e2e = stats.percentiles([s.ttft for s in level.samples], (50, 95)), \
        stats.percentiles([s.e2e for s in level.samples], (50, 95))
    return {"requests": len(level.samples), "errors": level.errors,
            "prompt_tokens_p50": stats.median([s.tokens for s in level.samples]),
            "ttft_p50_s": ttft[50], "ttft_p95_s": ttft[95], "e2e_p50_s": e2e[50], "e2e_p95_s": e2e[95],
            "ttft_cold_p50_s": stats.median([s.ttft for s in level.samples if s.cold]),
            "ttft_follow_p50_s": stats.median([s.ttft for s in follow]),
            "tokens_per_s": sum(s.generated for s in level.samples) / level.seconds if level.seconds else float("nan"),
            "cpu_ms_per_token": 1e3 * level.cpu_seconds / max(1, sum(s.generated for s in level.samples)),
            "offered_hit_rate": sum(s.hit for s in level.samples) / prompt if prompt else float("nan")}


def print_row(round_: int, variant: str, level: str, m: dict) -> None:
    print(f"round {round_} {variant:9s} {level:8s}: {m['requests']:3d} requests ({m['errors']} failed), prompt p50 "
          f"{m['prompt_tokens_p50']:5.0f} tokens; TTFT p50/p95 {m['ttft_p50_s']:6.2f} / {m['ttft_p95_s']:6.2f} s "
          f"(first of a walk {m['ttft_cold_p50_s']:6.2f}, follow-ups {m['ttft_follow_p50_s']:6.2f}); e2e p50/p95 "
          f"{m['e2e_p50_s']:6.2f} / {m['e2e_p95_s']:6.2f} s; {m['tokens_per_s']:6.1f} tokens/s "
          f"({m['cpu_ms_per_token']:.0f} CPU ms/token); prefix-cache hit "
          f"rate (offered) {m['offered_hit_rate']:.2f}; load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}",
          flush=True)


def verdict(value: float, goal: float, at_most: bool = True) -> str:
    if value != value:
        return "not measured in this run"
    return "met" if (value <= goal if at_most else value >= goal) else "MISSED"


def goals(rows: list[dict]) -> list[str]:
    """Issue 53's goals, each a ratio of two variants' figures in the same round (the median over rounds)."""
    def ratio(a: str, b: str, level: str, key: str, key_b: str | None = None) -> float:
        per_round = []
        for r in sorted({row["round"] for row in rows}):
            x = [row for row in rows if (row["round"], row["variant"], row["level"]) == (r, a, level)]
            y = [row for row in rows if (row["round"], row["variant"], row["level"]) == (r, b, level)]
            if x and y:
                per_round.append(x[0]["figures"][key] / y[0]["figures"][key_b or key])
        return stats.median(per_round)

    lines = []
    for level in ("c1", "c4"):
        value = ratio("cache-on", "cache-off", level, "ttft_follow_p50_s")
        lines.append(f"{level}: TTFT p50 of a follow-up (its prefix just served) / the same prompts cold: "
                     f"{value:.2f}x (goal <= 0.2x) {verdict(value, 0.2)}")
        value = ratio("cache-on", "cache-off", level, "e2e_p50_s")
        lines.append(f"{level}: editor e2e p50 caching on / off: {value:.2f}x (goal <= 0.5x) {verdict(value, 0.5)}")
    value = ratio("cache-on", "cache-off", "plain16", "tokens_per_s")
    lines.append(f"plain c16 (no shared prefix) tokens/s caching on / off: {value:.2f}x (goal >= 0.95x) "
                 f"{verdict(value, 0.95, at_most=False)}")
    value = ratio("cache-off", "cache-on", "plain16", "cpu_ms_per_token")
    lines.append(f"plain c16 (no shared prefix) CPU time per token, as tokens per CPU second, caching on / off: "
                 f"{value:.2f}x (the same goal, read off CPU time) {verdict(value, 0.95, at_most=False)}")
    for level in ("c1", "plain16"):
        value = ratio("lookup", "cache-on", level, "tokens_per_s")
        if value == value:
            lines.append(f"{level}: prompt lookup on / off tokens/s: {value:.2f}x (no goal: it depends on how "
                         f"often drafts are accepted)")
    for level in ("c1", "c4", "plain16"):
        value = ratio("bf16", "f32", level, "tokens_per_s")
        if value == value:
            lines.append(f"{level}: bf16 / f32 tokens/s: {value:.2f}x")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["350m", "demo"], default="350m")
    parser.add_argument("--weights", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", nargs="*", default=["cache-on", "cache-off"], choices=list(VARIANTS))
    parser.add_argument("--levels", nargs="*", default=["c1", "c4", "plain16"], choices=["c1", "c4", "plain16"])
    parser.add_argument("--steps", type=int, default=4, help="requests per client walk (per level and round)")
    parser.add_argument("--lines", type=int, default=3, help="lines the cursor moves down between requests")
    parser.add_argument("--min-tokens", type=int, default=600)
    parser.add_argument("--max-tokens", type=int, default=1800)
    parser.add_argument("--lookup-tokens", type=int, default=4, help="draft ids per step of the lookup variant")
    parser.add_argument("--precision", choices=["f32", "bf16"], default=None, help="override the shipped config's")
    args = parser.parse_args()
    VARIANTS["lookup"] = {"prompt_lookup_tokens": args.lookup_tokens}

    from tokenizers import Tokenizer

    folder, ir = model_folder(args.model, args.weights)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    context = int(json.loads((ir / "config.json").read_text())["n_positions"])
    max_tokens = min(args.max_tokens, context - NEW_TOKENS)
    all_walks = walks(lambda text: tokenizer.encode(text).ids, list(FILES), args.min_tokens, max_tokens, args.lines)
    all_walks = [w for w in all_walks if len(w) >= args.steps]
    need = args.rounds * sum({"c1": 1, "c4": 4}.get(level, 0) for level in args.levels)
    if len(all_walks) < need:
        raise SystemExit(f"{len(all_walks)} files give a walk of {args.steps} requests; {need} are needed")
    extra = {"precision": args.precision} if args.precision else {}
    engines = {name: load_variant(folder, ir, {**VARIANTS[name], **extra}) for name in args.variants}
    any_engine = next(iter(engines.values()))
    precisions = ", ".join(f"{name} {engine.precision}" for name, engine in engines.items())
    print(f"bench.editor: {args.model} shape, {args.weights} weights ({precisions}), "
          f"{any_engine.threads} thread(s), {os.cpu_count()} CPUs; {NEW_TOKENS} new tokens, a walk of "
          f"{args.steps} requests {args.lines} lines apart, prompts {args.min_tokens}-{max_tokens} tokens; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    rows, next_walk = [], 0
    try:
        for r in range(args.rounds):
            for level in args.levels:
                clients = {"c1": 1, "c4": 4}.get(level, 0)
                level_walks, next_walk = all_walks[next_walk:next_walk + clients], next_walk + clients
                order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
                for variant in order:
                    if level == "plain16":
                        result = plain_level(engines[variant], lambda text: tokenizer.encode(text).ids)
                    else:
                        result = editor_level(engines[variant], level_walks, args.steps)
                    row = {"round": r + 1, "variant": variant, "level": level, "figures": figures(result)}
                    rows.append(row)
                    print_row(r + 1, variant, level, row["figures"])
    finally:
        for engine in engines.values():
            engine.close()
    print("\ngoals (issue 53, median over rounds of each round's ratio):")
    for line in goals(rows):
        print("  " + line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
