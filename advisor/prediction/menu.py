"""The menu of `advisor fit`: the configurations a question asks about (adapters x dtypes x optimizers x
strategies x shardings x offload), each refused where it cannot run, in the rules' order."""

from __future__ import annotations

from functools import cache
from importlib.util import find_spec

from advisor.errors import InputError
from advisor.prediction import accelerators
from advisor.prediction.fit_request import ADAPTERS, DTYPES, OFFLOADS, SHARDINGS, FitRequest, dtypes_asked
from advisor.prediction.step import (
    Config,
    Method,
)
from advisor.rules import Accelerator, Rules

# FSDP's default strategies (Menu.strategies): Trainer's own checkpointing (fsdp_config's, on or off), with and
# without accumulation (each micro-batch's gradients reduce-scattered: accelerate's sync_each_batch)
SHARDED_STRATEGIES = ("standard", "checkpointing", "accumulation", "checkpointing+accumulation")


OFFLOAD_DTYPES = ("bf16-mixed",)  # what an offloaded optimizer is predicted for: a bf16 device copy


class Menu:
    """The configurations a question asks about: each axis as given, else its default, with the combinations
    that do not apply left out (and refused when the user named both sides of one)."""

    def __init__(self, options: FitRequest, rules: Rules, acc: Accelerator | None):
        self.o, self.rules, self.acc = options, rules, acc
        self.cpu = acc is not None and acc.key == "cpu"
        self.left_out: list[str] = []

    def configs(self) -> tuple[tuple[Config, ...], tuple[str, ...]]:
        out, why = [], []
        for sharding in self.shardings():
            for adapter in self.adapters():
                for dtype in self.dtypes(adapter):
                    for optimizer in self.optimizers(adapter):
                        reason = refused(sharding, adapter, dtype, optimizer, self.rules) or self._copy(
                            sharding, adapter
                        )
                        if reason:
                            why.append(reason)
                            continue
                        offloads = self.offloads(adapter, dtype, optimizer, sharding)
                        if not offloads:
                            self.left_out.append(
                                f"{sharding}: --offload {'/'.join(self.o.offload)} does not apply to it"
                            )
                        for offload in offloads:
                            out += [
                                Config(adapter, dtype, optimizer, s, offload, sharding)
                                for s in self.strategies(sharding)
                            ]
        if not out and self.cpu and "none" not in (self.o.offload or ("none",)):
            raise InputError(
                "offload moves state from an accelerator to the host: a CPU run has nothing to offload.",
                "offload",
            )
        if not out and "none" not in (self.o.offload or ("none",)):
            raise InputError(
                "offload applies to full fine-tuning in bf16-mixed on one GPU (an optimizer the host can step: "
                "adam, adamw, adagrad, lion_32bit), to ZeRO-2 and ZeRO-3 (optimizer; ZeRO-3 also "
                "optimizer+params) and to FSDP and HSDP (optimizer+params).",
                "offload",
            )
        if not out:
            hint = f" ({why[0]})" if why else ""
            raise InputError(
                f"no configuration is left to predict{hint}: widen --adapter, --dtype, --optimizer or --sharding.",
                "shardings" if why else "adapters",
            )
        return tuple(out), tuple(dict.fromkeys(self.left_out))

    def shardings(self) -> tuple[str, ...]:
        """How the ranks share the work: none on one accelerator; else every way that applies to the nodes."""
        world = self.o.gpus * self.o.nodes
        asked = tuple(self.o.shardings)
        if world == 1:
            if asked and asked != ("none",):
                raise InputError(
                    f"--sharding {asked[0]} takes several accelerators: pass --gpus 2 or more.", "shardings"
                )
            return ("none",)
        if "none" in asked:
            raise InputError(
                "--sharding none is one accelerator: drop --gpus and --nodes, or pick a sharding.",
                "shardings",
            )
        if "hsdp" in asked and self.o.nodes == 1:
            raise InputError(
                "hsdp shards within a node and replicates across nodes: pass --nodes 2 or more, or use fsdp.",
                "shardings",
            )
        if asked:
            return asked
        return tuple(s for s in SHARDINGS if s != "none" and (s != "hsdp" or self.o.nodes > 1))

    def adapters(self) -> tuple[str, ...]:
        if self.o.adapters:
            if "qlora" in self.o.adapters and self.cpu:
                raise InputError(
                    "QLoRA's 4-bit and 8-bit kernels are CUDA's: pass a --gpu, not cpu.", "adapters"
                )
            return tuple(a for a in ADAPTERS if a in self.o.adapters)
        menu = ("full", "lora") if self.cpu else ADAPTERS
        if self.o.reference == "adapter":  # an adapter to disable: full fine-tuning has none
            self.left_out.append(
                "full: --reference adapter disables a LoRA adapter, which full fine-tuning has not"
            )
            return tuple(a for a in menu if a != "full")
        return menu

    def dtypes(self, adapter: str) -> tuple[str, ...]:
        asked = dtypes_asked(self.o.dtype)
        for dtype in asked:
            self._check_dtype(dtype)
        if adapter == "qlora" and "fp32" in asked:
            if self.o.adapters and asked == ("fp32",):
                raise InputError(
                    f"QLoRA computes in half precision: pass --dtype {mixed_dtype(self.acc)}.", "dtype"
                )
            asked = tuple(d for d in asked if d != "fp32")
            if not asked:
                self.left_out.append("qlora: QLoRA computes in half precision, and --dtype asked fp32 only")
                return ()
        if asked:
            return asked
        best = mixed_dtype(self.acc)
        # pure bf16 is a full fine-tuning choice; an adapter's frozen base is bf16 under bf16-mixed already
        return (best, "bf16") if adapter == "full" and best == "bf16-mixed" else (best,)

    def _check_dtype(self, dtype: str) -> None:
        if dtype not in DTYPES:
            raise InputError(f"unknown dtype {dtype!r}. Choose from: {', '.join(DTYPES)}.", "dtype")
        acc = self.acc
        if acc is not None and not self.cpu and accelerators.peak_tflops(acc, dtype) is None:
            raise InputError(
                f"{acc.name} has no {accelerators.PRECISION[dtype]} support; use --dtype fp16-mixed or fp32.",
                "dtype",
            )

    def optimizers(self, adapter: str) -> tuple[str, ...]:
        info = self.rules.optimizer_info
        if self.o.optimizers:
            for name in self.o.optimizers:
                self._check_installed(name)
                if adapter not in info[name].adapters and self.o.adapters:
                    raise InputError(
                        f"{name} trains {', '.join(info[name].adapters)} only: with --adapter {adapter}, "
                        "pick an AdamW-class optimizer (e.g. adamw).",
                        "optimizers",
                    )
            return tuple(n for n in self.o.optimizers if adapter in info[n].adapters)
        out = []
        for name, record in info.items():
            if self.cpu and name.startswith("paged_"):
                continue  # paging moves state from an accelerator to the host: a CPU run has no such thing
            if record.menu and adapter in record.adapters:
                if not installed(self.rules, name):
                    self.left_out.append(f"{name}: needs {record.package} (pip install {record.package})")
                else:
                    out.append(name)
        return tuple(out)

    def _check_installed(self, name: str) -> None:
        if not installed(self.rules, name):
            package = self.rules.optimizer_info[name].package
            raise InputError(
                f"{name} needs {package}: pip install {package} (or pip install 'advisor[measure]').",
                "optimizers",
            )

    def _reference_copy(self, adapter: str) -> bool:
        """DPO (GRPO with a KL coefficient) with its reference as a frozen copy of the model, for this adapter."""
        method = Method.asked(self.o.method, self.o.reference, adapter, self.o.beta or 0.0)
        return method.reference == "model"

    def _copy(self, sharding: str, adapter: str) -> str | None:
        """Why the method is not predicted under a sharding (None: it is): DPO's frozen reference copy under
        ZeRO; GRPO's generation under ZeRO or FSDP, which gathers the whole model on every rank for
        `generate` (TRL's ds3_gather_for_generation, FSDP's summon_full_params): not traced."""
        if self.o.method == "grpo" and sharding not in ("none", "ddp"):
            reason = "GRPO is predicted on one GPU and under DDP, not ZeRO or FSDP (their generation gathers the whole model on every rank)"
            self.left_out.append(reason)
            return reason
        if sharding.startswith("zero") and self._reference_copy(adapter):
            return (
                "DPO's reference copy is predicted on one GPU, under DDP and FSDP, not ZeRO (or --reference "
                "adapter / precomputed)"
            )
        return None

    def offloads(self, adapter: str, dtype: str, optimizer: str, sharding: str = "none") -> tuple[str, ...]:
        hostable = self.rules.optimizer_info[optimizer].offload and not self.cpu
        if self._reference_copy(adapter) or self.o.method == "grpo":  # not composed with a copy, a rollout
            hostable = False
        applies = {
            "none": ("optimizer",) if adapter == "full" and dtype in OFFLOAD_DTYPES and hostable else (),
            "zero2": ("optimizer",) if hostable else (),
            "zero3": ("optimizer", "optimizer+params") if hostable else (),
            "fsdp": ("optimizer+params",) if not self.cpu else (),
            "hsdp": ("optimizer+params",) if not self.cpu else (),
        }.get(sharding, ())
        return tuple(o for o in self.o.offload or OFFLOADS if o == "none" or o in applies)

    def strategies(self, sharding: str = "none") -> tuple[str, ...]:
        """As asked, else every one; FSDP's default is Trainer's own (fsdp_config's activation checkpointing, full
        or none, with or without accumulation): its traces are the menu's dearest."""
        if self.o.strategies:
            return tuple(self.o.strategies)
        if sharding in ("fsdp", "hsdp"):
            self.left_out.append(f"{sharding}: selective checkpointing on request (--strategy)")
            return tuple(s for s in self.rules.strategies if s in SHARDED_STRATEGIES)
        return self.rules.fit_strategies


