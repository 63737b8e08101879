"""Known mutants, kept: each patch in this folder breaks the code on purpose, in a copy of the tree, and the
tests named for it must pass without it and fail, themselves, with it (issues 25 and 33; the harness:
tests/mutants/harness.py, its own tests: tests/mutants/test_harness.py).

A mutant that no longer applies fails here too: update the patch with the code it breaks.  Only mutants
that fail their test within a few seconds are kept; the others are listed in tests/README.md.
"""
from __future__ import annotations

import concurrent.futures
import os

import pytest

from tests.mutants.harness import HERE, baseline, check, kinds, named
from tests.procs import REPO

# patch -> the tests that must fail on it
MUTANTS = {
    # issue 39: a step function's compiling call is compile, between steps and in no share
    # torch.compile's compilations (torch._dynamo.callback) are compile inside the steps, on the stepping thread
    "torch_compile_is_communication.patch": (
        ["tests/client/test_session_compile.py::test_a_compilation_inside_a_step_is_carved_out_of_its_compute"]),
    "torch_compile_any_thread.patch": (
        ["tests/client/test_session_compile.py::test_a_compilation_on_another_thread_is_not_the_steps"]),
    "torch_compile_warm_up_dropped.patch": (
        ["tests/client/test_session_compile.py::test_a_warm_up_compilation_before_the_first_batch_is_compile_apart_from_the_first_step"]),
    "torch_compile_end_on_any_thread.patch": (
        ["tests/client/test_session_compile.py::test_a_compilation_that_ends_on_another_thread_is_dropped"]),
    "torch_compile_start_stays_open.patch": (
        ["tests/client/test_session_compile.py::test_a_start_without_its_end_leaves_nothing_open"]),
    "compile_call_in_the_step.patch": (
        ["tests/client/test_session_compile.py::test_the_call_that_compiled_is_compile_between_two_steps"]),
    "report_share_counts_compile.patch": (
        ["tests/report/test_compile_units.py::test_compile_is_listed_and_in_no_share"]),
    "evidence_step_time_keeps_compile.patch": (
        ["tests/phases/test_verdict.py::test_compile_is_in_no_share_wherever_the_client_put_it"]),
    "rule_input_share_counts_compile.patch": (
        ["tests/deploy/test_prometheus_rules.py::test_promtool_unit_tests_pass"]),
    # issue 38 (RSS): the idle agent without prometheus_client, two malloc arenas, process_* read by teye
    "render_negotiate_om_default.patch": ["tests/test_render.py::test_negotiation_is_prometheus_clients"],
    "daemon_registry_at_start.patch": (
        ["tests/test_agent_startup.py::test_the_idle_agent_never_imports_prometheus_clients_http_stack"]),
    "heap_arenas_unlimited.patch": (
        ["tests/test_agent_startup.py::test_the_idle_agent_never_imports_prometheus_clients_http_stack"]),
    "selfstats_fds_without_limit.patch": (
        ["tests/test_selfstats.py::test_limits_without_the_open_files_line_drop_the_two_fd_families"]),
    # issue 40: the node_exporter mode's hidden collectors, its map's subquery, its covered collectors; Grafana
    "render_hidden_exported.patch": (
        ["tests/test_exporter.py::test_a_hidden_collector_is_sampled_but_its_families_are_not_exported_by_either_renderer"]),
    "hostseries_derived_range_no_subquery.patch": (
        ["tests/deploy/test_node_exporter_mode.py::test_to_node_exporter_rewrites_selectors_ranges_and_nothing_else"]),
    "node_exporter_mode_keeps_cpu.patch": (
        ["tests/deploy/test_node_exporter_mode.py::"
         "test_the_mode_turns_off_the_covered_collectors_unless_one_is_turned_on_explicitly"]),
    "grafana_follows_redirects.patch": (
        ["tests/deploy/test_push.py::test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else"]),
    "input_bound_ratio_plus_2_points.patch": ["tests/phases/test_profile.py::test_input_bound_command"],
    "http_budget_logged_not_kept.patch": ["tests/web/test_attack.py"],
    "merged_1ns_gaps.patch": ["tests/phases/test_shares.py::test_no_share_exceeds_one_for_any_stream"],
    "pending_series_vanishes_with_jobs.patch": (
        ["tests/test_series_budget.py::test_jobs_scale_linearly_and_nothing_else_moves"]),
    "pmu_bad_alias_keeps_controller.patch": (
        ["tests/pmu/test_source.py::test_unparseable_description_and_unknown_format_field"]),
    # issues 38 and 40: the agent's own cost, dcgm-exporter's counters
    "gpu_ring_depth_not_capping_the_poll.patch": (
        ["tests/gpu/test_ring_cadence.py::"
         "test_a_shallow_ring_is_read_at_half_its_depth_and_loses_nothing_where_5_s_would"]),
    "gpu_first_poll_after_baseline_slow.patch": (
        ["tests/gpu/test_ring_cadence.py::"
         "test_the_ring_is_read_every_second_while_phase_intervals_wait_for_its_samples"]),
    "gpu_field_value_status_ignored.patch": (
        ["tests/gpu/test_source.py::test_each_dcgm_default_a_gpu_does_not_support_is_absent_alone"]),
    "allocation_grpc_imported_at_start.patch": (
        ["tests/sources/test_allocation.py::test_grpc_is_imported_only_when_a_kubelet_socket_exists"]),
    # issue 39: a process's overlapping intervals of one phase merged before they are added, GPU idle too
    "overlap_covered_gaps_not_advanced.patch": (
        ["tests/phases/test_overlap.py::test_1000_copies_of_one_interval_add_exactly_its_length"]),
    "overlap_gpu_idle_of_the_raw_interval.patch": (
        ["tests/phases/test_overlap.py::test_gpu_idle_of_overlapping_intervals_is_the_idle_of_their_union"]),
    # issue 39: a process's overlapping windows of fast steps (version 2) counted once in time
    "sums_window_copies_counted_again.patch": (
        ["tests/phases/test_overlap.py::test_1000_copies_of_one_window_add_exactly_one_window"]),
    "sums_partial_window_counted_whole.patch": (
        ["tests/phases/test_overlap.py::test_two_windows_overlapping_by_half_add_one_and_a_half_windows"]),
    "sums_empty_window_counted_per_copy.patch": (
        ["tests/phases/test_overlap.py::test_a_window_of_no_span_counts_its_steps_once_and_no_time"]),
    "sums_step_time_over_the_span.patch": (
        ["tests/phases/test_overlap.py::test_a_windows_phase_above_its_span_is_held_there_and_its_copies_add_nothing"]),
    "sums_part_steps_rounded_down.patch": (
        ["tests/phases/test_overlap.py::test_a_window_overlapping_the_last_by_a_microsecond_loses_no_step"]),
    "sums_windows_of_all_processes_merged.patch": (
        ["tests/phases/test_overlap.py::test_windows_of_two_processes_are_never_merged"]),
    # issue 38: the client sums what the agent cannot resolve (protocol version 2)
    "sums_window_past_the_resolution.patch": (
        ["tests/phases/test_sums.py::test_a_process_stepping_200000_times_a_second_sends_a_bounded_number_of_records"]),
    "sums_one_step_window_summed.patch": (
        ["tests/phases/test_sums.py::test_a_window_of_one_step_goes_as_its_intervals"]),
    "sums_fork_keeps_parent_window.patch": (
        ["tests/phases/test_sums.py::test_a_fork_in_the_middle_of_a_window_sends_only_its_own_steps"]),
    "sums_version_1_takes_sums.patch": (
        ["tests/phases/test_sums.py::test_a_version_1_message_ignores_sums_and_a_version_2_one_takes_them"]),
    "sums_window_not_split_at_sample_boundary.patch": (
        ["tests/phases/test_sums.py::test_a_window_spanning_a_gpu_sample_boundary_is_split_in_proportion"]),
    # issue 33: the client injected into jobs, the report, the web server's own counters
    "reporter_record_step_ignores_max_batch.patch": (
        ["tests/client/test_reporter.py::test_thousands_of_fast_steps_stay_within_the_batch_bound_and_all_count[record_step_exact]"]),
    "reporter_fork_keeps_parent_buffer.patch": (
        ["tests/client/test_reporter.py::test_a_forked_child_sends_only_its_own_records"]),
    "report_403_not_auth.patch": (
        ["tests/report/test_report_bad_input.py::test_credentials_forbidden_is_an_auth_failure"]),
    "report_tls_only_certificate_errors.patch": (
        ["tests/report/test_report_bad_input.py::test_https_url_to_a_plain_http_prometheus_is_a_tls_failure"]),
    "report_counter_reset_loses_new_value.patch": (
        ["tests/report/test_units.py::test_increase_is_exact_and_sums_across_resets"]),
    # issue 29: one run per run (the report of a job name's latest run)
    "report_runs_not_cut.patch": (
        ["tests/report/test_runs_e2e.py::test_the_latest_run_is_reported_and_the_earlier_one_named"]),
    # issue 39: step times with their resolution, the same runs on every call, short runs
    "report_step_quantile_a_point.patch": (
        ["tests/report/test_runs_e2e.py::test_the_109_ms_job_reads_109_ms_and_its_bucket"]),
    "report_grid_follows_the_call.patch": (
        ["tests/report/test_units.py::test_the_grid_ends_on_a_multiple_of_the_step_whatever_the_time_of_the_call"]),
    "report_short_run_zero_seconds.patch": (
        ["tests/report/test_runs_e2e.py::test_a_run_shorter_than_a_scrape_interval_has_its_step_time_and_says_short"]),
    # issue 29: evaluation apart (Keras' evaluate/predict, Session.evaluation)
    "session_eval_step_not_after_the_evaluation.patch": (
        ["tests/client/test_session_eval.py::test_an_evaluation_between_steps_is_eval_and_the_next_step_starts_after_it"]),
    "session_eval_that_steps_still_eval.patch": (
        ["tests/client/test_session_eval.py::test_an_evaluation_inside_another_counts_once_and_one_that_steps_trains"]),
    # issue 39: every loader a step reads trains; the flush before os._exit; a dropped optimizer's lead
    "session_ended_pass_trains.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_probe_and_an_ended_pass_are_eval_a_held_loader_is_not"]),
    "session_nograd_ignored.patch": (
        ["tests/client/test_session_loaders.py::test_a_held_loader_read_under_no_grad_is_eval_unless_it_trained"]),
    "session_dropped_loader_trains.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_probe_and_an_ended_pass_are_eval_a_held_loader_is_not"]),
    "session_held_loader_eval.patch": (
        ["tests/client/test_session_loaders.py::test_every_loader_a_step_reads_trains_in_any_order"]),
    "os_exit_no_flush.patch": (
        ["tests/client/test_session_loaders.py::test_os_exit_flushes_first_and_keeps_its_status"]),
    "leader_never_gone.patch": (
        ["tests/client/test_session_loaders.py::test_a_dropped_leading_optimizer_hands_the_lead_on"]),
    "webstats_client_path_as_label.patch": (
        ["tests/web/test_selfmetrics.py::test_basic_auth_failures_by_reason_and_requests_by_path_and_code"]),
    "webstats_connections_max_is_open_count.patch": (
        ["tests/web/test_selfmetrics.py::test_no_web_config_no_tls_no_auth_series"]),
    "http_in_flight_not_in_finally.patch": (
        ["tests/web/test_selfmetrics.py::test_timeouts_by_kind_with_slow_clients"]),
    # issue 36: Slurm inputs that are numbers, --print-env safe for eval
    "slurm_prolog_dots_as_index.patch": (
        ["tests/deploy/test_slurm_inputs.py::test_prolog_refuses_a_gpu_that_is_not_an_index_and_writes_nothing_outside"]),
    "print_env_unquoted.patch": (
        ["tests/client/test_print_env_quoting.py::test_eval_of_the_default_form_keeps_every_value_literal"]),
    # issue 39: mutants that survived the suite before it
    "run_no_agent_unsaid.patch": (
        ["tests/client/test_run_says.py::test_no_agent_on_the_socket_is_said_once_and_the_status_is_the_commands"]),
    "ranks_own_wait_without_spread.patch": (
        ["tests/phases/test_ranks.py::test_ranks_that_all_wait_alike_name_nobody_and_one_that_waits_more_is_named"]),
    "jobs_even_ranks_export_a_critical_rank.patch": (
        ["tests/phases/test_ranks.py::test_even_ranks_export_no_critical_rank"]),
    "cause_wakeup_delay_is_demand.patch": (
        ["tests/phases/test_cause.py::test_a_waiter_woken_into_a_loaded_run_queue_is_not_starved"]),
    "session_read_ahead_counted_at_fetch.patch": (
        ["tests/client/test_session_loaders.py::test_a_read_ahead_loader_counts_the_batches_the_steps_took"]),
    # issue 39: Lightning with DataLoader workers, eval and training to its own clock
    "session_eval_runs_past_the_training_iterator.patch": (
        ["tests/client/test_session_loaders.py::test_an_evaluation_ends_where_the_training_iterator_was_made"]),
    "session_before_the_evaluation_dropped.patch": (
        ["tests/client/test_session_loaders.py::test_what_comes_before_an_evaluation_is_training"]),
    "session_tf_data_before_the_evaluation_trains.patch": (
        ["tests/client/test_session_loaders.py::test_what_comes_before_a_tf_data_evaluation_is_in_neither"]),
    # the case whose names differ: the other three say nothing with or without the mutant
    "client_job_name_difference_unsaid.patch": (
        ["tests/client/test_run_says.py::test_a_scripts_own_job_name_wins_over_job_and_a_difference_is_said"
         "[mine-other-mine-True]"]),
    "client_pod_name_hostname_first.patch": ["tests/client/test_zero_code.py::test_job_name_order"],
    "client_off_switch_skips_users_sitecustomize.patch": (
        ["tests/client/test_zero_code.py::test_the_off_switch_still_runs_the_users_sitecustomize"]),
    # issue 36: every file under --procfs, --sysfs and the cgroup root bounded; job ids only ASCII digits
    "files_not_regular_read.patch": (
        ["tests/sources/test_bounded_reads.py::test_fifo_and_device_refused_without_blocking_counted_and_named_once"]),
    "files_no_size_bound.patch": (
        ["tests/sources/test_bounded_reads.py::test_a_huge_stat_is_refused_after_the_bound_not_read_whole"]),
    "cgroup_job_dir_trailing_newline.patch": (
        ["tests/sources/test_bounded_reads.py::test_bad_job_dir_names_are_counted_named_and_the_rest_exact"]),
    # issue 36: job limits that cannot lock others out, ended runs kept until scraped, pods as tenants
    "job_limit_no_fair_share_eviction.patch": (
        ["tests/phases/test_job_limits.py::test_two_flooding_uids_never_lock_out_a_victims_first_job"]),
    "ended_run_keep_off_by_one.patch": (
        ["tests/phases/test_runs.py::test_ended_runs_give_way_to_a_new_job_at_the_limits"]),
    "pods_not_in_job_key.patch": (
        ["tests/phases/test_job_limits.py::test_two_pods_of_one_uid_are_kept_apart"]),
    # issue 40: absent hardware and node_exporter's flag conventions
    "absent_after_it_worked.patch": (
        ["tests/test_collector_states.py::test_absent_until_it_worked_then_down_and_failures_counted_only_for_down"]),
    "cli_bad_flag_top_level_usage.patch": (
        ["tests/test_cli_flags.py::test_a_bad_flag_prints_the_subcommands_own_usage"]),
    # issues 36 and 39: the report's HTTP client, its bad answers and flags
    "report_credentials_sent_to_any_host.patch": (
        ["tests/report/test_report_client.py::test_a_redirect_to_another_host_is_followed_without_the_credentials"]),
    "report_follow_redirects_ignored.patch": ["tests/report/test_report_client.py::test_follow_redirects_false_is_honoured"],
    "report_https_to_http_followed.patch": ["tests/report/test_report_client.py::test_https_to_plain_http_is_never_followed"],
    "report_answer_read_without_bound.patch": (
        ["tests/report/test_report_client.py::test_an_endless_answer_without_a_length_is_cut_at_the_bound"]),
    # the two cases of the 15 that give a series without string labels (the other 13 pass on it; the suite
    # runs them all, the harness's own runs need only these)
    "report_series_without_metric_accepted.patch": (
        ["tests/report/test_report_client.py::test_a_malformed_answer_is_exit_1_naming_the_query[matrix_without_metric]",
         "tests/report/test_report_client.py::test_a_malformed_answer_is_exit_1_naming_the_query[matrix_label_not_string]"]),
    "report_cpus_not_range_checked.patch": ["tests/report/test_report_client.py::test_a_flag_out_of_range_is_a_usage_error"],
    "http_refused_request_not_counted.patch": (
        ["tests/web/test_selfmetrics.py::test_every_refused_request_counts_by_path_and_code"]),
    # issue 36: basic auth that cannot starve the scrape
    "auth_verified_credential_hashed_again.patch": (
        ["tests/web/test_auth_flood.py::test_hashing_bounds_per_client_and_in_all_while_bcrypt_is_stuck"]),
    "auth_no_client_bound.patch": (
        ["tests/web/test_auth_flood.py::test_hashing_bounds_per_client_and_in_all_while_bcrypt_is_stuck"]),
    "auth_no_server_bound.patch": (
        ["tests/web/test_auth_flood.py::test_hashing_bounds_per_client_and_in_all_while_bcrypt_is_stuck"]),
    "auth_failure_evicts_verified.patch": ["tests/web/test_tls.py::test_bcrypt_results_are_cached"],
    "auth_held_refusal_not_evictable.patch": (
        ["tests/web/test_auth_flood.py::test_refusals_held_by_the_throttle_delay_never_fill_the_connection_table"]),
    "auth_rate_limit_before_auth.patch": (
        ["tests/web/test_auth_flood.py::test_clients_that_never_authenticate_cannot_spend_the_rate_limit"]),
    # issue 37: communication seen
    "ranks_communication_rule_without_spread.patch": (
        ["tests/phases/test_ranks.py::test_ranks_that_exchange_alike_name_nobody_by_communication"]),
    "links_carrier_changes_not_errors.patch": (
        ["tests/phases/test_links.py::test_errors_and_a_flapping_carrier_come_before_bandwidth"]),
    "link_gauge_latest_not_at_window_end.patch": (
        ["tests/phases/test_links.py::test_history_differences_counters_over_the_window"]),
    "session_carve_takes_any_phase.patch": (
        ["tests/client/test_ddp_bad_input.py::"
         "test_a_held_step_goes_out_at_the_next_with_its_exposed_exchange_carved_from_compute_only"]),
    "qdisc_children_exported.patch": ["tests/sources/test_qdisc.py::test_a_replayed_dump_with_known_values"],
    "tf_exchange_taken_as_observed.patch": (
        ["tests/phases/test_ranks.py::test_tensorflow_ranks_have_no_scaling_efficiency_and_the_exchange_not_observed"]),
    # issue 38: teye profile's timeline readable at any step rate, device idle from GPU samples only
    "profile_fast_steps_not_banded.patch": (
        ["tests/phases/test_profile_timeline.py::test_fast_steps_read_as_steady_bands_not_a_block_of_ticks"]),
    "profile_idle_from_phase_gaps.patch": (
        ["tests/phases/test_profile_timeline.py::test_a_cpu_only_job_has_no_hatched_idle_and_its_gpu_lane_says_so"]),
}


