"""The training loop of the demo trainers that run a fixed number of AdamW steps (captioner, CLIP,
codegen): each passes what differs (its batch's loss, learning rate and its schedule, gradient
clipping)."""
from __future__ import annotations

from typing import Callable

from build.common import TrainLog


def warmup_then_linear(steps: int, warmup: int = 20, floor: float = 0.05) -> Callable[[int], float]:
    """Learning-rate factor of step s: a linear warm-up over `warmup` steps, then a linear decay to
    `floor` of the rate at the last step."""
    return lambda s: min(1.0, (s + 1) / warmup) * max(floor, 1 - s / steps)


def train_steps(model, steps: int, batch_loss: Callable[[int], "torch.Tensor"], name: str, lr: float,
                schedule: Callable[[int], float], betas: tuple[float, float] = (0.9, 0.999),
                clip_norm: float | None = None) -> None:
    """`steps` AdamW updates (weight decay 0.01) of the whole model on batch_loss(step), the learning rate
    scaled by schedule(step), gradients clipped to clip_norm (None: not clipped); the model is left in
    eval mode."""
    import torch

    # fused: the square roots are torch's own, not MKL's vector math (build/instruction_set.py)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=betas, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    log = TrainLog(name, steps)
    model.train()
    for step in range(steps):
        loss = batch_loss(step)
        optimizer.zero_grad()
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        scheduler.step()
        log.step(step, loss.item())
    model.eval()
