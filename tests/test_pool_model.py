"""Model-based test of a host-memory pool: random streams of alloc / free / stream free /
complete / defrag / scope / trim / batches, against a shadow of what each live allocation must
hold.
Every live allocation carries its own byte pattern; after every step all of them are checked
(no overlap, defrag moves keep contents) and the pool validates itself."""

import ctypes

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import gpumm
from gpumm.units import KiB, MiB

SIZES = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(4 * KiB, 1 * MiB),
    st.integers(1 * MiB, 9 * MiB),
)


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = gpumm.MemoryPool(
            gpumm.Device(backend="host", vidmem="48MiB"), check=True, scrub=True
        )
        self.live = {}  # Allocation -> pattern byte
        self.batched = {}  # pointer of a batch member -> (size, pattern byte)
        self.fences = []
        self.next_pattern = 1
        self.scope = None

    def _pattern(self):
        pattern = self.next_pattern
        self.next_pattern = self.next_pattern % 255 + 1
        return pattern

    def _fill(self, a):
        pattern = self._pattern()
        ctypes.memset(a.ptr, pattern, a.size)
        self.live[a] = pattern

    @rule(sizes=st.lists(SIZES, min_size=1, max_size=5), arena=st.booleans())
    def batch(self, sizes, arena):
        try:
            ptrs = self.pool.alloc_batch(sizes, arena=arena)
        except gpumm.OutOfMemoryError:
            return
        for ptr, size in zip(ptrs.tolist(), sizes):
            pattern = self._pattern()
            ctypes.memset(ptr, pattern, size)
            self.batched[ptr] = (size, pattern)

    @precondition(lambda self: self.batched)
    @rule(i=st.integers(0, 10**6), n=st.integers(1, 6))
    def free_batch(self, i, n):
        ptrs = list(self.batched)
        i %= len(ptrs)
        chosen = ptrs[i:i + n]
        self.pool.free_batch(chosen)
        for ptr in chosen:
            del self.batched[ptr]

    @rule(size=SIZES, stream=st.integers(0, 2), movable=st.booleans())
    def alloc(self, size, stream, movable):
        try:
            a = self.pool.alloc(size, stream, movable=movable)
        except gpumm.OutOfMemoryError:
            return
        self._fill(a)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 10**6))
    def free(self, i):
        a = list(self.live)[i % len(self.live)]
        del self.live[a]
        a.free()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 10**6), stream=st.integers(0, 2))
    def free_on_stream(self, i, stream):
        a = list(self.live)[i % len(self.live)]
        del self.live[a]
        self.fences.append(a.free(stream=stream))

    @precondition(lambda self: self.fences)
    @rule(i=st.integers(0, 10**6))
    def complete(self, i):
        self.pool.complete(self.fences[i % len(self.fences)])

    @rule()
    def synchronize(self):
        self.pool.synchronize()

    @rule()
    def defrag(self):
        self.pool.defrag()

    @rule(keep=st.sampled_from([0, 4 * MiB]))
    def trim(self, keep):
        self.pool.trim(keep)

    @rule(sizes=st.lists(SIZES, min_size=1, max_size=4))
    def scoped(self, sizes):
        with self.pool.scope() as s:
            for size in sizes:
                try:
                    self.pool.alloc(size)
                except gpumm.OutOfMemoryError:
                    pass
        assert s.freed == s.made

    @invariant()
    def contents_and_invariants(self):
        spans = sorted([(a.ptr, a.ptr + ((a.size + 255) // 256) * 256) for a in self.live]
                       + [(p, p + ((n + 255) // 256) * 256) for p, (n, _) in self.batched.items()])
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert e0 <= s1, "live allocations overlap"
        for a, pattern in self.live.items():
            assert ctypes.string_at(a.ptr, a.size) == bytes([pattern]) * a.size
        for ptr, (size, pattern) in self.batched.items():
            assert ctypes.string_at(ptr, size) == bytes([pattern]) * size
        s = self.pool.stats()
        assert s["live_bytes"] == sum(a.size for a in self.live) + sum(
            n for n, _ in self.batched.values())
        self.pool.validate()

    def teardown(self):
        self.pool.close()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
