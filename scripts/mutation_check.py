"""Do the tests notice a wrong number? Plant plausible bugs one at a time and see.

Copies the checkout (tracked and untracked, non-ignored files) to a scratch directory,
runs the targeted tests there once unchanged (they must pass), then for each mutation
replaces one line of source, runs only the tests that should catch it (sequentially, with a
timeout) and restores the line. A mutation is *caught* when those tests fail. The checkout
itself is never modified.

    python scripts/mutation_check.py                 # every mutation
    python scripts/mutation_check.py --list          # their names and what they plant
    python scripts/mutation_check.py --check-table   # only: is every line still there?
    python scripts/mutation_check.py median_lower jsd_dtype

(or ``python -m scripts.mutation_check ...`` from the checkout's root).

Before anything runs, every selected mutation's file, line and tests are looked up; the
script stops (exit 2) naming each one that is out of date, and where its line now is when it
moved to another file: when source moves, update ``MUTATIONS`` (one entry per planted bug:
file, exact line text, replacement, tests). ``tests/test_mutation_table.py`` runs the same
check. Exit status 0 when every selected mutation is caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
SOURCE_FOLDERS = ("attnaudit", "examples")  # where a moved line is looked for
TABLE_OUT_OF_DATE = 2
# The editable install maps the folder examples/ to this package name; the scratch copy is
# run from PYTHONPATH, so it gets the same name as a link (see scratch_copy).
EXAMPLES_PACKAGE = "attnaudit_examples"

PINNED = "tests/interventions/test_pinned_interventions.py"
INCREMENTAL = "tests/interventions/test_incremental.py"
DEFINITIONS = "tests/interventions/test_definitions.py"
FULL_SUITE = "tests/auditing/test_intervention_suite.py"
BATCHING = "tests/interventions/test_batching.py"
CAPTURE_PINS = "tests/capturing/test_pinned_numbers.py"
ROW_SUM_GATE = "tests/validity/test_row_sum_gate.py"
REPORT = "tests/report/test_report_date.py"
ALIGNMENT = "tests/examples/test_alignment_audit.py::test_date_numbers_match_a_hand_written_decoder"
TORCHRUN = "tests/runtime/test_torchrun.py::test_two_ranks_write_the_single_process_report"
CONTRIBUTION_SUITE = "tests/auditing/test_contribution_suite.py"
SINK_PADDING = ("tests/contributions/test_rollout_zeroing_sinks.py::test_the_sink_table_leaves_"
                "padded_query_rows_and_keys_out_as_a_per_example_count")
BEAM_EDGES = "tests/capturing/test_beam_records_edges.py"
CACHED_EDGES = "tests/validity/test_cached_decoding_edges.py"
MAP_EDGES = "tests/analysis/test_example_maps_edges.py"
SEQUENCE_EDGES = "tests/interventions/test_sequence_effects_edges.py"
ROW_EXPECTATIONS = "tests/validity/test_row_expectations_edges.py"
EXTRACT_EDGES = "tests/alignments/test_extract_edges.py"
ROLE_EDGES = "tests/capturing/test_role_rules_edges.py"
EXPLORER_BROWSER = "tests/report/test_explorer_browser.py"
EXPLORER_MEANS = (EXPLORER_BROWSER
                  + "::test_the_mean_over_layers_and_over_heads_is_the_mean_of_the_csv")
EXPLORER_POINTER = (EXPLORER_BROWSER
                    + "::test_the_model_view_maps_the_pointer_to_cells_that_are_not_square")
EXPLORER_OPENING = (EXPLORER_BROWSER
                    + "::test_the_explorer_opens_on_the_most_concentrated_cross_attention_head")
OTHER_EXAMPLE = "tests/interventions/test_value_other_example.py"
LSTM_CONTRIBUTIONS = (CONTRIBUTION_SUITE + "::test_the_date_lstm_computes_value_zeroing_and_says_"
                      "why_not_for_the_rest")


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``."""

    name: str
    planted: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation("median_lower", "median of an even count: the lower middle value",
             "attnaudit/interventions/outputs.py",
             "return 0.5 * (ordered[..., (n - 1) // 2] + ordered[..., n // 2])",
             "return ordered[..., (n - 1) // 2]", (DEFINITIONS, PINNED)),
    Mutation("jsd_dtype", "JSD computed in the inputs' dtype (float16 smoothing rounds to 0)",
             "attnaudit/interventions/outputs.py",
             "return torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)",
             "return torch.promote_types(p.dtype, q.dtype)", (DEFINITIONS,)),
    Mutation("jsd_log_base", "JSD in bits: log2 instead of the natural log",
             "attnaudit/interventions/outputs.py",
             "return (p * (torch.log(p + EPS) - torch.log(m + EPS))).sum(-1)",
             "return (p * (torch.log2(p + EPS) - torch.log2(m + EPS))).sum(-1)",
             (DEFINITIONS,)),
    Mutation("entropy_log_base", "attention entropy in bits: log2 instead of the natural log",
             "attnaudit/analysis/entropy.py",
             "entropy = -(w * torch.log(w.clamp_min(0.0) + EPS)).sum(-1)",
             "entropy = -(w * torch.log2(w.clamp_min(0.0) + EPS)).sum(-1)",
             (REPORT + "::test_region_and_entropy_tables_match_the_hand_written_decoder",)),
    Mutation("tvd_no_half", "TVD without the factor 1/2",
             "attnaudit/interventions/outputs.py",
             "return 0.5 * distance.sum(-1)", "return distance.sum(-1)",
             (PINNED + "::test_value_replacement_reads_zero_and_the_mean_of_eligible_values",)),
    Mutation("mask_threshold", "masked when the score is below -1e4, not at or below",
             "attnaudit/capturing/layout.py",
             "return ~(scores <= MASKED_SCORE)", "return ~(scores < MASKED_SCORE)",
             (CAPTURE_PINS,)),
    Mutation("uniform_axis", "uniform share normalised over the wrong axis",
             "attnaudit/interventions/ablation.py",
             "share = eligible.to(dtype) / eligible.sum(-1, keepdim=True).clamp_min(1)",
             "share = eligible.to(dtype) / eligible.sum(0, keepdim=True).clamp_min(1)",
             (PINNED + "::test_uniform_and_single_zeroing_match_hand_edited_weights",)),
    Mutation("uniform_keeps_ineligible", "uniform spreads only the eligible mass and keeps "
             "the weight on ineligible keys (not Wiegreffe & Pinter's 1/n_valid, 0 elsewhere)",
             "attnaudit/interventions/ablation.py",
             "return torch.where(eligible.any(-1)[:, None, None], _even(eligible, old.dtype), "
             "old)",
             "return uniform_mass_rows(old, eligible)",
             ("tests/interventions/test_uniform_definition.py",)),
    Mutation("value_zeroing_unnormalised", "value zeroing reported as the raw distances, "
             "not normalised per row (Mohebbi et al.)", "attnaudit/contributions/zeroing.py",
             "return torch.where(total > 0, kept / total.clamp_min(torch.finfo(raw.dtype).tiny), "
             "0.0)",
             "return kept",
             ("tests/contributions/test_value_zeroing_normalised.py",)),
    Mutation("sdpa_mask_dropped", "SDPA path: the bool mask is not applied to the scores",
             "attnaudit/capturing/sdpa.py",
             'scores = scores.masked_fill_(~allowed, float("-inf"))', "pass",
             ("tests/capturing/test_sdpa_path.py",)),
    Mutation("value_mean_padding", "value replacement: mean taken over every key, padding too",
             "attnaudit/interventions/values.py",
             "share = eligible[:, None, :].to(old.dtype) / eligible.sum(-1)[:, None, None]"
             ".clamp_min(1)",
             "share = torch.ones_like(eligible[:, None, :], dtype=old.dtype) / "
             "eligible.shape[-1]",
             (PINNED + "::test_value_replacement_reads_zero_and_the_mean_of_eligible_values",)),
    Mutation("value_zero_renormalised", "value zero renormalises the row (a weight edit, not "
             "a value edit)", "attnaudit/interventions/values.py",
             "return old.scatter(-1, top[:, None, None].expand(-1, old.shape[1], 1), 0.0)",
             "new = old.scatter(-1, top[:, None, None].expand(-1, old.shape[1], 1), 0.0)\n"
             "    return new / new.sum(-1, keepdim=True)",
             (PINNED + "::test_value_replacement_reads_zero_and_the_mean_of_eligible_values",)),
    Mutation("permutation_padding", "permutation shuffles padding and special keys too",
             "attnaudit/interventions/permutation.py",
             "self._cache[row] = eligible_permutation(eligible, noise)",
             "self._cache[row] = eligible_permutation(torch.ones_like(eligible), "
             "torch.rand(noise.shape, generator=gen))",
             (PINNED + "::test_permutation_medians_from_the_weights_the_model_read",)),
    Mutation("gradient_order_sign", "gradient removal order reversed (sign)",
             "attnaudit/interventions/ablation.py",
             'scores["gradient"] = grads.sum(1)', 'scores["gradient"] = -grads.sum(1)',
             (PINNED + "::test_cumulative_removal_in_every_order",)),
    Mutation("weight_gradient_of_log", "weight gradients of log p instead of p",
             "attnaudit/interventions/ablation.py",
             "chosen = probs[torch.arange(len(idx)), predicted[idx]]",
             "chosen = probs[torch.arange(len(idx)), predicted[idx]].log()",
             (PINNED + "::test_weight_gradients_match_autograd_on_the_hand_written_forward",)),
    Mutation("cumulative_off_by_one", "cumulative removal: one key too many in frac_mass",
             "attnaudit/interventions/ablation.py",
             "removed = (rank[:, o] < k[:, None]) & eligible",
             "removed = (rank[:, o] <= k[:, None]) & eligible",
             (PINNED + "::test_cumulative_removal_in_every_order",)),
    Mutation("adversarial_sign", "adversarial loss rewards staying close (sign of the JSD)",
             "attnaudit/interventions/adversarial.py",
             "loss = (-away + penalty * torch.relu(change - eps)).sum(-1) - _pairwise_jsd(a)",
             "loss = (away + penalty * torch.relu(change - eps)).sum(-1) - _pairwise_jsd(a)",
             (PINNED + "::test_adversarial_search_moves_away_within_the_constraint",)),
    Mutation("adversarial_penalty_sign", "adversarial penalty pushes the output TVD above eps",
             "attnaudit/interventions/adversarial.py",
             "loss = (-away + penalty * torch.relu(change - eps)).sum(-1) - _pairwise_jsd(a)",
             "loss = (-away + penalty * torch.relu(eps - change)).sum(-1) - _pairwise_jsd(a)",
             (PINNED + "::test_adversarial_search_moves_away_within_the_constraint",)),
    Mutation("adversarial_constraint", "eps-max JSD over candidates above eps",
             "attnaudit/interventions/adversarial.py",
             "within = tvd_final <= eps", "within = tvd_final >= eps",
             (PINNED + "::test_adversarial_candidates_checked_where_the_model_reads_them",)),
    Mutation("seed_local_example", "row seeds from the batch-local example index",
             "attnaudit/interventions/runner.py",
             "seeded_generator(ref.seed, ref.first_example + example, step, salt)",
             "seeded_generator(ref.seed, example, step, salt)",
             (FULL_SUITE + "::test_tables_do_not_depend_on_the_example_batch_size",)),
    Mutation("draws_padded_width", "random draws over the padded key width",
             "attnaudit/interventions/draws.py",
             "out[..., eligible] = sample(*lead, int(eligible.sum()), generator=generator)",
             "out[..., eligible] = sample(*lead, eligible.shape[-1], generator=generator)"
             "[..., eligible]",
             (FULL_SUITE + "::test_tables_do_not_depend_on_the_example_batch_size",)),
    Mutation("ig_zero_baseline", "integrated gradients from a zero baseline, not the pad "
             "embedding", "attnaudit/attribution/inputs.py",
             "source_base = passes.source_module(",
             "source_base = 0 * passes.source_module(",
             (FULL_SUITE + "::test_integrated_gradients_and_agreement_against_independent_"
              "references",)),
    Mutation("shared_forward_step", "every step's gradient taken from the last step's output",
             "attnaudit/attribution/step_gradients.py",
             "torch.autograd.grad(outputs[:, step].sum(), leaves,",
             "torch.autograd.grad(outputs[:, -1].sum(), leaves,",
             ("tests/attribution/test_shared_forward.py::test_shared_forward_equals_captum_"
              "step_by_step_on_the_bundled_models",)),
    Mutation("stacking_order", "calls stacked newest first",
             "attnaudit/record.py", "self.calls.append(call)", "self.calls.insert(0, call)",
             (CAPTURE_PINS + "::test_decoder_steps_stack_in_call_order",)),
    Mutation("flex_allowed", "flex attention backend let through",
             "attnaudit/capturing/hf.py", 'CAPTURABLE_BACKENDS = ("eager", "sdpa")',
             'CAPTURABLE_BACKENDS = ("eager", "sdpa", "flex_attention")',
             (CAPTURE_PINS + "::test_flex_backend_is_refused_on_a_hugging_face_model",)),
    Mutation("gate_ignores_row_sum", "the gate does not fail on row sums",
             "attnaudit/validity/findings.py",
             'site, "row_sum", int(s.row_sum_rows), total,', 'site, "row_sum", 0, total,',
             (ROW_SUM_GATE,)),
    Mutation("row_sum_tolerance_fixed", "--row-sum-tolerance is ignored",
             "attnaudit/auditing/orchestration.py",
             "row_sum_tolerance=options.tolerances.row_sum_tolerance,",
             "row_sum_tolerance=1e-3,", (ROW_SUM_GATE,)),
    Mutation("top_weight_hit_axis", "top-weight hit: argmax over the query axis",
             "attnaudit/analysis/regions.py",
             'top = safe.masked_fill(~eligible, float("-inf")).argmax(-1, keepdim=True)',
             'top = safe.masked_fill(~eligible, float("-inf")).argmax(-2, keepdim=True)',
             (ALIGNMENT,)),
    Mutation("year_rows", "region mass over the first three rows, not four",
             "examples/date/target.py",
             'Expectation("source year", year_keys, rows=YEAR_CHARS)',
             'Expectation("source year", year_keys, rows=YEAR_CHARS - 1)', (ALIGNMENT,)),
    Mutation("explanation_cut", "explanation verdict: the permutation cut-off moved",
             "attnaudit/checklist/claims.py", "SENSITIVE_BELOW = 0.5",
             "SENSITIVE_BELOW = 0.05",
             ("tests/checklist/test_claims.py::test_sensitivity_from_the_share_and_its_interval",)),
    Mutation("shard_rank_order", "distributed suite: gathered batches kept in rank order",
             "attnaudit/auditing/intervention_suite.py", "key=lambda part: part[0])",
             "key=lambda part: 0)", (TORCHRUN + "[date_lstm]",)),
    Mutation("shard_stats_own_only", "distributed audit: each rank keeps its own analyser "
             "statistics", "attnaudit/analysis/merging.py",
             "_all_reduce_stats(analyser.stats, collectives)", "None", (TORCHRUN + "[date_lstm]",)),
    Mutation("layout_inverse", "an edit written back through the forward permutation, not its "
             "inverse (wrong for heads after two query axes)", "attnaudit/capturing/layout.py",
             "inverse = sorted(range(len(order)), key=order.__getitem__)", "inverse = order",
             ("tests/capturing/test_layout_rules.py",)),
    Mutation("self_view_pre_edit", "decoder-only: the self view read from the weights before "
             "the cross view's edit was written", "attnaudit/capturing/recorder.py",
             "view.of(current)", "view.of(weights)", ("tests/capturing/test_prompt_views.py",)),
    Mutation("prompt_first_tokens", "decoder-only: an over-long prompt keeps its first tokens",
             "attnaudit/targets/hf/causal.py",
             "kept = [row[-limit:] if limit is not None else row for row in rows]",
             "kept = [row[:limit] if limit is not None else row for row in rows]",
             ("tests/targets/test_causal_target.py::"
              "test_a_prompt_over_the_limit_keeps_its_last_tokens",)),
    Mutation("ig_delta_reduced", "IG convergence delta from the displayed reduction, not the "
             "signed sums", "attnaudit/attribution/gradient_methods.py",
             'token_score(integral, d.float(), "sum")',
             "token_score(integral, d.float(), reduction)",
             ("tests/attribution/test_attribution.py::"
              "test_the_convergence_delta_is_signed_whatever_the_token_reduction",)),
    Mutation("shap_stdev_squared", "GradientShap noise scaled by the variance, not the standard "
             "deviation", "attnaudit/attribution/reference_methods.py",
             "starts.append(base + stdev * noise.to(base.device, base.dtype))",
             "starts.append(base + stdev ** 2 * noise.to(base.device, base.dtype))",
             ("tests/attribution/test_reference_methods.py::"
              "test_gradient_shap_draws_equal_identically_seeded_draws",)),
    Mutation("unk_drops_eos", "the unk baseline replaces end-of-sequence tokens too",
             "attnaudit/attribution/inputs.py",
             "return torch.where(ids == eos_id, ids, base) if eos_kept else base",
             "return base", ("tests/attribution/test_attribution.py::"
                             "test_the_unk_baseline_keeps_the_end_of_sequence_token",)),
    Mutation("word_attention_max", "the report's word attention: the largest token weight of a "
             "word, not their sum", "attnaudit/analysis/words.py",
             "per_word = aggregate(torch.from_numpy(amap.weights).mean(0), groups,",
             'per_word = aggregate(torch.from_numpy(amap.weights).mean(0), groups, reduce="max",',
             ("tests/analysis/test_aggregation.py::"
              "test_word_attention_of_words_of_several_tokens_is_the_sum_of_their_weights",)),
    Mutation("tolerance_by_queries", "the dtype row-sum tolerance read off the query count",
             "attnaudit/analysis/numerics.py",
             "row_sum_tolerance(rows.dtype, w.shape[-1])",
             "row_sum_tolerance(rows.dtype, w.shape[-2])",
             ("tests/validity/test_dtypes.py::test_the_tolerance_counts_keys_not_queries",)),
    Mutation("site_tolerance_by_queries", "a site's stated row-sum tolerance read off the "
             "query count", "attnaudit/validity/analysers.py",
             "row_sum_tolerance(data.dtype, data.weights.shape[-1])",
             "row_sum_tolerance(data.dtype, data.weights.shape[-2])",
             ("tests/validity/test_dtypes.py::test_the_tolerance_counts_keys_not_queries",)),
    Mutation("budget_state_once", "chunk budget: a cached step's state counted once",
             "attnaudit/interventions/memory.py", "STATE_COPIES * self.state_bytes",
             "self.state_bytes", ("tests/interventions/test_memory_measured.py",)),
    Mutation("helper_keeps_wrong_axis_rule", "pytest helper: a wrong-axis site checked against "
             "the declared source rule", "attnaudit/testing.py",
             "wrong_axis = keys_before_queries(record.site.layout)", "wrong_axis = False",
             ("tests/validity/test_testing_helper.py",)),
    Mutation("suite_reads_first_layer", "the suite reads composed measures (ALTI, rollout) "
             "after the first layer, not the last", "attnaudit/auditing/contribution_suite.py",
             "return {m: (found.mean(1) if m in PER_LAYER else found[:, -1])[..., :n_keys]",
             "return {m: (found.mean(1) if m in PER_LAYER else found[:, 0])[..., :n_keys]",
             (CONTRIBUTION_SUITE + "::test_the_suite_reads_rollout_after_the_last_layer_as_an_"
              "eager_numpy_rollout",)),
    Mutation("zeroing_first_example", "value zeroing re-runs the first example for every "
             "example of the batch", "attnaudit/contributions/zeroing.py",
             "copies = batch.select([b]).repeat(count)",
             "copies = batch.select([0]).repeat(count)", (LSTM_CONTRIBUTIONS,)),
    Mutation("one_measure_fails_all", "one measure that cannot be computed marks every measure "
             "not computed", "attnaudit/auditing/contribution_suite.py",
             '[{"measure": m, "reading": READINGS[m], "status": "computed" if m in found else',
             '[{"measure": m, "reading": READINGS[m], "status": "computed" if not reasons else',
             (LSTM_CONTRIBUTIONS,)),
    Mutation("alti_residual_shape_unchecked", "ALTI takes an attention input of another width "
             "than its output as the residual (Zamba)", "attnaudit/contributions/alti.py",
             "shaped = {k: v for k, v in candidates.items() if v is not None and v.shape == "
             "out.shape}", "shaped = {k: v for k, v in candidates.items() if v is not None}",
             ("tests/contributions/test_architectures.py::test_a_hybrid_layer_whose_attention_"
              "reads_more_than_the_stream_says_why",)),
    Mutation("rollout_stacked_rows", "rollout composes a site whose rows stack several runs",
             "attnaudit/contributions/measures.py", "        _check_square(traced, names)",
             "        pass", ("tests/contributions/test_architectures.py::test_self_attention_"
                              "run_several_times_per_pass_is_not_composed_and_says_why",)),
    Mutation("sink_padded_rows_over", "the sink table counts padded query rows over the "
             "share", "attnaudit/contributions/sinks.py",
             "over = ((at_top[..., 0] > SINK_SHARE) & (rows[:, None] > 0)).sum(-1).float()",
             "over = (at_top[..., 0] > SINK_SHARE).sum(-1).float()", (SINK_PADDING,)),
    Mutation("sink_padded_keys_norm", "the sink table's mean value norm over padded keys too",
             "attnaudit/contributions/sinks.py",
             "mean = (norms * eligible).sum(-1) / eligible.sum(-1).clamp_min(1)",
             "mean = norms.mean(-1)", (SINK_PADDING,)),
    Mutation("sink_padded_rows_mass", "the sink table's mass averaged over padded query rows",
             "attnaudit/contributions/sinks.py",
             "rows = keys.query_mask.to(weights.device).float()  # (B, Q)",
             "rows = torch.ones_like(keys.query_mask, device=weights.device).float()",
             (SINK_PADDING,)),
    Mutation("meta_mha_compares_data", "MHA on the meta device: keys compared by data",
             "attnaudit/capturing/mha.py", "    if query.is_meta or key.is_meta:",
             "    if False:", ("tests/capturing/test_unusable_models.py::test_meta_model_with_"
                               "separate_keys_is_captured_shape_only",)),
    Mutation("naopc_sufficiency_unflipped", "normalised AOPC of sufficiency not reversed "
             "(the worst ordering scored 1)", "attnaudit/interventions/faithfulness.py",
             "share = (values - low) / span if higher_is_better else (high - values) / span",
             "share = (values - low) / span",
             ("tests/interventions/test_faithfulness_toy.py",)),
    Mutation("beam_key_mask_first_slots", "beam-aligned key masks read from the first slots, "
             "not the slots along each returned path", "attnaudit/capturing/beams.py",
             "    return mask[rows]", "    return mask[:rows.shape[0]]", (BEAM_EDGES,)),
    Mutation("beam_examples_interleaved", "several returned sequences per source: sequence i "
             "given example i mod batch", "attnaudit/capturing/beams.py",
             "aligned[name] = _example_record(record, torch.arange(n) // per)",
             "aligned[name] = _example_record(record, torch.arange(n) % next(iter(rows)))",
             (BEAM_EDGES,)),
    Mutation("cached_rows_after_eos_compete", "cached decoding: rows after an end-of-sequence "
             "step compete for the largest row", "attnaudit/analysis/cached_decoding.py",
             "at = int(gap.nan_to_num(2.0).masked_fill(~counted, -1.0).argmax())",
             "at = int(gap.nan_to_num(2.0).argmax())", (CACHED_EDGES,)),
    Mutation("cached_example_within_batch", "cached decoding: the largest row's example "
             "counted within its batch, not the audit data",
             "attnaudit/analysis/cached_decoding.py",
             "total_variation=float(gap.flatten()[at]), example=first + example,",
             "total_variation=float(gap.flatten()[at]), example=example,", (CACHED_EDGES,)),
    Mutation("maps_captured_rows_per_call", "example maps: a captured site keeps up to 512 "
             "rows of every call, not 512 in all", "attnaudit/analysis/example_maps.py",
             "take = max(MAX_MAP_SIDE - site.rows, 0)", "take = MAX_MAP_SIDE", (MAP_EDGES,)),
    Mutation("maps_masked_mass_per_call", "example maps: a run of rows straddling two calls "
             "keeps only the later call's largest masked mass",
             "attnaudit/analysis/example_maps.py",
             'checks.masked.scatter_reduce_(1, index, masked, "amax")',
             'checks.masked.scatter_reduce_(1, index, masked, "amax", include_self=False)',
             (MAP_EDGES,)),
    Mutation("maps_words_dropped_at_limit", "example maps: the words dropped at exactly 512 "
             "source tokens", "attnaudit/analysis/example_maps.py",
             "if len(kept_words) > MAX_MAP_SIDE:", "if len(kept_words) >= MAX_MAP_SIDE:",
             (MAP_EDGES,)),
    Mutation("maps_runs_below_limit", "example maps: an axis of exactly 512 averaged into 511 "
             "runs", "attnaudit/analysis/example_maps.py",
             "    return min(MAX_MAP_SIDE, length)", "    return min(MAX_MAP_SIDE - 1, length)",
             (MAP_EDGES,)),
    Mutation("sequence_length_padded", "sequence effects: the unedited length counts the "
             "batch's padded steps, not the output's tokens", "attnaudit/interventions/sequence.py",
             '"length": len(before), "edited_length": len(after)})',
             '"length": len(unedited[e]), "edited_length": len(after)})', (SEQUENCE_EDGES,)),
    Mutation("sequence_length_edited", "sequence effects: the unedited length is the edited "
             "output's", "attnaudit/interventions/sequence.py",
             '"length": len(before), "edited_length": len(after)})',
             '"length": len(after), "edited_length": len(after)})', (SEQUENCE_EDGES,)),
    Mutation("row_expectation_block_start", "per-row expectations: each query block reads "
             "the expectation's first rows, not its own", "attnaudit/validity/batch.py",
             "expected = expected[..., start:stop, :]",
             "expected = expected[..., : stop - start, :]", (ROW_EXPECTATIONS,)),
    Mutation("row_expectation_rank", "per-row expectations (B, T, n) not sliced per block, "
             "only (B, H, T, n) ones", "attnaudit/validity/batch.py",
             "if expected.ndim >= 3:  # per query row: (B, Q, K) or (B, H, Q, K)",
             "if expected.ndim >= 4:  # per query row: (B, Q, K) or (B, H, Q, K)",
             (ROW_EXPECTATIONS,)),
    Mutation("one_unit_source_undecided", "alignment extraction: a one-unit source's scores "
             "count as all equal (no link)", "attnaudit/alignments/extract.py",
             "undecided = n_source > 1 and bool(scores.max() == scores.min())",
             "undecided = bool(scores.max() == scores.min())", (EXTRACT_EDGES,)),
    Mutation("one_unit_source_empty", "alignment extraction: a one-unit source gets an empty "
             "alignment", "attnaudit/alignments/extract.py", "        if n_source == 0:",
             "        if n_source <= 1:", (EXTRACT_EDGES,)),
    Mutation("router_class_no_hyperconnection", "role rules: a stream mixer's class name "
             "(HyperConnection) no longer read as routing", "attnaudit/capturing/roles.py",
             '_ROUTER_CLASS = re.compile(r"(router|gate|gating|moe|moeblock|hyperconnections?)$")',
             '_ROUTER_CLASS = re.compile(r"(router|gate|gating|moe|moeblock)$")',
             (ROLE_EDGES,)),
    Mutation("router_class_no_moeblock", "role rules: a MoeBlock class no longer read as "
             "routing", "attnaudit/capturing/roles.py",
             '_ROUTER_CLASS = re.compile(r"(router|gate|gating|moe|moeblock|hyperconnections?)$")',
             '_ROUTER_CLASS = re.compile(r"(router|gate|gating|moe|hyperconnections?)$")',
             (ROLE_EDGES,)),
    Mutation("router_name_no_gate", "role rules: a module named gate no longer read as a "
             "router", "attnaudit/capturing/roles.py",
             '_ROUTER_PARTS = frozenset(("router", "gate", "gating", "moe", "hc"))',
             '_ROUTER_PARTS = frozenset(("router", "gating", "moe", "hc"))', (ROLE_EDGES,)),
    Mutation("causal_positions_from_one", "causal LM position ids counted by the target start "
             "at 1", "attnaudit/targets/hf/causal.py",
             "    return (mask.cumsum(-1) - 1).clamp_min(0)",
             "    return mask.cumsum(-1).clamp_min(0)",
             ("tests/targets/test_causal_positions_edges.py",)),
    Mutation("explorer_mean_layers_count", "explorer: the mean over layers divides by the "
             "head count (a sum over layers)", "attnaudit/report/static/explorer.js",
             "    return sum / (ls.length * hs.length);", "    return sum / hs.length;",
             (EXPLORER_MEANS,)),
    Mutation("explorer_mean_heads_count", "explorer: the mean over heads divides by the "
             "layer count (a sum over heads)", "attnaudit/report/static/explorer.js",
             "    return sum / (ls.length * hs.length);", "    return sum / ls.length;",
             (EXPLORER_MEANS,)),
    Mutation("explorer_pointer_square_cells", "explorer: the pointer's row from the cell "
             "width (cells taken as square)", "attnaudit/report/static/explorer.js",
             "const q = hit.q0 + Math.floor((y - hit.y) / hit.ch),",
             "const q = hit.q0 + Math.floor((y - hit.y) / hit.cw),", (EXPLORER_POINTER,)),
    Mutation("explorer_opens_least_concentrated", "explorer: opens on the head with the "
             "lowest mean max weight", "attnaudit/report/explorer.py",
             "layer, head = np.unravel_index(int(np.argmax(concentration)), concentration.shape)",
             "layer, head = np.unravel_index(int(np.argmin(concentration)), concentration.shape)",
             (EXPLORER_OPENING,)),
    Mutation("explorer_opens_on_mean_weight", "explorer: the opening statistic is the rows' "
             "mean weight, not their max", "attnaudit/report/explorer.py",
             "peaks = [np.where(f, np.nanmax(np.where(f[..., None], w, 0.0), -1), 0.0)",
             "peaks = [np.where(f, np.nanmean(np.where(f[..., None], w, 0.0), -1), 0.0)",
             (EXPLORER_OPENING,)),
    Mutation("explorer_opens_on_first_view", "explorer: opens on the first view, not the "
             "cross-attention (continuation over the prompt)", "attnaudit/report/explorer.py",
             "v = next((i for i, view in enumerate(views) if view.role == Role.CROSS), 0)",
             "v = 0", (EXPLORER_OPENING,)),
    Mutation("explorer_scale_always_fixed", "explorer: every map coloured on the fixed "
             "0-1 scale, whatever the control says", "attnaudit/report/static/explorer.js",
             '    if (this.state.scale === "fixed") return m.scale;', "    return m.scale;",
             (EXPLORER_OPENING,)),
    Mutation("other_example_wrong_position", "other-example value: the donor's value read at "
             "the next key position", "attnaudit/interventions/values.py",
             "            kept[site.name] = values[:, chosen][where, :, key].float().cpu()",
             "            kept[site.name] = values[:, chosen][where, :, (key + 1) "
             "% values.shape[2]].float().cpu()", (OTHER_EXAMPLE,)),
    Mutation("other_example_is_itself", "other-example value: the donor is the row's own "
             "example", "attnaudit/interventions/values.py",
             "        donor[has_key] = donor_examples(ref, rows.select(has_key), keys[has_key], "
             "salt)",
             "        donor[has_key] = rows.example[has_key]", (OTHER_EXAMPLE,)),
    Mutation("other_example_any_length", "other-example value: donors drawn whatever their "
             "source length", "attnaudit/interventions/values.py",
             "    fits = ref.eligible[:, rows.step, key].T.clone()  # (N, B)",
             "    fits = torch.ones_like(ref.eligible[:, rows.step, key].T)  # (N, B)",
             (OTHER_EXAMPLE,)),
    Mutation("other_example_every_row", "other-example value: the donor's value read by every "
             "query row of the edited sequence, not only the edited step's",
             "attnaudit/interventions/runner.py",
             "            read[at, :, rows_at, :] = rows",
             "            read[at] = rows[:, :, None]", (OTHER_EXAMPLE,)),
    Mutation("value_edit_ignored", "capture: the value edit's read dropped, the model's own "
             "weights @ values used", "attnaudit/capturing/sdpa.py",
             "        return layout.read_from_record(read)",
             "        return torch.matmul(used, self.value)", (OTHER_EXAMPLE,)),
    Mutation("steps_unmasked", "a call of several cached steps: a row at an earlier step "
             "also attends to the later steps' cached positions",
             "attnaudit/targets/hf/causal.py",
             "        reached = torch.arange(before, device=rows.device)[None, :] < at[:, None]",
             "        reached = torch.arange(before, device=rows.device)[None, :] >= 0",
             (INCREMENTAL,)),
    Mutation("steps_with_step_zero", "items of step 0 folded into the later steps' call "
             "(whose prompt keys then miss the prompt's last position)",
             "attnaudit/interventions/reference_run.py",
             "        return step.clamp(max=1) if self.mixed_steps else step",
             "        return step.clamp(max=0) if self.mixed_steps else step",
             (INCREMENTAL,)),
    Mutation("grouped_heads_interleaved", "grouped-query capture: query head h read with "
             "key/value head h % groups instead of h // groups",
             "attnaudit/capturing/sdpa.py",
             "    folded = rows.reshape(*lead, heads // groups, groups * n_rows, width)",
             "    folded = rows.reshape(*lead, groups, heads // groups, n_rows, width).transpose("
             "1, 2).reshape(*lead, heads // groups, groups * n_rows, width)",
             ("tests/capturing/test_sdpa_path.py",)),
    Mutation("alti_block_residual_offset", "ALTI in key blocks: every block adds the residual "
             "to the diagonal of its first keys' queries", "attnaudit/contributions/alti.py",
             "terms[:, :, span].diagonal(dim1=1, dim2=2).add_(own[:, span].transpose(1, 2))",
             "terms.diagonal(dim1=1, dim2=2).add_(own[:, :terms.shape[1]].transpose(1, 2))",
             ("tests/contributions/test_alti_reference.py",)),
    Mutation("greedy_decoded_twice", "the validity audit decodes the first batch again "
             "beside the plan's timed decoding", "attnaudit/auditing/orchestration.py",
             "        first_greedy = _planned_greedy(plan)\n",
             "        first_greedy = None\n",
             ("tests/auditing/test_plan.py::test_the_suite_run_on_the_plans_reference_equals_"
              "one_run_without_a_plan",)),
    Mutation("hash_tied_by_address", "model hash: tensors that start at one address taken "
             "as one tensor whatever their shape", "attnaudit/report/manifest.py",
             "        distinct.setdefault(_tensor_key(name, state[name]), (name, state[name]))",
             "        distinct.setdefault(_tensor_key(name, state[name])[:2], "
             "(name, state[name]))", ("tests/report/test_model_hash.py",)),
    Mutation("math_attention_on_long_keys",
             "gradient passes: the math backend taken for long calls and the fused kernel "
             "for short ones",
             "attnaudit/attribution/attention_backward.py",
             "        and key.shape[-2] <= MATH_KEYS_PER_WIDTH * query.shape[-1]",
             "        and key.shape[-2] > MATH_KEYS_PER_WIDTH * query.shape[-1]",
             ("tests/attribution/test_attention_backward.py",)),
    Mutation("linear_map_untransposed",
             "output projection: a plain Linear's weight read as the map without its transpose",
             "attnaudit/contributions/projection.py",
             "        return weight.t().float(), bias.float()",
             "        return weight.float(), bias.float()",
             ("tests/contributions/test_affine_map.py",)),
    Mutation("cache_tensors_always_shared",
             "cached step: every cache layer's tensors shared with the copy it selects from",
             "attnaudit/targets/hf/cache.py",
             "        return copy.deepcopy(cache)\n",
             "        pass\n",
             ("tests/targets/test_hf_cache_paths.py",)),
    Mutation("kept_logits_of_changed_weights",
             "kept decoding: its logits returned after a weight changed in place",
             "attnaudit/targets/kept_decoding.py",
             "            and _state(model) == last.state)",
             "            )",
             ("tests/targets/test_kept_decoding.py",)),
    Mutation("kept_logits_of_an_edited_decoding",
             "kept decoding: the logits of a decoding under an edit kept",
             "attnaudit/targets/kept_decoding.py",
             "decoding.num_beams == 1 and ACTIVE.capture is None",
             "decoding.num_beams == 1",
             ("tests/targets/test_kept_decoding.py",)),
    Mutation("edited_check_first_row",
             "edited prompts: the cached chunk's check runs its first copy, not its last",
             "attnaudit/interventions/edited_sources.py",
             "            last = torch.tensor([len(rows) - 1])",
             "            last = torch.tensor([0])",
             ("tests/interventions/test_edited_sources.py",)),
    Mutation("plans_timed_pass_run_again",
             "validity: the plan's timed pass without capture run again on the first batch",
             "attnaudit/validity/timing.py",
             "    if known_plain is not None and keep_logits and known_plain.logits is None:",
             "    if known_plain is not None:",
             ("tests/auditing/test_plan.py",)),
    Mutation("loo_priced_as_whole_sequences",
             "plan: leave-one-out's copies from the cached prefix priced as whole sequences",
             "attnaudit/interventions/edited_sources.py",
             "            whole += len(part) * (total - start) / total",
             "            whole += len(part)",
             ("tests/interventions/test_edited_sources.py",)),
    Mutation("validity_priced_without_handover",
             "plan: the validity audit priced as if the plan handed it no timed pass",
             "attnaudit/auditing/plan.py",
             "    return max(per_batch * batches - greedy - forced * plain_known, 0.0)",
             "    return max(per_batch * batches - greedy, 0.0)",
             ("tests/auditing/test_plan.py",)),
    Mutation("budget_ignores_backward_passes",
             "work budget: integrated gradients' points priced by their forward pass alone",
             "attnaudit/auditing/attribution_protocol.py",
             "ctx.sequence_multiply_adds() * (1 + steps)",
             "ctx.sequence_multiply_adds()",
             ("tests/interventions/test_work_budget.py",)),
    Mutation("short_search_still_runs",
             "work budget: an adversarial search shorter than its least runs anyway",
             "attnaudit/interventions/protocols.py",
             "        return steps if steps >= min(LEAST_ADVERSARIAL_STEPS, self.steps) else None",
             "        return steps",
             ("tests/interventions/test_work_budget.py",)),
    Mutation("budget_of_all_examples",
             "work budget: the faithfulness rows' budget spent over every example at once",
             "attnaudit/auditing/faithfulness_protocol.py",
             "            spent[example] = spent.get(example, 0) + bound",
             "            spent[0] = spent.get(0, 0) + bound",
             ("tests/interventions/test_faithfulness_budget.py",)),
    Mutation("merged_cell_written_shared",
             "row statistics: a cell handed over by merge written to without being copied",
             "attnaudit/analysis/stats.py",
             "        elif key in self._shared:\n            cells = cells.copy()\n",
             "",
             ("tests/analysis/test_row_stats_parts.py",)),
    Mutation("waiting_codes_counted_twice",
             "row statistics: codes counted into a histogram kept waiting, counted again on "
             "the next read", "attnaudit/analysis/stats.py",
             "            self.pending = []\n", "",
             ("tests/analysis/test_row_stats_parts.py",)),
    Mutation("waiting_codes_head_for_step",
             "row statistics: a waiting code's head and step swapped when counted in",
             "attnaudit/analysis/stats.py",
             "np.add.at(self.counted.reshape(-1), (rest // HIST_BINS * steps + step) * HIST_BINS",
             "np.add.at(self.counted.reshape(-1), (step * steps + rest // HIST_BINS) * HIST_BINS",
             ("tests/analysis/test_row_stats_parts.py",)),
)


