"""``gpumm.record(..., compile=True)`` with a backward that inductor's post-grad passes rewrite.

The backward graph is compiled at the first backward call, outside ``compile_fx``'s context;
a forward that slices its input has ``slice_scatter`` in its backward, and inductor's reinplace
pass rebuilds such a scatter under ``V.fake_mode``, which only the graph's example inputs can
give there (``gpumm.record_hooks._eager_inner``).
"""

import torch  # in the test extra

from gpumm.record import record, recording_info
from gpumm.traces import read_trace


class _Sliced(torch.nn.Module):
    """One projection cut into two halves by slicing: its backward scatters the halves'
    gradients back into one (``slice_scatter``)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 32, bias=False)

    def forward(self, x):
        h = self.proj(x)
        return (h[..., :16] * h[..., 16:]).sum()


def test_record_compile_runs_a_backward_with_scatters(tmp_path):
    torch.manual_seed(0)
    model, x = _Sliced(), torch.randn(8, 16)
    expected = torch.autograd.grad(model(x), model.proj.weight)[0]
    path = tmp_path / "c.pickle"
    with record(path, compile=True, step_on="forward"):
        y = torch.compile(model)(x)
        y.backward()  # compiles the backward graph here
    assert recording_info(path)["compile"] is True
    torch.testing.assert_close(model.proj.weight.grad, expected)
    # the backward's gradient is among the recorded allocations
    sizes = [e.size for e in read_trace(path).events if e.action == "alloc"]
    assert model.proj.weight.numel() * 4 in sizes