def refused(sharding: str, adapter: str, dtype: str, optimizer: str, rules: Rules) -> str | None:
    """Why a sharding does not take this adapter, precision or optimizer (None: it does)."""
    if sharding.startswith("zero"):
        if adapter == "qlora":
            return "DeepSpeed ZeRO is predicted for full fine-tuning and LoRA, not QLoRA"
        if dtype not in ("bf16-mixed", "fp16-mixed"):
            return f"DeepSpeed ZeRO keeps fp32 master weights (--dtype bf16-mixed or fp16-mixed), not --dtype {dtype}"
        if optimizer in ("cgd", "muon") or optimizer.startswith("paged_"):
            return f"{optimizer} is not predicted under DeepSpeed ZeRO"
    if sharding in ("fsdp", "hsdp"):
        if adapter == "qlora":
            return "FSDP with a quantized base (QLoRA) is not predicted yet"
        if dtype == "fp16-mixed":
            return "FSDP is predicted in fp32, bf16-mixed and bf16"
        if not rules.optimizer_info[optimizer].sharded:
            return f"{optimizer} does not step FSDP's sharded parameters"
    return None


def mixed_dtype(acc: Accelerator | None) -> str:
    """The accelerator's mixed precision: bf16 where the chip has it, fp16 where it has only fp16; fp32 on a
    CPU (and bf16-mixed for a bare --memory budget)."""
    if acc is not None and acc.key == "cpu":
        return "fp32"
    return "bf16-mixed" if acc is None or "bf16" in acc.tflops else "fp16-mixed"


def installed(rules: Rules, optimizer: str) -> bool:
    """Whether the package an optimizer needs (rules/optimizers.toml) is installed; found without importing."""
    package = rules.optimizer_info[optimizer].package
    return package is None or _findable(package)


@cache  # once a process: a menu asks it of every row (a 70B menu on 8 GPUs: 120 times)
def _findable(package: str) -> bool:
    return find_spec(package) is not None