def table_problems(mutations: tuple[Mutation, ...] | list[Mutation],
                   root: Path = ROOT) -> list[str]:
    """One line per mutation whose file, line or tests are not where the table says: its
    file is missing, its line occurs there other than exactly once (with the files under
    ``SOURCE_FOLDERS`` that hold it once, when it moved), or a test file is missing."""
    problems = []
    for m in mutations:
        path = root / m.path
        count = path.read_text(encoding="utf-8").count(m.old) if path.is_file() else None
        if count != 1:
            found = "file not found" if count is None else f"line found {count} times"
            moved = [str(p.relative_to(root)) for folder in SOURCE_FOLDERS
                     for p in sorted((root / folder).rglob("*.py"))
                     if p != path and p.read_text(encoding="utf-8").count(m.old) == 1]
            where = f"; the line is now in {', '.join(moved)}" if moved else ""
            problems.append(f"{m.name}: {m.path}: {found} ({m.old!r}){where}")
        for test in m.tests:
            if not (root / test.partition("::")[0]).is_file():
                problems.append(f"{m.name}: test file not found: {test}")
    return problems


def scratch_copy(dest: Path) -> None:
    """Tracked and untracked, non-ignored files of the checkout, copied under ``dest``, and
    ``dest/attnaudit_examples`` linked to ``dest/examples`` so that the copy's examples are
    the ones imported."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest / EXAMPLES_PACKAGE).symlink_to(dest / "examples", target_is_directory=True)


def run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    """Run ``tests`` in ``root`` with this interpreter: ("pass" | "fail" | "timeout", s)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", *tests]
    started = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started
    if result.returncode not in (0, 1):
        tail = (result.stdout + result.stderr)[-2000:]
        return f"error (pytest exit {result.returncode}): {tail}", time.perf_counter() - started
    return ("pass" if result.returncode == 0 else "fail"), time.perf_counter() - started


