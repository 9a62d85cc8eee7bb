"""`sort`: a tiny transformer learns to sort variable-length sequences.

Sequences are padded by the task's `collate_fn`; throughput is counted in
tokens (padding excluded). Exported models take any length up to `max_len`;
`export-model --static` fixes the length at `max_len` (shorter sequences are
fed padded with token 0 and a False mask, which the model ignores).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from gridrun.tasks import InputInfo, Task

PAD = 0


class Sequences(Dataset):
    def __init__(self, n: int, vocab: int, min_len: int, max_len: int, seed: int):
        self.n, self.vocab, self.min_len, self.max_len, self.seed = n, vocab, min_len, max_len, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        length = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        return torch.randint(1, self.vocab, (length,), generator=g)  # 0 is padding


def collate(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    x = nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=PAD)
    y = nn.utils.rnn.pad_sequence([t.sort().values for t in items], batch_first=True,
                                  padding_value=PAD)
    return {"x": x, "y": y, "mask": x != PAD}


class Sorter(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        return self.head(self.encoder(h, src_key_padding_mask=~mask))


def sort(vocab: int = 16, dim: int = 32, heads: int = 2, layers: int = 2, min_len: int = 4,
         max_len: int = 12, train_size: int = 1024, val_size: int = 256, data_seed: int = 7) -> Task:
    """Sort integer sequences of varying length. Metrics: loss, token accuracy."""
    length = torch.export.Dim("length", min=1, max=max_len)

    def loss(model, batch):
        logits = model(batch["x"], batch["mask"])
        return F.cross_entropy(logits[batch["mask"]], batch["y"][batch["mask"]])

    def evaluate(model, batch):
        mask = batch["mask"]
        logits = model(batch["x"], mask)[mask]
        y = batch["y"][mask]
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), mask.sum()),
                "accuracy": ((logits.argmax(-1) == y).sum(), mask.sum())}

    return Task(
        model=Sorter(vocab, dim, heads, layers, max_len),
        train_data=Sequences(train_size, vocab, min_len, max_len, data_seed),
        val_data=Sequences(val_size, vocab, min_len, max_len, data_seed + 1),
        loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"},
        collate_fn=collate,
        count_samples=lambda batch: batch["x"].shape[0],
        count_tokens=lambda batch: int(batch["mask"].sum()),
        inputs=lambda batch: {"x": batch["x"], "mask": batch["mask"]},
        # exported models take any batch size and any length up to max_len (the positions)
        dynamic_shapes={"x": {0: "batch", 1: length}, "mask": {0: "batch", 1: length}},
        # no preprocess: token ids and their mask are the model's input as they are
        input_info={"x": InputInfo("L", (0, vocab - 1), f"token ids 1..{vocab - 1}; 0 is padding"),
                    "mask": InputInfo("L", (0, 1), "True at real tokens (x != 0), False at padding")},
    )
