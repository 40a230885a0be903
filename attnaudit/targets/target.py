"""What an audit runs: a seq2seq model, its data, and how to run it.

A :class:`Seq2SeqTarget` bundles the model with plain callables, so any model can be
audited without changing its code:

- ``batches()`` yields :class:`Batch` objects (source ids ``(B, n)``, source mask, texts,
  and whatever else the model needs in ``inputs``; ``inputs["offsets"]``, when given,
  is ``(B, n, 2)`` character offsets of the source tokens, which word-level tables use);
- ``greedy(batch)`` returns the emitted ids ``(B, T)`` (the decoder start token excluded,
  end-of-sequence included, anything after it is padding);
- ``teacher_forced(batch, emitted)`` returns logits ``(B, T, V)`` where position ``t``
  predicts ``emitted[:, t]`` from ``emitted[:, :t]`` and the source, i.e. the model's own
  greedy output fed back — the default seq2seq protocol of docs/metrics.md;
- ``source_embedding`` is the module whose first call in a forward pass embeds the source
  (attributions hook that call only, so an embedding shared with the decoder is safe);
- optionally ``encode(batch)`` and ``decode(batch, encoded, emitted)``, the two halves of
  ``teacher_forced``: interventions that edit only decoder-side attention then encode each
  example once and re-run only the decoder for its many edited copies;
- optionally, with those, ``decode_states(batch, encoded, emitted)`` and
  ``decode_step(batch, encoded, states, emitted, step)``: the decoder's state before every
  step from one unedited teacher-forced pass (a KV cache, a recurrent state), and one
  decoder step from it. An edited copy of step ``t`` then runs one step instead of the
  prefix ``0..t``. :func:`from_hf` provides both from the model's KV cache.

Cross-attention keys are source positions: key ``j`` of a cross-attention row is
``batch.source_ids[:, j]``. Build a target from parts, with :func:`from_hf` for a local
Hugging Face checkpoint, or load one by name with :func:`load_target`.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.hf import check_backends
from attnaudit.capturing.sites import SiteSelection
from attnaudit.errors import CaptureError, TargetError
from attnaudit.targets.datafile import DataRows, read_rows
from attnaudit.targets.hf.cache import cache_argument, cache_prefix, cache_tensors
from attnaudit.targets.hf.causal import CausalLM, is_causal_lm
from attnaudit.targets.hf.tokenizer import check_tokenization, check_tokenizer_files


@dataclass
class Batch:
    """One batch of sources.

    source_ids: (B, n) long. source_mask: (B, n) bool, True on real (non-padding) tokens.
    texts: the B source strings. references: gold target strings when known.
    inputs: anything else the target's callables need; a tensor whose first axis is B
        follows the batch through :meth:`select` and :meth:`repeat`.
    """

    source_ids: torch.Tensor
    source_mask: torch.Tensor
    texts: list[str]
    references: list[str] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.source_ids.shape[0])

    def select(self, index: torch.Tensor | Sequence[int]) -> Batch:
        """The examples at ``index`` (a long tensor or list of positions), in that order."""
        index = torch.as_tensor(index, dtype=torch.long)
        picks = index.tolist()
        return Batch(
            self.source_ids[index],
            self.source_mask[index],
            [self.texts[i] for i in picks],
            None if self.references is None else [self.references[i] for i in picks],
            {k: _take(v, index, len(self)) for k, v in self.inputs.items()},
        )

    def to(self, device: torch.device) -> Batch:
        """The batch with every tensor on ``device``."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in self.inputs.items()}
        return Batch(self.source_ids.to(device), self.source_mask.to(device), self.texts,
                     self.references, moved)

    def repeat(self, times: int) -> Batch:
        """Each example ``times`` times in a row: (B, ...) -> (B * times, ...)."""
        return self.select(torch.arange(len(self)).repeat_interleave(times))


