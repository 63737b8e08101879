"""The phase client, kept importable here for instrumented code: ``from workloads.phases import Reporter``.

It lives in ``teye_client.reporter`` (standard library only, an import name no user module has).
"""
from teye_client.reporter import (  # noqa: F401  (re-exported)
    PHASES, VERSION, Reporter, _encode, _job_name, default_socket_path,
)

__all__ = ["Reporter", "PHASES", "default_socket_path"]
