"""The `teye trace` defaults its parser shows: here, apart from the modules that use them, so that building the
CLI (and so starting the daemon) imports neither the request side (teye_client, secrets, tempfile) nor the
summary (statistics): about 3 MiB of the daemon's resident memory (benchmarks/footprint.py)."""

DEFAULT_STEPS = 5
DEFAULT_START_IN_S = 1.0      # after the job's processes looked for the request (every 0.25 s and a step)
DEFAULT_TIMEOUT_S = 120.0
MAX_TRACE_BYTES = 256 * 1024 * 1024     # default bound on a trace (and on a .gz's decompressed size)
TOP_N = 10
