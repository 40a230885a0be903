"""How many edited sequences one forward pass may fold: a memory budget, not a fixed count.

An edited sequence costs, per decoder position it runs: its logits (model dtype, then float32
probabilities), the activations of every decoder layer, every layer's attention scores and
weights over the source and the positions run, and the captured weights of the edited
sites; once: its encoder and decoder state twice (the copy gathered for the chunk, and the
cache the step writes from it: self-attention keys and values are concatenated with the new
position into new tensors), and the float32 distribution compared at its step.
:class:`ChunkBudget` holds those sizes, read off the model and the reference run, and turns
a byte budget into a number of sequences. An estimate, not a measurement: it keeps the peak
of a chunk proportional to the budget, whatever the vocabulary or the number of examples
(``tests/interventions/test_memory_measured.py`` checks it against measured peak memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnaudit.capturing.blocks import DEFAULT_MAX_MEMORY, parse_memory

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


def model_heads(model: nn.Module) -> int:
    """Attention heads per decoder layer from a Hugging Face-style config, else 1."""
    return max(_config_int(getattr(model, "config", None), _HEAD_KEYS) or 1, 1)


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
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        element_size = param.element_size() if param is not None else 4
        budget = DEFAULT_MAX_MEMORY if max_memory is None else parse_memory(max_memory)
        return cls(budget, vocab, width, layers, model_heads(model), element_size, keys,
                   site_heads, state_bytes)

    def sequence_bytes(self, positions: int, *, compared: int = 1, grad: bool = False) -> int:
        """Estimated bytes of one edited sequence running ``positions`` decoder positions
        and comparing the distributions of ``compared`` of them."""
        per_position = (self.vocab * (self.element_size + 4)
                        + ACTIVATIONS_PER_LAYER * self.width * self.layers * self.element_size
                        + ATTENTION_COPIES * self.heads * self.layers * (self.keys + positions) * 4
                        + 3 * self.site_heads * self.keys * 4)
        total = (positions * per_position + STATE_COPIES * self.state_bytes
                 + compared * COMPARED_COPIES * self.vocab * 4)
        return total * GRADIENT_FACTOR if grad else total

    def sequences(self, positions: int, *, compared: int = 1, grad: bool = False) -> int:
        """Sequences per chunk: as many as the budget holds, at least 1, at most MAX_CHUNK."""
        need = self.sequence_bytes(max(positions, 1), compared=compared, grad=grad)
        return int(min(max(self.max_memory // need, 1), MAX_CHUNK))


def encoder_bytes(model: nn.Module, keys: int) -> int:
    """Estimated bytes of one sequence's encoder pass over ``keys`` source positions: its
    activations and its attention over the source, in each encoder layer (the config's
    encoder layer count, else the decoder's)."""
    width, decoder_layers = model_width_and_layers(model)
    layers = _config_int(getattr(model, "config", None), _ENCODER_LAYER_KEYS) or decoder_layers
    return keys * max(layers, 1) * (width * ACTIVATIONS_PER_LAYER
                                    + ATTENTION_COPIES * model_heads(model) * keys) * 4