def _take(value: Any, index: torch.Tensor, size: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == size:
        return value[index.to(value.device)]
    if isinstance(value, list) and len(value) == size:
        return [value[i] for i in index.tolist()]
    return value


@dataclass
class Expectation:
    """Where attention is expected to go, e.g. the date task's source-year characters.

    keys(batch, emitted) -> bool (B, n) or (B, T, n): expected source keys.
    rows: query steps that count — the first ``rows`` steps, or None for every step.
    """

    name: str
    keys: Callable[[Batch, torch.Tensor], torch.Tensor]
    rows: int | None = None


@dataclass
class Seq2SeqTarget:
    """A model under audit and how to run it (see the module docstring for the contract).

    Attributes:
        name: short label used in reports.
        model: the unmodified model.
        batches: () -> iterable of :class:`Batch`, the audit data.
        greedy: batch -> emitted ids (B, T) long.
        teacher_forced: (batch, emitted (B, T)) -> logits (B, T, V).
        source_embedding: module whose first call per forward embeds the source.
        target_embedding: optional, the module embedding the decoder's input tokens (its
            calls after the source's: one ``(B, T, d)``, or one ``(B, d)`` per step), for
            target-side attribution.
        first_prefix_input: the first decoder input that target-side attribution scores (1
            for a decoder-only target, whose input 0, the prompt's last token, is a prompt
            token scored on the source side).
        unk_id: optional, the unknown token's id (the ``"unk"`` attribution baseline).
        source_tokens: batch -> per example, a label per source position.
        target_tokens: emitted (B, T) -> per example, a label per step.
        eos_id: id ending the output; steps after the first one are padding.
        special_ids: source ids left out of explanation metrics (pad, BOS, EOS ...).
        sites: capture site selection (None: every site).
        kinds: capture kind overrides, e.g. ``{"attend": "cross"}``.
        expectations: expected-key sets to report region_mass / top_weight_hit for.
        seed: seed for every random draw in interventions.
        description: one paragraph for the report.
        encode: optional, batch -> encoder state: a tensor, or a tuple/list/dict of them,
            each with the batch on its first axis.
        decode: optional, (batch, encoder state, emitted (B, T)) -> logits (B, T, V), equal
            to ``teacher_forced(batch, emitted)`` when the state comes from ``encode(batch)``.
        decode_states: optional, (batch, encoder state, emitted (B, T)) -> the decoder state
            before every step 0..T-1, from one teacher-forced pass: a tensor, or a
            tuple/list/dict of them, each with the batch on its first axis.
        decode_step: optional, (batch, encoder state, decoder states, emitted (B, T),
            step t) -> logits (B, V) at step t, run from the state before t; equal to
            ``decode(batch, encoded, emitted)[:, t]``. Used only with ``decode_states``.
        device: where the model runs; batches are moved there (None: as yielded).
        truncation: one sentence on how sources were truncated, for the report.
    """

    name: str
    model: nn.Module
    batches: Callable[[], Iterable[Batch]]
    greedy: Callable[[Batch], torch.Tensor]
    teacher_forced: Callable[[Batch, torch.Tensor], torch.Tensor]
    source_embedding: nn.Module | None
    source_tokens: Callable[[Batch], list[list[str]]]
    target_tokens: Callable[[torch.Tensor], list[list[str]]]
    eos_id: int
    special_ids: tuple[int, ...] = ()
    sites: SiteSelection = None
    kinds: Mapping[str, str] | None = None
    expectations: tuple[Expectation, ...] = ()
    seed: int = 0
    description: str = ""
    encode: Callable[[Batch], Any] | None = None
    decode: Callable[[Batch, Any, torch.Tensor], torch.Tensor] | None = None
    decode_states: Callable[[Batch, Any, torch.Tensor], Any] | None = None
    decode_step: Callable[[Batch, Any, Any, torch.Tensor, int], torch.Tensor] | None = None
    device: torch.device | None = None
    truncation: str = ""
    target_embedding: nn.Module | None = None
    first_prefix_input: int = 0
    unk_id: int | None = None

    def step_mask(self, emitted: torch.Tensor) -> torch.Tensor:
        """Bool (B, T): steps up to and including the first ``eos_id``."""
        is_eos = emitted == self.eos_id
        return (is_eos.long().cumsum(-1) - is_eos.long()) == 0

    def explain_keys(self, batch: Batch) -> torch.Tensor:
        """Bool (B, n): source keys counted by explanation metrics (real, not special)."""
        keep = batch.source_mask.clone()
        for special in self.special_ids:
            keep &= batch.source_ids != special
        return keep

    def iter_batches(self, limit: int | None = None) -> Iterator[Batch]:
        """The audit data, cut after ``limit`` examples (>= 0) when given."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 examples, got {limit}")
        seen = 0
        for batch in self.batches():
            if self.device is not None:
                batch = batch.to(self.device)
            if limit is not None and seen + len(batch) > limit:
                batch = batch.select(torch.arange(limit - seen))
            if len(batch):
                yield batch
            seen += len(batch)
            if limit is not None and seen >= limit:
                return

    def with_options(self, **changes: Any) -> Seq2SeqTarget:
        """A copy with some attributes changed."""
        return replace(self, **changes)


def select_state(state: Any, index: torch.Tensor) -> Any:
    """An encoder state (tensor, or tuple/list/dict of tensors with the batch first) at
    ``index`` along the batch axis; anything else passes through unchanged."""
    if isinstance(state, torch.Tensor):
        return state[index.to(state.device)]
    if isinstance(state, tuple | list):
        return type(state)(select_state(part, index) for part in state)
    if isinstance(state, dict):  # also a Hugging Face ModelOutput, kept as its own type
        parts = {key: select_state(part, index) for key, part in state.items()}
        return parts if type(state) is dict else type(state)(**parts)
    return state


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"meta"`` -> a torch.device (None
    stays None); a clear :class:`TargetError` for anything else."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise TargetError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or "
                          "meta") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise TargetError(f"device {device!r}: CUDA is not available here (this torch "
                              "build or machine has no GPU); use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise TargetError(f"device {device!r}: there are {torch.cuda.device_count()} "
                              f"CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise TargetError(f"device {device!r}: MPS is not available here; use --device cpu")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype) -> torch dtype."""
    if dtype is None or dtype in DTYPES.values():
        return dtype  # type: ignore[return-value]
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise TargetError(f"unsupported dtype {dtype!r}: use one of {', '.join(DTYPES)}")


def place(target: Seq2SeqTarget, device: str | torch.device | None = None,
          dtype: str | torch.dtype | None = None) -> Seq2SeqTarget:
    """``target`` with its model moved to ``device`` and cast to the floating ``dtype`` (in
    place: the model is the target's own) and its batches following the model's device."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if device is None and dtype is None:
        return target
    target.model.to(device=device, dtype=dtype)
    return target.with_options(device=device) if device is not None else target


def from_hf(model_or_dir: nn.Module | str | Path, data: Any, *, tokenizer: Any = None,
            batch_size: int = 100, max_new_tokens: int = 64,
            max_source_tokens: int | None = None, device: str | torch.device | None = None,
            dtype: str | torch.dtype | None = None, name: str | None = None,
            contrast: Sequence[str] | None = None) -> Seq2SeqTarget:
    """A target from a Hugging Face model and its tokenizer: loaded, or a local folder.

    A seq2seq model (``config.is_encoder_decoder``) audits source -> output; a decoder-only
    model (GPT-2, Llama ...) audits prompt -> greedy continuation, the prompts being the
    sources (see :mod:`attnaudit.targets.hf.causal`).

    Args:
        model_or_dir: a loaded ``PreTrainedModel`` (give ``tokenizer``), or a directory with
            config, weights and tokenizer files (read offline).
        data: the sources: a TSV file of ``source[<TAB>target]`` lines, a list of strings,
            a pandas Series (or any iterable of strings, e.g. a ``datasets`` column), or a
            pandas DataFrame laid out as the TSV (sources, then optional references).
        tokenizer: the model's tokenizer; required with a loaded model, read from the folder
            otherwise.
        batch_size: examples per batch.
        max_new_tokens: generation limit for greedy decoding.
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

    A loaded model is left exactly as it is — mode, dtype, device, attention backend: the
    target runs it in place. When ``device`` or ``dtype`` would change it, a copy is moved
    or cast instead (memory for a second model). A model in training mode is audited in
    training mode (dropout active, the report says so), with a warning: call
    ``model.eval()`` first for a deterministic audit. A folder's model is loaded in eval
    mode with its default attention backend (sdpa where it has one, else eager).

    Interventions get ``encode``/``decode`` and, from the model's key/value cache,
    ``decode_states``/``decode_step``: an edited copy of step ``t`` runs one cached decoder
    step.
    """
    try:
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSeq2SeqLM,
            AutoTokenizer,
        )
    except ImportError as exc:
        raise TargetError("--hf needs transformers: pip install 'attnaudit[hf]'") from exc
    for option, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens),
                          ("max_source_tokens", max_source_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise TargetError(f"{option} must be a positive integer, got {value!r}")
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if isinstance(model_or_dir, nn.Module):
        if tokenizer is None:
            raise TargetError("a loaded model needs its tokenizer: from_hf(model, data, "
                              "tokenizer=tokenizer)")
        sources, references, contrast = _audit_data(data, contrast)
        model = _loaded_model(model_or_dir, device, dtype)
        origin = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        label = origin or type(model).__name__
    else:
        model_dir = Path(model_or_dir)
        if not model_dir.is_dir():
            raise TargetError(f"Hugging Face model directory not found: {model_dir}")
        sources, references, contrast = _audit_data(data, contrast)  # before the slow load
        if tokenizer is None:
            check_tokenizer_files(model_dir)
        causal = False
        try:
            causal = is_causal_lm(AutoConfig.from_pretrained(model_dir, local_files_only=True))
            auto = AutoModelForCausalLM if causal else AutoModelForSeq2SeqLM
            # The model's own default backend: sdpa where it has one, else eager; both
            # expose weights to capture.
            model = auto.from_pretrained(model_dir, local_files_only=True).eval()
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError) as exc:
            what = "causal LM" if causal else "seq2seq model"
            raise TargetError(f"cannot load a {what} and tokenizer from {model_dir}: "
                              f"{exc}") from exc
        model.to(device=device, dtype=dtype)
        origin = label = model_dir.as_posix()
    empty = check_tokenization(Path(label), tokenizer, sources)
    if empty:
        warnings.warn(f"attnaudit: the tokenizer turns {empty} of {len(sources)} sources into "
                      "special tokens only; they are counted apart as degenerate",
                      stacklevel=2)
    try:
        check_backends(list(model.named_modules()))
    except CaptureError as exc:
        raise TargetError(f"{label}: {exc}") from None
    if contrast is not None and len(contrast) != len(sources):
        raise TargetError(f"contrast gives {len(contrast)} outputs for {len(sources)} sources; "
                          "give one per source")
    if is_causal_lm(getattr(model, "config", None)):
        return _causal_target(CausalLM(model, tokenizer, max_new_tokens), sources, references,
                              contrast, batch_size=batch_size,
                              max_source_tokens=max_source_tokens, label=label, origin=origin,
                              name=name)
    config = model.config
    start = config.decoder_start_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if start is None or pad is None or eos is None:
        raise TargetError(f"{label}: config needs decoder_start_token_id, pad and eos ids")
    limit, truncation = _source_limit(tokenizer, config, sources, max_source_tokens)
    where = next(model.parameters()).device
    cache_arg = cache_argument(model)

    fast = bool(getattr(tokenizer, "is_fast", False))  # offsets: word-level tables

    def batches() -> Iterator[Batch]:
        for at in range(0, len(sources), batch_size):
            texts = sources[at : at + batch_size]
            enc = tokenizer(texts, padding=True, truncation=limit is not None,
                            max_length=limit, return_tensors="pt",
                            return_offsets_mapping=fast)
            inputs: dict[str, Any] = {"offsets": enc["offset_mapping"]} if fast else {}
            if contrast is not None:
                foil = tokenizer(text_target=list(contrast[at : at + batch_size]),
                                 padding=True, return_tensors="pt")
                ids = foil["input_ids"].masked_fill(foil["attention_mask"] == 0, eos)
                inputs["contrast_ids"] = ids.to(where)
            yield Batch(enc["input_ids"].to(where), enc["attention_mask"].bool().to(where),
                        texts, None if references is None else references[at : at + batch_size],
                        inputs)

    @torch.no_grad()
    def greedy(batch: Batch) -> torch.Tensor:
        out = model.generate(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                             do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                             decoder_start_token_id=start, pad_token_id=pad, eos_token_id=eos)
        return out[:, 1:]

    def encode(batch: Batch) -> Any:
        """The encoder's own output object (some models read more than its hidden states)."""
        return model.get_encoder()(input_ids=batch.source_ids,
                                   attention_mask=batch.source_mask.long())

    def decoder_inputs(emitted: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.full_like(emitted[:, :1], start), emitted[:, :-1]], dim=1)

    def run_decoder(batch: Batch, encoded: Any, decoder_ids: torch.Tensor,
                    **cache: Any) -> Any:
        # source ids too: some models (FSMT) build the decoder's causal mask only from them
        return model(input_ids=batch.source_ids, encoder_outputs=encoded,
                     attention_mask=batch.source_mask.long(), decoder_input_ids=decoder_ids,
                     **cache)

    def decode(batch: Batch, encoded: Any, emitted: torch.Tensor) -> torch.Tensor:
        return run_decoder(batch, encoded, decoder_inputs(emitted), use_cache=False).logits

    def decode_states(batch: Batch, encoded: Any, emitted: torch.Tensor
                      ) -> dict[str, tuple[torch.Tensor, ...]]:
        """The KV cache of one teacher-forced pass: self-attention keys and values
        (B, H, T, d) per layer (position t = step t), cross-attention ones (B, H, n, d)."""
        out = run_decoder(batch, encoded, decoder_inputs(emitted), use_cache=True)
        cache = getattr(out, cache_arg)
        return {"self": cache_tensors(cache.self_attention_cache),
                "cross": cache_tensors(cache.cross_attention_cache)}

    def decode_step(batch: Batch, encoded: Any, states: dict[str, tuple[torch.Tensor, ...]],
                    emitted: torch.Tensor, step: int) -> torch.Tensor:
        from transformers import EncoderDecoderCache

        cache = EncoderDecoderCache(cache_prefix(states["self"], step),
                                    cache_prefix(states["cross"], states["cross"][0].shape[2]))
        previous = decoder_inputs(emitted)[:, step : step + 1]
        return run_decoder(batch, encoded, previous, use_cache=True,
                           **{cache_arg: cache}).logits[:, -1]

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        return decode(batch, encode(batch), emitted)

    def tokens(ids: torch.Tensor) -> list[list[str]]:
        return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    specials = tuple(sorted({i for i in (pad, eos, tokenizer.bos_token_id,
                                         tokenizer.cls_token_id, tokenizer.sep_token_id)
                             if i is not None}))
    return Seq2SeqTarget(
        name=name or label,
        model=model,
        batches=batches,
        greedy=greedy,
        teacher_forced=teacher_forced,
        source_embedding=_source_embedding(model),
        source_tokens=lambda batch: tokens(batch.source_ids),
        target_tokens=tokens,
        eos_id=eos,
        special_ids=specials,
        description=(f"{type(model).__name__} from {origin or 'a loaded model'} "
                     f"({len(sources)} sources)"),
        encode=encode,
        decode=decode,
        decode_states=decode_states,
        decode_step=decode_step,
        device=where,
        truncation=truncation,
        target_embedding=_decoder_embedding(model),
        unk_id=tokenizer.unk_token_id,
    )


