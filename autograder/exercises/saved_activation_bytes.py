"""Lesson 7 exercise: ``saved_activation_bytes(module, *inputs) -> int``.

Runs ``module(*inputs)`` with autograd on and returns the bytes autograd keeps for backward: every tensor saved
during that forward as ``torch.autograd.graph.saved_tensors_hooks`` sees it, counted once per distinct storage by
the storage's size (``t.untyped_storage().nbytes()``), the module's own parameters and buffers left out, everything
else (the inputs included) counted.

Observed on seeded layers (each on held-out sizes for a non-zero salt; the bytes depend on the sizes only): an
``nn.Linear`` (what it saves is its input, and its weight, which is a parameter); a small module that multiplies
by a buffer (a buffer saved for backward, left out); a GELU applied to a slice of a larger tensor (a view: its
whole storage counts); ``coursekit.transformer.Block`` in float32 with SDPA (q, k and v are views of one storage);
and the same block in bfloat16 with naive attention and dropout in training mode (Korthikanti et al.'s
34sbh + 5as²b, plus LayerNorm's statistics and the causal mask). The checks compare exact integers with the
reference's count. The numbers are the evidence: only counting the seeded layers' saved tensors gives them.

Cost of one observation: about 0.1 s on the 2-core CPU.
"""
import torch
from torch import nn

from coursekit.transformer import Block, Config

from ..exercise import (
    Check,
    Exercise,
    held_out_rng,
    observation,
    off_by,
    scenario,
    what,
)

SCENARIOS = {  # name: (what it is, public sizes)
    "linear": ("called on an nn.Linear", {"batch": 8, "d_in": 24, "d_out": 40}),
    "buffer": ("called on a layer that multiplies by a registered buffer", {"batch": 6, "width": 32}),
    "slice": ("called on GELU applied to a slice (a view) of a larger tensor", {"rows": 10, "cols": 48, "keep": 20}),
    "block_sdpa": ("called on a float32 transformer Block with SDPA attention",
                   {"batch": 2, "seq": 32, "width": 64, "heads": 4}),
    "block_bf16_dropout": ("called on a bfloat16 transformer Block with naive attention and dropout, in training",
                           {"batch": 2, "seq": 24, "width": 32, "heads": 2}),
}


def held_out_sizes(name: str, salt: int) -> dict:
    rng = held_out_rng(salt, f"sizes of {name}")
    if name == "linear":
        return {"batch": rng.randint(3, 12), "d_in": rng.randint(10, 40), "d_out": rng.randint(10, 40)}
    if name == "buffer":
        return {"batch": rng.randint(3, 12), "width": rng.randint(10, 40)}
    if name == "slice":
        cols = rng.randint(30, 60)
        return {"rows": rng.randint(4, 12), "cols": cols, "keep": rng.randint(5, cols // 2)}
    heads = rng.choice([2, 4])
    return {"batch": rng.randint(1, 3), "seq": rng.randint(9, 40), "width": heads * rng.choice([8, 16]),
            "heads": heads}


def cases(salt: int) -> dict[str, dict]:
    return {name: {"what": words, "layer": name, **(sizes if salt == 0 else held_out_sizes(name, salt)),
                   "seed": 700 + i}
            for i, (name, (words, sizes)) in enumerate(SCENARIOS.items())}


# ---- the layers --------------------------------------------------------------------------------

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


# ---- the checks (plain Python) -----------------------------------------------------------------

HINTS = {
    "linear": "nn.Linear saves its input x (count it: the inputs count) and its weight (a parameter: leave it out).",
    "buffer": "leave out every storage of the module's parameters and buffers (module.parameters() and "
              "module.buffers()), also when an op saves a view of one.",
    "slice": "a view holds on to its whole storage: count t.untyped_storage().nbytes(), not the view's own bytes.",
    "block_sdpa": "q, k and v are views of one storage (the qkv projection's output), and some tensors are saved "
                  "by several ops: count each storage once, keyed by untyped_storage().data_ptr().",
    "block_bf16_dropout": "count every saved storage once by its whole size (dropout's masks are 1 byte an "
                          "element), the input included and the block's parameters left out.",
}


def bytes_problem(student, reference, key: str) -> str | None:
    got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]
    if got["bytes"] is None:
        return f"When {what(reference, key)}, your function returned a {got['type']}, not a number of bytes."
    if float(got["bytes"]) != float(want["bytes"]):
        return (f"When {what(reference, key)}, your count ({int(got['bytes']):,} bytes) is "
                f"{off_by(float(got['bytes']), float(want['bytes']))}: {HINTS[key]}")
    return None


def check_linear(student, reference):
    return bytes_problem(student, reference, "linear")


def check_buffer(student, reference):
    return bytes_problem(student, reference, "buffer")


def check_slice(student, reference):
    return bytes_problem(student, reference, "slice")


def check_block_sdpa(student, reference):
    return bytes_problem(student, reference, "block_sdpa")


def check_block_bf16(student, reference):
    return bytes_problem(student, reference, "block_bf16_dropout")


def check_returns_int(student, reference):
    for key in reference["scenarios"]:
        got = scenario(student, key, what(reference, key))
        if got["type"] != "int":
            return f"Return a Python int (sum of the storages' sizes), not a {got['type']}."
    return None


def counted_right(got: dict, want: dict) -> str | None:
    """The evidence: the count of this seeded layer is exact, which only counting its saved tensors gives."""
    if got.get("bytes") is not None and float(got["bytes"]) == float(want["bytes"]):
        return None
    return f"when {want['case']['what']}, the count is not the layer's."


EXERCISE = Exercise(
    name="saved_activation_bytes",
    notebook="07_transformers.ipynb",
    observe=observe,
    evidence=counted_right,
    timeout_s=30,
    checks=[
        Check("Counts what nn.Linear saves, its input included", 2, check_linear),
        Check("Leaves the module's parameters and buffers out", 2, check_buffer),
        Check("Counts a view by its whole storage", 2, check_slice),
        Check("Counts each storage once (a transformer block: q, k, v are views of one tensor)", 2,
              check_block_sdpa),
        Check("A bfloat16 block with naive attention and dropout, to the byte", 2, check_block_bf16),
        Check("Returns a Python int", 1, check_returns_int, evidence=("linear",)),
    ],
)
