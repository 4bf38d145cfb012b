"""The in-place KV cache of the codegen generator: the same tensors as transformers' DynamicCache after
any mix of appends and the engine's own reassignments, appends without reallocation while there is
room, and never a write into a tensor it was given."""
from __future__ import annotations

import torch
from transformers import DynamicCache, GPTJConfig, GPTJModel

from gptj_generator.kv_cache import GrowingLayer, growing_cache, spare_room


def _columns(rows: int, n: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 2, n, 4, generator=torch.Generator().manual_seed(seed))


def test_appends_equal_torch_cat_and_reuse_the_buffer():
    layer = GrowingLayer()
    reference = None
    buffers = set()
    for step, n in enumerate([5, 1, 1, 3, 1] + [1] * 40):
        keys, values = _columns(3, n, step), _columns(3, n, 1000 + step)
        got_k, got_v = layer.update(keys, values)
        reference = (keys, values) if reference is None else (torch.cat([reference[0], keys], 2),
                                                            torch.cat([reference[1], values], 2))
        assert torch.equal(got_k, reference[0]) and torch.equal(got_v, reference[1])
        assert torch.equal(layer.keys, reference[0]) and layer.get_seq_length() == reference[0].shape[2]
        buffers.add(layer._buffers["keys"].data_ptr())
    # 54 columns in 45 appends: a handful of allocations, not one per step
    assert len(buffers) <= 3, len(buffers)
    assert layer._buffers["keys"].shape[2] <= 54 + spare_room(54)


def test_assigned_tensors_are_adopted_and_never_written_into():
    layer = GrowingLayer()
    layer.update(_columns(4, 6, 0), _columns(4, 6, 1))
    # what the engine does when rows leave: index_select, then a slice (a view of another tensor)
    full_k, full_v = layer.keys.index_select(0, torch.tensor([0, 2])), layer.values.index_select(0, torch.tensor([0, 2]))
    before = full_k.clone()
    layer.keys, layer.values = full_k[:, :, 2:], full_v[:, :, 2:]
    assert layer.get_seq_length() == 4
    new_k, new_v = _columns(2, 1, 2), _columns(2, 1, 3)
    got_k, _ = layer.update(new_k, new_v)
    assert torch.equal(got_k, torch.cat([before[:, :, 2:], new_k], 2))
    assert torch.equal(full_k, before), "the adopted view's storage was written into"


def test_model_outputs_equal_with_dynamic_and_growing_cache():
    """A small GPT-J decoding step by step, left-padded rows, on both caches: equal hidden states."""
    torch.manual_seed(0)
    model = GPTJModel(GPTJConfig(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)).eval()
    ids = torch.randint(0, 64, (2, 7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    outputs = []
    for cache in (DynamicCache(), growing_cache()):
        with torch.inference_mode():
            steps = [model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).last_hidden_state]
            step_mask, position = mask, mask.sum(1, keepdim=True)
            for token in range(6):
                step_mask = torch.cat([step_mask, torch.ones(2, 1, dtype=torch.long)], 1)
                steps.append(model(input_ids=torch.full((2, 1), token), attention_mask=step_mask,
                                   position_ids=position + token, past_key_values=cache, use_cache=True).last_hidden_state)
        outputs.append(torch.cat(steps, 1))
    assert isinstance(cache.layers[0], GrowingLayer)
    assert torch.allclose(outputs[0], outputs[1], atol=1e-6, rtol=0)
