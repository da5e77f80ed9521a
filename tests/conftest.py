import pytest

import gpumm


@pytest.fixture
def pmm() -> gpumm.Pmm:
    """A small Hopper PMM that validates itself after every operation."""
    return gpumm.Pmm(arch="hopper", vidmem="16MiB", check=True)
