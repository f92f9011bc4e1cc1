"""The `advisor` command line: thin click commands that parse, call the Python API (advisor/api/), render.

Commands live by subject: `answering.py` (recommend, frontier, flowchart, claims), `fitting.py` (fit),
`measuring.py` (measure, validate, calibrate, pretrain), `kb_commands.py` (the kb group), `reporting.py` (report); `params.py`
declares what they share (option groups, parameter types, the translation of errors). A command's module
is imported when that command runs (click's lazy-loading pattern), so that one answer does not pay for
every other command's imports.
"""

from __future__ import annotations

import gc
import importlib
import sys

import click

from advisor.cli.params import CONTEXT

# command -> the module that defines it, and its name there
COMMANDS = {  # in the order --help lists them: what fits first, then the evidence
    "fit": ("advisor.cli.fitting", "fit_command"),
    "recommend": ("advisor.cli.answering", "recommend"),
    "frontier": ("advisor.cli.answering", "frontier"),
    "flowchart": ("advisor.cli.answering", "flowchart"),
    "claims": ("advisor.cli.answering", "claims"),
    "transfer": ("advisor.cli.answering", "transfer"),
    "measure": ("advisor.cli.measuring", "measure"),
    "validate": ("advisor.cli.measuring", "validate"),
    "calibrate": ("advisor.cli.measuring", "calibrate"),
    "pretrain": ("advisor.cli.measuring", "pretrain"),
    "kb": ("advisor.cli.kb_commands", "kb"),
    "report": ("advisor.cli.reporting", "report"),
}


class LazyGroup(click.Group):
    """A group whose commands' modules are imported when a command is asked for (click's documented
    lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name]
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(package_name="advisor")
def cli():
    """Which optimizer and memory strategy should I train this transformer with, under this constraint?

    Answers come from predictions of a real training step of your model (`advisor fit`) and from a
    knowledge base of training runs (the paper's published figures, arXiv 2608.08961, and measurements
    made with `advisor measure`). Start with what fits your GPU, then the evidence:

    \b
        advisor fit --model llama-3.1-8b --gpu RTX4090
        advisor recommend --model llama-3.1-8b --gpu RTX4090 --optimize time
        advisor recommend --arch encoder --optimize memory
    """


# Commands that only read: once one has answered, its objects are left to the process's end, not collected
# one by one at exit (gc.freeze: about 15 ms of a 130 ms answer). Nothing they hold needs closing (their KBs
# are read-only); a command that writes keeps the collector's last pass, which closes its KB.
READ_ONLY = ("recommend", "frontier", "flowchart", "claims", "transfer")


def main():
    try:
        cli(prog_name="advisor")
    except BrokenPipeError:  # `advisor kb export | head` is not an error
        sys.stderr.close()
    finally:
        if sys.argv[1:2] and sys.argv[1] in READ_ONLY:
            gc.freeze()


__all__ = ["cli", "main"]
