"""Known mutants, kept: each patch in this folder breaks the code on purpose, in a copy of the tree, and the
tests named for it must pass without it and fail, themselves, with it (issues 25 and 33; the harness:
tests/mutants/harness.py, its own tests: tests/mutants/test_harness.py).

A mutant that no longer applies fails here too: update the patch with the code it breaks.  Only mutants
that fail their test within a few seconds are kept; the others are listed in tests/README.md.
"""
from __future__ import annotations

import os

import pytest

from tests.mutants.harness import HERE, check
from tests.procs import REPO

# patch -> (tests that must fail on it, whether the C helpers must be rebuilt)
MUTANTS = {
    "input_bound_ratio_plus_2_points.patch": (["tests/phases/test_profile.py::test_input_bound_command"], False),
    "http_budget_logged_not_kept.patch": (["tests/web/test_attack.py"], False),
    "c_decoder_records_limit_per_list.patch": (
        ["tests/phases/test_fast.py::test_mutated_datagrams_agree_with_python"], True),
    "c_table_touching_pieces_not_merged.patch": (
        ["tests/phases/test_fast_table.py::test_generated_histories_leave_the_same_state"], True),
    "merged_1ns_gaps.patch": (["tests/phases/test_shares.py::test_no_share_exceeds_one_for_any_stream"], False),
    "pending_series_vanishes_with_jobs.patch": (
        ["tests/test_series_budget.py::test_jobs_scale_linearly_and_nothing_else_moves"], False),
    "serve_cost_always_python.patch": (["tests/phases/test_bench_serve_cost.py"], False),
    "pmu_bad_alias_keeps_controller.patch": (
        ["tests/pmu/test_source.py::test_unparseable_description_and_unknown_format_field"], False),
    # issue 33: the client injected into jobs, the report, the web server's own counters
    "reporter_record_step_ignores_max_batch.patch": (
        ["tests/client/test_reporter.py::test_thousands_of_fast_steps_stay_within_the_batch_bound_and_all_count"],
        False),
    "reporter_fork_keeps_parent_buffer.patch": (
        ["tests/client/test_reporter.py::test_a_forked_child_sends_only_its_own_records"], False),
    "report_403_not_auth.patch": (
        ["tests/report/test_report_bad_input.py::test_credentials_forbidden_is_an_auth_failure"], False),
    "report_tls_only_certificate_errors.patch": (
        ["tests/report/test_report_bad_input.py::test_https_url_to_a_plain_http_prometheus_is_a_tls_failure"], False),
    "report_counter_reset_loses_new_value.patch": (
        ["tests/report/test_units.py::test_increase_is_exact_and_sums_across_resets"], False),
    # issue 29: one run per run (the report of a job name's latest run)
    "report_runs_not_cut.patch": (
        ["tests/report/test_runs_e2e.py::test_the_latest_run_is_reported_and_the_earlier_one_named"], False),
    # issue 29: evaluation apart (Keras' evaluate/predict, Session.evaluation)
    "session_eval_step_not_after_the_evaluation.patch": (
        ["tests/client/test_session_eval.py::test_an_evaluation_between_steps_is_eval_and_the_next_step_starts_after_it"],
        False),
    "session_eval_that_steps_still_eval.patch": (
        ["tests/client/test_session_eval.py::test_an_evaluation_inside_another_counts_once_and_one_that_steps_trains"],
        False),
    # issue 39: every loader a step reads trains; the flush before os._exit; a dropped optimizer's lead
    "session_ended_pass_trains.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_probe_and_an_ended_pass_are_eval_a_held_loader_is_not"],
        False),
    "session_nograd_ignored.patch": (
        ["tests/client/test_session_loaders.py::test_a_held_loader_read_under_no_grad_is_eval_unless_it_trained"],
        False),
    "session_dropped_loader_trains.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_probe_and_an_ended_pass_are_eval_a_held_loader_is_not"],
        False),
    "session_held_loader_eval.patch": (
        ["tests/client/test_session_loaders.py::test_every_loader_a_step_reads_trains_in_any_order"], False),
    "os_exit_no_flush.patch": (
        ["tests/client/test_session_loaders.py::test_os_exit_flushes_first_and_keeps_its_status"], False),
    "leader_never_gone.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_leading_optimizer_hands_the_lead_on"], False),
    "webstats_client_path_as_label.patch": (
        ["tests/web/test_selfmetrics.py::test_basic_auth_failures_by_reason_and_requests_by_path_and_code"], False),
    "webstats_connections_max_is_open_count.patch": (
        ["tests/web/test_selfmetrics.py::test_no_web_config_no_tls_no_auth_series"], False),
    "http_in_flight_not_in_finally.patch": (
        ["tests/web/test_selfmetrics.py::test_timeouts_by_kind_with_slow_clients"], False),
}


def test_every_patch_here_is_listed():
    assert sorted(f for f in os.listdir(HERE) if f.endswith(".patch")) == sorted(MUTANTS)


@pytest.mark.parametrize("patch", sorted(MUTANTS))
def test_the_named_tests_fail_on_the_mutant(tmp_path, patch):
    tests, rebuild = MUTANTS[patch]
    check(REPO, os.path.join(HERE, patch), tests, rebuild, str(tmp_path))
