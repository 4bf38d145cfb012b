"""How the char LMs' time axis is cut into segments (shared by the torch and ONNX Runtime taggers).

Rows are sorted longest first; each segment runs the LSTM from the previous segment's end to its own over
only the rows not yet finished, the state carried across. Padding is never computed beyond a row's end."""
from __future__ import annotations

# The cost of one LSTM step over a batch, in units of one row's share (measured on CPU, hidden 1024: 1.4 ms
# per step at batch 1, +0.18 ms per row), and of starting one more segment (one more LSTM call).
STEP_COST_IN_ROWS = 8
SEGMENT_COST_IN_ROW_STEPS = 20


def plan_segments(lengths_desc: list[int]) -> list[tuple[int, int]]:
    """Cheapest cut of time into segments for rows sorted longest first: [(end, active rows), ...], each
    segment running from the previous end to its own over the first `active` rows (those longer than its
    start). Cost of a segment = its steps * (STEP_COST + active) + SEGMENT_COST."""
    points = [0] + sorted(set(lengths_desc))
    active = [sum(1 for n in lengths_desc if n > p) for p in points]
    best, cut = [0.0] + [float("inf")] * (len(points) - 1), [0] * len(points)
    for j in range(1, len(points)):
        for i in range(j):
            cost = best[i] + (points[j] - points[i]) * (STEP_COST_IN_ROWS + active[i]) + SEGMENT_COST_IN_ROW_STEPS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    segments, j = [], len(points) - 1
    while j > 0:
        segments.append((points[j], active[cut[j]]))
        j = cut[j]
    return segments[::-1]
