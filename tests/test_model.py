"""A hypothesis state machine: random PMM operations against a shadow set of ranges."""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import gpumm


class PmmMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pmm = gpumm.Pmm(arch="turing", vidmem="8MiB", check=True)
        self.live = {}  # address -> chunk

    chunks = Bundle("chunks")

    def _add(self, c):
        end = c.address + c.size
        for a, other in self.live.items():
            assert end <= a or a + other.size <= c.address, f"{c!r} overlaps {other!r}"
        self.live[c.address] = c

    @rule(target=chunks, kind=st.sampled_from(["user", "kernel"]), idx=st.integers(0, 3))
    def alloc(self, kind, idx):
        sizes = self.pmm.user_sizes if kind == "user" else self.pmm.kernel_sizes
        try:
            c = self.pmm.alloc_chunk(sizes[idx % len(sizes)], kind)
        except gpumm.OutOfMemoryError:
            return None
        self._add(c)
        return c

    @rule(c=consumes(chunks))
    def free(self, c):
        if c is None or self.live.get(c.address) != c:
            return
        del self.live[c.address]
        self.pmm.free(c)
        try:
            self.pmm.free(c)
            raise AssertionError("double free accepted")
        except gpumm.InvalidFreeError:
            pass

    @rule(c=chunks)
    def unpin(self, c):
        if c is not None and c.state == "temp_pinned":
            self.pmm.unpin(c)

    @rule(c=chunks)
    def mark(self, c):
        if c is not None and c.state == "allocated" and c.type == "user":
            self.pmm.mark_root_unused(c)

    @rule(c=consumes(chunks))
    def split_and_merge(self, c):
        if c is None or self.live.get(c.address) != c or c.size == 4096 or c.size == 256:
            return
        kids = self.pmm.split(c)
        assert sum(k.size for k in kids) == c.size
        self.pmm.merge(c)
        self.pmm.free(c)
        del self.live[c.address]

    @rule()
    def evict(self):
        try:
            ev = self.pmm.evict_root()
        except gpumm.OutOfMemoryError:
            return
        for x in ev.chunks:
            assert self.live.pop(x.address) == x

    @invariant()
    def bytes_agree(self):
        live = {a: c for a, c in self.live.items() if c.state != "freed"}
        assert self.pmm.stats()["allocated_bytes"] == sum(c.size for c in live.values())

    def teardown(self):
        for c in list(self.live.values()):
            if c.state != "freed":
                self.pmm.free(c)
        self.pmm.validate()
        s = self.pmm.stats()
        assert s["allocated_bytes"] == 0
        assert s["roots_free"] + s["roots_pma_owned"] == s["num_roots"]


PmmMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPmmModel = PmmMachine.TestCase
