"""How many edited sequences one forward pass may fold: a memory budget, not a fixed count.

An edited sequence costs, per decoder position it runs: its logits (model dtype, then float32
probabilities), the activations of every decoder layer, every layer's attention scores and
weights over the source and the positions run, and the captured weights of the edited
sites; once: its encoder and decoder state twice (the copy gathered for the chunk, and the
cache the step writes from it: self-attention keys and values are concatenated with the new
position into new tensors), and the float32 distribution compared at its step.
:class:`ChunkBudget` holds those sizes, read off the model and the reference run, and turns
a byte budget into a number of sequences. A *whole* teacher-forced pass (an edited source's,
a gradient pass's) computes its source's pass instead of copying a state: counted once, as
:func:`source_bytes` estimates it (:meth:`ChunkBudget.pass_bytes`). An estimate, not a
measurement: it keeps the peak of a chunk proportional to the budget, whatever the
vocabulary or the number of examples (``tests/interventions/test_memory_measured.py`` checks
it against measured peak memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnaudit.capturing.blocks import DEFAULT_MAX_MEMORY, parse_memory
from attnaudit.targets.contract import DecoderOnlyTarget, Seq2SeqTarget

MAX_CHUNK = 4096  # sequences per forward pass at most: larger chunks do not keep BLAS busier
# Live activation tensors per decoder layer and position, in units of the model width:
# attention projections, feed-forward (4x), residuals and norms.
ACTIVATIONS_PER_LAYER = 16
# Float32 copies of the compared distribution alive at once: softmax, |p - q|, the mixture
# and its logarithms in JSD.
COMPARED_COPIES = 6
# Float32 tensors per attention row alive at once: scores, weights, and the masked or
# dropped-out copy an explicit attention makes.
ATTENTION_COPIES = 3
STATE_COPIES = 2  # the state gathered for a chunk, and the cache its step writes
GRADIENT_FACTOR = 3  # a backward pass keeps the forward's tensors and their gradients
# A whole pass kept for backward passes: its count already holds every layer's activations at
# once; the backward adds about one layer's gradients at a time (measured 1.3x the count on a
# Llama-3.2-1B-shaped model in bfloat16: 0.24 GiB per sequence, 0.18 GiB counted).
WHOLE_GRADIENT_FACTOR = 2

_WIDTH_KEYS = ("d_model", "hidden_size", "n_embd", "dim")
_LAYER_KEYS = ("decoder_layers", "num_decoder_layers", "n_layer", "num_layers",
               "num_hidden_layers")
_ENCODER_LAYER_KEYS = ("encoder_layers", "num_encoder_layers", "num_layers")
_HEAD_KEYS = ("decoder_attention_heads", "num_decoder_attention_heads", "num_attention_heads",
              "num_heads", "n_head")


def _config_int(config: object, keys: tuple[str, ...]) -> int | None:
    return next((int(getattr(config, k)) for k in keys
                 if isinstance(getattr(config, k, None), int)), None)


def model_width_and_layers(model: nn.Module) -> tuple[int, int]:
    """(hidden width, decoder layers) from a Hugging Face-style config, else the widest
    matrix's input size and one layer."""
    config = getattr(model, "config", None)
    width = _config_int(config, _WIDTH_KEYS) or max(
        (int(p.shape[-1]) for p in model.parameters() if p.ndim == 2), default=1)
    return width, max(_config_int(config, _LAYER_KEYS) or 1, 1)


def model_encoder_layers(model: nn.Module) -> int:
    """Encoder layers from a Hugging Face-style config, else the decoder's layer count."""
    layers = _config_int(getattr(model, "config", None), _ENCODER_LAYER_KEYS)
    return max(layers or model_width_and_layers(model)[1], 1)


def model_heads(model: nn.Module) -> int:
    """Attention heads per decoder layer from a Hugging Face-style config, else 1."""
    return max(_config_int(getattr(model, "config", None), _HEAD_KEYS) or 1, 1)


