"""bench/editor.py's workload without an engine: the cursor walks (held-out files, growing prompts within the
token bounds, a few lines apart) and the prefix-cache hits a follow-up offers (block-aligned, the last token
always computed)."""
from __future__ import annotations

from bench import editor


def characters(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_a_walk_grows_by_whole_lines_within_its_bounds():
    walks = editor.walks(characters, ["json/decoder.py"], 600, 1800, 3)
    assert len(walks) == 1
    walk = walks[0]
    assert len(walk) >= 2 and all(600 <= len(ids) <= 1800 for ids in walk)
    for before, after in zip(walk, walk[1:]):
        assert after[:len(before)] == before and len(after) > len(before), "each request extends the last"
        assert sum(1 for c in after[len(before):] if c == ord("\n")) == 3


def test_the_held_out_files_are_no_top_level_module_of_the_training_set():
    assert all("/" in name for name in editor.FILES)  # build/codegen.py stdlib_sources: top-level *.py alone


def test_offered_hits_are_the_shared_prefix_in_whole_blocks():
    previous = list(range(100))
    assert editor.offered_hits(list(range(130)), None) == 0
    assert editor.offered_hits(list(range(130)), previous) == 96  # 100 shared: three blocks of 32
    assert editor.offered_hits(previous, previous) == 96  # the last token is computed again: 99 -> 96
    assert editor.offered_hits([1] + list(range(1, 130)), previous) == 0
