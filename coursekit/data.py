"""Real data that ships with a package, so nothing downloads: scikit-learn's digits.

1,797 handwritten 8×8 digits (64 features, 10 classes), bundled inside scikit-learn.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset


def digits(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Features scaled to [0, 1] and integer labels."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return torch.tensor(X / 16.0, dtype=dtype), torch.tensor(y, dtype=torch.long)


def digits_loader(batch_size: int, *, shuffle: bool = True, seed: int = 0, limit: int | None = None,
                  drop_last: bool = False) -> DataLoader:
    """A seeded DataLoader over the digits (the same batches every run for a given seed)."""
    X, y = digits()
    if limit is not None:
        X, y = X[:limit], y[:limit]
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=shuffle,
                      generator=generator, drop_last=drop_last)


def mlp(hidden: int = 64, *, dropout: float = 0.0, seed: int = 0) -> torch.nn.Module:
    """The small classifier most lessons train on the digits: 64 → hidden → 10."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(64, hidden), torch.nn.ReLU()]
    if dropout:
        layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(*layers)
