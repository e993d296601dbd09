"""ByteSplat's trainer config: nerfstudio's Trainer, with multi-GPU refused up front until it is supported."""

from __future__ import annotations

from dataclasses import dataclass, field

from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils.rich_utils import CONSOLE


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: type = field(default_factory=lambda: Trainer)

    def __post_init__(self) -> None:
        devices = self.machine.num_devices * self.machine.num_machines
        if devices > 1:
            CONSOLE.print(
                f"[bold red]bytesplat trains on one device for now; got {self.machine.num_devices} device(s) x "
                f"{self.machine.num_machines} machine(s).[/bold red] Drop --machine.num-devices/--machine.num-machines "
                "(multi-GPU training comes in its own release)."
            )
            raise SystemExit(2)
