"""The shadow rank's state: it applies each all-reduced gradient one step late and keeps the last K states.

It holds Z(t−1) while the workers hold Z(t) and never writes a per-step checkpoint: an announced audit
of step s is served from memory while s − 1 is still among the last K states (else CHECKPOINT_MISSING).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from node.protocol.ledger import InvalidTraining, TrainingReason
from node.training.model import TrainState, compute_lr, compute_update
from node.training.spec import RunSpec

Updater = Callable[[TrainState, torch.Tensor, int], TrainState]  # (Z(t−1), all-reduced gradient, t) → Z(t)


class ShadowState:
    """The rolling buffer of the last K training states and the one gradient not yet applied."""

    def __init__(self, spec: RunSpec, initial: TrainState, update: Updater | None = None) -> None:
        self.spec = spec
        self.update: Updater = update or (lambda s, g, t: compute_update(s, g, compute_lr(spec, t), spec.momentum))
        self.states: OrderedDict[int, TrainState] = OrderedDict({initial.step: initial})
        self.pending: tuple[int, torch.Tensor] | None = None

    @property
    def latest(self) -> TrainState:
        """Return the newest applied state Z(t−1)."""
        return next(reversed(self.states.values()))

    def on_gradient(self, step: int, grad: torch.Tensor) -> None:
        """Take step t's all-reduced gradient: apply step t−1's, buffer this one."""
        if self.pending is not None:
            self._apply(*self.pending)
        self.pending = (step, grad)

    def _apply(self, step: int, grad: torch.Tensor) -> None:
        latest = self.latest
        if step != latest.step + 1:
            raise InvalidTraining(f"gradient of step {step} after state {latest.step}", TrainingReason.LEDGER_STEP_GAP,
                                  step)
        while len(self.states) >= self.spec.keep_checkpoints and len(self.states) > 1:
            self.states.popitem(last=False)  # dropped before the new state exists: K + 1 states never coexist
        self.states[step] = self.update(latest, grad, step)

    def get_state(self, step: int) -> TrainState:
        """Return Z(step) from the buffer, or the pending step's state computed on demand."""
        if step in self.states:
            return self.states[step]
        if self.pending is not None and step == self.pending[0] and step == self.latest.step + 1:
            grad_step, grad = self.pending
            return self.update(self.latest, grad, grad_step)
        raise InvalidTraining(f"state of step {step} is no longer among the last {self.spec.keep_checkpoints}",
                              TrainingReason.CHECKPOINT_MISSING, step)
