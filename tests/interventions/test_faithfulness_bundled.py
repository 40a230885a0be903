"""Faithfulness on the bundled date BART and date LSTM equals a re-computation from re-run
outputs: for seeded rows and measures, the test ranks the keys itself (numpy, stable, most
important first), replaces the removed source ids by the pad token in a one-example batch,
runs the teacher-forced model on it and reads the audited token's probability with a numpy
softmax, independent of the protocol's deduplication and chunking."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.attribution_protocol import ATTRIBUTION, IMPORTANCES
from attnaudit.auditing.faithfulness_protocol import FAITHFULNESS, RANDOM
from attnaudit.interventions.faithfulness import FRACTIONS, random_ranking, row_seed
from attnaudit.interventions.protocol import BatchContext, SuiteSettings
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.registry import registered_protocols

ROWS_CHECKED = 4


def date_bart():
    from attnaudit_examples.date_transformer.target import make_target

    return make_target(), 3


def date_lstm():
    from attnaudit_examples.date.target import make_target

    return make_target(limit=2, batch_size=2), 2


def run_protocols(target, ref):
    """The attribution protocol, then faithfulness on the same context (as the suite does)."""
    settings = SuiteSettings(quick=True, n_examples=len(ref.batch), seed=target.seed,
                             n_permutations=2, cumulative_examples=0, adversarial_examples=0,
                             attribution=AttributionOptions(),
                             methods=("saliency", "input_x_gradient"))
    protocols = {p.name: p for p in registered_protocols()}
    shared: dict = {}
    earlier: dict = {}
    for name in (ATTRIBUTION, FAITHFULNESS):
        ctx = BatchContext(target, ref.batch, ref, ref.rows(), settings,
                           frozenset({ATTRIBUTION, FAITHFULNESS}), earlier, shared, {})
        earlier[name] = protocols[name].run(ctx)
    return earlier[FAITHFULNESS]["faithfulness_rows"], shared[IMPORTANCES]


def p_edited(target, ref, example: int, step: int, removed: list[int], pad: int) -> float:
    one = ref.batch.select([example])
    ids = one.source_ids.clone()
    ids[0, removed] = pad
    with torch.no_grad():
        logits = target.teacher_forced(replace(one, source_ids=ids), ref.emitted[[example]])
    row = logits[0, step].double().cpu().numpy()
    probs = np.exp(row - row.max())
    return float(probs[int(ref.emitted[example, step])] / probs.sum())


def curves(target, ref, example, step, order, pad):
    """Comprehensiveness and sufficiency (F,) of ``order``, the eligible keys ranked."""
    n = len(order)
    sizes = [min(n, max(1, -(-f * n // 100))) for f in FRACTIONS]
    p_full = p_edited(target, ref, example, step, [], pad)
    comp = [p_full - p_edited(target, ref, example, step, order[:k], pad) for k in sizes]
    suff = [p_full - p_edited(target, ref, example, step, order[k:], pad) for k in sizes]
    return np.array(comp), np.array(suff)


@pytest.mark.parametrize("make", [date_bart, date_lstm])
def test_the_numbers_equal_a_recomputation_from_rerun_outputs(make):
    target, limit = make()
    ref = reference(target, next(target.iter_batches(limit)))
    table, importances = run_protocols(target, ref)
    pad = int(table["baseline"].iloc[0].split()[2])
    rows = ref.rows()
    pick = np.random.default_rng(0).choice(len(rows), min(ROWS_CHECKED, len(rows)),
                                           replace=False)
    maps = {"weights": ref.attention, "leave_one_out": importances["loo"],
            "saliency": importances["saliency"]}
    indexed = table.set_index(["example", "step", "measure"])
    for i in pick:
        e, s = int(rows.example[i]), int(rows.step[i])
        keys = ref.eligible[e, s].nonzero().squeeze(1).numpy()
        orders = {name: keys[np.argsort(-values[e, s].double().numpy()[keys], kind="stable")]
                  for name, values in maps.items()}
        drawn = random_ranking(ref.eligible[e, s][None], [row_seed(target.seed, e, s)])[0]
        orders[RANDOM] = drawn[: len(keys)].numpy()
        for name, order in orders.items():
            comp, suff = curves(target, ref, e, s, order.tolist(), pad)
            got = indexed.loc[(e + ref.first_example, s, name)]
            np.testing.assert_allclose([got[f"comprehensiveness_{f}"] for f in FRACTIONS],
                                       comp, atol=2e-4)
            np.testing.assert_allclose([got[f"sufficiency_{f}"] for f in FRACTIONS],
                                       suff, atol=2e-4)
            assert got["aopc_comprehensiveness"] == pytest.approx(comp.mean(), abs=2e-4)
            assert got["aopc_sufficiency"] == pytest.approx(suff.mean(), abs=2e-4)
        # the bounds: every measure's AOPC and the reversed leave-one-out ordering's
        worst = curves(target, ref, e, s, orders["leave_one_out"][::-1].tolist(), pad)
        row = table[(table["example"] == e + ref.first_example) & (table["step"] == s)]
        for kind, extra in (("comprehensiveness", worst[0].mean()),
                            ("sufficiency", worst[1].mean())):
            values = np.append(row[f"aopc_{kind}"].to_numpy(), extra)
            low, high = values.min(), values.max()
            assert row[f"aopc_{kind}_bound_low"].iloc[0] == pytest.approx(low, abs=2e-4)
            assert row[f"aopc_{kind}_bound_high"].iloc[0] == pytest.approx(high, abs=2e-4)
            share = (row[f"aopc_{kind}"].to_numpy() - low) / (high - low)
            want = share if kind == "comprehensiveness" else 1 - share
            np.testing.assert_allclose(row[f"normalised_aopc_{kind}"].to_numpy(), want,
                                       atol=1e-3)
