"""`teye trace summarize FILE... [--json]`: the HTA-style summary of PyTorch profiler traces (issue 46)."""
from __future__ import annotations

import json
import sys

from .summary import MAX_TRACE_BYTES, TOP_N, render_text, summarize_files

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2


def add_parser(sub) -> None:
    """Register `teye trace` on the CLI's subparsers."""
    t = sub.add_parser("trace", help="PyTorch profiler traces: summarize (data wait, compute, communication, "
                       "idle, top ops, spread between ranks)")
    tsub = t.add_subparsers(dest="trace_command", metavar="ACTION")
    tsub.required = True
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
