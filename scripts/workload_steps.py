"""What every recorded workload is made of: the ``Workload`` record that
scripts/record_workloads.py runs, and the training and decoding steps that the workloads of
scripts/workloads.py and scripts/workloads_heldout.py share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Step = Callable[[], None]


@dataclass(frozen=True)
class Workload:
    """A model step to record: ``build()`` returns the step; ``warmup`` steps run unrecorded,
    then ``steps`` run under the profiler."""

    name: str
    summary: str
    build: Callable[[], Step]
    warmup: int
    steps: int


def adamw_step(model, loss_of: Callable[[], "object"]) -> Step:
    """A training step of ``model``: the loss ``loss_of()`` returns, its backward pass, an
    AdamW step, the gradients dropped (``set_to_none``)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def image_classifier_step(model, batch: int, side: int) -> Step:
    """An AdamW training step of an image classifier with 10 classes on ``batch`` random
    ``side`` × ``side`` RGB images."""
    import torch

    pixels = torch.randn(batch, 3, side, side)
    labels = torch.randint(0, 10, (batch,))
    return adamw_step(model, lambda: model(pixel_values=pixels, labels=labels).loss)


def generate_step(model, vocab: int, batch: int, prompt: int, new: int) -> Step:
    """Greedy ``generate`` of ``new`` tokens after a random ``prompt``-token prompt, with the
    KV cache (``past_key_values`` grows by one position a token)."""
    import torch

    ids = torch.randint(0, vocab, (batch, prompt))
    mask = torch.ones_like(ids)
    model.eval()

    def step() -> None:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, use_cache=True, pad_token_id=0)
        assert out.shape == (batch, prompt + new), out.shape

    return step
