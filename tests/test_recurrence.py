"""The recurrent-state contract, once for every recurrent registry entry, in float64:

    forward(tokens)                  = step iterated from init_state
    forward_chunk(tokens, state)     = step iterated from `state` (any state reached mid-stream)
    forward_chunk over two pieces    = forward_chunk over the whole, states carried

The ONNX side of the same contract (step and chunk graphs against torch) is in test_export.py."""

import pytest
import torch

from zoo.constructions import construct
from zoo.models import create_model
from zoo.registry import get_task_spec, list_entries


def _signature(entry) -> tuple:
    """Entries with the same architecture and token width share their code path: one of each."""
    return entry.arch.model_dump_json(), get_task_spec(entry.task).build().token_dim, entry.source.kind


def _recurrent_entries():
    out = {}
    for entry in list_entries():
        task = get_task_spec(entry.task).build()
        if create_model(entry.arch, task).recurrent:
            out.setdefault(_signature(entry), entry)
    return list(out.values())


RECURRENT = _recurrent_entries()


def model_for(entry):
    task = get_task_spec(entry.task).build()
    torch.manual_seed(0)
    model = create_model(entry.arch, task).double().eval()
    if entry.source.kind == "constructed":
        construct(entry, model, task, task.sample(2000, seed=5, dtype=torch.float64))
    return model, task


def stepped(model, tokens, state):
    outs = []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], state)
        outs.append(out)
    return torch.stack(outs, dim=1), state


def close(a, b, what):
    scale = max(1.0, b.abs().max().item())
    assert (a - b).abs().max().item() <= 1e-9 * scale, f"{what}: max error {(a - b).abs().max().item():.2e}"


def test_every_recurrent_family_is_covered():
    types = {e.arch.type for e in RECURRENT}
    assert types >= {"lsa", "gated_rnn", "gd_ssm", "lru", "s5", "lstm", "gru", "mamba", "griffin"}, types


@pytest.mark.parametrize("entry", RECURRENT, ids=lambda e: e.name)
def test_forward_and_forward_chunk_equal_iterated_step(entry):
    model, task = model_for(entry)
    b = task.sample(6, seed=11, dtype=torch.float64)
    tokens = b.tokens.reshape(3, -1, task.token_dim)  # two prompts back to back: a stream of 2 n_tokens
    with torch.no_grad():
        ref, _ = stepped(model, tokens, model.init_state(3))
        close(model(tokens), ref, "forward vs step")
        # from a state reached mid-stream (not zeros), in two pieces of uneven length
        cut = task.n_tokens + 3
        mid_out, mid_state = stepped(model, tokens[:, :cut], model.init_state(3))
        first, state = model.forward_chunk(tokens[:, cut : cut + 4], mid_state)
        second, state = model.forward_chunk(tokens[:, cut + 4 :], state)
        close(torch.cat([mid_out, first, second], dim=1), ref, "forward_chunk from a carried state vs step")
        _, final = stepped(model, tokens, model.init_state(3))
        for name, got, want in zip(model.state_names(), state, final):
            close(got, want, f"state {name} after the stream")
        whole, _ = model.forward_chunk(tokens, None)
        close(whole, ref, "forward_chunk from None (the zero state) vs step")


def _entries_by_code_path():
    out = {}
    for entry in list_entries():
        out.setdefault(_signature(entry), entry)
    return list(out.values())


@pytest.mark.parametrize("entry", _entries_by_code_path(), ids=lambda e: e.name)
def test_predict_equals_the_read_out_of_forward(entry):
    """`predict` may take a shortcut to the read-out (the gated RNN and GD-SSM compute their one
    query's state as a weighted sum, and their output there only): for every registry code path,
    constructed weights included (λ = 0 and 1 exactly), it equals reading `forward`'s output."""
    model, task = model_for(entry)
    tokens = task.sample(5, seed=12, dtype=torch.float64).tokens
    with torch.no_grad():
        close(model.predict(tokens), model.readout(model(tokens)), "predict vs readout(forward)")
