"""Every flag of every `teye` subcommand has help text (argparse walked, nothing listed by hand)."""
from __future__ import annotations

import argparse

from agent.cli import build_parser


def actions(parser: argparse.ArgumentParser, path=("teye",)):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from actions(sub, path + (name,))
        else:
            yield " ".join(path), a


def test_every_flag_and_argument_has_help():
    seen = list(actions(build_parser()))
    commands = {cmd for cmd, _ in seen}
    assert {"teye agent", "teye run", "teye report", "teye dashboards push", "teye record"} <= commands
    missing = [f"{cmd} {'/'.join(a.option_strings) or a.dest}" for cmd, a in seen
               if a.help is not argparse.SUPPRESS and not (a.help or "").strip()]
    assert not missing, missing
    assert len(seen) > 40     # the walk reached the subcommands' flags
