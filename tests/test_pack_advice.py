"""Issue 35: `gridrun pack` is advised only to data that reads files. An input-bound run
whose samples are tensors in memory already (a TensorDataset, a Subset of one) is told
what helps it instead."""

from __future__ import annotations

import torch
from data_helpers import FileLike
from helper_tasks import SlowData
from torch.utils.data import ConcatDataset, Subset, TensorDataset

from gridrun.tasks.spirals import spirals
from gridrun.train import remedies

TENSORS = TensorDataset(torch.zeros(100, 2), torch.zeros(100, dtype=torch.long))


def advice(dataset, workers: int = 0) -> str:
    told = remedies.input_bound({"num_workers": workers}, dataset, {}, 6.0, 10.0, 1000)
    assert told is not None
    return told["text"]


def test_tensors_in_memory_are_not_told_to_pack():
    for dataset in (TENSORS, Subset(TENSORS, range(50)), Subset(Subset(TENSORS, [1, 2]), [0]),
                    ConcatDataset([TENSORS, Subset(TENSORS, [3])]),
                    spirals(train_size=64, val_size=16).train_data):
        text = advice(dataset)
        assert "gridrun pack" not in text and "packing" not in text, (dataset, text)
        assert "in memory already" in text and "a larger batch_size" in text, text


def test_with_workers_tensors_in_memory_are_told_fewer_workers_may_help():
    text = advice(TENSORS, workers=2)
    assert "gridrun pack" not in text and "num_workers = 0" in text, text
    assert "num_workers = 0" not in advice(TENSORS, workers=0)


def test_the_record_says_the_data_is_in_memory():
    told = remedies.input_bound({"num_workers": 0}, TENSORS, {}, 6.0, 10.0, 1000)
    assert told["storage"] == "memory"


def test_data_that_reads_files_is_still_told_to_pack():
    assert "gridrun pack DIR -o DIR.lmdb" in advice(FileLike())
    # a dataset that does not say how it reads: packing, if it reads one file per sample
    assert "packing, if it reads one file per sample (`gridrun pack`)" in advice(
        SlowData(TENSORS, 0.0))
    # a Subset of one that reads files is told too
    assert "gridrun pack DIR -o DIR.lmdb" in advice(Subset(FileLike(), [0]))
