"""Sequence-level effects on the date BART against re-decoding by hand.

The reference decodes with ``model.generate`` called here (greedy, the bundled generation
config's 12 new tokens), under a capture whose edit is written here from the protocol
definitions: uniform weight over the eligible keys, the top key of the row (site-and-head
mean of a teacher-forced pass captured here) or the library's seeded random other key
zeroed and the row renormalised, and a row's median permutation draw (its index checked
against the permutation test's own median TVD). The edit holds at every step; the output is
compared with the unedited one by a plain-Python Levenshtein distance.
"""

from __future__ import annotations

import pytest
import torch

import attnaudit
from attnaudit.interventions.ablation import random_other_key
from attnaudit.interventions.outputs import tvd
from attnaudit.interventions.permutation import _PermutationEdit, permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.sequence import edit_distance, sequence_effects

pytest.importorskip("transformers")

EXAMPLES = 3
DRAWS = 5  # odd: the median draw's TVD is the median TVD


@pytest.fixture(scope="module")
def date():
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    batch = next(target.iter_batches(EXAMPLES))
    ref = reference(target, batch)
    rows = ref.rows()
    perm = permutation_test(target, ref, rows, n_permutations=DRAWS, median_draw=True)
    table = sequence_effects(target, ref, rows, n_permutations=DRAWS,
                             perm_median_draw=perm["perm_median_draw"].to_numpy())
    return target, batch, ref, rows, perm, table


