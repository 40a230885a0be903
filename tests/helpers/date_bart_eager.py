"""The date BART's cross-attention as Hugging Face's eager backend returns it, loaded
again from its checkpoint folder: ground truth that never passes through capture."""

from __future__ import annotations

import torch

from attnaudit.targets.contract import Batch


def eager_cross_attentions(batch: Batch, emitted: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per decoder layer, (B, H, T, S): the eager cross-attention of the date BART,
    teacher-forced on ``emitted`` (B, T) (its start token, then emitted[:, :-1])."""
    import transformers

    from attnaudit_examples.date_transformer.model import MODEL_DIR

    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        MODEL_DIR, attn_implementation="eager").eval()
    start = torch.full_like(emitted[:, :1], model.config.decoder_start_token_id)
    with torch.no_grad():
        out = model(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                    decoder_input_ids=torch.cat([start, emitted[:, :-1]], 1),
                    output_attentions=True)
    return tuple(out.cross_attentions)


def eager_cross_attention(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
    """(B, T, S): the mean over layers and heads of :func:`eager_cross_attentions`."""
    return torch.stack(eager_cross_attentions(batch, emitted)).mean((0, 2))


def decoder_layer_output(model: torch.nn.Module, inputs: dict, layer: torch.nn.Module,
                         zero_key: int | None = None) -> torch.Tensor:
    """(B, T, d): a Hugging Face encoder-decoder's decoder ``layer`` output in one eager
    forward of ``inputs``; with ``zero_key``, the cross-attention's value of that source key
    set to 0 (its ``v_proj`` output row, bias included): value zeroing by hand."""
    seen: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(
        lambda m, a, out: seen.append(out if isinstance(out, torch.Tensor) else out[0]))]
    if zero_key is not None:
        def zero(m, a, out):
            out = out.clone()
            out[:, zero_key] = 0.0
            return out
        handles.append(layer.encoder_attn.v_proj.register_forward_hook(zero))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen[0]
