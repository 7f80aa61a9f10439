"""Data-pipeline inputs that gave silently wrong results, checked against torch.utils.data:
each test its reproducer, with what parcl did before and what PyTorch gives."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from parcl.data import (ConcatDataset, DataLoader, Dataset, TensorDataset, default_collate,
                        text_corpus)

MIXED = {
    # numpy's float64 where PyTorch keeps the float32 sample's dtype (Python floats are
    # torch's default dtype, float32, in its inference)
    "a float32 scalar and a Python float": [np.float32(0.5), 0.25],
    "a float16 scalar and a Python int": [np.float16(1.5), 2],
    "int32 and float32 scalars": [np.int32(3), np.float32(0.5)],
    "int32 and float32 arrays": [np.ones(2, np.int32), np.full(2, 0.5, np.float32)],
    "int64 and float16 arrays": [np.arange(2), np.full(2, 0.5, np.float16)],
    # float32 where PyTorch keeps float64: 0.1 became 0.10000000149
    "a Python int and a float64 scalar": [1, np.float64(0.1)],
    "a Python int and a float16 scalar": [1, np.float16(0.5)],
    # int64 with the imaginary part dropped where PyTorch gives complex64
    "a Python int and a complex64 scalar": [1, np.complex64(2j)],
}


@pytest.mark.parametrize("batch", MIXED.values(), ids=MIXED.keys())
def test_default_collate_promotes_samples_of_mixed_dtypes_as_pytorch(batch):
    want = tud.default_collate(batch).numpy()
    got = default_collate(batch)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_loader_batches_float32_targets_with_a_python_float_among_them_as_float32():
    """A dataset whose targets are float32 but 0.0 where a target is missing: the batch was
    float64 [0.5, 0.0, 1.5] (every later op on it float64 or refused) where PyTorch's is
    float32."""

    class Targets(Dataset):
        y = np.array([0.5, np.nan, 1.5], np.float32)

        def __len__(self):
            return 3

        def __getitem__(self, i):
            return 0.0 if np.isnan(self.y[i]) else self.y[i]

    (batch,) = DataLoader(Targets(), batch_size=3)
    (want,) = tud.DataLoader(Targets(), batch_size=3)
    assert want.dtype == torch.float32 and batch.dtype == np.float32
    assert batch.tolist() == want.tolist() == [0.5, 0.0, 1.5]


def test_default_collate_of_one_dtype_is_unchanged():
    assert default_collate([np.float32(1), np.float32(2)]).dtype == np.float32
    assert default_collate([1, 2]).dtype == np.int64
    assert default_collate([1, 2.5]).dtype == np.float32      # torch.tensor([1, 2.5])
    assert default_collate([2.5, 1]).dtype == np.float64      # a float first: float64
    assert default_collate([True, False]).dtype == np.bool_
    assert default_collate([np.ones(2, np.float16)] * 2).dtype == np.float16


def test_a_corpus_root_inside_a_site_packages_reads_its_files(tmp_path):
    """The files' absolute paths were checked for a site-packages part, so a root inside a
    virtual environment's (``text_corpus(root=numpy's directory)``) left out every file and
    raised 'no .py files under ...' where there were; a site-packages below the root is
    still left out."""
    root = tmp_path / "site-packages" / "pkg"
    (root / "site-packages").mkdir(parents=True)
    for name, text in (("a.py", "a = 1\n"), ("b.py", "b = 2\n"), ("c.py", "c = 3\n")):
        (root / name).write_text(text)
    (root / "site-packages" / "d.py").write_text("d = 4\n")
    corpus = text_corpus(max_chars=100, val_every=2, root=str(root))
    assert sorted(corpus.train_files + corpus.val_files) == ["a.py", "b.py", "c.py"]
    assert len(corpus.train) + len(corpus.val) == 18


def test_a_corpus_whose_first_validation_file_is_empty_reads_on_until_validation_has_text(
        tmp_path):
    """The cap stopped the reading once validation had a file, so where that file (the first
    in CRC-32 order) was empty, as an ``__init__.py``, the validation text was empty and
    ``unigram_baseline()`` NaN; now the reading goes on to the next validation file."""
    names = sorted((f"m{i}.py" for i in range(5)), key=lambda n: zlib.crc32(n.encode()))
    (tmp_path / names[0]).write_text("")
    for name in names[1:]:
        (tmp_path / name).write_text("x = 1\n" * 20)
    corpus = text_corpus(max_chars=100, val_every=2, root=str(tmp_path))
    assert corpus.val_files == (names[0], names[2]) and corpus.train_files == (names[1],)
    assert len(corpus.val) == 120 and len(corpus.train) == 120
    counts = np.bincount(corpus.train, minlength=corpus.vocab.size) + 1.0
    want = -np.log(counts / counts.sum())[corpus.val].mean()
    assert corpus.unigram_baseline().nats == pytest.approx(want)


def test_a_loaders_collate_fn_is_default_collate_unless_given_as_pytorch():
    """``loader.collate_fn`` was None where none was given, so collating samples the loader's
    way (``loader.collate_fn([ds[0], ds[1]])``) raised 'NoneType' object is not callable;
    PyTorch's is default_collate, and over a TensorDataset it gives the sliced batch."""
    ds = TensorDataset(np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(3))
    for loader in (DataLoader(ds, batch_size=2), DataLoader(ConcatDataset([ds]), 2)):
        assert loader.collate_fn is default_collate
    assert tud.DataLoader(list(range(3))).collate_fn is tud.default_collate
    x, y = DataLoader(ds, batch_size=2).collate_fn([ds[0], ds[1]])
    first = next(iter(DataLoader(ds, batch_size=2)))
    assert x.tolist() == first[0].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert y.dtype == first[1].dtype == np.int64 and y.tolist() == first[1].tolist() == [0, 1]
    assert DataLoader(ds, 2, collate_fn=len).collate_fn is len