def levenshtein(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def test_edit_distance_is_levenshtein():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        a = torch.randint(4, (int(torch.randint(7, (1,), generator=gen)),), generator=gen)
        b = torch.randint(4, (int(torch.randint(7, (1,), generator=gen)),), generator=gen)
        assert edit_distance(a.tolist(), b.tolist()) == levenshtein(a.tolist(), b.tolist())


class ByHand:
    """The date BART decoded with model.generate under a hand-written held edit."""

    def __init__(self, target, batch) -> None:
        self.model, self.batch = target.model, batch
        config = self.model.config
        self.ids = {"decoder_start_token_id": config.decoder_start_token_id,
                    "pad_token_id": config.pad_token_id, "eos_token_id": config.eos_token_id}
        special = torch.tensor(target.special_ids)
        self.eligible = batch.source_mask & ~torch.isin(batch.source_ids, special)  # (B, n)
        self.sites: list[str] = []
        self.unedited = self.decode(list(range(len(batch))), None)
        decoder_inputs = torch.cat([torch.full((len(batch), 1), config.decoder_start_token_id),
                                    self.generated()[:, :-1]], dim=1)
        with torch.no_grad(), attnaudit.capture(self.model) as cap:
            self.model(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                       decoder_input_ids=decoder_inputs)
        self.sites = [name for name, r in cap.records.items() if r.kind == "cross"]
        self.heads = [cap.records[s].weights.shape[1] for s in self.sites]
        # (B, T, n): the teacher-forced cross-attention, mean over sites and heads
        self.mean = torch.cat([cap.records[s].weights for s in self.sites], 1).float().mean(1)

    def generated(self) -> torch.Tensor:
        with torch.no_grad():
            out = self.model.generate(input_ids=self.batch.source_ids,
                                      attention_mask=self.batch.source_mask.long(),
                                      num_beams=1, do_sample=False, max_new_tokens=12,
                                      **self.ids)
        return out[:, 1:]

    def decode(self, examples: list[int], rows) -> list[list[int]]:
        """Each example decoded alone; ``rows(site_index, weights (1, H, Q, n), example)``
        gives the edited weights (None: no edit)."""
        outputs = []
        for e in examples:
            def edit(site, weights, mask, e=e):
                return rows(self.sites.index(site.name), weights, e)

            context = attnaudit.capture(self.model, sites=self.sites,
                                        edit=edit) if rows else torch.no_grad()
            with torch.no_grad(), context:
                out = self.model.generate(input_ids=self.batch.source_ids[e:e + 1],
                                          attention_mask=self.batch.source_mask[e:e + 1].long(),
                                          num_beams=1, do_sample=False, max_new_tokens=12,
                                          **self.ids)[0, 1:].tolist()
            eos = self.ids["eos_token_id"]
            outputs.append(out[: out.index(eos) + 1] if eos in out else out)
        return outputs

    def zeroed(self, weights: torch.Tensor, key: int, e: int) -> torch.Tensor:
        kept = weights.clone()
        kept[..., key] = 0
        return kept / kept.sum(-1, keepdim=True)

    def uniform(self, weights: torch.Tensor, e: int) -> torch.Tensor:
        eligible = self.eligible[e]  # 1 / n_valid on eligible keys, 0 on the rest
        new = torch.zeros_like(weights)
        new[..., eligible] = 1.0 / int(eligible.sum())
        return new


def _expect(table, protocol: str, by_hand: ByHand, outputs, examples, steps) -> None:
    got = table[table["protocol"] == protocol].reset_index(drop=True)
    assert list(got["example"]) == examples and list(got["step"]) == steps
    before = [by_hand.unedited[e] for e in examples]
    assert list(got["exact_match"]) == [a == b for a, b in zip(before, outputs, strict=True)]
    assert list(got["edit_distance"]) == [levenshtein(a, b)
                                          for a, b in zip(before, outputs, strict=True)]
    assert list(got["edited_length"]) == [len(b) for b in outputs]


def test_uniform_and_zeroing_equal_redecoding_by_hand(date):
    target, batch, ref, rows, _, table = date
    by_hand = ByHand(target, batch)
    examples = list(range(EXAMPLES))
    uniform = by_hand.decode(examples, lambda s, w, e: by_hand.uniform(w, e))
    _expect(table, "uniform", by_hand, uniform, examples, [-1] * EXAMPLES)
    assert not all(a == b for a, b in zip(uniform, by_hand.unedited, strict=True))

    row_examples, row_steps = rows.example.tolist(), rows.step.tolist()
    tops = [int(by_hand.mean[e, t].masked_fill(~by_hand.eligible[e], -1).argmax())
            for e, t in zip(row_examples, row_steps, strict=True)]
    top_out = [by_hand.decode([e], lambda s, w, e, k=k: by_hand.zeroed(w, k, e))[0]
               for e, k in zip(row_examples, tops, strict=True)]
    others = random_other_key(ref, rows, torch.tensor(tops)).tolist()
    assert min(others) >= 0  # every row has a random alternative: none is left out
    other_out = [by_hand.decode([e], lambda s, w, e, k=k: by_hand.zeroed(w, k, e))[0]
                 for e, k in zip(row_examples, others, strict=True)]
    _expect(table, "zero_top", by_hand, top_out, row_examples, row_steps)
    _expect(table, "zero_random", by_hand, other_out, row_examples, row_steps)
    changed = table[table["protocol"] == "zero_top"]["exact_match"]
    assert 0 < changed.sum() < len(changed)  # some rows' edits change the text, some do not


def test_the_median_permutation_draw_equals_redecoding_by_hand(date):
    target, batch, ref, rows, perm, table = date
    by_hand = ByHand(target, batch)
    edit = _PermutationEdit(ref, rows, DRAWS)
    pick = [0, len(rows) // 2, len(rows) - 1]  # a few rows: each is a decoding by hand
    offsets = [sum(by_hand.heads[:i]) for i in range(len(by_hand.sites))]
    outputs, checked = [], []
    for i in pick:
        e, t = int(rows.example[i]), int(rows.step[i])
        draw = int(perm["perm_median_draw"][i])
        order = edit.permutations(i)[draw]  # (sites * heads, n)

        def permuted(s, w, e, order=order):
            index = order[offsets[s]: offsets[s] + w.shape[1]]  # (H, n)
            return w.gather(-1, index[None, :, None, :].expand_as(w))

        outputs.append(by_hand.decode([e], permuted)[0])
        checked.append((e, t, order))
    got = table[table["protocol"] == "perm_median"].reset_index(drop=True).iloc[pick]
    before = [by_hand.unedited[int(rows.example[i])] for i in pick]
    assert list(got["edit_distance"]) == [levenshtein(a, b)
                                          for a, b in zip(before, outputs, strict=True)]
    assert list(got["exact_match"]) == [a == b for a, b in zip(before, outputs, strict=True)]
    # the draw held is the median one: its own one-step TVD is the row's median TVD
    for i, (e, t, order) in zip(pick, checked, strict=True):
        _check_median_draw(by_hand, e, t, order, offsets, float(perm["perm_median_tvd"][i]))


def _check_median_draw(by_hand: ByHand, e: int, t: int, order: torch.Tensor,
                       offsets: list[int], median_tvd: float) -> None:
    """Teacher-forced, the draw at step t alone moves the output by the median TVD."""
    model, batch = by_hand.model, by_hand.batch
    emitted = torch.tensor(by_hand.unedited[e])
    start = model.config.decoder_start_token_id
    decoder_inputs = torch.cat([torch.tensor([start]), emitted[:-1]])[None]

    def at_step(site, w, mask):
        s = by_hand.sites.index(site.name)
        index = order[offsets[s]: offsets[s] + w.shape[1]]
        new = w.clone()
        new[:, :, t] = w[:, :, t].gather(-1, index[None].expand_as(w[:, :, t]))
        return new

    def probs(edit):
        context = attnaudit.capture(model, sites=by_hand.sites, edit=edit)
        with torch.no_grad(), context:
            logits = model(input_ids=batch.source_ids[e:e + 1],
                           attention_mask=batch.source_mask[e:e + 1].long(),
                           decoder_input_ids=decoder_inputs).logits
        return torch.softmax(logits[0, t].float(), -1)

    assert float(tvd(probs(None), probs(at_step))) == pytest.approx(median_tvd, abs=1e-5)


def test_a_causal_lm_with_beams_redecodes_as_by_hand(tmp_path):
    """GPT-2 with 2 beams from its generation config, left-padded prompts: the uniform
    edit of the ``:cross`` view held while decoding equals, by hand, the continuation rows'
    eligible prompt weight spread evenly over the eligible prompt keys in every call."""
    transformers = pytest.importorskip("transformers")
    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, initializer_range=0.3, bos_token_id=1,
                                     eos_token_id=2, pad_token_id=0)
    save_checkpoint(transformers.GPT2LMHeadModel, config, tmp_path, eos_after=False)
    transformers.GenerationConfig(num_beams=2, max_new_tokens=4, bos_token_id=1,
                                  eos_token_id=2, pad_token_id=0).save_pretrained(tmp_path)
    target = attnaudit.from_hf(tmp_path, ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14"])
    batch = next(target.iter_batches())
    ref = reference(target, batch)
    table = sequence_effects(target, ref, ref.rows())
    got = table[table["protocol"] == "uniform"]
    assert set(table["protocol"]) == {"uniform", "zero_top", "zero_random"}

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompt = batch.source_ids.shape[1]
    eligible = batch.source_mask  # no special token in these prompts

    def generate(e: int, edit=None) -> list[int]:
        context = attnaudit.capture(model, edit=edit) if edit else torch.no_grad()
        with torch.no_grad(), context:
            out = model.generate(input_ids=batch.source_ids[e:e + 1],
                                 attention_mask=batch.source_mask[e:e + 1].long(),
                                 num_beams=2, max_new_tokens=4, pad_token_id=0,
                                 eos_token_id=2)[0, prompt:].tolist()
        return out[: out.index(2) + 1] if 2 in out else out

    def uniform_prompt(e: int):
        def edit(site, w, mask):
            queries, keys = w.shape[2], w.shape[3]
            first = max(prompt - 1 - (keys - queries), 0)  # rows of continuation steps
            keep = eligible[e].clone()
            new = w.clone()
            block = new[:, :, first:, :prompt]
            # the prompt view's mass, 1 / n_valid of it on each eligible prompt key, 0 on
            # the other prompt keys (the view is written back at its own mass)
            mass = block.sum(-1, keepdim=True)
            block.zero_()
            block[..., keep] = mass / int(keep.sum())
            new[:, :, first:, :prompt] = block
            return new
        return edit

    for row in got.itertuples(index=False):
        before, after = generate(row.example), generate(row.example, uniform_prompt(row.example))
        assert row.exact_match == (before == after)
        assert row.edit_distance == levenshtein(before, after)
        assert before == ref.emitted[row.example][ref.steps[row.example]].tolist()
    assert not got["exact_match"].all()
