"""``attnaudit align`` on the date BART and on a tiny decoder-only model: the links it writes
equal the argmax of the models' own eager ``output_attentions`` (averaged over heads and
layers as documented), and ``--gold`` prints the AER of the written file counted here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attnaudit.alignments.pharaoh import read_alignments
from attnaudit.cli import main
from attnaudit.targets.hf.loading import from_hf

transformers = pytest.importorskip("transformers")

from tests.helpers.date_bart_eager import eager_cross_attention  # noqa: E402
from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

BART = "attnaudit_examples.date_transformer.target:make_target"
GOLD = Path(__file__).resolve().parents[2] / "examples" / "date" / "audit.gold"
N = 4


def hand_aer(predicted: list[set], gold_lines: list[str]) -> float:
    """Och & Ney's AER counted from the raw gold text."""
    hits_sure = hits_possible = n_sure = n_predicted = 0
    for links, line in zip(predicted, gold_lines, strict=True):
        sure = {tuple(map(int, t.split("-"))) for t in line.split() if "p" not in t}
        possible = sure | {tuple(map(int, t.split("-p"))) for t in line.split() if "p" in t}
        hits_sure += len(links & sure)
        hits_possible += len(links & possible)
        n_sure += len(sure)
        n_predicted += len(links)
    return 1 - (hits_sure + hits_possible) / (n_predicted + n_sure)


@pytest.fixture(scope="module")
def bart_eager_links() -> list[set]:
    """Per example, (source char, output char) at the argmax of the eager cross-attention
    mean over heads and layers, at the step that emits the character."""
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    batch = next(target.iter_batches(N))
    emitted = target.greedy(batch)
    mean = eager_cross_attention(batch, emitted)  # (B, T, S)
    found = []
    for b, text in enumerate(batch.texts):
        n_out = int((emitted[b] != target.eos_id).cumprod(0).sum())
        found.append({(int(mean[b, j, :len(text)].argmax()), j) for j in range(n_out)})
    return found


def test_align_on_the_date_bart_equals_eager_attention(tmp_path, bart_eager_links, capsys):
    out = tmp_path / "bart.align"
    assert main(["align", BART, "--limit", str(N), "--units", "tokens", "--quiet",
                 "--out", str(out)]) == 0
    written = read_alignments(out)
    assert [a.sure for a in written] == bart_eager_links
    assert main(["align", BART, "--limit", str(N), "--units", "tokens", "--quiet",
                 "--gold", str(GOLD)]) == 0
    printed = capsys.readouterr().out
    aer = float(re.search(r"AER (\S+)", printed).group(1))
    gold_lines = GOLD.read_text().splitlines()[:N]
    assert aer == pytest.approx(hand_aer(bart_eager_links, gold_lines), abs=1e-4)


def test_align_table_of_measures_layers_and_conventions(capsys):
    assert main(["align", BART, "--limit", "2", "--units", "tokens", "--quiet", "--gold",
                 str(GOLD), "--measure", "weights,saliency", "--layer", "all",
                 "--convention", "all"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["measure", "layer", "convention", "aer", "precision",
                                "recall", "links", "sure", "sentences"]
    settings = {tuple(line.split()[:3]) for line in lines[1:]}
    assert settings == {(m, layer, c) for c in ("emit", "input")
                        for m, layer in [("weights", "0"), ("weights", "1"),
                                         ("weights", "mean"), ("saliency", "0")]}


def test_several_settings_without_gold_are_refused(capsys):
    assert main(["align", BART, "--limit", "1", "--measure", "weights,loo"]) == 2
    assert "give --gold FILE" in capsys.readouterr().err


PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"]


def test_align_on_a_decoder_only_model_equals_eager_attention(tmp_path, capsys):
    folder = tmp_path / "gpt2"
    config = transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     initializer_range=0.3, vocab_size=VOCAB, bos_token_id=1,
                                     eos_token_id=2, pad_token_id=0)
    save_checkpoint(transformers.GPT2LMHeadModel, config, folder, eos_after=False)
    data = tmp_path / "prompts.tsv"
    data.write_text("".join(p + "\n" for p in PROMPTS))
    assert main(["align", "--hf", str(folder), "--data", str(data), "--max-new-tokens", "3",
                 "--layer", "1", "--quiet"]) == 0
    written = [set(read_alignments_line(line))
               for line in capsys.readouterr().out.splitlines()]

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
    target = from_hf(model, PROMPTS, tokenizer=tokenizer, max_new_tokens=3)
    emitted = target.greedy(next(target.iter_batches()))
    expected = []
    for b, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        n_out = int((emitted[b] != target.eos_id).cumprod(0).sum())
        full = torch.tensor([ids + emitted[b, :n_out].tolist()])
        with torch.no_grad():
            attn = model(full, output_attentions=True).attentions[1][0]  # (H, N, N)
        rows = attn[:, len(ids) - 1:len(ids) - 1 + n_out, :len(ids)]  # continuation rows
        rows = (rows / rows.sum(-1, keepdim=True)).mean(0)  # renormalised over the prompt
        expected.append({(int(rows[j].argmax()), j) for j in range(n_out)})
    assert written == expected
    assert sum(len(links) for links in written) > 0


def read_alignments_line(line: str) -> list[tuple[int, int]]:
    return [tuple(map(int, token.split("-"))) for token in line.split()]


def test_an_unreadable_or_short_gold_file_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.gold"
    bad.write_text("0-0 1-x\n")
    assert main(["align", BART, "--limit", "1", "--gold", str(bad), "--quiet"]) == 2
    assert "bad.gold, line 1: '1-x' is not a link" in capsys.readouterr().err
    short = tmp_path / "short.gold"
    short.write_text("0-0\n")
    assert main(["align", BART, "--limit", "2", "--gold", str(short), "--quiet"]) == 2
    assert "2 predicted alignments but 1 gold" in capsys.readouterr().err


def test_align_defaults_to_the_step_that_emits_as_the_command_line_does(bart_eager_links):
    """attnaudit.align() with no convention reads output token j at the step that emits it,
    the command line's and the docs' default: the eager links, not the input step's."""
    import attnaudit
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    got = [set(a.sure) for a in attnaudit.align(target, units="tokens", limit=N)]
    assert got == bart_eager_links
    shifted = [set(a.sure) for a in attnaudit.align(target, units="tokens", limit=N,
                                                    convention="input")]
    assert shifted != bart_eager_links