# mutants whose named tests are marked measures (tests/kinds.py): ./dev.sh test checks them in its serial pass, one
# at a time; the others in its parallel pass, beside other work.  The baseline says each named test's kind, and a
# mutant listed here whose tests do not measure, or one left out whose tests do, fails.
MEASURING = {
    "input_bound_ratio_plus_2_points.patch",   # teye profile's share against the loop's perf_counter
}


def _param(patch):
    if patch in MEASURING:
        return pytest.param(patch, marks=pytest.mark.measures("its named tests measure (MEASURING)"))
    return patch


def test_every_patch_here_is_listed():
    assert sorted(f for f in os.listdir(HERE) if f.endswith(".patch")) == sorted(MUTANTS)
    assert MEASURING <= set(MUTANTS), sorted(MEASURING - set(MUTANTS))


WORKERS = 2   # mutants checked at once: each is a copy of the tree and a pytest process of its own


@pytest.fixture(scope="module")
def checked(request, tmp_path_factory):
    """Every selected mutant checked (the harness's steps 2 and 3), WORKERS at a time, after one run of all
    their named tests on one copy of the tree (step 1): patch -> what its check raised (None: it failed its
    tests as it must).  Each patch's test raises that again.  Step 1 runs alone, so a test that passes only
    on a quiet machine cannot make a patch look caught there; a named test failing on a mutant for a neighbour's
    load instead would, which is why the check insists the failure is the named test's own call."""
    chosen = sorted({it.callspec.params["patch"] for it in request.session.items
                     if getattr(it, "callspec", None) and "patch" in it.callspec.params
                     and it.name.startswith("test_the_named_tests_fail_on_the_mutant")})
    base = baseline(REPO, [t for p in chosen for t in MUTANTS[p]], str(tmp_path_factory.mktemp("base")))
    kind = kinds(base)

    def one(patch):
        measuring = sorted(n for n, k in kind.items() if k == "measures" and named(n, MUTANTS[patch]))
        if bool(measuring) != (patch in MEASURING):
            return AssertionError(f"{patch}: its named tests {'measure' if measuring else 'do not measure'} "
                                  f"({', '.join(measuring) or 'none is marked measures'}): "
                                  f"{'list it in' if measuring else 'take it out of'} MEASURING")
        try:
            check(REPO, os.path.join(HERE, patch), MUTANTS[patch], str(tmp_path_factory.mktemp("m")), base=base)
        except BaseException as e:   # AssertionError, pytest's skip and fail outcomes: raised by its test
            return e
        return None

    # WORKERS at a time, then those whose tests measure one at a time (nothing beside them: the serial pass)
    calm = [p for p in chosen if p not in MEASURING]
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        got = dict(zip(calm, pool.map(one, calm)))
    got.update((p, one(p)) for p in chosen if p in MEASURING)
    return got


@pytest.mark.parametrize("patch", [_param(p) for p in sorted(MUTANTS)])
def test_the_named_tests_fail_on_the_mutant(patch, checked):
    if checked[patch] is not None:
        raise checked[patch]
