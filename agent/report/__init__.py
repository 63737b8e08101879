"""`teye report`: per-job efficiency reports read back from the Prometheus that scraped the agents.

``prom`` is the one door to Prometheus (HTTP API, promtool's client config), ``series`` pure counter
arithmetic, ``build`` the batched queries and the per-job numbers, ``render`` text / Markdown / JSON /
the epilog's compact summary, ``main`` the command.  Nothing below the commands imports this room.
"""