def plant(root: Path, mutation: Mutation) -> str:
    """Apply ``mutation`` in ``root`` (checked by :func:`table_problems`); return the
    original text to restore."""
    path = root / mutation.path
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(mutation.old, mutation.new, 1), encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check-table", action="store_true",
                        help="check that every mutation's file, line and tests are there, "
                             "and exit")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds per test run (default %(default)s)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:26} {m.path}: {m.planted}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutations: {sorted(unknown)}")
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    problems = table_problems(chosen)
    if problems:
        print("the mutation table is out of date (update MUTATIONS in scripts/"
              "mutation_check.py):", *problems, sep="\n  ", file=sys.stderr)
        return TABLE_OUT_OF_DATE
    if args.check_table:
        print(f"all {len(chosen)} mutations found where the table says")
        return 0
    with tempfile.TemporaryDirectory(prefix="attnaudit-mutants-") as scratch:
        root = Path(scratch)
        scratch_copy(root)
        targeted = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        status, seconds = run_tests(root, targeted, args.timeout)
        print(f"unmutated: targeted tests {status} ({seconds:.0f} s)", flush=True)
        if status != "pass":
            return 1
        caught = 0
        for m in chosen:
            original = plant(root, m)
            try:
                status, seconds = run_tests(root, m.tests, args.timeout)
            finally:
                (root / m.path).write_text(original, encoding="utf-8")
            verdict = "caught" if status in ("fail", "timeout") else "MISSED"
            if status.startswith("error"):
                verdict = "ERROR"
            caught += verdict == "caught"
            print(f"{verdict:7} {m.name:26} {m.planted} ({status}, {seconds:.0f} s)"[:400],
                  flush=True)
    print(f"\n{caught} of {len(chosen)} planted bugs caught")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
