"""What a Hugging Face causal LM's own eager attention says, for the causal-LM sweep
(``tests/capturing/test_causal_architectures.py``): ground truth taken from the model alone.

- :func:`eager_layers`, :func:`module_calls`, :func:`eager_by_module`: eager's
  ``output_attentions`` maps of a pass (one ``generate()`` step, or a whole forward) matched
  to the attention modules in the order they ran (torch's own forward pre-hooks), so that a
  layer run several times per pass is held to each of its runs;
- :func:`eager_view`: eager's query rows cut, renormalised and scaled as a prompt view;
- :func:`leading_keys`: keys of the model's own before the sequence's (CPM-Ant);
- :func:`own_pass`: the model's own one pass, where it differs from its own cached steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

TOL = 1e-5
LOGIT_TOL = 1e-4
ROUNDING = 10 * TOL  # the most a model's one pass and its own steps differ by rounding alone


@dataclass
class OwnPass:
    """The eager model's own one pass over prompt + its generate() continuation, where it
    differs from the model's own cached generate() steps (:func:`own_pass`)."""

    logits: torch.Tensor  # (B, T, V): the rows that predict continuation tokens 0..T-1
    attentions: tuple[Any, ...]  # eager's output_attentions of the pass: maps (B, H, L, L)
    passes: list[list[str]]  # the pass's modules in the order they ran (:func:`module_calls`)
    # the views' tolerance: TOL, or where one pass and steps differ by rounding only (their
    # logits within the parity tolerance, their views by at most ROUNDING on any prompt),
    # that difference: capture cannot be held closer to eager than eager's one pass is to
    # its own steps
    tol: float
    gap: str  # how far the one pass is from the steps (logits; attention rows)


def own_pass(model: Any, target: Any, batch: Any, truth: Any) -> OwnPass | None:
    """The eager ``model``'s own one pass over what every audit runs in one pass, the
    prompts + ``truth``'s continuation less its last token, with the inputs the model's own
    ``prepare_inputs_for_generation`` builds for that sequence (no cache), when that pass
    differs from the same model's cached ``generate()`` steps: its logits by more than the
    parity tolerance, or a view of a continuation row (:func:`eager_view`) by more than
    :data:`TOL`. None
    where they agree on the unpadded prompt, or where the model gives no such pass.

    Some models compute other things in one pass than step by step, whatever attnaudit
    does: sparse-attention indexers pick their top-k keys before the causal mask (a row's
    keys depend on the positions after it), state-space layers scan in chunks instead of
    recurring, layers run many times compound rounding. Every audit reads the one
    teacher-forced pass, so the model's own one pass is what its captures must equal."""
    prompt, steps = batch.source_ids.shape[1], len(truth.logits)
    sequences = truth.sequences[:, : prompt + steps - 1]
    mask = torch.cat([batch.source_mask.long(),
                      torch.ones_like(sequences[:, prompt:])], dim=1)
    inputs = model.prepare_inputs_for_generation(sequences, attention_mask=mask,
                                                 use_cache=False)
    # the whole sequence, every position's logits, no cache
    inputs = {k: v for k, v in inputs.items() if v is not None and k not in
              ("past_key_values", "cache_params", "cache_position", "logits_to_keep")}
    if inputs.get("input_ids") is None or inputs["input_ids"].shape != sequences.shape:
        return None
    with module_calls(model) as passes:
        out = model(**inputs, output_attentions=True, return_dict=True)
    maps = eager_layers(out.attentions or (), model.config)
    if len(passes) != 1 or not maps:
        return None
    # measured on the unpadded prompt (row 0), where positions leave no choice
    assert batch.source_mask[0].all(), "the first prompt must be the unpadded one"
    raw = torch.stack(truth.logits, dim=1)
    logits = out.logits[:, prompt - 1 :]  # (B, T, V)
    real = target.step_mask(truth.sequences[:, prompt:])[0]
    logit_gap = (logits[0] - raw[0]).abs()[real].max().item()
    stepped = [eager_layers(step, model.config) for step in truth.attentions]
    if any(len(maps_t) != len(maps) for maps_t in stepped):
        return None
    view_gaps = torch.zeros(len(sequences))  # per prompt, the views' largest difference
    for at, one in enumerate(maps):
        rows = [one[:, :, prompt - 1 + t, : prompt + t] for t in range(steps)]
        # step t's row over the sequence's keys, its last P+t (leading keys of the
        # model's own are left out, as the views leave them)
        cached = [maps_t[at][:, :, -1, -(prompt + t):] for t, maps_t in enumerate(stepped)]
        for kind in ("cross", "self"):
            (a, in_a), (b, in_b) = eager_view(rows, kind, prompt), eager_view(cached, kind, prompt)
            gap = (a.double() - b.double()).abs().amax(-1).where(in_a & in_b, 0.0)
            view_gaps = torch.maximum(view_gaps, gap.flatten(1).amax(1).float())
    rounding = logit_gap <= LOGIT_TOL * max(1.0, raw.abs().max().item())
    worst = view_gaps.max().item()
    # consistent on the unpadded prompt; a padded one's gap counts only as rounding (it can
    # pass TOL where the unpadded one's does not, depending on the CPU's kernels): a larger
    # one is how prepare_inputs_for_generation positions padded rows, not the model
    if rounding and view_gaps[0] <= TOL and not TOL < worst <= ROUNDING:
        return None
    # rounding beyond TOL between two of its own equivalent computations: the captures are
    # held to the rounding bound (a third computation rounds differently again)
    tol = ROUNDING if rounding and worst <= ROUNDING else TOL
    return OwnPass(logits, out.attentions, passes, tol,
                   f"its one pass differs from its generate() steps by {logit_gap:.2g} in "
                   f"logits, {view_gaps[0]:.2g} in attention ({worst:.2g} on any prompt; views "
                   f"held to {tol:.2g})")


