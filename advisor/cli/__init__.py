"""The `advisor` command line: thin click commands that parse, call one domain function, and render.

Commands live by subject: `answering.py` (recommend, frontier, flowchart, claims), `fitting.py` (fit),
`measuring.py` (measure, validate), `kb_commands.py` (the kb group), `reporting.py` (report, and the
picture files of frontier and flowchart); `params.py` holds what they share
(option decorators, parameter types, the domain-error translation).
"""

from __future__ import annotations

import sys

import click

from advisor.cli import answering, fitting, kb_commands, measuring, reporting
from advisor.cli.params import CONTEXT


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="advisor")
def cli():
    """Which optimizer and memory strategy should I train this transformer with, under this constraint?

    Answers come from a knowledge base of training runs: the paper's published figures (arXiv 2608.08961)
    and measurements made with `advisor measure`. Start with:

        advisor recommend --arch encoder --optimize memory
    """


for _module in (answering, fitting, measuring, kb_commands, reporting):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main():
    try:
        cli(prog_name="advisor")
    except BrokenPipeError:  # `advisor kb export | head` is not an error
        sys.stderr.close()


__all__ = ["cli", "main"]
