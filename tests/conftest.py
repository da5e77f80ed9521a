import pytest

import gpumm


@pytest.fixture
def pmm() -> gpumm.Pmm:
    """A small Hopper PMM that validates itself after every operation."""
    return gpumm.Pmm(arch="hopper", vidmem="16MiB", check=True)


@pytest.fixture
def device() -> gpumm.Device:
    """A small simulated Hopper device."""
    return gpumm.Device(arch="hopper", vidmem="64MiB")


@pytest.fixture
def pool(device) -> gpumm.MemoryPool:
    """A pool that validates every invariant after every operation."""
    return gpumm.MemoryPool(device, check=True)


@pytest.fixture
def host_pool() -> gpumm.MemoryPool:
    """A pool of real host memory (memfd pages, stitched with mmap)."""
    return gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="64MiB"), check=True)
