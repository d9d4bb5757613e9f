"""compiling.compile_forward: one graph for every batch shape, whatever the first batch is."""

import pytest
import torch

from xformer_cli import compiling
from xformer_cli.model import build_model


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_first_batch_with_as_many_source_as_target_positions_does_not_specialize_the_graph():
    """Duck sizing would give S and T one symbol when the first batch has S == T; the next batch
    (S != T) would recompile forward and backward. Marked dynamic, every shape shares one graph."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=60, encoder_layers=1, decoder_layers=1)
    forward = compiling.compile_forward(model, backend="aot_eager")
    for b, s, t in [(4, 9, 9), (4, 7, 11), (3, 12, 5), (5, 6, 6)]:
        src, prev = torch.randint(4, 60, (b, s)), torch.randint(4, 60, (b, t))
        forward(src, prev).float().sum().backward()
        assert compiling.compiled_graphs() == 1, (b, s, t)
    assert forward.training is model.training  # attributes reach the module through the wrapper
