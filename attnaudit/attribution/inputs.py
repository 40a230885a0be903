"""What every attribution method shares: the baseline token, the embedded inputs of one batch,
and the teacher-forced passes that replace those embeddings and take gradients from them.

The attributed source input is the output of the **first call** of ``target.source_embedding``
(the encoder's call when a decoder shares the module); with target-side attribution the
decoder's input embeddings (``target.target_embedding``) are attributed too
(:class:`~attnaudit.attribution.step_gradients.EmbeddingCalls` records or replaces both). The
baseline of integrated gradients, occlusion, DeepLift and GradientShap is the embedding of one
token at every position (:func:`resolve_baseline_id`, :func:`baseline_ids`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from attnaudit.attribution.attention_backward import small_attention_on_math
from attnaudit.attribution.output_head import sparse_output_head
from attnaudit.attribution.step_gradients import EmbeddingCalls, attributed_output, step_gradients
from attnaudit.capturing.recorder import capture
from attnaudit.errors import InterventionError
from attnaudit.record import Site
from attnaudit.targets.contract import Batch, Seq2SeqTarget


def resolve_pad_id(target: Seq2SeqTarget, batch: Batch, pad_id: int | None = None) -> int:
    """The padding token id: ``pad_id`` when given, else the id found at the batch's padding
    positions, else ``model.config.pad_token_id``, else the target's only special id."""
    if pad_id is not None:
        return int(pad_id)
    at_padding = batch.source_ids[~batch.source_mask].unique()
    if at_padding.numel() == 1:
        return int(at_padding)
    config_pad = getattr(getattr(target.model, "config", None), "pad_token_id", None)
    if at_padding.numel() == 0 and config_pad is not None:
        return int(config_pad)
    if at_padding.numel() == 0 and len(target.special_ids) == 1:
        return int(target.special_ids[0])
    found = at_padding.tolist() if at_padding.numel() else "none"
    raise InterventionError(
        f"cannot tell the padding token of target {target.name!r} (ids at padding positions: "
        f"{found}; special ids: {list(target.special_ids)}); pass pad_id=...")


def resolve_baseline_id(target: Seq2SeqTarget, batch: Batch, baseline: str | int = "pad",
                        pad_id: int | None = None) -> int:
    """The baseline token: the pad id (:func:`resolve_pad_id`) for ``"pad"``, the unknown
    token for ``"unk"`` (``target.unk_id``, else ``model.config.unk_token_id``; inseq's
    default), or an explicit id."""
    if baseline == "pad":
        return resolve_pad_id(target, batch, pad_id)
    if baseline == "unk":
        unk = target.unk_id
        if unk is None:
            unk = getattr(getattr(target.model, "config", None), "unk_token_id", None)
        if unk is None:
            raise InterventionError(f"target {target.name!r} declares no unk_id (nor an "
                                    "unk_token_id in its model config); pass the baseline "
                                    "token id instead")
        return int(unk)
    if isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0:
        raise InterventionError(f'baseline must be "pad", "unk" or a token id, got {baseline!r}')
    return baseline


def baseline_ids(ids: torch.Tensor, baseline_id: int, eos_id: int, eos_kept: bool
                 ) -> torch.Tensor:
    """``baseline_id`` at every position of ``ids`` (B, L), or everywhere but the
    end-of-sequence tokens with ``eos_kept``."""
    base = torch.full_like(ids, baseline_id)
    return torch.where(ids == eos_id, ids, base) if eos_kept else base


def source_embedding_module(target: Seq2SeqTarget) -> nn.Module:
    """``target.source_embedding``; InterventionError when the target declares none."""
    if not isinstance(target.source_embedding, nn.Module):
        raise InterventionError(f"target {target.name!r} declares no source_embedding module; "
                                "attribution and leave-one-out need it")
    return target.source_embedding


def prefix_embedding_module(target: Seq2SeqTarget) -> nn.Module:
    """``target.target_embedding`` (the decoder's input embedding, which target-side
    attribution varies); InterventionError when the target declares none."""
    if not isinstance(target.target_embedding, nn.Module):
        raise InterventionError(f"target {target.name!r} declares no target_embedding module; "
                                "target-side attribution needs the decoder's input embedding")
    return target.target_embedding


