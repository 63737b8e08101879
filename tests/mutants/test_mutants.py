"""Known mutants, kept: each patch in this folder breaks the code on purpose, in a copy of the tree, and the
tests named for it must pass without it and fail, themselves, with it (issues 25 and 33; the harness:
tests/mutants/harness.py, its own tests: tests/mutants/test_harness.py).

A mutant that no longer applies fails here too: update the patch with the code it breaks.  Only mutants
that fail their test within a few seconds are kept; the others are listed in tests/README.md.
"""
from __future__ import annotations

import concurrent.futures
import os
import queue
import warnings

import pytest

from tests.kinds import run_ids
from tests.mutants.harness import HERE, Tree, baseline, check, kinds, named
from tests.procs import REPO

# patch -> the tests that must fail on it
MUTANTS = {
    # teye report --compare: an interval holding only a run's edge is not its noise
    "compare_counts_edge_intervals.patch": (
        ["tests/report/test_compare_units.py::test_an_interval_with_only_the_runs_last_steps_is_an_edge_and_left_out"]),
    "compare_band_without_floor.patch": (
        ["tests/report/test_compare_units.py::test_the_band_is_never_narrower_than_its_floor",
         "tests/report/test_compare_units.py::test_figures_shares_and_world_sizes"]),
    # issue 47: the flush thread is the backstop of a loop that sends its own records
    "flush_thread_without_backstop.patch": (
        ["tests/client/test_reporter.py::"
         "test_the_flush_thread_wakes_a_few_times_a_second_while_the_loop_sends_its_own_records"]),
    # issue 49: the phases collector's idle pace
    "idle_pace_never_hurried.patch": (
        ["tests/phases/test_idle_pace.py::"
         "test_a_source_slower_while_idle_shares_the_slower_grids_ticks_and_is_hurried_back",
         "tests/phases/test_idle_pace.py::"
         "test_an_idle_phases_collector_is_read_at_its_idle_pace_and_at_once_when_a_job_speaks"]),
    "idle_pace_off_the_grid.patch": (
        ["tests/phases/test_idle_pace.py::"
         "test_a_source_slower_while_idle_shares_the_slower_grids_ticks_and_is_hurried_back"]),
    "idle_pace_receiver_tells_no_one.patch": (
        ["tests/phases/test_idle_pace.py::test_a_connection_without_a_message_brings_an_idle_read_back_at_once"]),
    "idle_pace_gpus_unknown_to_a_new_job.patch": (
        ["tests/phases/test_idle_pace.py::"
         "test_a_new_jobs_first_datagrams_are_credited_to_the_gpus_sampled_since_the_idle_read"]),
    "idle_pace_blind_to_what_came.patch": (
        ["tests/phases/test_idle_pace.py::"
         "test_the_pace_asked_is_the_configured_one_once_anything_came_since_the_idle_read"]),
    # issue 47: the forward's hooks narrow to the modules called outermost after the first steps
    "forwards_never_narrow.patch": (
        ["tests/client/test_torch_forwards.py::"
         "test_the_hooks_narrow_to_the_outermost_modules_and_the_others_run_unhooked"]),
    "forwards_never_widen.patch": (
        ["tests/client/test_torch_forwards.py::"
         "test_a_step_without_a_forward_of_the_roots_brings_the_global_hooks_back"]),
    "forwards_narrow_keeps_the_global_hooks.patch": (
        ["tests/client/test_torch_forwards.py::"
         "test_the_hooks_narrow_to_the_outermost_modules_and_the_others_run_unhooked"]),
    "forwards_change_after_a_compile.patch": (
        ["tests/client/test_torch_forwards.py::test_after_a_compilation_the_hooks_stay_as_they_are"]),
    "forwards_roots_never_learned.patch": (
        ["tests/client/test_parts.py::test_each_part_within_5_points_of_the_scripts_own_clock[plain]"]),
    # issue 48's flood, mended at its cause: each client on a connection of its own
    "conn_refuse_drops_what_was_sent.patch": (
        ["tests/phases/test_connections.py::"
         "test_a_uid_over_its_connection_limit_is_refused_and_its_client_loses_nothing"]),
    "conn_limit_per_uid_ignored.patch": (
        ["tests/phases/test_connections.py::"
         "test_a_uid_over_its_connection_limit_is_refused_and_its_client_loses_nothing"]),
    "client_only_datagrams.patch": (
        ["tests/phases/test_connections.py::"
         "test_a_reporter_sends_on_a_connection_of_its_own_attributed_by_the_kernel"]),
    "idle_read_blind_to_connections.patch": (
        ["tests/phases/test_connections.py::test_an_idle_read_follows_connections_that_carry_no_message"]),
    "rebind_keeps_the_old_listener.patch": (
        ["tests/phases/test_connections.py::test_a_rebind_listens_again"]),
    "conn_backlog_shed_by_estimate.patch": (
        ["tests/phases/test_cost_budget.py::"
         "test_sixty_four_processes_of_one_uid_get_one_uids_share_and_a_job_of_another_uid_is_exact"]),
    "receiver_debt_from_a_stale_clock.patch": (
        ["tests/phases/test_cost_budget.py::"
         "test_three_uids_flooding_expensive_datagrams_are_shed_and_a_fourth_uids_job_is_exact"]),
    # issue 49: the 8-GPU replay's idle cost: a ring read is added to the timeline at once; one value union per value
    "timeline_add_many_overlaps.patch": (
        ["tests/phases/test_attribution.py::test_a_ring_read_added_at_once_is_each_sample_added_in_turn"]),
    "replay_one_value_for_every_sample.patch": (
        ["tests/gpu/test_replay.py::test_synthetic_trace_replay_yields_the_documented_gaps"]),
    # issue 49: idle CPU: the phases collector's idle read hands out the last reading until a datagram comes
    "phases_idle_read_ignores_the_counters.patch": (
        ["tests/phases/test_receiver.py::test_an_idle_read_is_the_last_one_until_a_datagram_moves_a_counter"]),
    "phases_idle_read_kept_with_a_job.patch": (
        ["tests/phases/test_receiver.py::test_an_idle_read_is_the_last_one_until_a_datagram_moves_a_counter"]),
    "phases_idle_read_learns_no_gpus.patch": (
        ["tests/phases/test_receiver.py::test_an_idle_read_is_the_last_one_until_a_datagram_moves_a_counter"]),
    # issue 49: idle CPU: an equal reading is not formatted again, a format is joined when asked for
    "render_equal_readings_by_type_only.patch": (
        ["tests/test_render.py::"
         "test_a_new_reading_equal_to_the_last_reuses_its_lines_and_a_changed_value_is_written_at_the_next_scrape"]),
    "render_one_format_joined_for_both.patch": (
        ["tests/test_render.py::test_each_format_is_joined_when_first_asked_for_and_kept"]),
    "render_second_collector_series_not_checked.patch": (
        ["tests/test_render.py::test_fallbacks_match_prometheus_client"]),
    # issue 49: idle CPU: a read through the sampler thread publishes one snapshot; a stuck one is marked in flight
    "sampler_stuck_read_never_marked_in_flight.patch": (
        ["tests/test_sampler_pace.py::test_a_hanging_source_hands_the_schedule_over_and_is_not_piled_up"]),
    "sampler_marks_a_returned_read_in_flight.patch": (
        ["tests/test_sampler_pace.py::test_a_read_that_returned_is_never_marked_in_flight_afterwards"]),
    "sampler_thread_publishes_each_reads_start.patch": (
        ["tests/test_sampler_pace.py::"
         "test_the_sampler_thread_publishes_a_read_once_it_returned_and_read_once_publishes_its_start"]),
    # issue 49: an idle agent's resident memory: no OpenSSL without TLS, no YAML parser without a file
    "lean_asyncio_imports_ssl.patch": (
        ["tests/web/test_lean.py::test_an_agent_without_a_web_config_maps_no_openssl_and_serves"]),
    "config_yaml_imported_always.patch": (
        ["tests/web/test_lean.py::test_an_agent_without_a_web_config_maps_no_openssl_and_serves"]),
    # issue 49: node_exporter's other default families
    "netstat_garbled_optional_file_fails_the_pass.patch": (
        ["tests/sources/test_node_families.py::test_a_garbled_optional_netstat_file_loses_only_its_families"]),
    "netclass_attributes_never_read_again.patch": (
        ["tests/sources/test_node_families.py::test_static_attributes_are_read_once_a_minute_and_at_once_when_the_link_changes"]),
    "netclass_link_change_keeps_cached_attributes.patch": (
        ["tests/sources/test_node_families.py::test_static_attributes_are_read_once_a_minute_and_at_once_when_the_link_changes"]),
    "netclass_bonding_masters_read_as_an_interface.patch": (
        ["tests/sources/test_node_families.py::test_bonding_masters_beside_the_interfaces_is_not_an_interface"]),
    "md_raid0_without_its_members.patch": (
        ["tests/sources/test_node_families.py::test_every_new_family_equals_node_exporters_golden_output",
         "tests/sources/test_node_families.py::test_md_arrays_by_hand"]),
    "md_pending_resync_in_sync.patch": (
        ["tests/sources/test_node_families.py::test_every_new_family_equals_node_exporters_golden_output"]),
    "softnet_cpu_from_the_line.patch": (
        ["tests/sources/test_node_families.py::test_softnet_labels_the_kernels_cpu_number_where_it_prints_one"]),
    "selinux_less_host_says_nothing.patch": (
        ["tests/sources/test_node_families.py::test_an_selinux_less_host_reads_not_enabled_and_an_selinux_host_its_modes"]),
    "timex_pps_jitter_ignores_sta_nano.patch": (
        ["tests/sources/test_timex.py::test_loop_tick_and_pps_fields_in_node_exporters_units"]),
    "systemd_include_searched.patch": (
        ["tests/sources/test_systemd.py::test_include_and_exclude_are_whole_name_matches"]),
    # issue 46: teye trace summarize: overlapped communication, a collective's own ops, self time
    # issue 46: ranks agree on the first traced step (CI stop 55: one started a step before the other)
    "trace_peers_proposals_ignored.patch": (
        ["tests/trace/test_request.py::test_ranks_that_end_a_step_on_either_side_of_start_after_trace_the_same_steps"]),
    "trace_peer_out_of_lockstep_waited_for.patch": (
        ["tests/trace/test_request.py::test_a_peer_out_of_lockstep_or_a_bad_status_is_not_waited_for"]),
    "trace_overlapped_comm_is_exposed.patch": (
        ["tests/trace/test_summary.py::test_exposed_and_overlapped_communication_on_the_host"]),
    "trace_collective_children_are_compute.patch": (
        ["tests/trace/test_summary.py::test_exposed_and_overlapped_communication_on_the_host"]),
    "trace_self_time_keeps_children.patch": ["tests/trace/test_summary.py::test_top_ops_by_self_time"],
    # issue 45: the step's parts and memory creep
    "parts_spans_counted_twice.patch": (
        ["tests/client/test_parts_device.py::test_host_parts_are_their_intervals_inside_compute_never_counted_twice"]),
    "parts_device_read_before_passed.patch": (
        ["tests/client/test_parts_device.py::"
         "test_pairs_are_read_once_the_device_passed_them_in_stream_order_without_synchronising"]),
    "parts_device_not_capped.patch": (
        ["tests/client/test_parts_device.py::test_device_parts_are_capped_at_the_steps_compute_and_the_rest_carried"]),
    "parts_above_compute_taken.patch": (
        ["tests/phases/test_parts.py::"
         "test_parts_above_the_compute_they_came_with_are_not_taken_and_other_never_goes_down"]),
    "creep_one_time_jump.patch": (
        ["tests/phases/test_parts.py::test_creep_warm_up_a_cache_a_sawtooth_slow_growth_and_noise_are_not"]),
    "creep_fall_back_allowed.patch": (
        ["tests/phases/test_parts.py::test_creep_warm_up_a_cache_a_sawtooth_slow_growth_and_noise_are_not"]),
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
    # issue 47: one definition of every figure (agent/phases/definitions.py): eval beside training, compile
    # out of the exported step seconds too
    "report_share_counts_eval.patch": (
        ["tests/report/test_compile_units.py::test_eval_is_beside_training_and_in_no_share"]),
    "rule_input_share_counts_eval.patch": (
        ["tests/deploy/test_prometheus_rules.py::test_promtool_unit_tests_pass"]),
    "step_hist_keeps_compile.patch": (
        ["tests/phases/test_jobs.py::test_step_seconds_counters_leave_a_compile_inside_a_step_out"]),
    # issue 47: a GAN's step is its loop iteration (the optimizer that steps least)
    "gan_first_optimizer_leads.patch": (
        ["tests/client/test_session_optimizers.py::test_a_gan_step_is_its_loop_iteration"]),
    # issue 47: a step begins where the training thread begins it; its samples are the batches it took
    "producer_first_step_from_its_fetch.patch": (
        ["tests/client/test_session_optimizers.py::test_a_producer_threads_batches_are_the_steps_that_took_them"]),
    "producer_step_takes_the_fill.patch": (
        ["tests/client/test_session_optimizers.py::test_a_producer_threads_batches_are_the_steps_that_took_them"]),
    # issue 47: a steps-only data-parallel job whose exchange alone crosses the threshold is communication
    "steps_only_exchange_not_judged.patch": (
        ["tests/phases/test_verdict.py::test_a_steps_only_job_whose_exchange_crosses_the_threshold_is_communication"]),
    # issue 47: a DataLoader read inside a generator of the job's own is steps only, never compute
    "own_generator_is_compute.patch": (
        ["tests/client/test_session_optimizers.py::test_a_dataloader_read_in_a_generator_of_the_jobs_own_is_steps_only"]),
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
    "reporter_thread_drops_after_one_wait.patch": (
        ["tests/client/test_reporter.py::test_a_queue_full_for_longer_than_one_wait_loses_nothing_the_buffer_can_hold"]),
    "reporter_fork_keeps_parent_buffer.patch": (
        ["tests/client/test_reporter.py::test_a_forked_child_sends_only_its_own_records"]),
    "report_403_not_auth.patch": (
        ["tests/report/test_report_bad_input.py::test_credentials_forbidden_is_an_auth_failure"]),
    "report_tls_only_certificate_errors.patch": (
        ["tests/report/test_report_bad_input.py::test_https_url_to_a_plain_http_prometheus_is_a_tls_failure"]),
    "report_counter_reset_loses_new_value.patch": (
        ["tests/report/test_units.py::test_increase_is_exact_and_sums_across_resets"]),
    # issue 47: a Slurm job runs while it holds its GPU or cgroup; a training job by name, while it says so
    "report_slurm_job_running_from_its_loop_only.patch": (
        ["tests/report/test_state_units.py::test_a_slurm_job_runs_while_it_holds_its_gpu_a_training_job_while_it_says_so"]),
    "report_train_job_running_from_its_slurm_job.patch": (
        ["tests/report/test_state_units.py::test_a_slurm_job_runs_while_it_holds_its_gpu_a_training_job_while_it_says_so"]),
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
    # issue 49: a true host view from a container; the coalesced sampler
    "filesystem_rootfs_prefix_in_label.patch": (
        ["tests/sources/test_filesystem.py::test_container_mount_table_keeps_the_hosts_mounts_without_the_prefix"]),
    "filesystem_not_host_not_raised.patch": (
        ["tests/sources/test_filesystem.py::test_no_host_root_is_one_named_state_not_an_error_per_mount"]),
    "filesystem_rootfs_self_statted.patch": (
        ["tests/sources/test_filesystem.py::test_rootfs_bound_onto_itself_is_counted_not_statted"]),
    "sampler_hang_not_handed_over.patch": (
        ["tests/test_sampler_pace.py::test_a_hanging_source_hands_the_schedule_over_and_is_not_piled_up"]),
    # issue 49: idle CPU: the watchdog sleeps until hang_s after the next slot; a read before its look wakes it
    "sampler_watchdog_never_woken_when_planned.patch": (
        ["tests/test_sampler_pace.py::"
         "test_the_idle_watchdog_looks_hang_s_after_the_next_slot_and_a_read_before_it_wakes_it"]),
    "sampler_watchdog_looks_at_the_slot.patch": (
        ["tests/test_sampler_pace.py::"
         "test_the_idle_watchdog_looks_hang_s_after_the_next_slot_and_a_read_before_it_wakes_it"]),
    # issue 49: idle CPU: a source's /proc files kept open and read again from offset 0
    "kept_files_never_kept.patch": (
        ["tests/sources/test_kept_files.py::test_a_kernel_file_is_kept_open_and_made_anew_at_each_read"]),
    "kept_files_link_not_checked.patch": (
        ["tests/sources/test_kept_files.py::test_an_empty_regular_file_kept_is_read_by_its_path_once_written_or_replaced"]),
    "kept_files_size_not_checked_again.patch": (
        ["tests/sources/test_kept_files.py::test_an_empty_regular_file_kept_is_read_by_its_path_once_written_or_replaced"]),
    "kept_files_unreadable_kept_again.patch": (
        ["tests/sources/test_kept_files.py::test_a_kept_file_that_cannot_be_read_again_is_read_by_its_path_and_never_kept_again"]),
    "netstat_conntrack_fds_not_set_aside.patch": (
        ["tests/sources/test_kept_files.py::"
         "test_each_source_keeps_no_more_descriptors_than_it_asks_the_http_server_to_leave_aside"]),
    # issue 49: idle CPU: start-up's objects frozen out of the full collections, its cycles collected first
    "daemon_start_up_not_frozen.patch": (
        ["tests/test_agent_startup.py::test_the_idle_agent_never_imports_prometheus_clients_http_stack"]),
    "heap_freeze_keeps_start_ups_cycles.patch": (
        ["tests/test_heap.py::test_freeze_collects_start_ups_cycles_then_leaves_what_is_left_out_of_the_collections"]),
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
    # issue 48: a reload never weakens the guard
    "webconfig_reload_drops_users.patch": (
        ["tests/web/test_reload_guard.py::test_a_reload_that_drops_basic_auth_is_refused_and_the_old_guard_stays"
         "[users section removed]"]),
    "webconfig_reload_weakens_client_certs.patch": (
        ["tests/web/test_reload_guard.py::test_weakened_client_certificates_are_refused"]),
    "webconfig_reload_drops_sans.patch": (
        ["tests/web/test_reload_guard.py::test_weakened_client_certificates_are_refused"]),
    "webconfig_empty_users_accepted.patch": (
        ["tests/web/test_reload_guard.py::test_present_but_empty_users_is_refused_at_start_too"]),
    # issue 48: the client trusts only its own directory; counters that stay possible
    "client_trusts_any_owner.patch": (
        ["tests/client/test_socket_trust.py::"
         "test_a_directory_planted_by_another_uid_gets_nothing_and_the_drop_is_counted_and_said"]),
    "possible_steps_over_span.patch": (
        ["tests/phases/test_possible_counts.py::test_each_rule_at_its_last_valid_and_first_invalid_value"]),
    "possible_buckets_disagree.patch": (
        ["tests/phases/test_possible_counts.py::test_each_rule_at_its_last_valid_and_first_invalid_value"]),
    "window_part_buckets_unchecked.patch": (
        ["tests/phases/test_possible_counts.py::test_part_of_a_slow_steps_window_keeps_its_buckets_possible"]),
    "window_of_no_span_one_ns.patch": (
        ["tests/phases/test_possible_counts.py::"
         "test_zero_span_windows_a_nanosecond_apart_add_one_step_per_microsecond_at_most"]),
    # issue 48: the receiver charges by cost
    "receiver_charges_by_count.patch": (
        ["tests/phases/test_cost_budget.py::test_an_expensive_sender_is_shed_first_on_the_receivers_own_loop"]),
    "receiver_pid_share_first_datagram_only.patch": (
        ["tests/phases/test_fair_budget.py::test_a_process_s_flush_retry_and_close_in_one_slice_pass_whatever_their_size"]),
    "receiver_pid_bucket_never_refills.patch": (
        ["tests/phases/test_fair_budget.py::test_a_processs_bucket_refills_at_its_share_of_each_slice_up_to_the_bucket"]),
    "receiver_pid_bucket_keeps_what_a_wait_saved.patch": (
        ["tests/phases/test_fair_budget.py::test_a_processs_bucket_refills_at_its_share_of_each_slice_up_to_the_bucket"]),
    "receiver_pid_share_one_slice.patch": (
        ["tests/phases/test_fair_budget.py::test_a_jobs_datagrams_that_waited_together_pass_and_a_burst_past_its_bucket_does_not"]),
    "launch_never_starts_again.patch": (
        ["tests/workloads/test_multiworker.py::test_a_worker_whose_port_was_taken_is_started_again_on_new_ports"]),
    "launch_starts_again_whatever_the_failure.patch": (
        ["tests/workloads/test_multiworker.py::test_a_worker_that_fails_otherwise_is_not_started_again_and_its_log_is_shown"]),
    "nvml_imports_pynvml_without_the_library.patch": (
        ["tests/gpu/test_loader.py::test_without_nvidias_library_the_gpu_is_absent_and_pynvml_never_imported"]),
    "trace_cli_imports_the_request_side.patch": (
        ["tests/test_agent_startup.py::test_the_idle_agent_never_imports_prometheus_clients_http_stack"]),
    "trace_over_the_byte_bound_kept.patch": (
        ["tests/trace/test_request.py::test_a_trace_over_the_requests_byte_bound_is_removed_and_its_status_says_why"]),
    "trace_byte_bound_off_by_one.patch": (
        ["tests/trace/test_request.py::test_a_trace_over_the_requests_byte_bound_is_removed_and_its_status_says_why"]),
    "receiver_no_shed_on_sight.patch": (
        ["tests/phases/test_cost_budget.py::test_an_expensive_sender_is_shed_first_on_the_receivers_own_loop"]),
    "receiver_uid_debt_sheds_every_spender.patch": (
        ["tests/phases/test_cost_budget.py::test_a_job_beside_its_own_uids_flooder_is_never_shed_on_sight"]),
    "receiver_full_gc_charged_to_sender.patch": (
        ["tests/phases/test_cost_budget.py::test_a_full_collection_is_the_budgets_not_the_senders"]),
    "receiver_every_gc_is_the_budgets.patch": (
        ["tests/phases/test_cost_budget.py::test_a_full_collection_is_the_budgets_not_the_senders"]),
    # issue 46: teye trace --train-job, the request path
    "trace_starts_when_taken.patch": (
        ["tests/trace/test_request.py::"
         "test_the_job_takes_a_request_once_starts_after_it_and_records_the_steps_asked"]),
    "trace_written_in_the_last_traced_step.patch": (
        ["tests/trace/test_request.py::"
         "test_the_job_takes_a_request_once_starts_after_it_and_records_the_steps_asked"]),
    "trace_rank_filter_ignored.patch": (
        ["tests/trace/test_request.py::"
         "test_a_request_for_other_ranks_or_in_a_directory_others_may_write_is_not_taken"]),
    "trace_request_dir_unchecked.patch": (
        ["tests/trace/test_request.py::"
         "test_a_request_for_other_ranks_or_in_a_directory_others_may_write_is_not_taken"]),
    "trace_output_unchecked_by_the_job.patch": (
        ["tests/trace/test_request.py::"
         "test_an_output_directory_that_is_not_the_jobs_own_fails_at_once"]),
    "trace_profiler_error_escapes.patch": (
        ["tests/trace/test_request.py::"
         "test_a_profiler_that_raises_fails_the_trace_and_the_job_goes_on"]),
    "trace_second_request_replaces_the_first.patch": (
        ["tests/trace/test_request.py::"
         "test_a_second_request_while_one_is_pending_is_refused"]),
    "trace_waits_the_full_timeout_for_nobody.patch": (
        ["tests/trace/test_request.py::"
         "test_the_cli_says_when_no_process_took_the_request_and_leaves_nothing_behind"]),
    "reporter_trace_sent_with_every_datagram.patch": (
        ["tests/client/test_parts_device.py::"
         "test_a_finished_trace_travels_once_with_the_next_datagram"]),
    "traces_latest_counts_earlier_ones.patch": (
        ["tests/phases/test_protocol.py::"
         "test_a_trace_report_is_the_jobs_latest_and_counted_per_process"]),
    "protocol_trace_steps_unbounded.patch": (
        ["tests/phases/test_protocol.py::"
         "test_each_malformed_kind_has_its_reason"]),
    "report_traces_unlisted.patch": (
        ["tests/report/test_traces_units.py::"
         "test_the_traces_in_the_jobs_window_are_listed_in_time_order_with_the_latest_named"]),
    "report_trace_seen_at_its_last_time.patch": (
        ["tests/report/test_traces_units.py::"
         "test_the_traces_in_the_jobs_window_are_listed_in_time_order_with_the_latest_named"]),
    # issue 46: the trace webhook
    "webhook_other_tenant_taken.patch": (
        ["tests/trace/test_webhook.py::"
         "test_each_alert_that_is_not_for_a_job_here_is_refused_with_its_reason"]),
    "webhook_job_not_rate_limited.patch": (
        ["tests/trace/test_webhook.py::"
         "test_the_rate_limits_per_job_and_per_node_and_a_pending_request"]),
    "webhook_resolved_alert_traced.patch": (
        ["tests/trace/test_webhook.py::"
         "test_each_alert_that_is_not_for_a_job_here_is_refused_with_its_reason"]),
    "webhook_ended_job_asked.patch": (
        ["tests/trace/test_webhook.py::"
         "test_each_alert_that_is_not_for_a_job_here_is_refused_with_its_reason"]),
    "daemon_webhook_without_auth_starts.patch": (
        ["tests/trace/test_webhook.py::"
         "test_the_agent_refuses_to_start_with_the_webhook_on_and_no_basic_auth"]),
    "http_post_open_without_auth.patch": (
        ["tests/web/test_trace_webhook_http.py::"
         "test_without_basic_auth_the_path_is_refused_not_open"]),
    "http_post_body_unbounded.patch": (
        ["tests/web/test_trace_webhook_http.py::"
         "test_only_a_valid_credential_reaches_the_handler_with_the_whole_body"]),
    "trace_agent_request_written_to_tmp.patch": (
        ["tests/trace/test_request.py::"
         "test_the_agents_request_is_taken_from_its_directory_and_traced_into_the_jobs_default"]),
    "sampler_stop_leaves_first_reads.patch": (
        ["tests/test_exporter.py::test_hung_source_never_hangs_a_scrape_and_others_keep_sampling"]),
    # issue 48: the smaller ones
    "http_bare_lf_waits.patch": (
        ["tests/web/test_http_server.py::test_a_bare_lf_is_answered_at_once_not_after_the_header_timeout"]),
    "http_control_char_accepted.patch": (
        ["tests/web/test_http_server.py::test_bad_requests_get_a_4xx_and_no_traceback"]),
    "textfile_logs_content.patch": (
        ["tests/sources/test_textfile.py::test_a_bad_line_is_named_by_number_without_its_content"]),
    "textfile_follows_links_out.patch": (
        ["tests/sources/test_textfile.py::test_a_link_out_is_skipped_unless_configured_and_a_link_inside_is_read"]),
    # issue 48: TLS connections that cost what they say
    "tls_handshakes_unbounded.patch": (
        ["tests/web/test_tls_cost.py::test_at_most_tls_max_handshakes_are_held_and_a_scraper_still_gets_through"]),
    "tls_idle_like_plain.patch": (
        ["tests/web/test_tls_cost.py::test_an_idle_tls_keep_alive_goes_sooner_than_a_plain_one"]),
    "http_closed_connection_traceback_kept.patch": (["tests/web/test_tls_cost.py::test_a_closed_tls_connection_is_freed_without_waiting_for_the_cyclic_gc[idle]"]),
    "http_closed_task_kept.patch": (["tests/web/test_tls_cost.py::test_a_closed_tls_connection_is_freed_without_waiting_for_the_cyclic_gc[evicted]"]),
    "webconfig_client_renegotiation_allowed.patch": (
        ["tests/web/test_tls_records.py::test_the_servers_context_refuses_renegotiation_whatever_openssls_default",
         "tests/web/test_tls_records.py::test_a_client_renegotiating_is_refused_and_the_server_still_serves"]),
    "http_accept_loop_keeps_the_last.patch": (["tests/web/test_tls_cost.py::test_a_closed_tls_connection_is_freed_without_waiting_for_the_cyclic_gc"]),
    # issue 47: the job's own CPU outside Slurm
    "jobcpu_live_descendants_left_out.patch": (
        ["tests/client/test_job_cpu.py::test_the_jobs_cpu_is_its_processes_by_their_own_clock",
         "tests/phases/test_jobcpu.py::test_a_jobs_cpu_is_its_ranks_their_reaped_children_and_live_descendants"]),
    "jobcpu_family_read_apart_from_its_parent.patch": (
        ["tests/phases/test_jobcpu.py::test_a_jobs_cpu_is_its_ranks_their_reaped_children_and_live_descendants"]),
    "jobcpu_exited_process_forgotten.patch": (
        ["tests/phases/test_jobcpu.py::test_a_jobs_cpu_is_its_ranks_their_reaped_children_and_live_descendants"]),
    "jobcpu_reused_descendant_pid_counted.patch": (
        ["tests/phases/test_jobcpu.py::test_a_jobs_cpu_is_its_ranks_their_reaped_children_and_live_descendants"]),
    "report_process_cpu_ignored.patch": (
        ["tests/report/test_units.py::test_a_job_outside_slurm_gets_its_processes_cpu_not_the_nodes"]),
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
    # issue 46: --compare, did the fix help: the noise rule, world sizes per rank, intervals across a restart
    "compare_noise_ignored.patch": (
        ["tests/report/test_compare_units.py::test_a_change_beyond_noise_counts_and_one_inside_it_does_not"]),
    "compare_world_size_ignored.patch": (
        ["tests/report/test_compare_units.py::test_figures_shares_and_world_sizes"]),
    "compare_interval_reset_counted.patch": (
        ["tests/report/test_compare_units.py::test_an_interval_where_a_counter_fell_is_left_out"]),
    # issue 38: teye profile's timeline readable at any step rate, device idle from GPU samples only
    "profile_fast_steps_not_banded.patch": (
        ["tests/phases/test_profile_timeline.py::test_fast_steps_read_as_steady_bands_not_a_block_of_ticks"]),
    "profile_idle_from_phase_gaps.patch": (
        ["tests/phases/test_profile_timeline.py::test_a_cpu_only_job_has_no_hatched_idle_and_its_gpu_lane_says_so"]),
    # issue 49: node-mixin's alerts with runbooks, Kubernetes for both modes
    "alert_without_runbook_url.patch": (
        ["tests/deploy/test_runbooks.py::test_every_alert_of_every_rule_file_has_a_runbook_url_to_its_own_section"]),
    "filling_up_without_current_usage_guard.patch": (
        ["tests/deploy/test_prometheus_rules.py::test_promtool_unit_tests_pass"]),
    "node_exporter_servicemonitor_keeps_pod_address.patch": (
        ["tests/deploy/test_kubernetes.py::test_node_exporter_mode_rules_config_and_the_scrape_that_joins_instance"]),
    "alertmanager_pair_inhibits_other_alerts.patch": (
        ["tests/deploy/test_alertmanager_inhibit.py::test_a_critical_mutes_its_own_warning_only"]),
    "daemonset_requires_runtimeclass_nvidia.patch": (
        ["tests/deploy/test_kubernetes.py::"
         "test_the_daemonset_needs_no_runtimeclass_and_the_components_set_one_or_tolerate_all"]),
    # issue 45: advice that starts from what the job is configured with; the configuration bounded
    "advice_ignores_the_config.patch": (
        ["tests/phases/test_advice.py::"
         "test_the_tuned_loop_is_never_told_to_set_what_it_has_and_at_the_cores_hears_the_host_is_the_limit"]),
    "advice_compute_slow_rank_gets_exchange_tips.patch": (
        ["tests/phases/test_advice.py::test_the_rank_that_computes_longer_gets_advice_about_itself_never_the_exchange"]),
    "advice_no_sync_suggested_anyway.patch": (
        ["tests/phases/test_advice.py::"
         "test_no_sync_and_compression_are_never_suggested_to_a_job_that_has_them_even_when_the_link_is_full"]),
    # issue 47: the training thread's own data work, placed by the forward's start
    "data_work_copies_kept.patch": (
        ["tests/client/test_session_data_work.py::test_a_copy_to_the_device_before_the_forward_is_compute"]),
    "data_work_any_thread.patch": (
        ["tests/client/test_session_data_work.py::test_a_forward_on_another_thread_is_not_the_loops_data_work"]),
    "data_work_from_the_steps_end.patch": (
        ["tests/client/test_session_data_work.py::"
         "test_each_micro_batchs_data_work_before_its_forward_and_none_of_teyes_bookkeeping"]),
    "data_work_first_forward_only.patch": (
        ["tests/client/test_session_data_work.py::"
         "test_each_micro_batchs_data_work_before_its_forward_and_none_of_teyes_bookkeeping"]),
    "data_work_not_placed.patch": (
        ["tests/client/test_session_data_work.py::"
         "test_each_micro_batchs_data_work_before_its_forward_and_none_of_teyes_bookkeeping"]),
    "advice_own_data_work_gets_loader_tips.patch": (
        ["tests/phases/test_advice.py::test_own_data_work_is_never_told_to_tune_the_dataloader_it_does_not_wait_for"]),
    "jobconfig_enum_value_unbounded.patch": (
        ["tests/phases/test_jobconfig.py::test_a_bad_configuration_is_refused_whole_with_its_reason"]),
    "client_config_bool_unchecked.patch": (
        ["tests/phases/test_jobconfig.py::test_the_client_leaves_out_what_does_not_check_and_sends_what_does"]),
    "trace_extra_files_outside_the_bound.patch": (
        ["tests/trace/test_tftrace.py::test_the_byte_bound_counts_the_xspace_too_and_removes_both"]),
    "tftrace_private_directory_left.patch": (
        ["tests/trace/test_tftrace.py::test_a_tensorflow_trace_keeps_the_xspace_beside_its_conversion_and_removes_"
         "its_private_directory",
         "tests/trace/test_tftrace.py::test_a_profiler_already_running_in_the_job_fails_the_trace_and_leaves_nothing"]),
    "tftrace_steps_not_named.patch": (
        ["tests/trace/test_tftrace.py::test_the_conversion_keeps_every_host_event_and_marks_the_steps"]),
    "tftrace_data_threads_are_host_ops.patch": (
        ["tests/trace/test_tftrace.py::test_the_summary_of_a_converted_trace_splits_each_step_as_placed"]),
    "summary_tf_input_wait_is_compute.patch": (
        ["tests/trace/test_tftrace.py::test_the_summary_of_a_converted_trace_splits_each_step_as_placed"]),
    "trace_store_never_asked.patch": (
        ["tests/trace/test_trace_nodes.py::"
         "test_ranks_on_two_nodes_trace_the_same_steps_when_each_nodes_command_runs_apart"]),
    "trace_store_offer_not_made.patch": (
        ["tests/trace/test_across_nodes.py::test_ranks_on_two_nodes_take_the_largest_proposal_through_the_jobs_store"]),
    "trace_store_offer_keeps_the_first.patch": (
        ["tests/trace/test_across_nodes.py::test_concurrent_offers_keep_the_largest"]),
    "trace_hook_imports_before_a_request.patch": (
        ["tests/trace/test_request.py::test_the_hook_imports_the_request_module_only_once_a_request_exists"]),
    # stop 59: the hook takes a request within one look's interval, by the script's own clock
    "trace_hook_looks_too_seldom.patch": (
        ["tests/trace/test_request.py::test_the_hook_imports_the_request_module_only_once_a_request_exists"]),
}


