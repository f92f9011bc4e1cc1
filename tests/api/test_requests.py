"""One request object per question, each field's default declared once: the command line's options read
their defaults from the dataclass, and the Python API takes the object or its fields as keywords."""

from dataclasses import MISSING, fields

import click
import pytest

import advisor
from advisor.api import RecommendRequest, recommend_request
from advisor.cli import cli
from advisor.errors import InputError
from advisor.fields import default_of, help_of
from advisor.prediction.fit_request import FitRequest


def _cli_default(param: click.Parameter):
    """What a command receives for `param` when the user does not pass it (callbacks applied)."""
    ctx = click.Context(click.Command("probe"))
    value = param.get_default(ctx)
    value = (
        None if value is None or type(value).__name__ == "Sentinel" else value
    )  # click's UNSET: no default
    if param.multiple:
        return tuple(value or ())
    if param.callback is not None:
        return param.callback(ctx, param, value)
    return value


def _fields(request: type) -> dict:
    return {f.name: f for f in fields(request)}


@pytest.mark.parametrize(
    "command, requests",
    [("fit", [FitRequest]), ("recommend", [RecommendRequest, FitRequest])],
)
def test_every_option_of_a_request_defaults_to_the_dataclass(command, requests):
    params = cli.get_command(click.Context(cli), command).params
    checked = 0
    for param in params:
        owner = next((r for r in requests if param.name in _fields(r)), None)
        if owner is None:
            continue
        assert _cli_default(param) == default_of(owner, param.name), f"{command} --{param.name}"
        checked += 1
    assert checked >= 10  # the request's options, not a command that declares none


def test_every_request_field_has_a_default_and_a_sentence():
    for request in (FitRequest, RecommendRequest):
        for f in fields(request):
            assert f.default is not MISSING or f.default_factory is not MISSING, f.name
            assert help_of(request, f.name).endswith((".", ")")), f.name


def test_recommends_keywords_go_to_the_request_and_the_menus_to_its_fit():
    asked = recommend_request(None, {"model": "vit", "gpu": "H100", "gpus": 2, "optimizers": ("adam",)})
    assert asked.model == "vit" and asked.optimizers == ("adam",)
    assert asked.fit == FitRequest(gpu="H100", gpus=2)
    over = recommend_request(asked, {"optimize": "time", "lora_r": 8})
    assert (over.optimize, over.fit.lora_r, over.fit.gpus) == ("time", 8, 2)


def test_an_unknown_keyword_is_refused_by_name():
    with pytest.raises(InputError, match="takes no colour"):
        recommend_request(None, {"arch": "vit", "colour": "red"})


def test_measures_options_default_to_its_request_and_run_configuration():
    from advisor.measuring.recipe.config import RunConfig
    from advisor.measuring.request import MeasureRequest

    params = cli.get_command(click.Context(cli), "measure").params
    checked = 0
    for param in params:
        owner = next((r for r in (MeasureRequest, RunConfig) if param.name in _fields(r)), None)
        if owner is None or param.name == "models":  # required on both sides: no default to compare
            continue
        assert _cli_default(param) == default_of(owner, param.name), f"measure --{param.name}"
        checked += 1
    assert checked >= 20


def test_the_api_takes_a_measure_request_or_its_options_not_both():
    import advisor
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    asked = advisor.MeasureRequest(models=(resolve_model("vit", load_rules()),), seeds=2)
    with pytest.raises(InputError, match="not both"):
        advisor.plan("vit", request=asked)
    with pytest.raises(InputError, match="takes no colour"):
        advisor.plan("vit", colour="red")


def test_recommends_checks_keep_the_command_lines_order():
    """The family before any menu option, --group before --evidence, the menu's flags in --help's order."""
    import advisor

    with pytest.raises(InputError) as e:
        advisor.recommend(arch="bogus", gpus=2)
    assert e.value.field == "arch"
    with pytest.raises(InputError) as e:
        advisor.recommend(arch="vit", evidence="zz", group="qq")
    assert e.value.field == "group"
    with pytest.raises(InputError) as e:
        advisor.recommend(arch="decoder", attention="eager", gpus=2)
    assert e.value.field == "attention"


def test_a_request_of_the_wrong_kind_is_a_sentence_and_fit_takes_a_whole_fit_request():
    import advisor

    with pytest.raises(InputError, match="takes a FitRequest as its request, not str"):
        advisor.fit("vit", "H100")
    asked = recommend_request(None, {"arch": "vit", "fit": FitRequest(gpu="H100"), "gpus": 2, "dtype": None})
    assert asked.fit == FitRequest(gpu="H100", gpus=2)


def _input_error_fields() -> list[tuple[str, int, str]]:
    """(module, line, field) of every InputError raised with a field named in advisor/: the error itself, a
    DataError, or a subclass passing its field to super().__init__."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "advisor"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            raised = getattr(node, "func", None)
            name = getattr(raised, "id", None) or getattr(raised, "attr", None)
            if not (isinstance(node, ast.Call) and name in ("InputError", "DataError", "__init__")):
                continue
            named = [*node.args[1:2], *(k.value for k in node.keywords if k.arg in ("field", "param"))]
            for arg in named:
                strings = [n.value for n in ast.walk(arg) if isinstance(n, ast.Constant)]
                found += [(path.name, node.lineno, s) for s in strings if isinstance(s, str) and len(s) > 1]
    return found


def test_an_input_error_names_a_field_and_the_command_line_alone_spells_its_flag(runner):
    """Issue 49: the API's errors carry the request's field ('batch_size'), never a flag; the CLI maps it
    to the running command's option (cli/params.py flag_of)."""
    from advisor.cli import COMMANDS
    from advisor.measuring.recipe.config import RunConfig
    from advisor.measuring.request import MeasureRequest

    known = {f.name for r in (FitRequest, RecommendRequest, MeasureRequest, RunConfig) for f in fields(r)}
    for name in COMMANDS:  # a command's own keywords (pretrain's --out, calibrate's --rounds)
        command = cli.get_command(None, name)
        known |= {p.name for p in getattr(command, "params", ())}
    found = _input_error_fields()
    assert len(found) > 50, "the scan found too few errors to mean anything"
    assert [f for f in found if f[2].startswith("-") or f[2] not in known] == []
    with pytest.raises(InputError) as e:
        advisor.fit("vit", gpu="H100", batch_size=0)
    assert e.value.field == "batch_size" and "--batch-size" in str(e.value)
    result = runner.invoke(
        cli, ["fit", "--model", "vit", "--gpu", "H100", "--adapter", "full", "--lora-r", "8"]
    )
    assert result.exit_code == 2 and "Invalid value for '--lora-r'" in result.output, result.output
