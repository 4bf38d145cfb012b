"""The gpu tier's own helpers, on any machine (no GPU needed): when parted greedy tokens are a near tie and when
they are not, and when a stage counts as placed on the GPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_helpers import (Row, assert_on_gpu, check_rows, divergence, first_difference, gpu_memory_grows,
                         row_ties)

CLEAR = np.array([0.0, 5.0, 10.0, 1.0])  # token 2 leads token 1 by 5.0
TIE = np.array([0.0, 9.99999, 10.0, 1.0])  # tokens 2 and 1 within the bound


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_clear_non_tie_is_refused_even_where_both_devices_computed_the_same_logits():
    near_tie, report = divergence(1, [2, 2], [2, 1], CLEAR, CLEAR.copy())
    assert not near_tie
    assert report.startswith("tokens part at position 1: cpu 2, gpu 1; tie bound 5.00e-02")
    assert "cpu logits [2]=10.000000 [1]=5.000000" in report
    rows = [Row("row", [2, 2], [2, 1], lambda position: (CLEAR, CLEAR))] + clean_rows(7)
    with pytest.raises(pytest.fail.Exception, match=r"not a near tie: row: tokens part at position 1"):
        check_rows(rows)


def test_a_constructed_tie_passes_once_in_eight_rows_with_a_warning():
    assert divergence(1, [2, 2], [2, 1], TIE, np.array([0.0, 10.00001, 9.99999, 1.0]))[0]
    rows = [Row("tied", [2, 2], [2, 1], lambda position: (CLEAR, CLEAR) if position == 0 else (TIE, TIE))]
    with pytest.warns(UserWarning, match="near tie, tied: tokens part at position 1"):
        check_rows(rows + clean_rows(7))


def test_more_tied_rows_than_one_in_eight_fail():
    def tied(name):
        return Row(name, [2, 2], [2, 1], lambda position: (CLEAR, CLEAR) if position == 0 else (TIE, TIE))

    with pytest.raises(pytest.fail.Exception, match=r"1 of 7 rows hold a near tie \(at most 0"):
        check_rows([tied("a")] + clean_rows(6))
    with pytest.raises(pytest.fail.Exception, match=r"2 of 8 rows hold a near tie \(at most 1"):
        check_rows([tied("a"), tied("b")] + clean_rows(6))


def test_a_row_may_part_at_one_position_only():
    """Fed the CPU's tokens, the GPU picks another token at position 0 (a tie), and the free-running tokens
    part at position 1 (a tie too): two positions in one row."""
    flipped = np.array([0.0, 10.0, 9.99999, 1.0])  # the GPU's argmax is 1, the CPU's token is 2
    row = Row("row", [2, 2], [2, 1], lambda position: (TIE, flipped) if position == 0 else (TIE, TIE))
    with pytest.raises(pytest.fail.Exception, match=r"2 positions part in one row"):
        row_ties(row)


def test_equal_tokens_still_fail_where_the_gpu_fed_the_cpus_tokens_picks_a_clearly_worse_one():
    wrong = np.array([0.0, 10.0, 5.0, 1.0])
    with pytest.raises(pytest.fail.Exception, match=r"not a near tie: row: tokens part at position 1: cpu 2, gpu 1"):
        row_ties(Row("row", [2, 2], [2, 2], lambda position: (CLEAR, CLEAR) if position == 0 else (CLEAR, wrong)))


def test_prompt_positions_are_not_compared():
    prompt_logits = np.array([9.0, 0.0, 0.0, 0.0])  # after the prompt's first token the model would say 0
    row = Row("row", [3, 2], [3, 2], lambda position: (prompt_logits, prompt_logits) if position == 0 else (CLEAR,) * 2,
              first_new=1)
    assert row_ties(row) == []


def test_a_sequence_ending_early_chose_the_end_token():
    end = np.array([0.0, 9.99999, 1.0, 10.0])  # the end token 3 and token 1 tie
    row = Row("row", [2], [2, 1], lambda position: (CLEAR, CLEAR) if position == 0 else (end, end))
    assert len(row_ties(row, end_token=3)) == 1
    with pytest.raises(pytest.fail.Exception, match=r"cpu None, gpu 1"):
        row_ties(row)  # no end token named: an early end is no tie
    with pytest.raises(pytest.fail.Exception, match=r"not a near tie"):
        row_ties(Row("row", [2], [2, 1], lambda position: (CLEAR, CLEAR)), end_token=3)


def clean_rows(n: int) -> list[Row]:
    return [Row(f"clean {i}", [2, 2], [2, 2], lambda position: (CLEAR, CLEAR)) for i in range(n)]


# ---- placement -------------------------------------------------------------------------------------------------

class Session:
    """What assert_on_gpu asks of an onnxruntime.InferenceSession."""

    def __init__(self, providers):
        self.providers = providers

    def get_providers(self):
        return self.providers


def closure_stage(module):
    """A stage keeping its model in a closure, as transformer_encoder's torch_forward does."""
    def forward(x):
        return module(x)

    class Stage:
        def __init__(self):
            self.forward, self.hidden_size = forward, 4
    return Stage()


def test_a_torch_stage_left_on_the_cpu_fails():
    stage = closure_stage(torch.nn.Linear(4, 4))
    with pytest.raises(AssertionError, match=r"Linear's tensors are on \{device\(type='cpu'\)\}, not cuda:0"):
        assert_on_gpu("encoder", stage)
    assert_on_gpu("encoder", stage, device=torch.device("cpu"))  # found in the closure, on the device asked


def test_an_onnx_runtime_session_on_the_cpu_provider_fails():
    import onnxruntime
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    class Stage:
        def __init__(self):
            self.vision, self.decoder = session, Session(["CUDAExecutionProvider", "CPUExecutionProvider"])

    with pytest.raises(AssertionError, match=r"an ONNX Runtime session runs on \['CPUExecutionProvider'\]"):
        assert_on_gpu("captioner", Stage())
    assert_on_gpu("captioner", {"sessions": [Session(["CUDAExecutionProvider", "CPUExecutionProvider"])]})


def test_a_stage_holding_no_runtime_fails():
    with pytest.raises(AssertionError, match="no torch module or ONNX Runtime session found"):
        assert_on_gpu("stage", closure_stage(None))


class Allocator:
    """torch.cuda's counters as gpu_memory_grows reads them: `grows` bytes allocated during the call."""

    def __init__(self, grows: int):
        self.grows, self.allocated, self.peak = grows, 1000, 1000

    def synchronize(self, device):
        pass

    def reset_peak_memory_stats(self, device):
        self.peak = self.allocated

    def memory_allocated(self, device):
        return self.allocated

    def max_memory_allocated(self, device):
        return self.peak

    def call(self):
        self.peak += self.grows
        return "result"


def test_a_call_that_allocates_nothing_on_the_gpu_fails():
    flat = Allocator(0)
    with pytest.raises(AssertionError, match=r"encoder: no memory allocated on cuda:0 during the call"):
        gpu_memory_grows("encoder", flat.call, cuda=flat)
    grows = Allocator(4096)
    assert gpu_memory_grows("encoder", grows.call, cuda=grows) == "result"
