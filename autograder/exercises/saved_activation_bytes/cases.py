"""The scenarios of ``saved_activation_bytes``: layers and their sizes (plain Python)."""
from ..scenarios import held_out_rng

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