@dataclass
class EmbeddedInputs:
    """One batch's embedded inputs, their baselines, and what is attributed at the input.

    source, source_base: (B, n, d) the embedded source and its baseline. prefix,
    prefix_base: (B, T, d) the decoder's input embeddings and their baseline (None without
    target-side attribution). emitted, contrast: (B, T) ids (contrast None unless a contrast
    output). values: (B, T) float32, the attributed output at the input. vocab: the output
    vocabulary size.
    """

    source: torch.Tensor
    source_base: torch.Tensor
    prefix: torch.Tensor | None
    prefix_base: torch.Tensor | None
    emitted: torch.Tensor
    contrast: torch.Tensor | None
    values: torch.Tensor
    vocab: int

    def sides(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The attributed inputs with their baselines: the source, then (with target-side
        attribution) the prefix."""
        sides = [(self.source, self.source_base)]
        if self.prefix is not None and self.prefix_base is not None:
            sides.append((self.prefix, self.prefix_base))
        return sides


def _detach_cross(site: Site, weights: torch.Tensor,
                  key_mask: torch.Tensor | None) -> torch.Tensor | None:
    return weights.detach() if site.kind == "cross" else None


class EmbeddingPasses:
    """One batch's teacher-forced forward passes over the whole output with its embeddings
    replaced, and the gradients of every step's attributed output from them.

    Holds the target, the batch, what is attributed (``output``, one of
    :data:`~attnaudit.attribution.step_gradients.OUTPUTS`) and the embedding modules whose
    calls are replaced: ``source_module`` and, with target-side attribution,
    ``prefix_module`` (else None).
    """

    def __init__(self, target: Seq2SeqTarget, batch: Batch, output: str,
                 target_side: bool) -> None:
        self.target, self.batch, self.output = target, batch, output
        self.source_module = source_embedding_module(target)
        self.prefix_module = prefix_embedding_module(target) if target_side else None

    def outputs(self, rows: torch.Tensor, emitted: torch.Tensor, contrast: torch.Tensor | None,
                source: torch.Tensor | None = None, prefix: torch.Tensor | None = None,
                detach: bool = False) -> tuple[torch.Tensor, EmbeddingCalls, int]:
        """Attributed outputs (R, T) of examples ``rows`` (R,) with the source (and prefix)
        embeddings replaced when given, the calls seen, and the vocabulary size. With
        gradients enabled, short attention calls run on the math backend
        (:mod:`~attnaudit.attribution.attention_backward`)."""
        calls = EmbeddingCalls(self.source_module, self.prefix_module, source, prefix)
        batch = self.batch.select(rows)
        edit = (capture(self.target.model, sites=self.target.sites, edit=_detach_cross,
                        kinds=self.target.kinds) if detach else nullcontext())
        kernels = small_attention_on_math() if torch.is_grad_enabled() else nullcontext()
        with edit as cap, calls.active(), kernels:
            logits = self.target.teacher_forced(batch, emitted[rows])
        if cap is not None and not any(rec.kind == "cross" for rec in cap.records.values()):
            raise InterventionError(
                f"detaching attention needs a cross-attention site; sites and kinds seen: "
                f"{ {n: r.kind for n, r in cap.records.items()} }. Declare kinds with "
                "Seq2SeqTarget(kinds={...}) or pass detach_attention=()")
        picked = attributed_output(logits, emitted[rows], self.output,
                                   None if contrast is None else contrast[rows])
        return picked, calls, int(logits.shape[-1])

    def gradients(self, rows: torch.Tensor, inputs: EmbeddedInputs, source: torch.Tensor,
                  prefix: torch.Tensor | None, detach: bool
                  ) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
        """Gradients at ``source`` (R, n, d) (and ``prefix`` (R, T, d)) of every step's
        output: yields ``(step, (source grads (R, n, d), prefix grads (R, T, d) when a
        prefix is given))``."""
        leaves = tuple(x.detach().requires_grad_() for x in (source, prefix) if x is not None)
        with torch.enable_grad():
            with sparse_output_head(self.target.model):
                values, _, _ = self.outputs(rows, inputs.emitted, inputs.contrast, leaves[0],
                                            leaves[1] if len(leaves) > 1 else None, detach)
            yield from step_gradients(values, leaves)


def embedded_inputs(passes: EmbeddingPasses, emitted: torch.Tensor,
                    contrast: torch.Tensor | None, baseline_id: int, eos_kept: bool
                    ) -> EmbeddedInputs:
    """The recorded embeddings of a real forward pass, their baselines, and the attributed
    outputs (no gradients)."""
    batch = passes.batch
    rows = torch.arange(len(batch))
    with torch.no_grad():
        values, calls, vocab = passes.outputs(rows, emitted, contrast)
        source = calls.recorded_source
        expected = tuple(batch.source_ids.shape)
        if not isinstance(source, torch.Tensor) or tuple(source.shape[:2]) != expected:
            got = tuple(source.shape) if isinstance(source, torch.Tensor) else type(source)
            raise InterventionError(
                f"the source embedding's first call gave {got}; attribution needs one vector "
                f"per source position, shape {expected} + (d,)")
        source_base = passes.source_module(baseline_ids(batch.source_ids, baseline_id,
                                                        passes.target.eos_id, eos_kept))
        if source_base.shape != source.shape:
            raise InterventionError(f"the baseline has shape {tuple(source_base.shape)}, the "
                                    f"embedded source {tuple(source.shape)}")
        prefix = prefix_base = None
        if passes.prefix_module is not None:
            prefix = calls.recorded_prefix
            if prefix is None or prefix.shape[:2] != emitted.shape:
                seen = None if prefix is None else tuple(prefix.shape)
                raise InterventionError(f"the target embedding gave {seen}; target-side "
                                        f"attribution needs {tuple(emitted.shape)} + (d,)")
            prefix_base = passes.prefix_module(baseline_ids(emitted, baseline_id,
                                                            passes.target.eos_id, eos_kept))
    return EmbeddedInputs(source.detach(), source_base, prefix, prefix_base, emitted, contrast,
                          values.float(), vocab)
