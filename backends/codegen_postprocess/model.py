import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen_common.detokenizer import Detokenizer, cut_at_stop_words  # noqa: E402
from codegen_common.generation_params import GenerationParams  # noqa: E402
from stage_common.request_inputs import row_stop_words  # noqa: E402
from stage_common.triton_io import execute_batched, input_array, string_tensor, text_rows, version_dir  # noqa: E402


def _parse(request) -> list[tuple]:
    """One (ids, stop words, prompt to prepend, healed prefix to cut) per row; ids padded with negatives are cut."""
    ids = input_array(request, "output_ids")
    ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
    n = ids.shape[0]
    params = input_array(request, "generation_params", optional=True)
    if params is not None:
        params = [GenerationParams.from_json(v) for v in params.reshape(-1)]
        stops = [list(p.stop) for p in params]
    else:
        stops = row_stop_words(request, n)
    prompts = text_rows(request, "text_input") if input_array(request, "text_input", optional=True) is not None \
        else [""] * n
    echo = [bool(params and not params[i].exclude_input) for i in range(n)]
    healed = [params[i].heal_prefix if params else "" for i in range(n)]
    return [(row[row >= 0], stops[i], prompts[i] if echo[i] else "", healed[i]) for i, row in enumerate(ids)]


def _decode(detokenizer: Detokenizer, requests: list[list[tuple]]) -> list[list[str] | Exception]:
    """Every request's texts; a request whose row fails to decode gets that error alone."""
    # token healing's prefix is cut before the stop words are looked for (it belongs to the prompt)
    flat = detokenizer.decode([(ids, []) for rows in requests for ids, _, _, _ in rows])
    out, at = [], 0
    for rows in requests:
        texts = flat[at:at + len(rows)]
        failed = [t for t in texts if isinstance(t, Exception)]
        out.append(failed[0] if failed else [prompt + cut_at_stop_words(text[len(healed):], stop)
                                             for (_, stop, prompt, healed), text in zip(rows, texts)])
        at += len(rows)
    return out


class TritonPythonModel:
    """output_ids (INT32 [-1] per row: generated ids padded with -1, or one streamed chunk)
    [+ generation_params (stop words, echo) or stop_words] [+ text_input, prepended when the row's
    exclude_input_in_output is false] -> text_output (TYPE_STRING [1] per row)."""

    def initialize(self, args):
        self.detokenizer = Detokenizer(version_dir(args) / "tokenizer.json")

    def execute(self, requests):
        return execute_batched(requests, parse=_parse, compute=lambda reqs: _decode(self.detokenizer, reqs),
                               respond=lambda _parsed, texts: [string_tensor("text_output", texts, (len(texts), 1))])
