"""PyTorch profiler traces (issue 46): ``summary`` reduces a Chrome trace to an HTA-style summary (pure
functions, the standard library only), ``main`` is the `teye trace` command.  Nothing below the commands
imports this room.
"""