def element_bytes(model: nn.Module) -> int:
    """Bytes per element of the model's floating dtype (its first floating parameter's;
    4 without one)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    return param.element_size() if param is not None else 4


def tensor_bytes(state: object) -> int:
    """Bytes of every tensor in a tensor, or tuple/list/dict of them (nested), or in the
    attributes of a cache object inside them (a Hugging Face ``Cache``, its layers), each
    tensor counted once."""
    return _tensor_bytes(state, set())


def _tensor_bytes(state: object, seen: set[int]) -> int:
    if id(state) in seen:
        return 0
    seen.add(id(state))
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, tuple | list):
        return sum(_tensor_bytes(part, seen) for part in state)
    if isinstance(state, dict):
        return sum(_tensor_bytes(part, seen) for part in state.values())
    if _is_cache(state):
        return sum(_tensor_bytes(part, seen) for part in vars(state).values())
    return 0


def _is_cache(state: object) -> bool:
    """A cache object or one of its layers: a transformers cache_utils class."""
    return hasattr(state, "__dict__") and type(state).__module__.endswith("cache_utils")


@dataclass(frozen=True)
class ChunkBudget:
    """Sizes that set the cost of one edited sequence (see the module docstring).

    max_memory: bytes a chunk may use. vocab: output vocabulary V. width, layers: the
    decoder's hidden size and layer count. heads: attention heads per decoder layer.
    element_size: bytes per element of the model's
    floating dtype. keys: source positions n. site_heads: heads over every edited site.
    state_bytes: per sequence, its copy of the encoder and decoder state.
    """

    max_memory: int
    vocab: int
    width: int
    layers: int
    heads: int
    element_size: int
    keys: int
    site_heads: int
    state_bytes: int

    @classmethod
    def of(cls, model: nn.Module, *, vocab: int, keys: int, site_heads: int,
           state_bytes: int, max_memory: int | str | None = None) -> ChunkBudget:
        width, layers = model_width_and_layers(model)
        budget = DEFAULT_MAX_MEMORY if max_memory is None else parse_memory(max_memory)
        return cls(budget, vocab, width, layers, model_heads(model), element_bytes(model), keys,
                   site_heads, state_bytes)

    def _positions_bytes(self, positions: int, compared: int) -> int:
        """``positions`` decoder positions (logits, activations, attention, captured weights)
        and ``compared`` compared distributions."""
        per_position = (self.vocab * (self.element_size + 4)
                        + ACTIVATIONS_PER_LAYER * self.width * self.layers * self.element_size
                        + ATTENTION_COPIES * self.heads * self.layers * (self.keys + positions) * 4
                        + 3 * self.site_heads * self.keys * 4)
        return positions * per_position + compared * COMPARED_COPIES * self.vocab * 4

    def sequence_bytes(self, positions: int, *, compared: int = 1, grad: bool = False) -> int:
        """Estimated bytes of one edited sequence running ``positions`` decoder positions
        from its copied state and comparing the distributions of ``compared`` of them."""
        total = self._positions_bytes(positions, compared) + STATE_COPIES * self.state_bytes
        return total * GRADIENT_FACTOR if grad else total

    def pass_bytes(self, steps: int, *, grad: bool = False) -> int:
        """Estimated bytes of one sequence's whole teacher-forced pass: its source's pass
        (``state_bytes``, from :func:`source_bytes`), ``steps`` decoder positions and every
        step's distribution compared; ``grad``: its graph kept for backward passes."""
        total = self._positions_bytes(steps, steps) + self.state_bytes
        return total * WHOLE_GRADIENT_FACTOR if grad else total

    def sequences(self, positions: int, *, compared: int = 1, grad: bool = False) -> int:
        """Sequences per chunk: as many as the budget holds, at least 1, at most MAX_CHUNK."""
        return self._fitting(self.sequence_bytes(max(positions, 1), compared=compared,
                                                 grad=grad))

    def pass_sequences(self, steps: int, *, grad: bool = False) -> int:
        """Whole passes (:meth:`pass_bytes`) per chunk, as :meth:`sequences` counts them."""
        return self._fitting(self.pass_bytes(max(steps, 1), grad=grad))

    def _fitting(self, need: int) -> int:
        return int(min(max(self.max_memory // need, 1), MAX_CHUNK))


def source_bytes(model: nn.Module, keys: int, *, decoder_only: bool) -> int:
    """Estimated bytes of one sequence's pass over its ``keys`` source positions: an
    encoder-decoder's encoder pass (:func:`encoder_bytes`); a decoder-only model's prompt
    through its decoder, each position with every layer's activations in the model's dtype
    and its attention over the prompt (float32)."""
    if not decoder_only:
        return encoder_bytes(model, keys)
    width, layers = model_width_and_layers(model)
    return keys * layers * (ACTIVATIONS_PER_LAYER * width * element_bytes(model)
                            + ATTENTION_COPIES * model_heads(model) * keys * 4)


def whole_passes(target: Seq2SeqTarget, *, vocab: int, keys: int, steps: int,
                 grad: bool = False, max_memory: int | str | None = None) -> int:
    """Sequences per whole teacher-forced pass of ``target`` within ``max_memory`` (default
    :data:`~attnaudit.capturing.blocks.DEFAULT_MAX_MEMORY`): each runs its source of
    ``keys`` positions (:func:`source_bytes`) and ``steps`` decoder positions, comparing every
    step's distribution; ``grad``: kept for backward passes (:meth:`ChunkBudget.pass_bytes`)."""
    state = source_bytes(target.model, keys, decoder_only=isinstance(target, DecoderOnlyTarget))
    budget = ChunkBudget.of(target.model, vocab=vocab, keys=keys, site_heads=0,
                            state_bytes=state, max_memory=max_memory)
    return budget.pass_sequences(steps, grad=grad)


def encoder_bytes(model: nn.Module, keys: int) -> int:
    """Estimated bytes of one sequence's encoder pass over ``keys`` source positions: its
    activations and its attention over the source, in each encoder layer (the config's
    encoder layer count, else the decoder's)."""
    width, _ = model_width_and_layers(model)
    return keys * model_encoder_layers(model) * (width * ACTIVATIONS_PER_LAYER
                                                 + ATTENTION_COPIES * model_heads(model) * keys) * 4
