"""A model run as its two declared stages on two devices, the activation moved between them (write-up 3's
model parallel), used by `mp` (one process) and `ddp-mp` (DDP over such processes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.models import two_stages


class SplitModel(nn.Module):
    """`model` with stage 1 on devices[0] and stage 2 on devices[1]; same parameters, same state_dict keys."""

    stages: tuple[nn.Module, nn.Module]

    def __init__(self, model: nn.Module, devices: tuple[torch.device, torch.device]) -> None:
        super().__init__()
        self.model = model  # registered: train()/eval() and parameters() reach every layer through it
        first, second = two_stages(model)
        # Moving a stage moves the model's own layers (shared, in place); the stages are not registered, so
        # the parameters are not listed twice.
        object.__setattr__(self, "stages", (first.to(devices[0]), second.to(devices[1])))
        self.devices = devices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.stages
        hidden = first(x.to(self.devices[0]))
        # The output goes back to the input's device, so the labels and the metrics stay where the data is.
        return second(hidden.to(self.devices[1])).to(x.device)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The unsplit model's state_dict: snapshots and final_model.pt compare with any other strategy's."""
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load an unsplit model's weights (each lands on the device its layer is on)."""
        return self.model.load_state_dict(state_dict, strict, assign)