def eager_layers(step_attentions: tuple[Any, ...], config: Any) -> list[torch.Tensor]:
    """One generate() step's attention maps (B, H, q, k), in the order the layers ran: layers
    without one left out, and linear-attention layers (``config.layer_types``), whose entry
    is their key-value state (MiniMax's lightning attention), not weights."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or len(types) != len(step_attentions):
        types = [None] * len(step_attentions)
    return [a for a, kind in zip(step_attentions, types, strict=True)
            if isinstance(a, torch.Tensor) and "linear" not in str(kind)]


@contextmanager
def module_calls(model: torch.nn.Module) -> Iterator[list[list[str]]]:
    """Per forward of ``model``, the paths of its submodules in the order they ran (torch's
    own forward pre-hooks: how eager's per-layer attentions line up with the modules when a
    layer runs more than once per pass)."""
    passes: list[list[str]] = []
    handles = [model.register_forward_pre_hook(lambda *_: passes.append([]))]
    handles += [module.register_forward_pre_hook(
                    lambda *_, path=path: passes[-1].append(path) if passes else None)
                for path, module in model.named_modules() if path]
    try:
        yield passes
    finally:
        for handle in handles:
            handle.remove()


def eager_by_module(attentions: tuple[Any, ...], config: Any, passes: list[list[str]],
                    modules: set[str]) -> dict[str, list[list[torch.Tensor]]]:
    """module -> pass -> the maps eager returned for the module's runs in that pass (one
    generate() step, or a whole forward), by the order the record ``modules`` ran in it."""
    out: dict[str, list[list[torch.Tensor]]] = {m: [] for m in modules}
    for step, ran in zip(attentions, passes, strict=True):
        maps, order = eager_layers(step, config), [p for p in ran if p in modules]
        assert len(order) == len(maps), f"modules run {order} vs {len(maps)} eager maps"
        for entries in out.values():
            entries.append([])
        for path, weights in zip(order, maps, strict=True):
            out[path][-1].append(weights)
    return out


def leading_keys(truth: Any, config: Any, prompt: int) -> int:
    """Keys of the model's own before the sequence's (CPM-Ant's learned prompt positions),
    as eager's last cached step shows them: its key count less the P + t positions of the
    sequence (0 for a model that prepends nothing, or when generate() ran one step)."""
    t = len(truth.attentions) - 1
    keys = eager_layers(truth.attentions[t], config)[0].shape[-1]
    return max(keys - (prompt + t), 0) if t else 0


def eager_view(rows: list[torch.Tensor], kind: str,
               prompt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager's query rows of steps t = 0..T-1 (B, H, P + t) as a view: cut to the view's
    keys (the prompt for ``cross``, the prompt's last token + prefix for ``self``),
    renormalised, scaled to what the row's keys hold (1 less the weight on sink columns,
    which eager leaves out). Returns the view (B, H, T, P or T) and where it is defined
    (B, H, T): eager's float32 rows define a view only where the view's mass is a normal
    float; below, its weights have underflowed (to 0, or to a few subnormal steps) and
    renormalising them has no precision left to compare with."""
    first = rows[0]
    width = prompt if kind == "cross" else len(rows)
    expected = first.new_zeros(*first.shape[:2], len(rows), width)
    defined = torch.zeros(expected.shape[:3], dtype=torch.bool)
    for t, row in enumerate(rows):
        part = row[..., :prompt] if kind == "cross" else row[..., prompt - 1 :]
        mass, total = part.sum(-1, keepdim=True), row.sum(-1, keepdim=True)
        expected[:, :, t, : part.shape[-1]] = part / mass * total
        defined[:, :, t] = mass.squeeze(-1) >= torch.finfo(mass.dtype).tiny
    return expected, defined
