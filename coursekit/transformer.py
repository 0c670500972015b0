"""A small decoder-only transformer language model (nanoGPT's shape) and text that ships with Python.

Lessons 7 and 8 train and measure this model; it is deliberately plain so that every tensor it keeps for
backward can be named: token + position embeddings, ``n_layer`` pre-LayerNorm blocks (causal self-attention,
then a 4× MLP with GELU), a final LayerNorm and a head tied to the token embedding.

Attention is pluggable: ``Config.attention`` is ``"sdpa"`` (``F.scaled_dot_product_attention``), ``"naive"``
(softmax(q kᵀ / √d) v written out, which keeps the s × s matrices) or any function
``attend(q, k, v, is_causal) -> o`` on (batch, heads, s, head_dim) tensors, e.g. a student's FlashAttention.

Dropout (``Config.dropout``, off by default) sits where GPT-2 and Megatron put it: on the attention probabilities
(built-in attentions only: a function ``attend`` gets none), after each projection into the residual stream, and
after the embeddings. It keeps a 1-byte mask for backward on every device, as CUDA's fused dropout kernel does, so
the bytes a block saves are those of Korthikanti et al. (2022), 34sbh + 5as²b in 16-bit (``F.dropout`` on a CPU
keeps the scaled noise instead, in the activations' dtype).

The text: the docstrings of a fixed list of standard-library modules, so nothing downloads and every machine
with the same Python minor version reads the same characters.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

CORPUS_MODULES = ("this", "collections", "functools", "itertools", "json", "pathlib", "random", "statistics",
                  "string", "textwrap", "typing", "dataclasses", "heapq", "bisect", "fractions", "decimal")


@dataclass
class Config:
    vocab_size: int = 96
    block_size: int = 128       # longest sequence the position embedding covers
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    attention: str | Callable = "sdpa"


class Dropout(nn.Dropout):
    """``nn.Dropout`` that keeps a 1-byte mask for backward on every device (``torch.native_dropout``, the kernel
    ``F.dropout`` uses on CUDA; on a CPU ``F.dropout`` keeps the scaled noise, 2 or 4 bytes an element)."""

    def forward(self, x):
        return torch.native_dropout(x, self.p, True)[0] if self.training and self.p > 0 else x


def naive_attention(q, k, v, is_causal: bool = False, dropout_p: float = 0.0):
    """softmax(q kᵀ / √d) v with the s × s scores and probabilities as real tensors (kept for backward)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if is_causal:
        n_q, n_k = scores.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    probabilities = scores.softmax(dim=-1)
    if dropout_p > 0:
        probabilities = torch.native_dropout(probabilities, dropout_p, True)[0]
    return probabilities @ v


def sdpa_attention(q, k, v, is_causal: bool = False, dropout_p: float = 0.0):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p)


def attention_function(choice: str | Callable) -> Callable:
    if callable(choice):
        return choice
    return {"sdpa": sdpa_attention, "naive": naive_attention}[choice]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)
        self.attend = attention_function(config.attention)
        self.attention_dropout = config.dropout if isinstance(config.attention, str) else 0.0

    def forward(self, x):
        b, s, _ = x.shape
        # Sizes come from the tensors, not the config: under tensor parallelism (Lesson 8) qkv yields only this
        # rank's heads.
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.training and self.attention_dropout > 0:
            y = self.attend(q, k, v, is_causal=True, dropout_p=self.attention_dropout)
        else:
            y = self.attend(q, k, v, is_causal=True)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(b, s, -1)))


class MLP(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: Config, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = nn.Embedding(config.block_size, config.n_embd)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():  # GPT-2's init; projections into the residual stream scaled down
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, tokens, targets=None):
        s = tokens.size(1)
        x = self.drop(self.tok(tokens) + self.pos(torch.arange(s, device=tokens.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ---- text that ships with Python ------------------------------------------------------------------

def corpus_text() -> str:
    """The docstrings of ``CORPUS_MODULES`` (module, classes and functions), printable ASCII only."""
    import contextlib
    import importlib
    import inspect
    import io

    parts = []
    for name in CORPUS_MODULES:
        with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen the first time
            module = importlib.import_module(name)
        if name == "this":  # the Zen of Python is stored rot13-encoded
            parts.append("".join(module.d.get(c, c) for c in module.s))
            continue
        parts.append(inspect.getdoc(module) or "")
        for _, obj in sorted(vars(module).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
                parts.append(inspect.getdoc(obj) or "")
    text = "\n\n".join(p for p in parts if p)
    return "".join(c for c in text if c == "\n" or 32 <= ord(c) < 127)


class CharTokenizer:
    """Characters ↔ integers: the 95 printable ASCII characters and newline (96 tokens)."""

    chars = "\n" + "".join(chr(i) for i in range(32, 127))

    def __init__(self):
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text if c in self.index], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def token_data() -> torch.Tensor:
    """The corpus as one long tensor of token ids."""
    return CharTokenizer().encode(corpus_text())


def batch(data: torch.Tensor, batch_size: int, seq_len: int, *, generator: torch.Generator | None = None):
    """Random windows of ``seq_len`` tokens and their next-token targets: (batch, seq_len) each."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + seq_len] for i in starts])
    y = torch.stack([data[i + 1:i + 1 + seq_len] for i in starts])
    return x, y
