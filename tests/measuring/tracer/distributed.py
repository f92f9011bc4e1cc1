"""Real training steps of N ranks on this CPU over gloo (torch.multiprocessing on 127.0.0.1): FSDP2 as
`advisor/measuring/tracer/fsdp.py` wraps a model (fully_shard on every block and on the root) or DDP, full fine-tuning or
LoRA, and every rank's peak of live tensor bytes in its second step by PyTorch's MemTracker: the truth
`advisor fit --gpu cpu --gpus N` is checked against (tests/measuring/tracer/test_sharding.py)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path


def tiny_llama(folder: Path) -> Path:
    """The 4-layer, 256-wide Llama the issue measured (75.4 MB a rank of 2 under FSDP), as a config folder."""
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=4096,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    return folder


def run_ranks(
    folder: Path, world: int, sharding: str, adapter: str, batch: int, seq_len: int, micro_batches: int = 1
) -> list[int]:
    """Every rank's peak (bytes) of a real step: `sharding` fsdp or ddp, `adapter` full or lora; with
    `micro_batches` above one, accumulating, each micro-batch's gradients reduced as it ends (accelerate's
    sync_each_batch, the printed code's)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(
            _rank,
            args=(world, str(folder), sharding, adapter, batch, seq_len, port, out, micro_batches),
            nprocs=world,
            join=True,
        )
        return [json.loads((Path(out) / f"{r}.json").read_text())["peak"] for r in range(world)]


def _rank(rank, world, folder, sharding, adapter, batch, seq_len, port, out, micro_batches=1) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig

    from advisor.measuring.model.adapters import adapted
    from advisor.measuring.model.families import family
    from advisor.measuring.recipe.optimizers import make_optimizer
    from advisor.measuring.tracer.fsdp import blocks
    from advisor.prediction.step import Adapter
    from advisor.rules import load_rules

    from .realstep import FrozenOKMemTracker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fam = family("decoder", load_rules())
        config = AutoConfig.from_pretrained(folder)
        torch.manual_seed(0)
        model = fam.model_class().from_config(config, attn_implementation="sdpa")
        if adapter == "lora":
            model = adapted(model, Adapter("lora"), "fp32")
        if sharding == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in blocks(model):
                fully_shard(block)
            fully_shard(model)
        else:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer("adamw", trainable, 1e-4, cuda_defaults=False, model=model)
        inputs = fam.fit_batch(config, batch, seq_len, None)

        tracker = None

        def step():
            opt.zero_grad(set_to_none=True)
            for _ in range(micro_batches):
                if tracker is not None:
                    tracker.reset_mod_stats()  # MemTracker's per-module stats take one forward at a time
                loss = model(**inputs).loss
                loss.backward()
                del loss
            opt.step()

        step()  # the optimizer's state, DDP's rebuilt buckets
        tracker = FrozenOKMemTracker()
        tracker.track_external(model, opt)
        with tracker:
            step()
        (snapshot,) = tracker.get_tracker_snapshot("peak").values()
        (Path(out) / f"{rank}.json").write_text(json.dumps({"peak": snapshot["Total"]}))
    finally:
        dist.destroy_process_group()
