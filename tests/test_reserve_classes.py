"""gpumm's reserve on the workload classes of issue 27, on streams generated here (seeded, so
every figure is deterministic): small traces of tens of MiB, many 1-10 MiB tensors, a KV cache
extended token by token, long- and short-lived small tensors interleaved, several streams, and
a small convolutional network's tensors of whole pages and powers of two.

Each class is replayed through every model (`gpumm.replay.replay`, default pool, 80 GiB) and
checked against the issue's targets: gpumm's peak reserved at most 1.02 x peak live + 4 MiB
and at most every other model's; its smallest capacity at most 1.02 x peak live + 8 MiB. A
class where a target is not met yet is in ``OPEN`` with what it measures; its test is a strict
xfail, so it fails as soon as the target is met and the entry must go.

Regenerate a figure: ``python -c "import test_reserve_classes as t; t.show('kv_cache')"`` from
``tests/``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

from gpumm.replay import ALLOCATORS, replay
from gpumm.traces import read_rmm_csv
from gpumm.units import KiB, MiB

#: (action, id, size, stream) in order; a free names the id of an earlier allocation
Events = List[Tuple[str, int, int, int]]


class _Gen:
    """Allocation ids and the event list of one generated stream."""

    def __init__(self) -> None:
        self.events: Events = []
        self.next_id = 0

    def alloc(self, size: int, stream: int = 0) -> int:
        self.next_id += 1
        self.events.append(("allocate", self.next_id, size, stream))
        return self.next_id

    def free(self, i: int, stream: int = 0) -> None:
        self.events.append(("free", i, 0, stream))


def small_trace(seed: int = 1) -> Events:
    """Tens of MiB: a decoder step's small activations (4-512 KiB) around a few 1-3 MiB
    tensors, 200 steps; about 30 MiB live at the peak, where whole pages and heap pages are a
    large share of the reserve."""
    r, g = random.Random(seed), _Gen()
    for _ in range(24):  # weights, live throughout
        g.alloc(r.choice([64 * KiB, 256 * KiB, 2 * MiB + 4 * KiB]))
    for _ in range(200):
        step = [g.alloc(r.randrange(1, 128) * 4 * KiB) for _ in range(30)]
        big = [g.alloc(r.randrange(1, 3) * MiB + r.randrange(0, 64) * 4 * KiB) for _ in range(2)]
        for i in step[::2] + big + step[1::2]:
            g.free(i)
    return g.events


def mid_size(seed: int = 2) -> Events:
    """Many 1-10 MiB tensors (random sizes, not page multiples) live about 40 at a time,
    each freed a random while after it was made: the page tails of mid-size tensors."""
    r, g = random.Random(seed), _Gen()
    live: List[int] = []
    for _ in range(3000):
        live.append(g.alloc(r.randrange(MiB, 10 * MiB, 512)))
        if len(live) > 40:
            g.free(live.pop(r.randrange(len(live) // 2)))
    return g.events


def kv_cache(seed: int = 3) -> Events:
    """A KV cache extended token by token, as `generate` does with `torch.cat`: per layer the
    cache of n tokens is copied into one of n + 1 (both live together), then the old is freed;
    each token's activations (small and mid-size) come and go between."""
    r, g = random.Random(seed), _Gen()
    layers, per_token = 8, 2 * 4 * 64 * 2 * 4  # k and v, 4 heads x 64, batch 2, fp32
    prompt = 64
    cache = [g.alloc(prompt * per_token) for _ in range(layers)]
    for t in range(prompt, prompt + 400):
        act = [g.alloc(r.choice([8 * KiB, 32 * KiB, 128 * KiB, 1 * MiB + 256 * KiB]))
               for _ in range(6)]
        for layer in range(layers):
            new = g.alloc((t + 1) * per_token)
            g.free(cache[layer])
            cache[layer] = new
        for i in act:
            g.free(i)
    return g.events


def interleaved(seed: int = 4) -> Events:
    """Long- and short-lived small tensors interleaved: of every 16 small (1-900 KiB) tensors
    one lives for the whole run, the others for a few requests; long-lived ones pin heap pages
    that short-lived ones would have given back."""
    r, g = random.Random(seed), _Gen()
    short: List[int] = []
    for k in range(6000):
        i = g.alloc(r.randrange(1, 900) * KiB)
        if k % 16:
            short.append(i)
        if len(short) > 24:
            g.free(short.pop(r.randrange(len(short))))
    return g.events


def streams(seed: int = 5) -> Events:
    """Several streams: three streams each with its own 0.5-6 MiB tensors and small ones,
    freed on the stream that made them, about 20 live a stream."""
    r, g = random.Random(seed), _Gen()
    live: Dict[int, List[int]] = {s: [] for s in (0, 7, 9)}
    for _ in range(4000):
        s = r.choice(list(live))
        size = r.randrange(512 * KiB, 6 * MiB, 256) if r.random() < 0.6 else r.randrange(1, 256) * KiB
        live[s].append(g.alloc(size, s))
        if len(live[s]) > 20:
            g.free(live[s].pop(r.randrange(len(live[s]))), s)
    return g.events


