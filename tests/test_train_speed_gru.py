"""The GRU's training path (`classic_rnn.GRUSequence`, issue 43): the same function as torch's fused nn.GRU,
values and gradients, the same parameters (released checkpoints load unchanged), and the same training
losses. No timings here: benchmarks/train_throughput.py measures them."""

import pytest
import torch
from safetensors.torch import load_file
from same_training import assert_trains_the_same, losses_and_weights
from torch import nn

from zoo.running.train import train
from zoo.science.models import classic_rnn, create_model
from zoo.science.models.classic_rnn import GRU_PARAMETERS, GRULayer, GRUSequence, gru_sequence
from zoo.science.registry import get_entry, get_task_spec


def assert_close_to_scale(got, expected, tol):
    """max |got − expected| ≤ tol · max |expected|: rounding relative to the tensor's scale (an element
    that is a difference of large terms carries their rounding, not its own)."""
    scale = expected.abs().max().clamp_min(1e-300)
    assert ((got - expected).abs().max() / scale).item() <= tol, ((got - expected).abs().max() / scale).item()



def _gru_pair(w_in, w, seed=0):
    """An nn.GRU in float64 with weights large enough that the gates saturate somewhere, and the GRULayer
    holding the same tensors."""
    torch.manual_seed(seed)
    reference = nn.GRU(w_in, w, batch_first=True).double()
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_(0, 0.6)
    layer = GRULayer(w).double() if w_in == w else None
    if layer is not None:
        layer.load_state_dict(reference.state_dict())
    return reference, layer


@pytest.mark.parametrize("B,T,w_in,w", [(3, 1, 4, 5), (5, 7, 4, 6), (64, 32, 60, 60)])
@pytest.mark.parametrize("with_h0", [False, True])
def test_written_out_gru_equals_the_fused_kernel_in_float64(B, T, w_in, w, with_h0):
    """Values and the gradients of every input and parameter (the backward pass is written by hand):
    float64 rounding only, relative to each tensor's largest entry (measured ≤ 4e-13 at 64 × 32 × 60 with
    saturating gates; float32's own rounding is 1e-7)."""
    reference, _ = _gru_pair(w_in, w)
    x = torch.randn(B, T, w_in, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, w, dtype=torch.float64, requires_grad=True) if with_h0 else None
    y_ref, h_ref = reference(x, None if h0 is None else h0.unsqueeze(0))
    y = gru_sequence(reference, x, h0)
    assert_close_to_scale(y, y_ref, 1e-11)
    assert_close_to_scale(y[:, -1], h_ref[0], 1e-11)
    cotangent = torch.randn_like(y)
    inputs = [x, *([h0] if with_h0 else []), *reference.parameters()]
    expected = torch.autograd.grad((y_ref * cotangent).sum(), inputs)
    got = torch.autograd.grad((y * cotangent).sum(), inputs)
    for e, g in zip(expected, got):
        assert_close_to_scale(g, e, 1e-10)


def test_written_out_gru_passes_gradcheck():
    reference, _ = _gru_pair(3, 4)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h0, *p: GRUSequence.apply(x.transpose(0, 1), h0, *p)[0],
                                    (x, h0, *reference.parameters()))


def test_gru_layer_is_nn_gru_under_another_class():
    """Same parameter names, shapes and initial values from the same seed (nn.GRU draws them), and the same
    fused kernel to the bit; the GRU block's state_dict keys are unchanged."""
    torch.manual_seed(3)
    layer = GRULayer(60)
    torch.manual_seed(3)
    reference = nn.GRU(60, 60, batch_first=True)
    assert list(layer.state_dict()) == list(reference.state_dict()) == list(GRU_PARAMETERS)
    for name, value in reference.state_dict().items():
        assert torch.equal(layer.state_dict()[name], value)
    x, hx = torch.randn(4, 7, 60), torch.randn(1, 4, 60)
    with torch.no_grad():
        for a, b in zip(layer(x, hx), reference(x, hx)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["gru-zucchet-icl", "gru-student-d6"])
