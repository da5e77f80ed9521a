"""Records the allocation traces of real model workloads on a CPU, as RMM logs, for the corpus
that tests and benchmarks replay (tests/corpus.py picks them up from the cache folder).

Each workload builds a Hugging Face ``transformers`` (or ``diffusers``) model from a
configuration in code (random weights: nothing is downloaded), runs its warm-up steps, then
runs its recorded steps under ``torch.profiler.profile(profile_memory=True)``. The profiler's
allocation events on the CPU (address, bytes: positive for an allocation, negative for a free)
become the rows of an RMM ``logging_resource_adaptor`` log in the order they happened, Time
from the first event, written by :func:`gpumm.traces.write_rmm_csv`. Sizes are the exact
byte counts the CPU allocator was asked for (``check_exact_sizes`` shows it on tensors of known
size before anything is recorded). Memory allocated before recording began (weights,
optimizer state, the warm-up's leftovers) is not in the log: frees of it are left out, as
RMM would never have seen the allocation; allocations still live at the end have no free.

    pip install torch transformers diffusers
    python scripts/record_workloads.py [--out DIR] [--only NAME ...] [--force] [--list]

The output folder is ``--out``, else ``$GPUMM_TRACE_CACHE``, else ``~/.cache/gpumm/traces``;
each workload writes ``<name>.csv.gz`` there. A file already there is kept unless ``--force``.
The workloads (and their configurations) are listed in docs/replay.md, "Recorded workloads".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from gpumm.traces import Event, Trace, write_rmm_csv

Step = Callable[[], None]


def cache_dir() -> Path:
    """The folder recorded traces go to: ``$GPUMM_TRACE_CACHE`` or ``~/.cache/gpumm/traces``."""
    env = os.environ.get("GPUMM_TRACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpumm" / "traces"


@dataclass(frozen=True)
class Workload:
    """A model step to record: ``build()`` returns the step; ``warmup`` steps run unrecorded,
    then ``steps`` run under the profiler."""

    name: str
    summary: str
    build: Callable[[], Step]
    warmup: int
    steps: int


def _adamw_step(model, loss_of: Callable[[], "object"]) -> Step:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _generate_step(model, vocab: int, batch: int, prompt: int, new: int) -> Step:
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


def gpt2_decode() -> Step:
    """GPT-2 small (the default GPT2Config: 12 layers, d_model 768, 12 heads, vocabulary
    50257), batch 2, a 32-token prompt, 160 new tokens by greedy ``generate`` with the KV
    cache."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return _generate_step(GPT2LMHeadModel(GPT2Config()), 50257, 2, 32, 160)


def llama_decode() -> Step:
    """Token-by-token decoding with grouped-query attention: transformers' Llama with a shrunk
    configuration (8 layers, hidden 512, 8 heads, 2 key/value heads, intermediate 1376,
    vocabulary 32000, RoPE), batch 4, a 64-token prompt, 192 new tokens by greedy
    ``generate`` with the KV cache."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=512)
    return _generate_step(LlamaForCausalLM(cfg), 32000, 4, 64, 192)


def t5_train() -> Step:
    """T5-small (the default T5Config: 6 + 6 layers, d_model 512, 8 heads, d_ff 2048,
    vocabulary 32128), batch 8, 128 source and 32 target tokens, AdamW."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    # t5-small's ids (the default configuration leaves the decoder's start id unset)
    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, pad_token_id=0))
    src = torch.randint(0, 32128, (8, 128))
    tgt = torch.randint(0, 32128, (8, 32))
    return _adamw_step(model, lambda: model(input_ids=src, labels=tgt).loss)