def page_multiples(seed: int = 17) -> Events:
    """A small convolutional network's training steps (a pool below 64 MiB): weights and
    activations of whole pages and powers of two (256 KiB-6 MiB, as channels x height x
    width of powers of two make them), a third of the activations freed during the forward
    pass, a temporary beside each layer, weight gradients kept to the next step."""
    r, g = random.Random(seed), _Gen()
    acts = [4 * MiB, 2 * MiB, MiB, 512 * KiB, 256 * KiB, 768 * KiB, 1600 * KiB, 1792 * KiB,
            3 * MiB, 6 * MiB]
    weights = [r.choice([4 * MiB, 2 * MiB, MiB, 512 * KiB, 256 * KiB, 64 * KiB, 16 * KiB,
                         4 * KiB]) for _ in range(r.randrange(6, 14))]
    for w in weights:
        g.alloc(w)
    layers = [r.choice(acts) for _ in range(r.randrange(8, 20))]
    grads: List[int] = []
    for _ in range(6):
        live: List[int] = []
        for size in layers:  # forward
            live.append(g.alloc(size))
            if r.random() < 0.3:
                g.free(live.pop(r.randrange(len(live))))
            g.free(g.alloc(r.choice([KiB, 4 * KiB, 12 * KiB, 256 * KiB, size])))
        for i in grads:  # the optimizer step
            g.free(i)
        grads = []
        while live:  # backward
            a, grad = live.pop(), g.alloc(r.choice(layers))
            if r.random() < 0.4:
                grads.append(g.alloc(r.choice(weights)))
            g.free(a)
            g.free(grad)
    return g.events


CLASSES: Dict[str, Callable[[], Events]] = {
    "small_trace": small_trace,
    "mid_size": mid_size,
    "kv_cache": kv_cache,
    "interleaved": interleaved,
    "streams": streams,
    "page_multiples": page_multiples,
}

#: classes where a target is not met yet: what gpumm measures (peak reserved / peak live)
OPEN: Dict[str, str] = {
    "interleaved": "1.055 x 170.6 MiB (180 MiB, as caching and caching-expandable on this "
                   "seed), over 1.02 x + 4 MiB (178.0); on 80 more seeds caching holds less on "
                   "none, caching-expandable on 22 (docs/reserve.md)",
    "streams": "1.095 x 168.1 MiB (184 MiB), over 1.02 x + 4 MiB (the best of the others: 1.283): "
               "page ends of mid-size tensors and half-empty heap pages (docs/reserve.md)",
}


def write_csv(events: Events, path: Path) -> Path:
    """The events as an RMM log (a free's row names its allocation's pointer)."""
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    for n, (action, i, size, stream) in enumerate(events):
        rows.append(f"1,{n // 1_000_000:02d}:00:00.{n % 1_000_000:06d},{action},"
                    f"{i << 12:#x},{size},{stream:#x}")
    path.write_text("\n".join(rows) + "\n")
    return path


def measure(name: str, folder: Path):
    """The replay report of class ``name`` (every model, 80 GiB)."""
    trace = read_rmm_csv(write_csv(CLASSES[name](), folder / f"{name}.csv"))
    return replay(trace, capacity="80GiB")


def show(name: str) -> None:
    """Prints every model's ratio and smallest capacity on class ``name``."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rep = measure(name, Path(d))
    print(f"{name}: peak live {rep.peak_live / MiB:.1f} MiB")
    for m, r in rep.results.items():
        print(f"  {m:20s} {r.ratio:.4f}  min_capacity {(r.min_capacity or 0) / MiB:.0f} MiB")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=OPEN[n])) if n in OPEN else n
    for n in CLASSES])
def test_gpumm_reserves_least_on_each_class(name, tmp_path):
    rep = measure(name, tmp_path)
    assert list(rep.results) == list(ALLOCATORS)
    for r in rep.results.values():
        assert r.error is None and not r.ooms, r.allocator
    g = rep.results["gpumm"]
    assert g.peak_reserved <= 1.02 * rep.peak_live + 4 * MiB, g.ratio
    assert g.min_capacity is not None and g.min_capacity <= 1.02 * rep.peak_live + 8 * MiB
    for m, r in rep.results.items():
        if m not in ("gpumm", "driver"):
            assert g.peak_reserved <= r.peak_reserved, (m, g.ratio, r.ratio)


def test_the_classes_are_what_they_say(tmp_path):
    """Each generator makes the workload its docstring names (peak live in its range)."""
    sizes = {}
    for name in CLASSES:
        rep = measure(name, tmp_path)
        sizes[name] = rep.peak_live
    assert 10 * MiB <= sizes["small_trace"] <= 90 * MiB
    assert 100 * MiB <= sizes["mid_size"] <= 400 * MiB
    assert sizes["kv_cache"] >= 8 * 464 * 4096  # 8 layers' caches at the last token
    assert 10 * MiB <= sizes["page_multiples"] < 64 * MiB  # a small pool's
