"""The fair protocol's judgements of a run (rules/protocol.toml): the target held-out loss and when it
was first reached, whether the run trained at all, and whether its timing was contended."""

from __future__ import annotations

from dataclasses import dataclass


class Untrained(Exception):
    """The run's held-out loss never went below where it started: it did not train (an outcome)."""


def target_loss(cfg, family: str, rules) -> float | None:
    """The held-out loss a run must reach: --target-loss, else rules/protocol.toml's for the family and
    preset (None where the rules set none: time to target is then not measured)."""
    if cfg.target_loss is not None:
        return cfg.target_loss
    return rules.protocol.get("targets", {}).get(family, {}).get(cfg.preset)


@dataclass
class TargetClock:
    """When a run first reached its target: optimizer updates and training seconds (evaluations excluded,
    warm-up included: the user waits for it too). Checked after every evaluation."""

    target: float | None
    steps: int | None = None
    seconds: float | None = None

    def check(self, eval_loss: float, steps: int, seconds: float) -> None:
        if self.target is not None and self.steps is None and eval_loss <= self.target:
            self.steps, self.seconds = steps, seconds

    def metrics(self) -> list[tuple[str, float, str]]:
        if self.target is None:
            return []
        out = [
            ("target_loss", self.target, "nats/target, held-out"),
            ("target_reached", float(self.steps is not None), "1 reached, 0 not"),
        ]
        if self.steps is not None:
            out += [
                ("time_to_target", self.seconds, "s of training, evaluations excluded"),
                ("steps_to_target", float(self.steps), "optimizer updates"),
            ]
        return out


def check_trained(initial: float, final: float) -> None:
    """Raises Untrained when the final held-out loss is not below the initial one."""
    if not final < initial:
        raise Untrained(
            f"did not train: held-out loss {final:.4g} at the end, {initial:.4g} at the start "
            "(try another learning rate, or --tune-lr)"
        )


def contended(epochs: list[dict], rules, steps_vary: bool = False) -> bool:
    """Whether any epoch's timing was disturbed: other processes busy, or step times spread widely (not
    judged where steps differ by design, `steps_vary`: a line search runs 1 to 20 evaluations a step)."""
    limits = rules.protocol.get("contention", {})
    others, spread = limits.get("others_cpu", 0.25), limits.get("step_time_cv", 0.3)
    if steps_vary:
        spread = float("inf")
    return any((e.get("others_cpu") or 0) > others or (e.get("step_time_cv") or 0) > spread for e in epochs)
