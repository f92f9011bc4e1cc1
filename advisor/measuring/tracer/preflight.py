"""Before a user's model is built for a cell: will it fit this machine? A config of just
{"model_type": "qwen2"} is transformers' default 7B model (~30 GB in fp32): predicted with advisor fit's
engine (no memory allocated) and skipped, with the prediction, instead of swapping the machine to death."""

from __future__ import annotations

from advisor.measuring.model.builder import user_config
from advisor.measuring.recipe.config import GridCell
from advisor.measuring.tracer.payloads import predict
from advisor.measuring.tracer.spec import Spec
from advisor.prediction.step import Adapter, tensor_peak
from advisor.rules import Rules, gib

MARGIN = 0.9  # of the memory available now: the process, data and other programs need the rest


def will_not_fit(cell: GridCell, rules: Rules) -> str | None:
    """Why a resolved cell of a user's model would not fit here (predicted GB > available GB), or None."""
    cfg = cell.config
    payload = _prediction(cell, rules)
    need = sum(tensor_peak(payload, cfg.batch_size)[1].values()) / 1e9
    capped = cfg.memory_cap_gb is not None and cfg.memory_cap_gb < available_gb(cfg.device)
    have = (cfg.memory_cap_gb if capped else available_gb(cfg.device)) * MARGIN
    if need <= have:
        return None
    where = "under --memory" if capped else "on this machine"
    return (
        f"predicted {gib(need):.1f} GiB of tensors > {gib(have):.1f} GiB available {where} (advisor fit): not "
        f"built. --preset applies to vit, modernbert, llama and nanovlm; pass a smaller config for your own model"
    )


_PREDICTED: dict[tuple, dict] = {}  # one trace per model and cell kind in a process


def _prediction(cell: GridCell, rules: Rules) -> dict:
    cfg = cell.config
    key = (cell.model.config_hash, cfg.optimizer, cfg.strategy, cfg.device, cfg.lora_r, cfg.lora_alpha)
    if key not in _PREDICTED:
        config, fam, shape = user_config(cell.model, rules)
        seq = shape.seq_len if cell.model.family.takes_text else None
        # a measured arm steps as its strategy does; an adapter strategy is its adapter on its step
        adapter, strategy = rules.as_fit(cfg.strategy)
        lora = Adapter(adapter, r=cfg.lora_r, alpha=cfg.lora_alpha)
        spec = Spec(config, fam, seq, shape.image_size, "fp32", cfg.device, lora)
        _PREDICTED[key] = predict(spec, [cfg.optimizer], [strategy])[(cfg.optimizer, strategy)]
    return _PREDICTED[key]


def available_gb(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] / 1e9
    import psutil

    return psutil.virtual_memory().available / 1e9
