"""ALTI: one attention block's output decomposed into per-input-token terms (Ferrando et
al. 2022a), with a built-in exactness check.

A block is the attention, its residual and, in a post-LN layer, the layer norm after them:

- post-LN (BART, Marian): y_i = LN(z_i), z_i = x_i + Σ_j Σ_h a^h_ij f_h(x_j) + b_O; the
  norm is linearised at the real sigma_i, LN(z_i) = s_i gamma ⊙ L(z_i) + beta with L
  centring (LayerNorm) or not (RMSNorm) and s_i = 1/sigma_i, so term j is
  T_i(x_j) = s_i gamma ⊙ L(z_ij) and the rest (s_i gamma ⊙ L(b_O) + beta) belongs to no
  token;
- pre-LN (T5, GPT-2, Llama): y_i = x_i + Σ_j Σ_h a^h_ij f_h(LN(x_j)) + b_O, the norm being
  inside f; T_i(x_j) = z_ij;
- sandwich (Gemma 2/3, OLMo 2): y_i = x_i + N(A_i), a norm N on the attention's output
  A_i = Σ_j Σ_h a^h_ij f_h(x_j) + b_O before the residual; N is linearised like a post-LN
  norm and maps the attention terms only, the residual staying x_i.

z_ij is the heads' term for key j plus, for self-attention, the residual x_i at j = i; a
cross-attention block's residual (the decoder stream) is one more term, after the source
keys. Which norm belongs to the block, and whether it comes before or after, is read off the
traced tensors: the next norm call in the layer after the attention takes z as its input, and
the residual x is the attention's own input (post-LN) or the input of the norm that made it
(pre-LN), whichever reproduces z. s_i is the least-squares scale mapping gamma ⊙ L(z_i) onto
y_i - beta (= 1/sigma_i exactly, whatever the norm's epsilon).

Contribution of term j (Ferrando's definition): max(0, ‖y_i‖₁ - ‖y_i - T_i(x_j)‖₁),
normalised over j to sum to 1 (a row whose terms all score 0 stays 0). Exactness:
Σ_j T_i(x_j) plus the rest must equal the block's real output; the largest relative error
‖Σ - y_i‖₂ / ‖y_i‖₂ over real query rows is reported per site (:class:`ExactnessCheck`),
pass when at most :data:`RESUM_TOLERANCE` (for fp32; looser for fp16/bf16 models).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from attnaudit.contributions.projection import Projection
from attnaudit.contributions.trace import SiteTrace
from attnaudit.targets.placement import onloaded

RESUM_TOLERANCE = 1e-4
HALF_RESUM_TOLERANCE = 2e-2  # fp16 / bf16 models: their own sums are this coarse
RESUM_CHECK = "alti_resum"
# numbers per block of per-key terms: 1 MiB in float32, so that a block is reduced (re-summed,
# its distances taken) while it is still in cache (on a 1B-shaped Llama about 1.6x faster than
# one block per example)
TERMS_BLOCK = 2**18
FEW_HEADS = 8  # up to this many heads, the per-key terms are summed head by head


@dataclass(frozen=True)
class ExactnessCheck:
    """Does a site's decomposition re-sum to its block's real output? Laid out as a
    validity finding: status ``pass`` / ``fail``, rows: failing (example, query) rows,
    value: the largest relative error, detail: one sentence."""

    site: str
    check: str
    status: str
    rows: int
    detail: str
    value: float | None = None


@dataclass
class Block:
    """An attention block's anatomy: placement ``post``, ``pre`` or ``sandwich``, the residual
    (B, Q, d), the real output y (B, Q, d), and for a norm after the attention its
    linearisation: scale s (B, Q, 1), gamma and beta (d,), and whether it centres."""

    placement: str
    residual: torch.Tensor
    output: torch.Tensor
    scale: torch.Tensor | None = None
    gamma: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    centred: bool = False


@dataclass
class BlockContributions:
    """One site's ALTI contributions: (B, Q, K) for self-attention, (B, Q, K + 1) for
    cross-attention (the last column: the decoder stream's residual). Rows sum to 1."""

    site: str
    role: str
    layer: str
    placement: str
    contributions: torch.Tensor
    check: ExactnessCheck


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _centre(u: torch.Tensor, centred: bool) -> torch.Tensor:
    return u - u.mean(-1, keepdim=True) if centred else u


def _linearised(module: nn.Module, z: torch.Tensor, y: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, float]:
    """(s (B, Q, 1), gamma, beta, centred, fit error) of a norm call, its input ``z`` and
    output ``y`` (float32 (B, Q, d)): centring (LayerNorm) or not (RMSNorm), and gamma the
    weight or 1 + weight (Gemma's RMSNorm), whichever form reproduces the call's output."""
    with onloaded(module):
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        gammas = [torch.ones_like(z[0, 0])] if weight is None else [
            weight.detach().float(), 1 + weight.detach().float()]
        beta = torch.zeros_like(z[0, 0]) if bias is None else bias.detach().float()
    best, shifted = None, y - beta
    for centred in (True, False):
        moved = _centre(z, centred)
        for gamma in gammas:
            a = gamma * moved
            scale = ((a * shifted).sum(-1, keepdim=True)
                     / (a * a).sum(-1, keepdim=True).clamp_min(1e-30))
            error = _relative(scale * a + beta, y)
            if best is None or error < best[4]:
                best = (scale, gamma, beta, centred, error)
    assert best is not None
    return best


def block_of(site: SiteTrace, projection: Projection) -> Block | str:
    """The site's block (module docstring), or why it cannot be read. The attention's
    output is the projection's (the attention module's own where the projection was
    declared and not seen)."""
    call = site.call
    if call is None or call.inputs is None or call.output is None:
        return f"the attention module {site.module_path} was not seen with its input"
    if call.times != 1:
        return f"{site.module_path} ran {call.times} times in one pass"
    norms = sorted(site.norms.values(), key=lambda c: c.order)
    if any(n.times != 1 for n in norms):
        return f"a norm in {site.layer} ran more than once in one pass"
    after = [n for n in norms if n.order > call.order]
    nxt = after[0] if after else None
    if nxt is None or nxt.inputs is None:
        return f"no norm runs after the attention in {site.layer}: its block output is unseen"
    out = (projection.output if projection.output is not None else call.output).float()
    if out.shape != nxt.inputs.shape:
        return (f"the attention's output {tuple(out.shape)} is not the shape of the next "
                f"norm's input {tuple(nxt.inputs.shape)} in {site.layer}")
    candidates: dict[str, torch.Tensor | None] = {"post": call.inputs}
    before = [n for n in norms if n.order < call.order]
    if before and before[-1].output is not None and before[-1].output.shape == call.inputs.shape \
            and _relative(before[-1].output, call.inputs.float()) <= 1e-6:
        candidates["pre"] = before[-1].inputs
    # the residual is added to the attention's output, so it has its shape; a hybrid layer
    # whose attention reads more than the stream (Zamba: the hidden state beside the input
    # embeddings) has no such input
    shaped = {k: v for k, v in candidates.items() if v is not None and v.shape == out.shape}
    if not shaped:
        return (f"the attention in {site.layer} reads an input of shape "
                f"{tuple(call.inputs.shape)}, not its output's {tuple(out.shape)}, so no "
                "residual stream runs through it for the block to decompose")
    z = nxt.inputs.float()
    if _relative(z, out) <= 1e-6 and nxt.output is not None:
        # the norm takes the attention's own output: y = x + N(attention)
        residual = shaped["pre" if "pre" in shaped else "post"].float()
        scale, gamma, beta, centred, _ = _linearised(nxt.module, z, nxt.output.float())
        return Block("sandwich", residual, residual + nxt.output.float(), scale, gamma, beta,
                     centred)
    placement, residual = min(shaped.items(),
                              key=lambda item: _relative(item[1].float() + out, z))
    residual = residual.float()
    if placement == "pre":
        return Block("pre", residual, z)
    assert nxt.output is not None  # a norm call seen with its input but no tensor output
    scale, gamma, beta, centred, _ = _linearised(nxt.module, z, nxt.output.float())
    return Block("post", residual, nxt.output.float(), scale, gamma, beta, centred)


def transformed_inputs(site: SiteTrace, vectors: torch.Tensor, bias: torch.Tensor,
                       block: Block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor]:
    """The block's map applied to each input before the weighted sum, which it commutes
    with (L and gamma act per vector; s per query): weights (B, H, Q, K), head vectors
    (B, H, K, d), residual (B, Q, d) and the rest (B, Q, d), so that
    T_i(x_j) = Σ_h weights^h_ij vectors^h_j (+ the residual at j = i, or as its own term)."""
    weights, residual = site.weights, block.residual
    rest = bias.expand_as(residual)
    if block.placement == "pre":
        return weights, vectors, residual, rest
    assert block.scale is not None and block.gamma is not None and block.beta is not None
    scale, gamma = block.scale, block.gamma  # (B, Q, 1), (d,)
    if block.placement == "post":  # the norm is after the residual: it maps it too
        residual = scale * gamma * _centre(residual, block.centred)
    return (weights * scale[:, None], gamma * _centre(vectors, block.centred), residual,
            scale * gamma * _centre(rest, block.centred) + block.beta)


def _own_position(site: SiteTrace, queries: int, keys: int) -> torch.Tensor:
    """Bool (Q, K): the residual's term (key i of query i) in self-attention, never unread."""
    if site.role == "cross":
        return torch.zeros(queries, keys, dtype=torch.bool, device=site.weights.device)
    return torch.eye(queries, keys, dtype=torch.bool, device=site.weights.device)


def attention_terms(weights: torch.Tensor, vectors: torch.Tensor
                    ) -> Iterator[tuple[slice, slice, torch.Tensor]]:
    """Blocks of examples and keys and their terms Σ_h weights^h_qk vectors^h_k, key-major
    (c, k, Q, d) float32, from weights (B, H, Q, K) and head vectors (B, H, K, d); a block
    holds at most :data:`TERMS_BLOCK` numbers (at least one example and one key), so memory
    does not grow with B or K. The blocks of a chunk of examples come in key order; a chunk
    spans several examples only when each fits a block with all its keys."""
    batch, _, queries, keys = weights.shape
    per_key = max(1, queries * vectors.shape[-1])
    block_keys = min(keys, max(1, TERMS_BLOCK // per_key))
    chunk = max(1, TERMS_BLOCK // (per_key * keys)) if block_keys == keys else 1
    for start in range(0, batch, chunk):
        part = slice(start, min(batch, start + chunk))
        # one (Q, H) @ (H, d) product per (example, key), on contiguous copies: a strided
        # operand makes the batched product several times slower
        by_key = weights[part].permute(0, 3, 2, 1).contiguous()  # (c, K, Q, H)
        heads = vectors[part].transpose(1, 2).contiguous()  # (c, K, H, d)
        for first in range(0, keys, block_keys):
            block = slice(first, min(keys, first + block_keys))
            yield part, block, _terms(by_key[:, block], heads[:, block])


def _reduced(terms: torch.Tensor, y: torch.Tensor, resum: torch.Tensor) -> torch.Tensor:
    """A block's terms (c, k, Q, d) added to ``resum`` (c, Q, d), then their L1 distances
    to the outputs ``y`` (c, Q, d): (c, Q, k) (the terms are overwritten)."""
    resum += terms.sum(1)
    return terms.sub_(y[:, None]).abs_().sum(-1).transpose(1, 2)


def terms_seconds(heads: int, width: int, queries: int, device: torch.device | None = None,
                  repeats: int = 3) -> float:
    """Seconds per number of per-key terms that :func:`alti_block`'s arithmetic takes here:
    one block of random terms of ``queries`` query rows, ``heads`` heads and model width
    ``width`` formed (:func:`attention_terms`), re-summed and reduced to distances, on
    ``device``; the fastest of ``repeats`` runs (a plan's price of ALTI)."""
    keys = max(1, TERMS_BLOCK // max(1, queries * width))
    weights = torch.rand(1, heads, queries, keys, device=device)
    vectors = torch.randn(1, heads, keys, width, device=device)
    y = torch.randn(1, queries, width, device=device)
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        resum = torch.zeros_like(y)
        for _, _, terms in attention_terms(weights, vectors):
            _reduced(terms, y, resum)
        float(resum[0, 0, 0])  # waits for a device's kernels
        best = min(best, time.perf_counter() - started)
    return best / (queries * keys * width)


def _terms(by_key: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """(c, k, Q, d): Σ_h by_key (c, k, Q, H) x heads (c, k, H, d)."""
    if by_key.shape[-1] > FEW_HEADS:
        return torch.matmul(by_key, heads)
    # with few heads the batched product is thousands of tiny products; a broadcast
    # multiply-add per head streams the terms instead (about 3x faster for 4 heads)
    terms = by_key[..., 0, None] * heads[:, :, None, 0]
    for head in range(1, by_key.shape[-1]):
        terms.addcmul_(by_key[..., head, None], heads[:, :, None, head])
    return terms


def _tolerance(site: SiteTrace) -> float:
    return HALF_RESUM_TOLERANCE if site.module_dtype in (torch.float16, torch.bfloat16) \
        else RESUM_TOLERANCE


def alti_block(site: SiteTrace, vectors: torch.Tensor, bias: torch.Tensor, block: Block,
               query_mask: torch.Tensor | None) -> BlockContributions:
    """The site's normalised ALTI contributions and its exactness check.

    vectors: the head vectors f_h(x_j) (B, H, K, d); bias: the output projection's (d,);
    query_mask: bool (B, Q), the rows the check counts (None, or a site whose queries are not
    the role's, e.g. ProphetNet's n-gram stream: all)."""
    weights, vectors, residual, rest = transformed_inputs(site, vectors, bias, block)
    # a key no head reads (padding) has a zero term, which contributes exactly 0
    unread = (site.weights == 0).all(1)  # (B, Q, K)
    rows, errors = [], []
    resum = distance = None
    for part, span, terms in attention_terms(weights, vectors):  # (c, k, Q, d)
        y, own = block.output[part], residual[part]
        keys, queries = site.weights.shape[-1], terms.shape[2]
        if span.start == 0:  # a new chunk of examples: its sums start from the rest
            resum = rest[part] + own if site.role == "cross" else rest[part].clone()
            distance = terms.new_empty(terms.shape[0], queries, keys)
        assert resum is not None and distance is not None
        if site.role != "cross":  # the residual belongs to the query's own position
            terms[:, :, span].diagonal(dim1=1, dim2=2).add_(own[:, span].transpose(1, 2))
        distance[..., span] = _reduced(terms, y, resum)
        if span.stop < keys:
            continue
        errors.append((resum - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30))
        scored = distance
        if site.role == "cross":  # the decoder stream: a term of its own, after the keys
            scored = torch.cat([distance, (y - own).abs().sum(-1, keepdim=True)], dim=-1)
        score = (y.abs().sum(-1, keepdim=True) - scored).clamp_min(0)
        score[..., :keys].masked_fill_(unread[part] & ~_own_position(site, queries, keys), 0)
        rows.append(score / score.sum(-1, keepdim=True).clamp_min(1e-30))
    error = torch.cat(errors)
    if query_mask is not None and query_mask.shape == error.shape:  # else: every row
        error = error[query_mask.to(error.device)]
    tolerance = _tolerance(site)
    worst = float(error.max()) if error.numel() else 0.0
    failing = int((~(error <= tolerance)).sum())
    status = "pass" if failing == 0 else "fail"
    detail = (f"{block.placement}-LN block of {site.layer}: the terms re-sum to the real "
              f"output within {worst:.2e} (relative, tolerance {tolerance:g})"
              if status == "pass" else
              f"{block.placement}-LN block of {site.layer}: {failing} row(s) re-sum with a "
              f"relative error up to {worst:.2e} (tolerance {tolerance:g}): the block does "
              "not decompose as attention + residual (+ a linearised norm)")
    check = ExactnessCheck(site.name, RESUM_CHECK, status, failing, detail, worst)
    return BlockContributions(site.name, site.role, site.layer, block.placement,
                              torch.cat(rows), check)


def unavailable(site: str, reason: str) -> ExactnessCheck:
    """The check of a site ALTI cannot decompose: failed, with the reason."""
    return ExactnessCheck(site, RESUM_CHECK, "fail", 0, f"not decomposed: {reason}", None)
