"""The explorer page of a long prompt: its size for a decoder-only model continuing an
8k-token prompt, against the 20 MB budget.

    python -m benchmarks.long_prompt_page [--prompt 8192] [--layers 16] [--heads 32]
        [--steps 32] [--dtype float32|bfloat16]

Synthetic attention of that shape (each continuation step's row over the prompt a softmax
of seeded random scores, in ``--dtype``) is streamed call by call, one (layer, step) at a
time, through the map builder the audit uses
(:class:`attnaudit.analysis.example_maps.MapBuilder`), then laid out as the report's
explorer (:func:`attnaudit.report.explorer.payload`,
:func:`attnaudit.report.explorer_page.explorer_block`). Printed: the page's bytes, the bytes
per (layer, head, step), the budget, and the seconds taken. Measured on a shared 2-core
machine (float32, defaults): 13.14 MB, 802 bytes per layer, head and step, in about 5 s.
"""

from __future__ import annotations

import time

import torch

from attnaudit.analysis.example_maps import MapBuilder
from attnaudit.record import AttentionCall, AttentionRecord, Family, Role, Site
from attnaudit.report.explorer import LONG_PAYLOAD_BUDGET, explorer_views, payload
from attnaudit.report.explorer_page import explorer_block
from benchmarks.harness import banner, load, parser


def page_bytes(prompt: int, layers: int, heads: int, steps: int,
               dtype: torch.dtype = torch.float32) -> int:
    """UTF-8 bytes of the explorer block for one example of that shape (module docstring)."""
    generator = torch.Generator().manual_seed(0)
    builder = MapBuilder(torch.ones(prompt, dtype=torch.bool),
                         torch.ones(steps, dtype=torch.bool), validity=True)
    for layer in range(layers):
        for step in range(steps):  # one call per decoding step, as a cached decoder makes
            scores = 3.0 * torch.randn(1, heads, 1, prompt, generator=generator)
            record = AttentionRecord(Site(f"layers.{layer}.attn:cross", "cross", "softmax",
                                          f"layers.{layer}.attn"))
            record.append(AttentionCall(torch.softmax(scores, -1).to(dtype)))
            builder.add(record, Role.PROMPT, step)
    tokens = [f"t{i}" for i in range(prompt)]
    maps = builder.maps("a long prompt", tokens, [f"s{i}" for i in range(steps)],
                        family=Family.DECODER_ONLY)
    data = payload(explorer_views([maps]), max_masked_mass=1e-6, row_sum_tolerance={})
    return len(str(explorer_block(data)).encode("utf-8"))


def main() -> None:
    args = parser(__spec__.name, __doc__)
    args.add_argument("--prompt", type=int, default=8192)
    args.add_argument("--layers", type=int, default=16)
    args.add_argument("--heads", type=int, default=32)
    args.add_argument("--steps", type=int, default=32)
    args.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    options = args.parse_args()
    print(banner())
    start = time.perf_counter()
    size = page_bytes(options.prompt, options.layers, options.heads, options.steps,
                      getattr(torch, options.dtype))
    seconds = time.perf_counter() - start
    rows = options.layers * options.heads * options.steps
    within = "within" if size <= LONG_PAYLOAD_BUDGET else "OVER"
    print(f"prompt {options.prompt} tokens, {options.layers} layers x {options.heads} heads, "
          f"{options.steps} steps, {options.dtype}: page {size / 1e6:.2f} MB "
          f"({size / rows:.0f} bytes per layer, head and step), budget "
          f"{LONG_PAYLOAD_BUDGET / 1e6:.0f} MB: {within}; {seconds:.1f} s")
    print(load())


if __name__ == "__main__":
    main()
