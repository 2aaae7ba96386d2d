"""Joules a request cost on the GPU, from NVML's energy counter (Volta and newer); None elsewhere.

`nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded, for the whole board, so a
reading covers everything the GPU did meanwhile: like the CPU seconds, it is exact for a quiet machine.
On the CPU there is no counter we can read without root (RAPL files are root-only on most distributions),
so CPU work is measured in process CPU seconds instead.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where there is a GPU (a CPU target may run without torch: `model.torchless`)
    import torch

    from specedit.engine.model.protocols import Device

log = logging.getLogger(__name__)


class EnergyMeter:
    """Reads the energy counter of the GPU behind a torch device; `read()` is None where there is none."""

    def __init__(self, device: Device) -> None:
        self._nvml: ModuleType | None = None
        self._handle: object = None
        if device.type != "cuda":
            return
        try:
            import pynvml
            import torch

            assert isinstance(device, torch.device)  # (a GPU is torch's)

            pynvml.nvmlInit()
            self._handle = _nvml_handle(pynvml, device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)  # supported on this board?
            self._nvml = pynvml
        except Exception as error:  # no driver, an old GPU, a sandbox: no joules, and no failure
            log.info("no GPU energy counter (%s): joules are not reported", error)
            self._handle = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> float | None:
        """Joules since the driver loaded, or None."""
        if self._nvml is None:
            return None
        import torch

        torch.cuda.synchronize()  # the work queued so far is part of this reading
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1000.0


def _nvml_handle(pynvml: ModuleType, device: torch.device) -> object:
    """NVML numbers GPUs by PCI order and CUDA may not (CUDA_VISIBLE_DEVICES): match by PCI bus id."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    bus = getattr(properties, "pci_bus_id", None)
    if bus is None:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    domain = getattr(properties, "pci_domain_id", 0)
    slot = getattr(properties, "pci_device_id", 0)
    return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{slot:02x}.0")
