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
    "webstats_client_path_as_label.patch": (
        ["tests/web/test_selfmetrics.py::test_basic_auth_failures_by_reason_and_requests_by_path_and_code"], False),
    "webstats_connections_max_is_open_count.patch": (
        ["tests/web/test_selfmetrics.py::test_no_web_config_no_tls_no_auth_series"], False),
    "http_in_flight_not_in_finally.patch": (
        ["tests/web/test_selfmetrics.py::test_timeouts_by_kind_with_slow_clients"], False),
    # issue 36: Slurm inputs that are numbers, --print-env safe for eval
    "slurm_prolog_dots_as_index.patch": (
        ["tests/deploy/test_slurm_inputs.py::test_prolog_refuses_a_gpu_that_is_not_an_index_and_writes_nothing_outside"],
        False),
    "print_env_unquoted.patch": (
        ["tests/client/test_print_env_quoting.py::test_eval_of_the_default_form_keeps_every_value_literal"], False),
    # issue 39: mutants that survived the suite before it
    "client_pod_name_hostname_first.patch": (["tests/client/test_zero_code.py::test_job_name_order"], False),
    "client_off_switch_skips_users_sitecustomize.patch": (
        ["tests/client/test_zero_code.py::test_the_off_switch_still_runs_the_users_sitecustomize"], False),
    # issue 36: every file under --procfs, --sysfs and the cgroup root bounded; job ids only ASCII digits
    "files_not_regular_read.patch": (
        ["tests/sources/test_bounded_reads.py::test_fifo_and_device_refused_without_blocking_counted_and_named_once"],
        False),
    "files_no_size_bound.patch": (
        ["tests/sources/test_bounded_reads.py::test_a_huge_stat_is_refused_after_the_bound_not_read_whole"], False),
    "cgroup_job_dir_trailing_newline.patch": (
        ["tests/sources/test_bounded_reads.py::test_bad_job_dir_names_are_counted_named_and_the_rest_exact"], False),
}


def test_every_patch_here_is_listed():
    assert sorted(f for f in os.listdir(HERE) if f.endswith(".patch")) == sorted(MUTANTS)


@pytest.mark.parametrize("patch", sorted(MUTANTS))
def test_the_named_tests_fail_on_the_mutant(tmp_path, patch):
    tests, rebuild = MUTANTS[patch]
    check(REPO, os.path.join(HERE, patch), tests, rebuild, str(tmp_path))
