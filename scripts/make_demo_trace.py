"""Makes python/gpumm/data/transformer_step.csv.gz: the allocation trace of one training step
of a GPT-2-small-sized decoder (12 layers, d_model 768, 12 heads, vocabulary 50257, batch 4 x
512 tokens, fp32, AdamW), written as an RMM log.

How it is made: the script walks the step the way PyTorch's autograd runs it and emits one
allocation per tensor PyTorch would create, with its exact byte size, and a free when the
tensor's last use is over:

- before the step: parameters (embeddings, per layer LayerNorm weights and biases, QKV,
  attention projection, MLP weights and biases); gradients are made in each backward, and
  AdamW's two moment buffers in the first optimizer step, as PyTorch does;
- forward, per layer: LayerNorm output with its saved mean and rstd, QKV, the attention score
  and probability matrices (batch x heads x T x T), the attention output and projection, the
  residual, the second LayerNorm, the MLP hidden (4 d) before and after GELU, the MLP output;
  saved activations live until the layer's backward, temporaries die at once;
- the loss: logits (batch x T x vocabulary), log-softmax, a scalar loss;
- backward in reverse: gradients of each activation (allocated, used, freed), gradients of
  each parameter (kept), attention's softmax backward temporaries;
- the optimizer: per parameter, AdamW's temporaries (the update, its denominator) allocated and
  freed; then `zero_grad(set_to_none=True)` frees every gradient;
- small tensors PyTorch also makes: shape scalars, dropout seeds, index tensors (4–64 B).

Two steps are written (the first also creates the optimizer state; the second is the
steady state). Run: ``python scripts/make_demo_trace.py``. Deterministic (no randomness).
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Dict, List, Tuple

OUT = Path(__file__).resolve().parents[1] / "python" / "gpumm" / "data" / "transformer_step.csv.gz"

L, D, H, V, B, T = 12, 768, 12, 50257, 4, 512
F = 4  # bytes per fp32


class Recorder:
    def __init__(self) -> None:
        self.rows: List[Tuple[str, int, int]] = []
        self.next_ptr = 0x7F00_0000_0000
        self.live: Dict[str, Tuple[int, int]] = {}
        self.time = 0

    def alloc(self, name: str, nbytes: int) -> None:
        assert name not in self.live, name
        ptr = self.next_ptr
        self.next_ptr += (nbytes + 511) // 512 * 512 + 512
        self.live[name] = (ptr, nbytes)
        self.rows.append(("allocate", ptr, nbytes))

    def free(self, name: str) -> None:
        ptr, nbytes = self.live.pop(name)
        self.rows.append(("free", ptr, nbytes))

    def temp(self, name: str, nbytes: int) -> None:
        self.alloc(name, nbytes)
        self.free(name)

    def small(self, tag: str) -> None:
        for i, n in enumerate((4, 8, 64)):
            self.temp(f"{tag}.small{i}", n)

    def csv(self) -> bytes:
        out = io.StringIO()
        out.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i, (action, ptr, nbytes) in enumerate(self.rows):
            us = i * 7
            s, us = divmod(us, 1_000_000)
            m, s = divmod(s, 60)
            out.write(f"1,00:{m:02d}:{s:02d}.{us:06d},{action},{ptr:#x},{nbytes},0x0\n")
        return gzip.compress(out.getvalue().encode(), mtime=0)


def params() -> List[Tuple[str, int]]:
    p = [("wte", V * D * F), ("wpe", T * D * F)]
    for i in range(L):
        p += [(f"h{i}.ln1.w", D * F), (f"h{i}.ln1.b", D * F),
              (f"h{i}.qkv.w", D * 3 * D * F), (f"h{i}.qkv.b", 3 * D * F),
              (f"h{i}.proj.w", D * D * F), (f"h{i}.proj.b", D * F),
              (f"h{i}.ln2.w", D * F), (f"h{i}.ln2.b", D * F),
              (f"h{i}.fc.w", D * 4 * D * F), (f"h{i}.fc.b", 4 * D * F),
              (f"h{i}.fc2.w", 4 * D * D * F), (f"h{i}.fc2.b", D * F)]
    return p + [("lnf.w", D * F), ("lnf.b", D * F)]


def step(r: Recorder, k: int, first: bool) -> None:
    act = B * T * D * F
    att = B * H * T * T * F
    r.alloc(f"s{k}.tokens", B * T * 8)
    r.small(f"s{k}.embed")
    r.alloc(f"s{k}.x0", act)
    for i in range(L):
        n = f"s{k}.h{i}"
        r.alloc(f"{n}.ln1", act)
        r.alloc(f"{n}.ln1.mean", B * T * F)
        r.alloc(f"{n}.ln1.rstd", B * T * F)
        r.alloc(f"{n}.qkv", 3 * act)
        r.alloc(f"{n}.scores", att)
        r.alloc(f"{n}.probs", att)
        r.free(f"{n}.scores")
        r.small(f"{n}.dropout")
        r.alloc(f"{n}.attn", act)
        r.alloc(f"{n}.proj", act)
        r.alloc(f"{n}.res1", act)
        r.free(f"{n}.proj")
        r.alloc(f"{n}.ln2", act)
        r.alloc(f"{n}.ln2.mean", B * T * F)
        r.alloc(f"{n}.ln2.rstd", B * T * F)
        r.alloc(f"{n}.fc", 4 * act)
        r.alloc(f"{n}.gelu", 4 * act)
        r.alloc(f"{n}.fc2", act)
        r.alloc(f"{n}.res2", act)
        r.free(f"{n}.fc2")
    r.alloc(f"s{k}.lnf", act)
    r.alloc(f"s{k}.logits", B * T * V * F)
    r.alloc(f"s{k}.logsoftmax", B * T * V * F)
    r.alloc(f"s{k}.loss", 4)
    r.small(f"s{k}.loss")
    # backward
    r.alloc(f"s{k}.dlogits", B * T * V * F)
    r.free(f"s{k}.logsoftmax")
    r.free(f"s{k}.logits")
    r.alloc("g.wte", V * D * F)
    r.alloc(f"s{k}.dlnf", act)
    r.free(f"s{k}.dlogits")
    r.free(f"s{k}.lnf")
    grad = f"s{k}.dlnf"
    for i in reversed(range(L)):
        n = f"s{k}.h{i}"
        new = r.alloc
        for pname, size in params():
            if pname.startswith(f"h{i}."):
                r.alloc(f"g.{pname}", size)
        new(f"{n}.dfc2", 4 * act)
        r.free(f"{n}.res2")
        r.free(f"{n}.gelu")
        new(f"{n}.dfc", 4 * act)
        r.free(f"{n}.dfc2")
        r.free(f"{n}.fc")
        new(f"{n}.dln2", act)
        r.free(f"{n}.dfc")
        for t in ("ln2", "ln2.mean", "ln2.rstd"):
            r.free(f"{n}.{t}")
        new(f"{n}.dres1", act)
        r.free(f"{n}.dln2")
        r.free(f"{n}.res1")
        new(f"{n}.dattn", act)
        new(f"{n}.dprobs", att)
        new(f"{n}.dscores", att)
        r.free(f"{n}.dprobs")
        r.free(f"{n}.probs")
        new(f"{n}.dqkv", 3 * act)
        r.free(f"{n}.dscores")
        r.free(f"{n}.dattn")
        r.free(f"{n}.qkv")
        r.free(f"{n}.attn")
        new(f"{n}.dln1", act)
        r.free(f"{n}.dqkv")
        for t in ("ln1", "ln1.mean", "ln1.rstd"):
            r.free(f"{n}.{t}")
        new(f"{n}.dx", act)
        r.free(f"{n}.dln1")
        r.free(f"{n}.dres1")
        r.free(grad)
        grad = f"{n}.dx"
    for pname, size in params():
        if not pname.startswith("h") and pname != "wte":
            r.alloc(f"g.{pname}", size)
    r.free(grad)
    r.free(f"s{k}.x0")
    r.free(f"s{k}.tokens")
    r.free(f"s{k}.loss")
    # optimizer: AdamW, moments made on the first step
    for pname, size in params():
        if first:
            r.alloc(f"m.{pname}", size)
            r.alloc(f"v.{pname}", size)
        r.temp(f"s{k}.upd.{pname}", size)
        r.temp(f"s{k}.denom.{pname}", size)
        r.small(f"s{k}.opt.{pname}")
    # zero_grad(set_to_none=True) after the step
    for pname, _ in params():
        r.free(f"g.{pname}")


def main() -> None:
    r = Recorder()
    for pname, size in params():
        r.alloc(pname, size)
    step(r, 0, first=True)
    step(r, 1, first=False)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(r.csv())
    print(f"{OUT}: {len(r.rows)} events")


if __name__ == "__main__":
    main()
