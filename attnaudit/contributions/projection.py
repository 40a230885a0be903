"""The output projection of an attention site, found by what it reads.

A head's contribution f_h(x_j) = v_j^h W_O^h needs the module that maps the heads' weighted
values, concatenated head-major ``(B, Q, H * d_v)``, to the model's width. Whatever it is
called (``out_proj``, ``o_proj``, ``o``, ``c_proj``, ``dense``), it is the linear-like
module whose input in the traced pass *is* that concatenation:
each candidate's recorded input is compared with ``merge(weights @ values)``. Candidates
are the linear-like modules of the site's layer, so a projection beside the attention
module (BERT's ``attention.output.dense``) is found too. A target may
declare the module instead (``projections={site: module}``); a site where neither gives one
gets a reason, never a guess.

The module is read as the affine map it is: ``W = proj(I) - proj(0)``, ``b = proj(0)``, so
GPT-2's ``Conv1D`` (``x W``) or any other affine module needs no special case; a plain
``nn.Linear`` (``x W^T``, no subclass, no hooks) gives its parameters directly, the same map
without a pass over an identity the width of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from attnaudit.contributions.trace import SiteTrace
from attnaudit.targets.placement import execution_device

# Relative error within which a module's input is the heads' concatenated read (the closest
# candidate is taken; a module reading anything else is off by order 1).
READS_VALUES = 1e-3
HALF_READS_VALUES = 5e-2  # fp16 / bf16 models


@dataclass
class Projection:
    """A site's output projection as a map per head.

    path: the module's path (or ``declared``). matrix: (H, d_v, d) float32, head h's block
    of W_O. bias: (d,) float32. output: what it returned in the traced pass, (B, Q, d)
    (None for a declared module that was not seen).
    """

    path: str
    matrix: torch.Tensor
    bias: torch.Tensor
    output: torch.Tensor | None = None


def merged_read(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(B, Q, H * d_v) float32: the heads' weighted values ``weights (B, H, Q, K) @ values
    (B, H, K, d_v)``, concatenated head-major."""
    read = torch.matmul(weights, values)  # (B, H, Q, d_v)
    batch, heads, queries, width = read.shape
    return read.transpose(1, 2).reshape(batch, queries, heads * width)


def _plain_linear(module: nn.Module) -> nn.Linear | None:
    """The module when it is an ``nn.Linear`` itself (no subclass) running its own forward
    with no hooks on readable parameters: its map is its parameters."""
    if not isinstance(module, nn.Linear) or type(module) is not nn.Linear:
        return None
    if "forward" in vars(module) or module._forward_hooks or module._forward_pre_hooks:
        return None
    return None if module.weight.device.type == "meta" else module


def affine_map(module: nn.Module, d_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W (d_in, d_out), b (d_out,))`` float32 with ``module(x) = x W + b``: a plain
    ``nn.Linear``'s parameters as they are, any other module's map read off it."""
    linear = _plain_linear(module)
    if linear is not None:
        weight = linear.weight.detach()
        bias = weight.new_zeros(weight.shape[0]) if linear.bias is None else linear.bias.detach()
        return weight.t().float(), bias.float()
    param = next(module.parameters())  # its dtype; an offloaded one's data is not read
    # the identity's rows, then a zero row: made in place, in the module's dtype
    probe = torch.eye(d_in + 1, d_in, dtype=param.dtype, device=execution_device(module))
    with torch.no_grad():
        out = module(probe)
        bias = out[-1].float()
        return out[:-1].float().sub_(bias), bias


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm().clamp_min(1e-30))


def output_projection(site: SiteTrace, declared: nn.Module | None = None
                      ) -> Projection | str:
    """The site's output projection, or a reason it cannot be had."""
    if site.values is None:
        return f"no values: {site.value_reason}"
    heads, width = site.heads, int(site.values.shape[-1])
    d_in = heads * width
    if declared is not None:
        matrix, bias = affine_map(declared, d_in)
        seen = next((c for c in site.linears.values() if c.module is declared), None)
        return Projection("declared", matrix.reshape(heads, width, -1), bias,
                          None if seen is None else seen.output)
    read = merged_read(site.weights, site.values)
    tolerance = HALF_READS_VALUES if site.module_dtype in (torch.float16, torch.bfloat16) \
        else READS_VALUES
    errors: dict[str, float] = {}
    by_input: dict[int, float] = {}  # a layer's query, key and value projections share one
    for path, call in site.linears.items():
        if call.inputs is not None and call.times == 1 and tuple(call.inputs.shape) == tuple(
                read.shape):
            if id(call.inputs) not in by_input:
                by_input[id(call.inputs)] = _relative(call.inputs, read)
            errors[path] = by_input[id(call.inputs)]
    best = min(errors, key=errors.__getitem__, default=None)
    if best is not None and errors[best] <= tolerance:
        call = site.linears[best]
        matrix, bias = affine_map(call.module, d_in)
        return Projection(best, matrix.reshape(heads, width, -1), bias, call.output)
    return (f"no module in {site.layer} reads the heads' weighted values "
            f"(shape {tuple(read.shape)}; compared: {', '.join(errors) or 'none of that shape'}); "
            "declare it with projections={site: module}")


def projections_of(sites: Mapping[str, SiteTrace],
                   declared: Mapping[str, nn.Module] | None = None
                   ) -> dict[str, Projection | str]:
    """Every site's output projection or reason; ``declared`` by site name (with or
    without its ``:kind`` suffix)."""
    declared = dict(declared or {})
    return {name: output_projection(site, declared.get(name, declared.get(
        name.split(":", 1)[0]))) for name, site in sites.items()}


def head_vectors(site: SiteTrace, projection: Projection) -> torch.Tensor:
    """(B, H, K, d) float32: f_h(x_j) = v_j^h W_O^h for every head and key."""
    assert site.values is not None
    values = site.values
    batch, heads, keys, width = values.shape
    # one (B * K, d_v) @ (d_v, d) product per head, rather than B * H small ones
    per_head = torch.matmul(values.transpose(0, 1).reshape(heads, batch * keys, width),
                            projection.matrix)
    return per_head.reshape(heads, batch, keys, -1).transpose(0, 1)
