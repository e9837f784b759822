"""Which modules of a model the sharded mode wraps with `fully_shard` as units of their own.

A unit is every decoder layer (the model's `_no_split_modules`) and the input and output
embeddings, so that no large module stays unsharded for a whole forward/backward (the root
keeps only its own parameters, the final norm). FSDP2 needs a shared parameter to live in one
unit: candidates that share a parameter (tied input and output embeddings) form one unit
together, `fully_shard([embed_tokens, lm_head])`, and a candidate that shares a parameter with
a module outside every candidate is not a unit at all (its parameters stay with the root).
"""

from __future__ import annotations

import torch


def _candidates(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    classes = set(getattr(model, "_no_split_modules", None) or ())
    named = {id(m): name for name, m in model.named_modules()}
    found = [
        (name, m)
        for name, m in model.named_modules()
        if m is not model and type(m).__name__ in classes
    ]
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if (
            isinstance(module, torch.nn.Module)
            and id(module) in named
            and all(module is not m for _, m in found)
            and any(True for _ in module.parameters())
        ):
            found.append((named[id(module)], module))
    return found


def _holder(name: str, prefixes: list[str]) -> int:
    """The index of the candidate whose module holds parameter `name` (-1: none)."""
    for index, prefix in enumerate(prefixes):
        if name.startswith(prefix + "."):
            return index
    return -1


def fsdp_units(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """The sharding units besides the root, each a list of modules that `fully_shard` wraps
    together (one module, or several that share parameters)."""
    candidates = _candidates(model)
    prefixes = [name for name, _ in candidates]
    group = list(range(len(candidates)))  # union-find over candidates sharing a parameter

    def find(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    holders: dict[int, set[int]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(param), set()).add(_holder(name, prefixes))
    outside: set[int] = set()
    for held in holders.values():
        inside = sorted(h for h in held if h >= 0)
        for other in inside[1:]:
            group[find(other)] = find(inside[0])
        if -1 in held:
            outside.update(inside)
    dropped = {find(i) for i in outside}
    units: dict[int, list[torch.nn.Module]] = {}
    for index, (_, module) in enumerate(candidates):
        root = find(index)
        if root not in dropped:
            units.setdefault(root, []).append(module)
    return list(units.values())
