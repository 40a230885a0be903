"""Values of a site whose mechanism does not hand them to capture, found by role.

Capture keeps values only for ``F.scaled_dot_product_attention`` calls. A softmax-path site
(Hugging Face's ``eager`` backend, FSMT, ProphetNet...) still reads values that some
linear-like module of its layer produced: the *value projection* is the module whose output,
split into heads (shared across head groups for grouped-query attention; the last third of a
fused query-key-value projection), read with the captured weights, *is* what the output
projection reads. Every pair of candidates is checked that way on the traced tensors (relative
error at most :data:`~attnaudit.contributions.projection.READS_VALUES`, the half-precision
tolerance for fp16/bf16 models), so the values are the model's own, or the site keeps its
reason.
"""

from __future__ import annotations

import torch

from attnaudit.contributions.projection import HALF_READS_VALUES, READS_VALUES, merged_read
from attnaudit.contributions.trace import Call, SiteTrace


def _split(output: torch.Tensor, heads: int, width: int) -> torch.Tensor | None:
    """(B, K, n * width) -> (B, heads, K, width), repeating n < heads value heads in order;
    None when the last axis does not split so."""
    batch, keys, total = output.shape
    groups = total // width
    if total % width or groups < 1 or heads % groups:
        return None
    split = output.float().view(batch, keys, groups, width).transpose(1, 2)
    return split.repeat_interleave(heads // groups, dim=1)


def _candidates(call: Call, batch: int, keys: int, read_width: int) -> list[torch.Tensor]:
    """A module's output as value candidates: whole, or the last third of a fused query,
    key and value projection."""
    out = call.output
    if out is None or out.ndim != 3 or tuple(out.shape[:2]) != (batch, keys):
        return []
    whole = [out]
    if out.shape[-1] == 3 * read_width:
        whole.append(out[..., 2 * read_width:])
    return whole


def values_by_role(site: SiteTrace) -> tuple[torch.Tensor, str] | None:
    """(values (B, H, K, d_v) float32, the value projection's path), or None."""
    batch, heads, queries, keys = site.weights.shape
    tolerance = HALF_READS_VALUES if site.module_dtype in (torch.float16, torch.bfloat16) \
        else READS_VALUES
    reads = [c.inputs for c in site.linears.values() if c.inputs is not None and c.times == 1
             and c.inputs.ndim == 3 and tuple(c.inputs.shape[:2]) == (batch, queries)
             and c.inputs.shape[-1] % heads == 0]  # each (B, Q, H * d_v)
    for path, call in site.linears.items():
        if call.times != 1:
            continue
        for read_in in reads:
            width = read_in.shape[-1] // heads
            for output in _candidates(call, batch, keys, read_in.shape[-1]):
                values = _split(output, heads, width)
                if values is None:
                    continue
                read = merged_read(site.weights, values)
                error = (read_in.float() - read).norm() / read.norm().clamp_min(1e-30)
                if float(error) <= tolerance:
                    return values, path
    return None