def test_released_gru_weights_load_unchanged(name):
    """The released checkpoints' tensors load strictly into today's model (names and shapes), and the model
    with them computes what nn.GRU with them computes: inference (fused kernel) and training (written out)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "release" / name / "model.safetensors"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    entry = get_entry(name)
    task = get_task_spec(entry.task).build()
    model = create_model(entry.arch, task)
    weights = load_file(str(path))
    model.load_state_dict(weights, strict=True)
    model = model.double()
    block = model.blocks[0]
    reference = nn.GRU(block.width, block.width, batch_first=True).double()
    reference.load_state_dict({k: v for k, v in block.gru.state_dict().items()})
    tokens = task.sample(16, seed=1).tokens.double()
    x = model.embed(tokens)
    with torch.no_grad():
        assert torch.equal(block(x), reference(x)[0])  # no grad: the fused kernel itself
    y = block(x)  # with grad: GRUSequence
    assert_close_to_scale(y, reference(x)[0], 1e-13)


def test_the_written_out_gru_runs_under_vmap():
    """`GRUSequence` has a vmap rule (torch generates it): E stacked members equal each member alone."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    layers = [GRULayer(6).double() for _ in range(3)]
    stacked = {k: torch.stack([dict(m.named_parameters())[k] for m in layers]) for k in GRU_PARAMETERS}
    x = torch.randn(3, 4, 5, 6, dtype=torch.float64)

    def loss(params, x):
        return (functional_call(layers[0], params, (x,))[0] ** 2).sum()  # forward: the fused kernel's signature

    def loss_written_out(params, x):
        return (GRUSequence.apply(x.transpose(0, 1), x.new_zeros(x.shape[0], 6), *(params[k] for k in GRU_PARAMETERS))[0] ** 2).sum()

    grads = vmap(grad(loss_written_out))(stacked, x)
    for i, layer in enumerate(layers):
        expected = torch.autograd.grad(loss({k: p for k, p in layer.named_parameters()}, x[i]), list(layer.parameters()))
        for e, name in zip(expected, GRU_PARAMETERS):
            assert_close_to_scale(grads[name][i], e, 1e-12)


def test_the_compiled_gru_step_is_one_graph():
    """torch.compile refuses any code touching an nn.GRU module (a graph break that left GRUSequence
    eager); the block holds a GRULayer, so the loss and its backward trace whole."""
    entry = get_entry("gru-zucchet-icl")
    task = get_task_spec(entry.task).build()
    model = create_model(entry.arch, task)
    batch = task.sample(8, seed=0)
    explained = torch._dynamo.explain(lambda t, y: task.loss(model.predict(t), y))(batch.tokens, batch.targets)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("mode", ["eager", pytest.param("compiled", marks=pytest.mark.compile)])
@pytest.mark.parametrize("name", ["gru-zucchet-icl", "gru-student-d6"])
def test_gru_training_losses_equal_the_fused_kernels(name, mode, tmp_path):
    """From one seed, the fused kernel's run (the benchmark's plain baseline: classic_rnn.WRITTEN_OUT_GRU_TRAINS
    off), the written-out eager run and the compiled run see the same batches and give the same losses and
    weights to rounding. The gap is float32 reassociation (the hand-written backward sums the weight
    gradients over all steps in one GEMM; torch accumulates them step by step), grown over 60 AdamW steps;
    the tolerance is 1e-4 relative, while a wrong gradient moves the losses by > 1e-2 within a few steps.
    The teacher–student prompts are cut from 32 tokens to 8 (the same code path): compiled, the written-out GRU
    unrolls over the prompt, and 32 steps took ~100 s to compile from a cold cache on the 2-core CPU, 8 about half."""
    entry = get_entry(name)
    spec = get_task_spec(entry.task)
    task = (spec.model_copy(update={"seq_len": 8}) if spec.kind == "lsa_teacher" else spec).build()
    run = entry.source.model_copy(update={"eval_every": 10, "checkpoint_every": 10**9, "batch_size": 32})
    results = {}
    for run_mode in ("fused", mode):
        torch.manual_seed(0)
        model = create_model(entry.arch, task)
        previous = classic_rnn.WRITTEN_OUT_GRU_TRAINS
        classic_rnn.WRITTEN_OUT_GRU_TRAINS = run_mode != "fused"
        try:
            result = train(model, task, run, run_dir=tmp_path / run_mode, steps=60, device="cpu", progress=False,
                           compiled=run_mode == "compiled")
        finally:
            classic_rnn.WRITTEN_OUT_GRU_TRAINS = previous
        results[run_mode] = losses_and_weights(result, model)
    assert_trains_the_same(results, "fused", (mode,), weight_atol=1e-5)