def _causal_target(lm: CausalLM, sources: list[str], references: list[str] | None,
                   contrast: Sequence[str] | None, *, batch_size: int,
                   max_source_tokens: int | None, label: str, origin: str,
                   name: str | None) -> Seq2SeqTarget:
    """Prompt -> continuation (:mod:`attnaudit.targets.hf.causal`): prompts cut to the smaller of
    ``max_source_tokens`` and the position limit less the continuation, keeping their end."""
    if lm.eos_id is None:
        raise TargetError(f"{label}: a causal LM target needs an end-of-sequence id "
                          "(tokenizer.eos_token_id or config.eos_token_id)")
    lm.limit, truncation = _source_limit(lm.tokenizer, lm.model.config, sources,
                                         max_source_tokens, reserved=lm.max_new_tokens)
    if lm.limit is not None:
        truncation += " (a cut prompt keeps its last tokens)"
    where = next(lm.model.parameters()).device

    def batches() -> Iterator[Batch]:
        for at in range(0, len(sources), batch_size):
            texts = sources[at : at + batch_size]
            ids, mask, inputs = lm.prompts(texts)
            if contrast is not None:
                foils = lm.continuations(contrast[at : at + batch_size])
                inputs["contrast_ids"] = foils.to(where)
            yield Batch(ids.to(where), mask.to(where), texts,
                        None if references is None else references[at : at + batch_size],
                        inputs)

    return Seq2SeqTarget(
        name=name or label, model=lm.model, batches=batches,
        greedy=lambda batch: lm.greedy(batch.source_ids, batch.source_mask),
        teacher_forced=lambda batch, emitted: lm.teacher_forced(
            batch.source_ids, batch.source_mask, emitted),
        # nothing to encode: the prompt ids stand in for an encoder state, so that an
        # edited step runs one position from the unedited pass's key/value cache
        encode=lambda batch: batch.source_ids,
        decode=lambda batch, encoded, emitted: lm.teacher_forced(
            batch.source_ids, batch.source_mask, emitted),
        decode_states=lambda batch, encoded, emitted: lm.states(
            batch.source_ids, batch.source_mask, emitted),
        decode_step=lambda batch, encoded, states, emitted, step: lm.step(
            batch.source_ids, batch.source_mask, states, emitted, step),
        source_embedding=lm.model.get_input_embeddings(),
        source_tokens=lambda batch: lm.tokens(batch.source_ids), target_tokens=lm.tokens,
        eos_id=lm.eos_id, special_ids=lm.special_ids,
        description=lm.description(origin, len(sources)), device=where,
        truncation=truncation, target_embedding=lm.model.get_input_embeddings(),
        first_prefix_input=1)


