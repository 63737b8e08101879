"""Fixtures of the client tests: a private socket directory (shared with the phase tests)."""
from tests.phases.conftest import listener, sockdir  # noqa: F401  (pytest fixtures)
