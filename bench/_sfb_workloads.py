"""Two user-style workloads with wide fully connected layers (``bench/_sfb_workloads.py:wide`` ...), where
Poseidon's rule says sufficient-factor broadcasting should win at small batches (bench/seed_plans.py)."""
import torch
import torch.nn.functional as F
from torch import nn


class Wide(nn.Module):
    """Two 2048 x 2048 layers regressing a fixed random teacher."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(1024, 2048), nn.Linear(2048, 2048)
        self.c = nn.Linear(2048, 64)

    def forward(self, x, y):
        return F.mse_loss(self.c(torch.relu(self.b(torch.relu(self.a(x))))), y)


def wide():
    teacher = torch.randn(1024, 64, generator=torch.Generator().manual_seed(1)) / 32

    def make_batch(batch_size, gen):
        x = torch.randn(batch_size, 1024, generator=gen)
        return {"x": x, "y": torch.tanh(x @ teacher)}
    torch.manual_seed(0)
    return Wide(), make_batch


class AutoEncoder(nn.Module):
    """A dense autoencoder 1536 -> 3072 -> 512 -> 3072 -> 1536 on low-rank data."""

    def __init__(self):
        super().__init__()
        dims = [1536, 3072, 512, 3072, 1536]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return F.mse_loss(h, x)


def autoencoder():
    basis = torch.randn(32, 1536, generator=torch.Generator().manual_seed(2))

    def make_batch(batch_size, gen):
        return {"x": torch.randn(batch_size, 32, generator=gen) @ basis / 8}
    torch.manual_seed(0)
    return AutoEncoder(), make_batch
