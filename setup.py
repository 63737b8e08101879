"""The optional C helpers of the phase path; everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build goes on without them and
the agent uses the same code in Python (see agent/phases/fast.py).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("agent.phases._fast", ["agent/phases/_fast.c", "agent/phases/_fast_table.c"],
                             depends=["agent/phases/_fast_table.h"], optional=True,
                             extra_compile_args=["-O2"])])
