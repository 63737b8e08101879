"""`teye trace`: ask a running job for a trace of its next steps (`--train-job`), and `teye trace summarize FILE...`:
the HTA-style summary of PyTorch profiler traces (issue 46)."""
from __future__ import annotations

import json
import os
import sys

from .defaults import DEFAULT_STEPS, DEFAULT_TIMEOUT_S, MAX_TRACE_BYTES, TOP_N

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2


def add_parser(sub) -> None:
    """Register `teye trace` on the CLI's subparsers."""
    t = sub.add_parser("trace", help="a trace of a running job's next steps (--train-job), or summarize PyTorch "
                       "profiler traces (data wait, compute, communication, idle, top ops, spread between ranks)")
    t.add_argument("--train-job", metavar="NAME", help="the job (as the agent names it) whose processes on this node "
                   "are asked to trace their next steps through teye's zero-code hook (docs/trace.md)")
    t.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"steps traced in each process (default {DEFAULT_STEPS})")
    t.add_argument("--rank", type=int, action="append", metavar="R", help="only this rank (repeatable; default all)")
    t.add_argument("--output", default="teye-traces", metavar="DIR", help="where the job writes its traces (a "
                   "directory of the job's uid that others cannot open; made 0700 where absent; default ./teye-traces)")
    t.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"how long to wait for every process's trace (default {DEFAULT_TIMEOUT_S:.0f} s)")
    t.add_argument("--max-bytes", type=int, default=MAX_TRACE_BYTES, metavar="N", help="a process's trace over N "
                   f"bytes is removed and its status says so (default {MAX_TRACE_BYTES}, what summarize reads)")
    t.add_argument("--id", metavar="ID", help="the request's id (1-64 letters, digits, '_', '-'; default a new "
                   "one): give every node's command the same, and the job's ranks on all nodes start at the same "
                   "step (docs/trace.md, 'Across nodes')")
    t.add_argument("--uid", type=int, metavar="UID", help="(root) the job's uid, where it is not root's")
    t.add_argument("--json", action="store_true", help="print JSON with stable keys instead of text")
    t.set_defaults(func=trace_command)
    tsub = t.add_subparsers(dest="trace_command", metavar="ACTION")
    s = tsub.add_parser("summarize", help="reduce torch.profiler Chrome traces (.json, .json.gz) to an HTA-style "
                        "summary (docs/trace.md); several files: one per rank, and the spread between them")
    s.add_argument("files", nargs="+", metavar="FILE", help="a trace as export_chrome_trace or "
                   "tensorboard_trace_handler writes it")
    s.add_argument("--json", action="store_true", help="print JSON with stable keys instead of text")
    s.add_argument("--max-bytes", type=int, default=MAX_TRACE_BYTES, metavar="N",
                   help=f"refuse a trace (or a .gz's decompressed text) over N bytes (default {MAX_TRACE_BYTES})")
    s.add_argument("--top", type=int, default=TOP_N, metavar="N", help=f"top ops and kernels listed (default {TOP_N})")
    s.set_defaults(func=summarize_command)


def summarize_command(args) -> int:
    from .summary import render_text, summarize_files   # (when the command runs: agent.trace.defaults)
    if args.max_bytes < 1 or args.top < 0:
        print("teye trace summarize: --max-bytes must be at least 1 and --top at least 0", file=sys.stderr)
        return EXIT_USAGE
    result = summarize_files(args.files, args.max_bytes, args.top)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1, sort_keys=True) + "\n")
    else:
        text = render_text(dict(result, errors=[]))
        if result["traces"]:
            sys.stdout.write(text)
    for e in result["errors"]:
        print(f"teye trace summarize: {e['file']}: {e['reason']}", file=sys.stderr)
    return EXIT_BAD_INPUT if result["errors"] else 0


