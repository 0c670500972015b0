"""Observing ``saved_activation_bytes`` on the grader's own layers."""
import torch
from torch import nn

from coursekit.transformer import Block, Config

from ..beside.observing import observation
from .cases import cases


class ScaledTanh(nn.Module):
    """tanh(linear(x) · gain), with gain a buffer: the multiplication saves it for backward."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("gain", torch.linspace(0.5, 1.5, width))

    def forward(self, x):
        return torch.tanh(self.fc(x) * self.gain)


def make_problem(c: dict):
    """The seeded layer and its inputs for a scenario."""
    name = c["layer"]
    torch.manual_seed(c["seed"])
    if name == "linear":
        return nn.Linear(c["d_in"], c["d_out"]), (torch.randn(c["batch"], c["d_in"], requires_grad=True),)
    if name == "buffer":
        return ScaledTanh(c["width"]), (torch.randn(c["batch"], c["width"]),)
    if name == "slice":
        whole = torch.randn(c["rows"], c["cols"], requires_grad=True)
        return nn.GELU(), (whole[:, :c["keep"]],)  # a view: GELU saves it, and with it the whole storage
    bf16 = name == "block_bf16_dropout"
    config = Config(n_embd=c["width"], n_head=c["heads"], dropout=0.1 if bf16 else 0.0,
                    attention="naive" if bf16 else "sdpa")
    block = Block(config).to(torch.bfloat16 if bf16 else torch.float32).train()
    x = torch.randn(c["batch"], c["seq"], c["width"], dtype=torch.bfloat16 if bf16 else torch.float32,
                    requires_grad=True)
    return block, (x,)


def run_problem(fn, c: dict) -> dict:
    module, inputs = make_problem(c)
    returned = fn(module, *inputs)
    is_number = isinstance(returned, (int, float, torch.Tensor)) and not isinstance(returned, bool) and \
        (not isinstance(returned, torch.Tensor) or returned.numel() == 1)
    return {"bytes": float(returned) if is_number else None, "type": type(returned).__name__}


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda c: run_problem(fn, c))
