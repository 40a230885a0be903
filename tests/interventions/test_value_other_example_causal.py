"""The other-example value control on a decoder-only Hugging Face model (a tiny Llama built
from a config: grouped-query attention, SDPA, left-padded prompts), against a hand-written
value edit, never through capture: the checkpoint loaded again with the eager backend, the
positions before continuation step t run unedited with their key/value cache kept, each
layer's cached value at prompt position j (its key/value head's) replaced by the donor
example's cached value at j (read from the donor's own eager pass over its prompt), and step
t run from that cache; at step 0, where j is the step's own position (the prompt's last
token), the step's ``v_proj`` output is replaced instead (a forward hook). Only the step's
query row reads the edited value, as the protocol edits the prompt view's key. The top key is
read off the eager pass's own attention (output_attentions), each layer's prompt block
renormalised as the prompt view is."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pandas as pd
import pytest
import torch

from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.values import value_replacement

transformers = pytest.importorskip("transformers")

TOL = 1e-5
OTHER = [f"value_other_example{s}_{m}" for s in ("", "_random") for m in ("tvd", "donor")]


class HandWritten:
    """One row of a left-padded batch of an eager causal LM, teacher-forced on the greedy
    continuation."""

    def __init__(self, model, batch, emitted) -> None:
        self.model, self.batch, self.emitted = model, batch, emitted
        self.prompt = batch.source_ids.shape[1]

    def _inputs(self, b: int, t: int) -> dict[str, torch.Tensor]:
        """Prompt row ``b`` + its first ``t`` continuation tokens: ids, mask, positions."""
        ids = torch.cat([self.batch.source_ids[b:b + 1], self.emitted[b:b + 1, :t]], 1)
        mask = torch.cat([self.batch.source_mask[b:b + 1].long(),
                          torch.ones(1, t, dtype=torch.long)], 1)
        return {"input_ids": ids, "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}

    def _layers(self) -> list:
        return list(self.model.model.layers)

    def donor_values(self, donor: int, key: int) -> list[torch.Tensor]:
        """Per layer, the donor's cached value at prompt position ``key``: (kv_heads, d)."""
        with torch.no_grad():
            out = self.model(**self._inputs(donor, 0), use_cache=True)
        return [layer.values[0, :, key].clone() for layer in out.past_key_values.layers]

    def top(self, b: int, t: int, eligible: torch.Tensor) -> int:
        """The key with the most prompt-view attention at step t, over layers and heads."""
        with torch.no_grad():
            out = self.model(**self._inputs(b, t + 1), output_attentions=True)
        row = self.prompt - 1 + t
        blocks = [a[0, :, row, :self.prompt] for a in out.attentions]  # (H, P) per layer
        mean = torch.stack([w / w.sum(-1, keepdim=True) for w in blocks]).mean((0, 1))
        return int(mean.masked_fill(~eligible, -1.0).argmax())

    @contextmanager
    def _step_value(self, rows: list[torch.Tensor] | None):
        """Every layer's ``v_proj`` output (the step's own value) set to ``rows``."""
        handles = []
        for layer, row in zip(self._layers(), rows or [], strict=False):
            def replace(module, args, out, row=row):
                return row.reshape(1, 1, -1).to(out.dtype)
            handles.append(layer.self_attn.v_proj.register_forward_hook(replace))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def step_probs(self, b: int, t: int, key: int | None = None,
                   rows: list[torch.Tensor] | None = None) -> torch.Tensor:
        """p(. | prompt, y_<t) at step t, float64; with ``key``, each layer's value at prompt
        position ``key`` replaced by ``rows`` (per layer) for the step's row only."""
        inputs = self._inputs(b, t)
        before = inputs["input_ids"].shape[1] - 1  # positions in the cache
        with torch.no_grad():
            prefix = self.model(**{k: v[:, :before] for k, v in inputs.items()},
                                use_cache=True)
            cache = prefix.past_key_values
            own = key is not None and key == before
            if key is not None and not own:
                for layer, row in zip(cache.layers, rows or [], strict=True):
                    layer.values[0, :, key] = row
            with self._step_value(rows if own else None):
                out = self.model(input_ids=inputs["input_ids"][:, -1:],
                                 attention_mask=inputs["attention_mask"],
                                 position_ids=inputs["position_ids"][:, -1:],
                                 past_key_values=cache, use_cache=True)
        return torch.softmax(out.logits[0, -1].double(), -1)

    def tvd(self, b: int, t: int, key: int, donor: int) -> float:
        after = self.step_probs(b, t, key, self.donor_values(donor, key))
        return 0.5 * float((after - self.step_probs(b, t)).abs().sum())


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_a_decoder_only_models_other_example_value_equals_a_hand_written_cache_edit(tmp_path):
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_targets import NEW_TOKENS, SOURCES, eager_model, save_tiny

    folder = save_tiny("llama", tmp_path)
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    ref = reference(target, batch)
    # every edited site is a prompt view (the continuation's rows over the prompt) of SDPA
    assert ref.sites and all(s.endswith(":cross") for s in ref.sites)
    assert ref.value_sites == ref.sites and ref.states is not None  # one cached step
    frame, status = value_replacement(target, ref)
    # the prefix re-run (every position up to t, no cache) edits the step's row only, too
    rerun = value_replacement(target, reference(target, batch, incremental=False))[0]
    pd.testing.assert_frame_equal(rerun[OTHER], frame[OTHER], rtol=0, atol=TOL)
    explain = target.explain_keys(batch)
    hand = HandWritten(eager_model("llama", folder), batch, ref.emitted)
    moved, checked, own = 0.0, 0, 0
    for row in frame.itertuples():
        b, t = int(row.example), int(row.step)
        top = hand.top(b, t, explain[b])
        donor = int(row.value_other_example_donor)
        if donor < 0:
            assert not any(bool(explain[d, top]) for d in range(len(batch)) if d != b)
            assert math.isnan(row.value_other_example_tvd)
            continue
        assert donor != b and bool(explain[donor, top])  # length-compatible
        assert row.value_other_example_tvd == pytest.approx(hand.tvd(b, t, top, donor),
                                                            abs=TOL)
        own += top == hand.prompt - 1 and t == 0
        random_donor = int(row.value_other_example_random_donor)
        if random_donor >= 0:
            assert any(abs(row.value_other_example_random_tvd
                           - hand.tvd(b, t, k, random_donor)) <= TOL
                       for k in explain[b].nonzero().squeeze(1).tolist()
                       if k != top and bool(explain[random_donor, k]))
        moved = max(moved, row.value_other_example_tvd)
        checked += 1
    # both edits were checked: a cached value, and (step 0, the last prompt token) the step's own
    assert checked >= 4 and moved > 1e-3 and 1 <= own < checked
    ran = status.set_index("control")
    assert ran.loc[["other_example", "other_example_random"], "status"].eq("run").all()