def _err(msg: str) -> int:
    print(f"teye trace: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def trace_command(args) -> int:
    """`teye trace --train-job NAME`: request, wait, summarize; exit 0 when every process that took the request
    wrote its trace, 1 otherwise (each process's reason printed)."""
    from . import request                                # (when the command runs: agent.trace.defaults)
    if not args.train_job:
        print("teye trace: give --train-job NAME (a trace of a running job) or the action summarize FILE...",
              file=sys.stderr)
        return EXIT_USAGE
    if not 1 <= args.steps <= request.job_side.MAX_STEPS or not 0 < args.timeout <= 24 * 3600:
        print(f"teye trace: --steps must be 1 to {request.job_side.MAX_STEPS} and --timeout over 0 s (a day at most)",
              file=sys.stderr)
        return EXIT_USAGE
    if not 1 <= args.max_bytes <= request.job_side.MAX_MAX_BYTES:
        print(f"teye trace: --max-bytes must be 1 to {request.job_side.MAX_MAX_BYTES}", file=sys.stderr)
        return EXIT_USAGE
    if args.id is not None and not request.job_side._ID.match(args.id):
        print(f"teye trace: --id {args.id!r}: 1 to 64 letters, digits, '_' or '-'", file=sys.stderr)
        return EXIT_USAGE
    if args.uid is not None and os.geteuid() != 0 and args.uid != os.geteuid():
        return _err(f"--uid {args.uid}: only root asks another uid's job for a trace")
    uid = os.geteuid() if args.uid is None else args.uid
    job = args.train_job
    if not job or "/" in job or job.startswith(".") or len(job) > 128:
        return _err(f"{job!r} is not a job name as teye_client sends it (no '/', at most 128 characters; "
                    "another user's job, shown as user/job, is asked for as root with --uid)")
    try:
        out = request.prepare_output(args.output, uid)
        req = request.write_request(job, uid, args.steps, out, args.rank, request.DEFAULT_START_IN_S, args.timeout,
                                    max_bytes=args.max_bytes, request_id=args.id)
    except request.RequestError as e:
        return _err(str(e))
    try:
        got = request.wait(req, job, args.timeout)
    finally:
        request.withdraw(req, job)
    return _report(job, req, got, out, args)


def _report(job: str, req: dict, got: dict, out: str, args) -> int:
    from . import request
    from .summary import summarize_files
    done = {pid: s for pid, s in got.items() if s.get("state") == "done" and isinstance(s.get("trace"), str)}
    firsts = sorted({s.get("first_step") for s in done.values()}, key=str)
    result = {"train_job": job, "id": req["id"], "output": out, "steps": req["steps"],
              "processes": [got[p] for p in sorted(got)], "same_first_step": len(firsts) == 1 if done else None,
              "summary": None, "summary_file": None}
    if done:
        summ = summarize_files([done[p]["trace"] for p in sorted(done)], max(args.max_bytes, MAX_TRACE_BYTES))
        result["summary"] = summ
        path = os.path.join(out, f"{job}.{req['id']}.summary.json")
        try:
            request.job_side._write_private(path, json.dumps(summ, indent=1, sort_keys=True).encode())
            result["summary_file"] = path
        except OSError as e:
            print(f"teye trace: the summary could not be written to {path}: {e.strerror or e}", file=sys.stderr)
    ok = bool(got) and len(done) == len(got)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1, sort_keys=True) + "\n")
    else:
        _print_text(job, req, got, result)
    if not got:
        return _err(f"no process of {job} on this node took the request (is it running, under teye's zero-code "
                    "hook, as this uid, and stepping? a process stuck before its next step never looks)")
    return 0 if ok else EXIT_BAD_INPUT


def _print_text(job: str, req: dict, got: dict, result: dict) -> None:
    from .summary import render_text
    w = sys.stdout.write
    w(f"teye trace: {job}, request {req['id']}: {len(got)} process(es) on this node took it\n")
    for pid in sorted(got):
        s = got[pid]
        who = f"rank {s['rank']} (pid {pid})" if s.get("rank") is not None else f"pid {pid}"
        if s.get("state") == "done":
            first = s.get("first_step")
            w(f"  {who}: steps {first}-{first + s['steps'] - 1}: {s['trace']}\n")
        elif s.get("state") == "failed":
            w(f"  {who}: failed: {s.get('reason')}\n")
        else:
            w(f"  {who}: no trace by the timeout (it said '{s.get('state')}': a step that never ended?)\n")
    if result["same_first_step"] is False:
        w("  the processes did not start at the same step (their steps are not in lockstep)\n")
    summ = result["summary"]
    if summ and summ["traces"]:
        w(render_text(dict(summ, errors=[])))
    for e in (summ or {}).get("errors", []):
        w(f"  {e['file']}: {e['reason']}\n")
    if result["summary_file"]:
        w(f"summary: {result['summary_file']}\n")
