"""Hugging Face models as targets: :func:`from_hf` takes a loaded model or a local
checkpoint folder with the audit data, checks them, and builds the target with the
encoder-decoder adapter (:mod:`attnaudit.targets.hf.seq2seq`) or the decoder-only one
(:mod:`attnaudit.targets.hf.causal`). transformers is imported only here, when it is called.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.hf import check_backends
from attnaudit.errors import CaptureError, TargetError
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.targets.data import AuditData, audit_data
from attnaudit.targets.decoding import resolve_decoding
from attnaudit.targets.hf.causal import CausalLM, is_causal_lm
from attnaudit.targets.hf.seq2seq import Seq2SeqLM
from attnaudit.targets.hf.tokenizer import check_tokenization, check_tokenizer_files
from attnaudit.targets.placement import (
    input_device,
    refuse_dispatched,
    resolve_device,
    resolve_dtype,
)


def from_hf(model_or_dir: nn.Module | str | Path, data: Any, *, tokenizer: Any = None,
            batch_size: int = 100, max_new_tokens: int | None = None,
            max_source_tokens: int | None = None, device: str | torch.device | None = None,
            dtype: str | torch.dtype | None = None, name: str | None = None,
            contrast: Sequence[str] | None = None, decoding: str = "model",
            generation: Mapping[str, Any] | None = None,
            seed: int | None = None) -> Seq2SeqTarget:
    """A target from a Hugging Face model and its tokenizer: loaded, or a local folder.

    A seq2seq model (``config.is_encoder_decoder``) audits source -> output; a decoder-only
    model (GPT-2, Llama ...) audits prompt -> continuation, the prompts being the sources
    (see :mod:`attnaudit.targets.hf.causal`). Outputs are decoded as the model decodes them:
    with its ``generation_config`` (beams, length penalty, length limits, forced BOS/EOS,
    no-repeat n-grams, bad words ...), and the one hypothesis ``generate`` returns (the best
    beam) is what every protocol teacher-forces (see :mod:`attnaudit.targets.decoding`).

    Args:
        model_or_dir: a loaded ``PreTrainedModel`` (give ``tokenizer``), or a directory with
            config, weights and tokenizer files (read offline).
        data: the sources: a TSV file of ``source[<TAB>target]`` lines, a list of strings,
            a pandas Series (or any iterable of strings, e.g. a ``datasets`` column), or a
            pandas DataFrame laid out as the TSV (sources, then optional references).
        tokenizer: the model's tokenizer; required with a loaded model, read from the folder
            otherwise.
        batch_size: examples per batch.
        max_new_tokens: the decoding's limit on new tokens (default: the model's generation
            config's ``max_new_tokens`` or ``max_length`` when it sets one, else 64).
        max_source_tokens: truncate longer sources (default: the model's position limit,
            ``max_position_embeddings``, when its config has one). Truncation warns with the
            number of sources cut and is recorded in ``target.truncation``.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:N``, ``mps``; default: a
            folder's model on the CPU, a loaded model where it is). dtype: ``float32``,
            ``bfloat16`` or ``float16`` (default: as loaded).
        name: the label in reports (default: the folder as given, or the name the loaded
            model was loaded from).
        contrast: optional, one contrast output string per source, for contrastive
            attribution; tokenized as targets into ``batch.inputs["contrast_ids"]`` (for a
            decoder-only model: as a continuation, without special tokens).
        decoding: ``"model"``: the model's generation settings with ``generation`` on top;
            ``"greedy"``: one hypothesis, the argmax at every step, whatever the config
            says about beams or sampling.
        generation: ``generate`` keyword arguments overriding the model's generation config,
            e.g. ``{"num_beams": 2, "length_penalty": 1.0}``.
        seed: seeds sampled decoding (refused without one: an audit must explain one
            reproducible output); each decoding call draws from a fresh state so seeded.

    A loaded model is left exactly as it is — mode, dtype, device, attention backend: the
    target runs it in place. When ``device`` or ``dtype`` would change it, a copy is moved
    or cast instead (memory for a second model). A model in training mode is audited in
    training mode (dropout active, the report says so), with a warning: call
    ``model.eval()`` first for a deterministic audit. A folder's model is loaded in eval
    mode with its default attention backend (sdpa where it has one, else eager).

    Interventions get ``encode``/``decode`` and, from the model's own cache object,
    ``decode_states``/``decode_step``: an edited copy of step ``t`` runs one cached decoder
    step, or re-runs the prefix where the cache cannot be cut back (the suite's metadata
    says which).
    """
    auto = _auto_classes()
    _check_sizes(batch_size=batch_size, max_new_tokens=max_new_tokens,
                 max_source_tokens=max_source_tokens)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if isinstance(model_or_dir, nn.Module):
        if tokenizer is None:
            raise TargetError("a loaded model needs its tokenizer: from_hf(model, data, "
                              "tokenizer=tokenizer)")
        examples = audit_data(data, contrast)
        model = _loaded_model(model_or_dir, device, dtype)
        origin = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        label = origin or type(model).__name__
    else:
        model_dir = Path(model_or_dir)
        if not model_dir.is_dir():
            raise TargetError(f"Hugging Face model directory not found: {model_dir}")
        examples = audit_data(data, contrast)  # before the slow load
        model, tokenizer = _load_folder(auto, model_dir, tokenizer, device, dtype)
        origin = label = model_dir.as_posix()
    _check_model(label, model, tokenizer, examples)
    how = resolve_decoding(model, mode=decoding, generation=generation, seed=seed,
                           max_new_tokens=max_new_tokens)
    adapter = CausalLM if is_causal_lm(getattr(model, "config", None)) else Seq2SeqLM
    return adapter(model, tokenizer, how).target(
        examples, batch_size=batch_size, max_source_tokens=max_source_tokens, label=label,
        origin=origin, name=name)


def _auto_classes() -> tuple[Any, Any, Any, Any]:
    """transformers' AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM and
    AutoTokenizer; a TargetError naming the extra to install when it is missing."""
    try:
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSeq2SeqLM,
            AutoTokenizer,
        )
    except ImportError as exc:
        raise TargetError("--hf needs transformers: pip install 'attnaudit[hf]'") from exc
    return AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer


def _check_sizes(**sizes: int | None) -> None:
    """Refuse a size option (None: not given) that is not a positive integer."""
    for option, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise TargetError(f"{option} must be a positive integer, got {value!r}")


def _load_folder(auto: tuple[Any, Any, Any, Any], model_dir: Path, tokenizer: Any,
                 device: torch.device | None, dtype: torch.dtype | None
                 ) -> tuple[nn.Module, Any]:
    """The checkpoint in ``model_dir`` (read offline, in eval mode, on ``device`` in
    ``dtype``) and its tokenizer, unless ``tokenizer`` is given."""
    auto_config, auto_causal, auto_seq2seq, auto_tokenizer = auto
    if tokenizer is None:
        check_tokenizer_files(model_dir)
    causal = False
    try:
        causal = is_causal_lm(auto_config.from_pretrained(model_dir, local_files_only=True))
        loader = auto_causal if causal else auto_seq2seq
        # The model's own default backend: sdpa where it has one, else eager; both
        # expose weights to capture.
        model = loader.from_pretrained(model_dir, local_files_only=True).eval()
        if tokenizer is None:
            tokenizer = auto_tokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        what = "causal LM" if causal else "seq2seq model"
        raise TargetError(f"cannot load a {what} and tokenizer from {model_dir}: "
                          f"{exc}") from exc
    model.to(device=device, dtype=dtype)
    return model, tokenizer


def _loaded_model(model: nn.Module, device: torch.device | None,
                  dtype: torch.dtype | None) -> nn.Module:
    """The user's model itself, or a copy on ``device`` in ``dtype`` when either differs."""
    causal = is_causal_lm(getattr(model, "config", None))
    if not hasattr(model, "generate") or not (causal or hasattr(model, "get_encoder")):
        raise TargetError(f"from_hf needs a Hugging Face seq2seq model (generate, "
                          f"get_encoder) or causal LM (generate), got {type(model).__name__}")
    where = input_device(model)  # offloaded parameters are on meta: not where it runs
    # "cuda" names whichever GPU the model is on: only a type or an explicit index moves it
    moves = device is not None and next(model.parameters(), None) is not None and (
        where.type != device.type
        or (device.index is not None and where.index != device.index))
    casts = dtype is not None and any(p.is_floating_point() and p.dtype != dtype
                                      for p in model.parameters())
    if model.training:
        warnings.warn("attnaudit: the model is in training mode, so dropout is active during "
                      "the audit; call model.eval() first for a deterministic audit",
                      stacklevel=3)
    if not (moves or casts):
        return model
    refuse_dispatched(model)  # a copy of offloaded weights would copy meta tensors
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def _check_model(label: str, model: nn.Module, tokenizer: Any, data: AuditData) -> None:
    """Refuse a tokenizer that knows none of the sources (warn when it knows only some), an
    attention backend capture cannot read, and a contrast output count that is not one per
    source."""
    empty = check_tokenization(Path(label), tokenizer, data.sources)
    if empty:
        warnings.warn(f"attnaudit: the tokenizer turns {empty} of {len(data.sources)} sources "
                      "into special tokens only; they are counted apart as degenerate",
                      stacklevel=3)
    try:
        check_backends(list(model.named_modules()))
    except CaptureError as exc:
        raise TargetError(f"{label}: {exc}") from None
    if data.contrast is not None and len(data.contrast) != len(data.sources):
        raise TargetError(f"contrast gives {len(data.contrast)} outputs for "
                          f"{len(data.sources)} sources; give one per source")
