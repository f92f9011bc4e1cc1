"""`advisor pretrain`: a family's reference model trained here into a base that fine-tuning starts from.

LoRA against full fine-tuning measures nothing on a randomly initialised model, and the reference grid
reaches no hub. So the base is made here: the reference model at a preset, trained on the generated corpus
restricted to its first genres (rules/protocol.toml [pretraining]), from a data seed no grid run uses.
Fine-tuning it (`advisor measure --model DIR --strategy standard --strategy lora`) trains on the whole
corpus, whose other genres (and, for vision, classes) the base has never seen: a task whose format it knows,
with new content, as a fine-tune meets it.

The folder is a transformers model (config.json and model.safetensors: what `advisor measure --model DIR`
loads as pretrained weights) and advisor-base.json: the recipe, the held-out loss as it trained, the
seconds it took and the versions, so that the runs measured on it can be traced to what they started from.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from advisor.errors import InputError
from advisor.measuring.data.corpus import encoded, epoch_batches, generated_rows
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.measuring.model.builder import MARKER, build_model
from advisor.measuring.recipe.config import PRESET_DEFAULTS
from advisor.model_ref import ResolvedModel
from advisor.places import user_dir
from advisor.rules import Rules

WRITES = {MARKER, "config.json", "generation_config.json", "model.safetensors"}  # all a base folder holds
HELDOUT_SEED = 20_021  # the pretraining corpus's own held-out examples: its genres, a seed of their own


@dataclass(frozen=True)
class PretrainRecipe:
    """How a base is pretrained: rules/protocol.toml [pretraining], `steps` overridable."""

    genres: int  # the first this many genres of the generated corpus (rules: of 23)
    steps: int  # optimizer updates, each on a fresh micro-batch (no example is seen twice)
    batch_size: int
    optimizer: str
    lr: float
    warmup_ratio: float  # linear warm-up over this share of the steps, then constant
    seed: int  # model init and data: a seed no grid run uses
    eval_every: int  # updates between held-out evaluations (its curve is kept with the base)

    @classmethod
    def of(cls, rules: Rules, steps: int | None = None) -> PretrainRecipe:
        recipe = cls(**rules.protocol["pretraining"])
        return recipe if steps is None else replace(recipe, steps=steps)


def default_out(model: ResolvedModel, preset: str) -> Path:
    """Where a base goes unless --out says: the data folder's bases/, by model and preset."""
    return user_dir() / "bases" / f"{model.name}-{preset}"


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that is a file, holds files this command did not write, or holds a base (without
    --force): nothing of the user's is ever replaced."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"{out} is not a folder: choose another --out.", "out")
    if not out.exists() or not any(out.iterdir()):
        return
    if not ((out / MARKER).is_file() and all(p.name in WRITES for p in out.iterdir())):
        raise InputError(
            f"{out} holds files advisor pretrain did not write: choose another --out (an empty or new folder).",
            "out",
        )
    if not force:
        raise InputError(
            f"a base is already at {out}: fine-tune it (advisor measure --model {out} --strategy standard "
            "--strategy lora), or pass --force to pretrain it again.",
            "out",
        )


def pretrain(
    model: ResolvedModel, preset: str, out: Path, rules: Rules, recipe: PretrainRecipe, say=lambda line: None
) -> dict:
    """Train the reference model by the recipe and save it at `out` (written beside it, then renamed into
    place: an interrupted run leaves no half base); returns what advisor-base.json records."""
    # torch and what loads it, here: advisor.api.pretrain imports this module to refuse a bad --out
    # (check_out, default_out) before training, and that must not wait seconds for torch
    import torch

    from advisor.measuring.recipe.optimizers import make_optimizer  # these load torch too
    from advisor.measuring.recipe.strategies import train_step
    from advisor.measuring.training.heldout import HeldOut
    from advisor.measuring.training.trainer import warmup_schedule

    device = torch.device(resolve_device("auto"))
    built = build_model(model, preset, rules, seed=recipe.seed)
    fam, shape, net = built.family, built.shape, built.model.to(device)
    data = encoded(generated_rows(recipe.steps * recipe.batch_size, recipe.seed, recipe.genres), fam, shape)
    eval_examples = PRESET_DEFAULTS.get(preset, PRESET_DEFAULTS["small"])["eval_examples"]
    own = HeldOut.of(
        fam, shape, encoded(generated_rows(eval_examples, HELDOUT_SEED, recipe.genres), fam, shape), 16
    )
    task = HeldOut(fam, shape, eval_examples, 16, "validation")  # the fine-tuning task's (every genre)
    optimizer = make_optimizer(recipe.optimizer, net.parameters(), recipe.lr, model=net)
    schedule = warmup_schedule(optimizer, recipe.warmup_ratio, recipe.steps)
    curve = [_point(0, own, task, net, device, 0.0)]
    batches, start = epoch_batches(data, fam, recipe.batch_size, recipe.seed, 0, shape), time.perf_counter()
    for step in range(1, recipe.steps + 1):
        loss = train_step(net, optimizer, fam, [next(batches)], device)
        schedule.step()
        if step % recipe.eval_every == 0 or step == recipe.steps:
            curve.append(_point(step, own, task, net, device, time.perf_counter() - start, loss))
            say(
                f"step {step}/{recipe.steps}: held-out loss {curve[-1]['heldout_loss']:.3f} on its genres, "
                f"{curve[-1]['task_loss']:.3f} on every genre"
            )
    here = describe(device)
    record = {
        "model": model.name,
        "family": fam.name,
        "preset": preset,
        "parameters": built.n_params,
        "recipe": asdict(recipe),
        "trained_s": round(time.perf_counter() - start, 1),
        "curve": curve,
        "hardware": here["hardware"],
        "versions": {k: v for k, v in here["software"].items() if v is not None},
    }
    _save(net, record, out)
    return record


def _point(step: int, own, task, net, device, seconds: float, train_loss: float | None = None) -> dict:
    """The base's held-out loss after `step` updates: on its own genres, and on the whole corpus."""
    point = {
        "step": step,
        "seconds": round(seconds, 1),
        "heldout_loss": own.evaluate(net, device).loss,
        "task_loss": task.evaluate(net, device).loss,
    }
    return point if train_loss is None else {**point, "training_loss": train_loss}


def _save(net, record: dict, out: Path) -> None:
    """The model and its record written into a folder beside `out`, then swapped into place."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" on a terminal that asked for one line
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its "Setting accelerator to CPU", on import
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        net.save_pretrained(partial)
        (partial / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():  # a base check_out allowed to be replaced (--force)
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            try:
                partial.rename(out)
            except OSError:
                old.rename(out)  # the base that was there stays
                raise
            shutil.rmtree(old)
        else:
            partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