# mutants whose named tests are marked measures (tests/kinds.py): ./dev.sh test checks them in its serial pass, one
# at a time; the others in its parallel pass, beside other work.  The baseline says each named test's kind, and a
# mutant listed here whose tests do not measure, or one left out whose tests do, fails.
MEASURING = {
    "flush_thread_without_backstop.patch",      # the flush thread's wake-ups beside a loop
    "forwards_roots_never_learned.patch",       # the parts against the script's own clock
    "conn_backlog_shed_by_estimate.patch",      # a flood of 64 processes beside the job
    "receiver_debt_from_a_stale_clock.patch",   # three uids flooding beside the job
    "input_bound_ratio_plus_2_points.patch",   # teye profile's share against the loop's perf_counter
    "http_bare_lf_waits.patch",                # the answer's delay against the header timeout
    "receiver_charges_by_count.patch",         # the receiver's CPU cost per datagram
    "receiver_no_shed_on_sight.patch",         # the same
    "receiver_uid_debt_sheds_every_spender.patch",   # the same
    "receiver_full_gc_charged_to_sender.patch",      # a collection's CPU time
    "receiver_every_gc_is_the_budgets.patch",        # the same
    "sampler_stop_leaves_first_reads.patch",         # a scrape's time beside a hung source (test_exporter)
    "tls_idle_like_plain.patch",               # when idle connections are closed
    "trace_store_never_asked.patch",           # the ranks' traced steps' start times
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
    their named tests on one copy of the tree (step 1; of those this run does not run itself): patch -> what
    its check raised (None: it failed its tests as it must).  Each patch's test raises that again.  Step 1 runs alone, so a test that passes only
    on a quiet machine cannot make a patch look caught there; a named test failing on a mutant for a neighbour's
    load instead would, which is why the check insists the failure is the named test's own call."""
    chosen = sorted({it.callspec.params["patch"] for it in request.session.items
                     if getattr(it, "callspec", None) and "patch" in it.callspec.params
                     and it.name.startswith("test_the_named_tests_fail_on_the_mutant")})
    # Step 1 for the named tests this very run also runs (./dev.sh test: the whole suite) is the run itself:
    # should one fail there, the run fails with it; only the others are run here first.
    here = run_ids(request.config)
    named_tests = sorted({t for p in chosen for t in MUTANTS[p]})
    vouched = {t: [n for n in here if named(n, [t])] for t in named_tests}
    rest = [t for t in named_tests if not vouched[t]]
    base = baseline(REPO, rest, str(tmp_path_factory.mktemp("base"))) if rest else [{"rc": 0, "stdout": "", "stderr": ""}]
    base = [{"nodeid": n, "when": w, "outcome": here[n] if w == "kind" else "passed", "text": "run by the suite"}
            for t in named_tests for n in vouched[t] for w in ("kind", "call")] + base
    kind = kinds(base)

    # each mutant's directory made here, before the threads: tmp_path_factory is not thread-safe, and when this
    # run vouches for every named test (no step-1 directory above) its base directory would be made by two
    # threads at once (CI: FileExistsError on popen-gw0, the other thread's rm_rf warning)
    dirs = {p: str(tmp_path_factory.mktemp("m")) for p in chosen}
    # a copy of the tree for each thread, each patch applied to it and taken back (harness.Tree)
    trees: "queue.Queue[Tree]" = queue.Queue()
    for _ in range(min(WORKERS, len(chosen))):
        trees.put(Tree(REPO, os.path.join(str(tmp_path_factory.mktemp("tree")), "tree")))

    def one(patch):
        measuring = sorted(n for n, k in kind.items() if k == "measures" and named(n, MUTANTS[patch]))
        if bool(measuring) != (patch in MEASURING):
            return AssertionError(f"{patch}: its named tests {'measure' if measuring else 'do not measure'} "
                                  f"({', '.join(measuring) or 'none is marked measures'}): "
                                  f"{'list it in' if measuring else 'take it out of'} MEASURING")
        tree = trees.get()
        try:
            check(REPO, os.path.join(HERE, patch), MUTANTS[patch], dirs[patch], base=base, tree=tree)
        except BaseException as e:   # AssertionError, pytest's skip and fail outcomes: raised by its test
            return e
        finally:
            trees.put(tree)
        return None

    # WORKERS at a time, then those whose tests measure one at a time (nothing beside them: the serial pass)
    calm = [p for p in chosen if p not in MEASURING]
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        got = dict(zip(calm, pool.map(one, calm)))
    got.update((p, one(p)) for p in chosen if p in MEASURING)
    written = sorted({w for t in list(trees.queue) for w in t.written})
    if written:   # (each cost a copy of the tree: said, so that the test writing there can be mended)
        warnings.warn(f"the named tests wrote into the tree, which was copied again after them: {written[:20]}")
    return got


@pytest.mark.parametrize("patch", [_param(p) for p in sorted(MUTANTS)])
def test_the_named_tests_fail_on_the_mutant(patch, checked):
    if checked[patch] is not None:
        raise checked[patch]
