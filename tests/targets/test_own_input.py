"""A causal LM that builds its own input from the ids (CPM-Ant: learned prompt positions
prepended, padding read from id 0, one pass attending both ways) is run as its own
``generate()`` runs it: prompts are padded with the id it reads as padding whatever the
tokenizer's pad, so a left-padded prompt's teacher-forced logits equal the model's own
cached steps on that prompt alone, also beside a row that ended early and that generate()
padded with that id; the teacher-forced pass gives the prompt as context
(its plain one pass, which lets the prompt read the continuation, differs) and leaves the
model as it was, also when the pass fails; a prompt holding the padding id as a token is
refused."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnaudit.errors import TargetError
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.hf.own_input import MASK_BUILDER, OwnInput, own_input

transformers = pytest.importorskip("transformers")


from tests.helpers.tiny_causal import tiny_causal_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11"]
NEW = 3


@pytest.fixture(scope="module")
def cpmant(tmp_path_factory):
    folder, tokenizer = tiny_causal_checkpoint("cpmant", tmp_path_factory.mktemp("cpmant"))
    tokenizer.pad_token = tokenizer.eos_token  # a pad the model does not read as padding
    assert tokenizer.pad_token_id != 0
    return folder, tokenizer


def own_steps(model, prompt: torch.Tensor, new: int = NEW
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own greedy cached steps on one unpadded prompt (1, P): the continuation
    (new,) and its raw logits (new, V)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(input_ids=prompt, do_sample=False, num_beams=1,
                             max_new_tokens=new, min_new_tokens=new, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, prompt.shape[1]:], torch.cat(out.logits)


def test_the_prompt_is_padded_as_the_model_reads_it_and_is_its_generate_context(cpmant):
    folder, tokenizer = cpmant
    target = from_hf(folder, PROMPTS, tokenizer=tokenizer, max_new_tokens=NEW,
                     decoding="greedy")
    model = target.model
    assert own_input(model) == OwnInput(pad_id=0, lead=model.config.prompt_length,
                                        whole_ids_per_step=True, prefix_context=True)
    batch = next(target.iter_batches())
    short = batch.source_ids[1][batch.source_mask[1]]
    assert (batch.source_ids[1][~batch.source_mask[1]] == 0).all()  # not the tokenizer's pad
    steps = [own_steps(model, row[None]) for row in (batch.source_ids[0], short)]
    emitted = torch.stack([tokens for tokens, _ in steps])
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
    for row, (_, expected) in enumerate(steps):
        torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-4)
    assert MASK_BUILDER not in vars(model.base_model)
    # the model's plain pass over prompt + continuation lets the prompt read the continuation
    with torch.no_grad():
        plain = model(input_ids=torch.cat([batch.source_ids[:1], emitted[:1, :-1]], 1)).logits
    assert (plain[0, -NEW:] - logits[0]).abs().max() > 1e-2


def test_a_finished_row_padded_by_generate_is_not_read_as_padding(cpmant):
    # generate() pads a row after its end of sequence with the pad id, which CPM-Ant reads
    # as padding of the whole row (it keeps its last ``count of non-zero ids`` positions)
    folder, tokenizer = cpmant
    target = from_hf(folder, PROMPTS, tokenizer=tokenizer, max_new_tokens=NEW,
                     decoding="greedy")
    batch = next(target.iter_batches())
    (tokens, expected), (others, _) = (own_steps(target.model, row[None][:, mask], NEW + 1)
                                       for row, mask in zip(batch.source_ids,
                                                            batch.source_mask, strict=True))
    finished = torch.tensor([tokens[0], target.eos_id] + [0] * (NEW - 1))
    emitted = torch.stack([finished, others])
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
        states = target.decode_states(batch, None, emitted)
        step = target.decode_step(batch, None, states, emitted, 1)
    torch.testing.assert_close(logits[0, :2], expected[:2], rtol=0, atol=1e-4)
    torch.testing.assert_close(step[0], expected[1], rtol=0, atol=1e-4)


def test_the_model_is_left_as_it_was_when_the_pass_fails(cpmant):
    folder, tokenizer = cpmant
    target = from_hf(folder, PROMPTS, tokenizer=tokenizer, max_new_tokens=NEW)
    model = target.model
    with pytest.raises(RuntimeError), own_input(model).context(model, 2):
        assert MASK_BUILDER in vars(model.base_model)
        raise RuntimeError("a failing pass")
    assert MASK_BUILDER not in vars(model.base_model)


def test_a_prompt_holding_the_padding_id_as_a_token_is_refused(cpmant):
    folder, tokenizer = cpmant
    target = from_hf(folder, ["w5 w6", "w7 <pad> w8"], tokenizer=tokenizer,
                     max_new_tokens=NEW)
    with pytest.raises(TargetError, match=r"reads id 0 as padding, and prompt\(s\) \[1\]"):
        next(target.iter_batches())


def test_a_model_that_builds_nothing_has_the_defaults():
    class Config:
        model_type = "gpt2"

    class Model(torch.nn.Module):
        config = Config()

    assert own_input(Model()) == OwnInput()