def _loaded_model(model: nn.Module, device: torch.device | None,
                  dtype: torch.dtype | None) -> nn.Module:
    """The user's model itself, or a copy on ``device`` in ``dtype`` when either differs."""
    causal = is_causal_lm(getattr(model, "config", None))
    if not hasattr(model, "generate") or not (causal or hasattr(model, "get_encoder")):
        raise TargetError(f"from_hf needs a Hugging Face seq2seq model (generate, "
                          f"get_encoder) or causal LM (generate), got {type(model).__name__}")
    param = next(model.parameters(), None)
    # "cuda" names whichever GPU the model is on: only a type or an explicit index moves it
    moves = device is not None and param is not None and (
        param.device.type != device.type
        or (device.index is not None and param.device.index != device.index))
    casts = dtype is not None and any(p.is_floating_point() and p.dtype != dtype
                                      for p in model.parameters())
    if model.training:
        warnings.warn("attnaudit: the model is in training mode, so dropout is active during "
                      "the audit; call model.eval() first for a deterministic audit",
                      stacklevel=3)
    if not (moves or casts):
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def _audit_data(data: Any, contrast: Sequence[str] | None
                ) -> tuple[list[str], list[str] | None, Sequence[str] | None]:
    """Sources, optional references and contrast outputs from a TSV path (its third column,
    or ``contrast``, not both), an iterable of strings (a list, a pandas Series, a
    ``datasets`` column), or a DataFrame laid out as the TSV's columns (sources, then
    optionally references, then optionally contrast outputs)."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        if data.shape[1] not in (1, 2, 3):
            raise TargetError(f"a DataFrame of audit data has 1 to 3 columns (sources, "
                              f"references, contrast outputs), got {data.shape[1]}: pass "
                              "those columns, e.g. frame[['source', 'target']]")
        references = list(data.iloc[:, 1]) if data.shape[1] > 1 else None
        sources = _read_rows(list(data.iloc[:, 0])).sources
        given = list(data.iloc[:, 2]) if data.shape[1] == 3 else None
        what = f"column {data.columns[-1]!r} of the DataFrame"
    else:
        rows = _read_rows(data)
        sources, references, given, what = rows.sources, rows.targets, rows.contrasts, data
    if given is not None:
        if contrast is not None:
            raise TargetError(f"{what} gives a contrast column and contrast outputs were "
                              "given as well (contrast=... or --contrast FILE); give one of "
                              "them")
        contrast = given
    else:
        what = "contrast="
    wrong = [c for c in contrast or () if not isinstance(c, str)]
    if wrong:
        raise TargetError(f"contrast outputs must be strings, got "
                          f"{type(wrong[0]).__name__} {wrong[0]!r} in {what}")
    wrong = [s for s in sources if not isinstance(s, str)]
    if wrong:
        raise TargetError(f"audit sources must be strings, got {type(wrong[0]).__name__} "
                          f"{wrong[0]!r}")
    return sources, references, contrast


def _source_embedding(model: nn.Module) -> nn.Module:
    """The module embedding the source: the encoder's own input embedding where it says
    which (FSMT's encoder only has ``embed_tokens``), else the model's."""
    encoder = model.get_encoder()
    try:
        return encoder.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = getattr(encoder, "embed_tokens", None)
        return embed if isinstance(embed, nn.Module) else model.get_input_embeddings()


def _decoder_embedding(model: nn.Module) -> nn.Module | None:
    """The module embedding the decoder's input tokens (FSMT's decoder only has
    ``embed_tokens``), or None when the decoder names none."""
    decoder = model.get_decoder()
    try:
        return decoder.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = getattr(decoder, "embed_tokens", None)
        return embed if isinstance(embed, nn.Module) else None


def _source_limit(tokenizer: Any, config: Any, sources: list[str],
                  max_source_tokens: int | None, reserved: int = 0) -> tuple[int | None, str]:
    """The source token limit (the smaller of ``max_source_tokens`` and the model's position
    limit less ``reserved`` positions) and a sentence on what truncation did; warns when
    sources are cut."""
    positions = getattr(config, "max_position_embeddings", None)
    limits = [x for x in (max_source_tokens,
                          positions - reserved if isinstance(positions, int) else None)
              if isinstance(x, int)]
    if not limits:
        return None, "sources were not truncated (no token limit known)"
    limit = min(limits)
    if limit < 1:
        raise TargetError(f"no room for the source: {positions} positions, {reserved} of "
                          "them for the output; lower max_new_tokens")
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    cut = sum(n > limit for n in lengths)
    if not cut:
        return limit, f"no source was truncated (limit {limit} tokens; longest {max(lengths)})"
    what = (f"{cut} of {len(sources)} sources were longer than {limit} tokens and were "
            f"truncated to {limit} (longest {max(lengths)})")
    warnings.warn(f"attnaudit: {what}", stacklevel=3)
    return limit, what


def _read_rows(data: str | Path | Sequence[str]) -> DataRows:
    if isinstance(data, str | Path):
        return read_rows(data)
    sources = list(data)
    if not sources:
        raise TargetError("the audit data is empty")
    return DataRows(sources, None, None)
