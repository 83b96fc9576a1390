"""A byte-level CNN: embedding, two convolutions, max over time, a linear head."""

from __future__ import annotations

import torch
from torch import nn


class ByteCNN(nn.Module):
    def __init__(self, classes: int, embed: int, channels: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, embed)
        self.conv1 = nn.Conv1d(embed, channels, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=5, padding=4, dilation=2)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).transpose(1, 2)  # (B, T) -> (B, E, T)
        h = torch.relu(self.conv1(h))  # (B, C, T)
        h = torch.relu(self.conv2(h))  # (B, C, T)
        h = h.amax(dim=2)  # (B, C): the strongest response anywhere in the window
        return self.head(self.drop(h))  # (B, classes)
