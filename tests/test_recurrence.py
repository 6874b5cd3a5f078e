"""The recurrent-state contract, once, for every recurrent registry entry (and a few variants of
them that the registry does not pin: deeper, looped, dense, windowed), in float64:

    forward(tokens)                  = step iterated from init_state
    forward_chunk(tokens, state)     = step iterated from `state` (any state reached mid-stream)
    forward_chunk over two pieces    = forward_chunk over the whole, states carried
    the exported fp32 step graph     = step iterated, streamed through ONNX Runtime (two prompts token by
                                       token, and a 1,000-token stream: one export per family and kind of
                                       weights and per variant by default, per token layout and arch
                                       setting with -m deep, the other cases with -m slow; `_onnx_cases`)

and the state interface a model declares once (`state_shapes`) is what `init_state`, `step`,
`check_state` and the graph's state inputs use. Longer streams and the chunk graph are in
test_export.py."""

import numpy as np
import pytest
import torch
from stream_parity import assert_parity, linearised, stream_tokens

from export.onnx_export import export_step
from export.streaming import StreamingSession
from zoo.science.constructions import construct
from zoo.science.models import FAMILY_OF_TYPE, create_model
from zoo.science.registry import get_entry, get_task_spec, list_entries, with_overrides

STREAM_LEN = 1000

# Variants of registry entries that exercise code paths no entry pins (overrides are validated
# like registry entries).
VARIANTS = [
    ("lsa-d10-c10", {"arch.attention": "causal", "arch.n_layers": 3, "arch.damping": 0.8, "arch.init_std": 0.3}),
    ("lsa-d10-c10", {"arch.loops": 3, "arch.damping": 0.8, "arch.init_std": 0.3}),
    ("gated-rnn-zucchet-icl", {"arch.recurrence": "dense", "arch.hidden": 12, "arch.gates": 9,
                              "source.recurrent_lr": None}),  # a dense recurrence has no ν for it (the registry refuses it)
    ("gd-ssm-nd", {"arch.window": 4, "arch.n_layers": 3, "arch.value_dim": 4, "arch.ridge": 0.3, "arch.lambda_range": [0.5, 0.99]}),
    ("gd-ssm-nd", {"arch.n_layers": 2, "arch.embed": 5, "arch.mlp": 7, "arch.zero_output": True}),
    ("mamba-1d", {"arch.n_layers": 2, "arch.state_size": 4, "arch.width": 8}),
    ("griffin-1d", {"arch.n_layers": 3, "arch.window": 3, "arch.width": 8}),
]


def _signature(entry) -> tuple:
    """Entries with the same architecture and token width share their code path: one of each."""
    return entry.arch.model_dump_json(), get_task_spec(entry.task).build().token_dim, entry.source.kind


def _recurrent_cases():
    out = {}
    for entry in list_entries():
        task = get_task_spec(entry.task).build()
        if create_model(entry.arch, task).recurrent:
            out.setdefault(_signature(entry), (entry.name, entry))
    for base, overrides in VARIANTS:
        name = base + "".join(f"--{k.split('.')[-1]}={v}" for k, v in overrides.items())
        out[name] = (name, with_overrides(get_entry(base), overrides))
    return list(out.values())


RECURRENT = _recurrent_cases()


def _graph_group(name: str, entry) -> tuple:
    """Cases whose step graphs run the same family code on the same token layout: a family, a layout (pairs,
    triples, products, interleaved, teacher–student) and trained or constructed weights. Each variant is its own."""
    task = get_task_spec(entry.task).build()
    return (name,) if "--" in name else (entry.arch.type, getattr(task, "layout", type(task).__name__), entry.source.kind)


