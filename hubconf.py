"""torch.hub entry points of icl-zoo: one per registry entry, generated from the registry when this file is
imported (never a hand-kept list), named after the entry with '-' → '_' (an entry point is a Python name):

    import torch
    model = torch.hub.load("/path/to/icl-zoo", "gated_rnn_zucchet_icl", source="local")   # this checkout
    torch.hub.load("/path/to/icl-zoo", "lsa_d10_c10", source="local", pretrained=False)  # untrained

Each returns `zoo.create_model(entry, pretrained=True)`: the released weights (`zoo.from_pretrained`, checked
against release/index.json) as a torch.nn.Module in eval mode, or with `pretrained=False` the untrained model.
torch.hub.list takes the public callables of this module: helpers here start with '_' so that only the
entries are listed.
"""

import zoo as _zoo

dependencies = ["torch", "safetensors", "huggingface_hub", "pydantic"]


def _entry_point(name: str):
    def entry_point(pretrained: bool = True, **kwargs):
        return _zoo.create_model(name, pretrained=pretrained, **kwargs)

    entry_point.__name__ = entry_point.__qualname__ = _identifier(name)
    entry_point.__doc__ = (f"icl-zoo entry {name!r}: the released checkpoint's model (pretrained=True, eval mode, "
                           f"verified against release/index.json) or the untrained model (pretrained=False). "
                           f"`zoo show {name}` prints the entry.")
    return entry_point


def _identifier(name: str) -> str:
    ident = name.replace("-", "_")
    return ident if ident.isidentifier() else f"entry_{ident}"


for _name in _zoo.list_models():
    globals()[_identifier(_name)] = _entry_point(_name)
