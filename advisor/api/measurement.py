"""advisor measure, --plan and pretrain in Python: asked and checked here, run by the measurement side."""

from __future__ import annotations

from pathlib import Path

from advisor.api.fits import require_measure_side
from advisor.api.inputs import PathLike, _given, _model, _models, _path, _shown, _typed
from advisor.errors import InputError
from advisor.model_ref import ResolvedModel
from advisor.prediction.fit_request import check_number
from advisor.rules import load_rules


def measure(
    *models: str | ResolvedModel,
    request=None,
    say=lambda line: None,
    reporter=None,
    on_grid=None,
    **options,
):
    """`advisor measure` in Python: the grid of `models` ('all' for the paper's four) trained on this machine
    into a KB, asked as a `MeasureRequest` (`request`, advisor.measuring.request) or with the options of
    `advisor measure` by their names (the run configuration's: `preset`, `epochs`, `lr`, `dtype`, `protocol`,
    ...; and `optimizers`, `strategies`, `seeds`, `data`, `tune_lr`, `executor`, `shard`, `db`, ...). `say`
    hears how the data was resolved; `reporter` the progress (advisor.measuring.training.progress.Reporter's
    callbacks). `on_grid(grid)` is called once the cells are known (`.cells`, `.path`: the KB they go into)
    and before any runs (the worker process already importing torch); a reporter it returns replaces
    `reporter` (the command starts its bars there). Returns what was measured (`.results`, `.as_dict()`).
    Needs torch."""
    require_measure_side()
    asked = _measure_request(models, request, options)
    rules = load_rules()
    grid = asked.grid(rules, say)  # the data resolved, said first
    if asked.executor == "local" and grid.cells:
        from advisor.measuring.grid.isolation import start_server  # torch: the measurement side

        start_server(rules)  # it imports in the background while the grid gets ready
    if on_grid is not None:
        reporter = on_grid(grid) or reporter
    return asked.run(rules, reporter, grid=grid)


def plan(*models: str | ResolvedModel, request=None, gpu: str | None = None, workers=(1,), **options):
    """`advisor measure --plan` in Python: what the grid would cost, nothing trained (a `Plan`: each cell's
    predicted time and memory on `gpu`, None: this machine, and the makespan on each number of `workers`;
    `.as_dict()`), asked as `measure` is. Needs torch for a shape not timed before."""
    if gpu is not None and not isinstance(gpu, str):
        raise InputError(f"--gpu must be an accelerator's name (a str), not {_shown(gpu)}.", "gpu")
    workers = _workers(workers)
    require_measure_side()
    asked = _measure_request(models, request, options)
    return asked.price(load_rules(), gpu, workers)


def _workers(workers) -> tuple[int, ...]:
    """plan's numbers of workers, as --workers takes them: whole numbers of at least 1 (one, or several)."""
    counts = (workers,) if isinstance(workers, int) else workers
    if not isinstance(counts, tuple | list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts
    ):
        raise InputError(
            f"--workers must be whole numbers of at least 1 (a tuple of them), not {_shown(workers)}.",
            "workers",
        )
    return tuple(counts)


def _measure_request(models: tuple, request, options: dict):
    """The MeasureRequest of `measure` and `plan`: the one given, or one built from models and options."""
    from advisor.measuring.request import MeasureRequest  # numpy and psutil: not on the answers' path
    from advisor.measuring.request import request as build

    if request is not None:
        if models or options:
            raise InputError("pass a MeasureRequest or models and options, not both.")
        return _typed(_given(request, MeasureRequest, "advisor.measure"))
    for name in MEASURE_SHARED:  # the shape and memory options measure shares with fit, held to fit's ranges
        check_number(name, options.get(name))
    rules = load_rules()
    return _typed(build(tuple(m for name in models for m in _models(name, rules)), **options))


# the options of `advisor measure` whose ranges are FitRequest's (advisor/cli/params.py shape_options and
# accelerator_options declare both commands' at once)
MEASURE_SHARED = ("memory", "batch_size", "seq_len", "image_size", "accumulation_steps")


def pretrain(
    model: str | ResolvedModel,
    *,
    preset: str = "small",
    out: PathLike | None = None,
    steps: int | None = None,
    force: bool = False,
    say=lambda line: None,
) -> dict:
    """`advisor pretrain` in Python: a reference model trained here into a base for fine-tuning (LoRA against
    full), saved at `out` (default: the data folder's bases/<model>-<preset>); returns its advisor-base.json
    record, with `path`."""
    rules = load_rules()
    out = _path(out, "out")
    resolved = _model(model, rules)
    if not resolved.reference:
        raise InputError(
            f"advisor pretrain trains a family's reference model ({', '.join(rules.reference_models())}); "
            f"{resolved.name} is your own: pass its folder to advisor measure --model.",
            "model",
        )
    if preset not in rules.presets:
        raise InputError(f"unknown preset {preset!r}. Choose from: {', '.join(rules.presets)}.", "preset")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise InputError(f"steps must be a whole number of at least 1, not {steps!r}.", "steps")
    require_measure_side()
    # the measurement side (its trainer loads torch when a base is trained)
    from advisor.measuring.pretraining import PretrainRecipe, check_out, default_out
    from advisor.measuring.pretraining import pretrain as train_base

    where = Path(out) if out is not None else default_out(resolved, preset)
    check_out(where, force)
    record = train_base(resolved, preset, where, rules, PretrainRecipe.of(rules, steps), say)
    return {**record, "path": str(where)}