def _onnx_cases() -> list:
    """The step-graph export and ONNX stream, one case per `_graph_group` (the one with the most layers, then the
    most arch fields set: the most code exercised). The everyday tier runs one of them per arch type and weight
    kind (trained or constructed) and every VARIANTS group (code paths no entry pins: looped, dense, windowed,
    embedded, …); the other groups' cases (a family's other token layouts and arch settings) are marked `deep`
    (the second line of .ci/run), the remaining cases `slow`: the three commands together run every case. An
    export takes 1–3 s; every released entry's shipped step graph also streams against torch in test_release.py
    (the graphs shipped, not this exporter's)."""
    picked = {}
    for name, entry in RECURRENT:
        arch = entry.arch.model_dump()
        rank = (arch.get("n_layers") or 1, sum(v not in (None, False, 0) for v in arch.values()))
        group = _graph_group(name, entry)
        if group not in picked or rank > picked[group][0]:
            picked[group] = (rank, name, entry)
    variants = {name for _, name, _ in picked.values() if "--" in name}  # every variant group: no entry pins it
    covered = {(e.arch.type, e.source.kind) for _, name, e in picked.values() if name in variants}
    everyday = {}
    for rank, name, entry in picked.values():
        kind = (entry.arch.type, entry.source.kind)
        if name not in variants and kind not in covered and (kind not in everyday or (rank, name) > everyday[kind]):
            everyday[kind] = (rank, name)
    daily = {name for _, name in everyday.values()} | variants
    deep = {name for _, name, _ in picked.values()} - daily
    marks = {name: () for name in daily} | {name: pytest.mark.deep for name in deep}
    return [pytest.param(entry, id=name, marks=marks.get(name, pytest.mark.slow)) for name, entry in RECURRENT]


def model_for(entry):
    task = get_task_spec(entry.task).build()
    torch.manual_seed(0)
    model = create_model(entry.arch, task).double().eval()
    if entry.source.kind == "constructed":
        construct(entry, model, task, task.sample(2000, seed=5, dtype=torch.float64))
    else:
        with torch.no_grad():  # zero-initialised factors (a gated unit's output, D) would hide what they multiply
            for p in model.parameters():
                if not p.any():
                    p.normal_(0.0, 0.3)
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
    """Every arch type of every family has a registry entry, and every type whose model keeps a
    constant-size state (built for its entries' tasks) is in the cases above."""
    used = {e.arch.type for e in list_entries()}
    assert used == set(FAMILY_OF_TYPE), f"arch types without a registry entry: {sorted(set(FAMILY_OF_TYPE) - used)}"
    recurrent = {e.arch.type for e in list_entries() if create_model(e.arch, get_task_spec(e.task).build()).recurrent}
    covered = {e.arch.type for _, e in RECURRENT}
    assert covered >= recurrent, sorted(recurrent - covered)


@pytest.mark.parametrize("entry", [e for _, e in RECURRENT], ids=[n for n, _ in RECURRENT])
def test_forward_equals_iterated_step_and_chunks(entry):
    """forward = step iterated = forward_chunk (from a carried state, in pieces), float64, for every case."""
    torch_parity(entry)


def torch_parity(entry):
    """The state contract in torch (module docstring); returns (the model, now in fp32, its task, two prompts back
    to back, the float64 step reference on them, the fp32 model's steps on them)."""
    model, task = model_for(entry)
    b = task.sample(6, seed=11, dtype=torch.float64)
    tokens = b.tokens.reshape(3, -1, task.token_dim)  # two prompts back to back: a stream of 2 n_tokens
    with torch.no_grad():
        # the declared state: names, zero state and shapes agree, and check_state holds `step` to them
        zero = model.init_state(3)
        assert [(n, (3, *s)) for n, s in model.state_shapes()] == [(n, tuple(z.shape)) for n, z in zip(model.state_names(), zero)]
        assert all(not z.any() and z.dtype == torch.float64 for z in zero)
        ref, final = stepped(model, tokens, zero)
        model.check_state(final, batch=3)
        with pytest.raises(ValueError, match="state"):
            model.check_state(final[:-1] if len(final) > 1 else (final[0][:1],), batch=3)
        close(model(tokens), ref, "forward vs step")
        # from a state reached mid-stream (not zeros), in two pieces of uneven length
        cut = task.n_tokens + 3
        mid_out, mid_state = stepped(model, tokens[:, :cut], model.init_state(3))
        first, state = model.forward_chunk(tokens[:, cut : cut + 4], mid_state)
        second, state = model.forward_chunk(tokens[:, cut + 4 :], state)
        close(torch.cat([mid_out, first, second], dim=1), ref, "forward_chunk from a carried state vs step")
        for name, got, want in zip(model.state_names(), state, final):
            close(got, want, f"state {name} after the stream")
        whole, _ = model.forward_chunk(tokens, None)
        close(whole, ref, "forward_chunk from None (the zero state) vs step")
        fp32 = stepped(model.float(), tokens.float(), model.init_state(3))[0].double()
    return model, task, tokens, ref, fp32


