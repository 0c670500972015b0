"""Which device the lessons run on, and how to name it next to a measurement."""
import datetime
import os
import platform

import torch


def pick_device() -> torch.device:
    """CUDA when present, else CPU. Every lesson runs on both."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device | str | None = None) -> str:
    """One line to print next to a number: what it was measured on, with which torch, when."""
    device = torch.device(device) if device is not None else pick_device()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        hw = f"{name} (CUDA {torch.version.cuda})"
    else:
        hw = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    return f"{hw} · torch {torch.__version__} · {datetime.date.today().isoformat()}"