def vit_train() -> Step:
    """ViT-base (the default ViTConfig: 12 layers, hidden 768, 12 heads, patch 16, 224 × 224
    images, 197 tokens) with a 10-class head, batch 4, AdamW."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(num_labels=10))
    pixels = torch.randn(4, 3, 224, 224)
    labels = torch.randint(0, 10, (4,))
    return _adamw_step(model, lambda: model(pixel_values=pixels, labels=labels).loss)


def unet_train() -> Step:
    """A DDPM training step of a diffusers UNet2DModel (64 × 64 RGB, block channels 64, 128,
    256, 256, two ResNet layers per block, attention in the two lowest-resolution down and
    up blocks), batch 4: noise added at random timesteps by DDPMScheduler (1000 steps), MSE
    on the predicted noise, AdamW."""
    import torch
    from diffusers import DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    model = UNet2DModel(
        sample_size=64, in_channels=3, out_channels=3, layers_per_block=2,
        block_out_channels=(64, 128, 256, 256),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    )
    sched = DDPMScheduler(num_train_timesteps=1000)
    images = torch.randn(4, 3, 64, 64)

    def loss():
        noise = torch.randn_like(images)
        t = torch.randint(0, 1000, (images.shape[0],))
        noisy = sched.add_noise(images, noise, t)
        return torch.nn.functional.mse_loss(model(noisy, t).sample, noise)

    return _adamw_step(model, loss)


def mixtral_moe_train() -> Step:
    """A mixture-of-experts decoder: transformers' Mixtral with a shrunk configuration
    (4 layers, hidden 256, 8 heads, 4 key/value heads, intermediate 512, 8 experts, top-2
    routing, vocabulary 32000), batch 4 × 128 tokens, causal-LM loss with the router's
    auxiliary loss, AdamW."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=32000, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                        num_local_experts=8, num_experts_per_tok=2, output_router_logits=True,
                        max_position_embeddings=512)
    model = MixtralForCausalLM(cfg)
    ids = torch.randint(0, 32000, (4, 128))
    return _adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def llama_train_512() -> Step:
    """A decoder-only LM trained on 512-token sequences: transformers' Llama with a shrunk
    configuration (8 layers, hidden 512, 8 heads, intermediate 1376, vocabulary 32000, RoPE),
    batch 2 × 512 tokens, AdamW."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 32000, (2, 512))
    return _adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


# Decoding and T5 come first: they are the ones the replay's crash reproductions need.
WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2_decode", "GPT-2 small, greedy generate, KV cache", gpt2_decode, 1, 1),
    Workload("t5_train", "T5-small, AdamW", t5_train, 1, 2),
    Workload("vit_train", "ViT-base, AdamW", vit_train, 1, 2),
    Workload("unet_train", "diffusers UNet2DModel, DDPM, AdamW", unet_train, 1, 2),
    Workload("mixtral_moe_train", "Mixtral MoE (small), AdamW", mixtral_moe_train, 1, 2),
    Workload("llama_train_512", "Llama (small), 2 x 512 tokens, AdamW", llama_train_512, 1, 2),
    Workload("llama_decode", "Llama (small, grouped-query), greedy generate, KV cache",
             llama_decode, 1, 1),
]}


def _allocation_events(prof) -> List[Tuple[int, int, int, int]]:
    """(time ns, thread, address, bytes) of every CPU allocation event the profiler saw, in
    the order they happened (bytes < 0: a free)."""
    from torch._C._profiler import _EventType

    out = []
    stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while stack:  # pre-order: children in the order they happened
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.tag != _EventType.Allocation:
            continue
        f = node.extra_fields
        if f.device.type != "cpu" or f.alloc_size == 0:
            continue
        out.append((node.start_time_ns, node.start_tid, f.ptr, f.alloc_size))
    out.sort(key=lambda e: e[0])  # stable: events of the same nanosecond keep their order
    return out


def _profile(fn: Callable[[], None]) -> List[Tuple[int, int, int, int]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    return _allocation_events(prof)


def to_trace(events: List[Tuple[int, int, int, int]], source: str) -> Trace:
    """The profiler's allocation events as a trace, Time from its first row: frees of
    addresses not allocated in the recording are left out (their allocation came before it),
    and each free carries the size of its allocation."""
    live: Dict[int, int] = {}
    rows: List[Tuple[str, int, int, int, int]] = []
    for ns, tid, ptr, nbytes in events:
        if nbytes > 0:
            if ptr in live:
                raise RuntimeError(f"{source}: {ptr:#x} allocated again while live")
            live[ptr] = nbytes
            rows.append(("alloc", ptr, nbytes, ns, tid))
        elif ptr in live:
            size = live.pop(ptr)
            if size != -nbytes:
                raise RuntimeError(f"{source}: {ptr:#x} freed with {-nbytes} B, allocated {size} B")
            rows.append(("free", ptr, size, ns, tid))
    t0 = rows[0][3] if rows else 0
    out = [Event(a, ptr, size, 0, (ns - t0) // 1000, tid) for a, ptr, size, ns, tid in rows]
    return Trace(out, source, format="rmm")


def check_exact_sizes() -> None:
    """The profiler reports the bytes asked for, not a rounded block: tensors of 1, 3, 1000
    and 12345 floats show up as 4, 12, 4000 and 49380 B."""
    import torch

    wanted = [1, 3, 1000, 12345]

    def make():
        keep = [torch.empty(n, dtype=torch.float32) for n in wanted]
        del keep

    seen = [b for _, _, _, b in _profile(make) if b > 0]
    if seen != [4 * n for n in wanted]:
        raise RuntimeError(f"the profiler's sizes are not exact tensor bytes: {seen}")


def record(w: Workload, path: Path) -> Trace:
    """Builds, warms up and records one workload; writes it to ``path``."""
    step = w.build()
    for _ in range(w.warmup):
        step()

    def run():
        for _ in range(w.steps):
            step()

    trace = to_trace(_profile(run), path.name)
    # a hidden name that still ends in .gz (write_rmm_csv compresses by the name): a reader of
    # the folder never sees half a file
    tmp = path.with_name("." + path.name)
    try:
        write_rmm_csv(trace, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return trace


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (default: $GPUMM_TRACE_CACHE or ~/.cache/gpumm/traces)")
    ap.add_argument("--only", nargs="+", choices=list(WORKLOADS), metavar="NAME",
                    help=f"record only these ({', '.join(WORKLOADS)})")
    ap.add_argument("--force", action="store_true", help="record again files already there")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = ap.parse_args(argv)
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:20} {w.summary}")
        return 0
    try:
        import torch
    except ImportError:
        print("record_workloads.py needs torch and transformers: pip install torch transformers diffusers",
              file=sys.stderr)
        return 2
    out = (args.out or cache_dir()).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    check_exact_sizes()
    todo = [WORKLOADS[n] for n in (args.only or WORKLOADS)]
    failed = 0
    for i, w in enumerate(todo, 1):
        path = out / f"{w.name}.csv.gz"
        head = f"[{i}/{len(todo)}] {w.name}"
        if path.exists() and not args.force:
            print(f"{head}: {path} is there, kept (--force records it again)", flush=True)
            continue
        print(f"{head}: {w.summary}: {w.warmup} warm-up + {w.steps} recorded steps ...", flush=True)
        t0 = time.perf_counter()
        try:
            trace = record(w, path)
        except Exception as e:  # a model the installed library cannot build: say so, go on
            failed += 1
            print(f"{head}: not recorded: {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{head}: {path}: {trace.num_allocs:,} allocations, peak live "
              f"{trace.peak_live() / 2**30:.2f} GiB, {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