@pytest.mark.parametrize("entry", _onnx_cases())
def test_the_step_graph_streams_as_the_model(entry, tmp_path):
    """The fp32 step graph, streamed token by token through ONNX Runtime, against the float64 model."""
    model, task, tokens, ref, fp32 = torch_parity(entry)
    # The step graph is the fp32 model, exported once per case: streamed token by token through ONNX Runtime
    # it is as close to the float64 reference as torch's own fp32 steps are (the constructed LSTM amplifies
    # fp32 rounding by 16/ε³, so the bound is relative to fp32 torch, with a floor for exact models) ...
    session = StreamingSession(export_step(model, tmp_path / "model_step.onnx", entry_name=entry.name))
    session.reset(3)
    assert session.state_shapes(3) == {f"state_in.{n}": (3, *shape) for n, shape in model.state_shapes()}
    got = torch.from_numpy(np.stack([session.push(tokens[:, t].float().numpy()) for t in range(tokens.shape[1])], 1)).double()
    scale = max(1.0, ref.abs().max().item())
    err, err_fp32 = (got - ref).abs().max().item(), (fp32 - ref).abs().max().item()
    assert err <= 4 * err_fp32 + 2e-6 * scale, f"ONNX step stream: max error {err:.2e}, fp32 torch {err_fp32:.2e}"
    if linearised(entry):
        return  # ill-conditioned in fp32 by design: its stream is test_export's test_linearised_constructions_…
    # ... and over a 1,000-token stream, token by token, within fp32 of the float64 forward (the chunk
    # graphs that run longer pushes: test_export.py's chunk test, one entry per family)
    model.float()
    long_tokens, long_ref = stream_tokens(model, task, STREAM_LEN)  # tokens scaled so the reference is O(1)
    session.reset(long_tokens.shape[0])
    steps = [session.push(long_tokens[:, t].numpy()) for t in range(STREAM_LEN)]
    assert_parity(np.stack(steps, axis=1), long_ref)
    assert session.steps == STREAM_LEN


@pytest.mark.parametrize("entry", [e for _, e in RECURRENT if get_task_spec(e.task).kind == "linear_regression"],
                         ids=[n for n, e in RECURRENT if get_task_spec(e.task).kind == "linear_regression"])
def test_query_jacobian_by_step_equals_autograd_through_forward(entry):
    """The evaluation's fast path (one `step` from the context's state) is the reference's ∂ŷ/∂x_query,
    autograd through the whole forward, on every recurrent code path (float64)."""
    from zoo.science.evaluation import query_jacobian_autograd, query_jacobian_by_step

    model, task = model_for(entry)
    tokens = task.sample(7, seed=13, dtype=torch.float64).tokens
    fast = query_jacobian_by_step(model, tokens, task.query_channels)
    reference = query_jacobian_autograd(model, tokens, task.query_channels)
    scale = reference.abs().max().item()  # relative: a small random init gives small Jacobians (LSA: ∝ init_std⁴)
    assert fast.shape == (7, task.d_y, task.d_x) and scale > 0
    assert (fast - reference).abs().max().item() <= 1e-9 * scale, "∂ŷ/∂x_query by step vs autograd through forward"
