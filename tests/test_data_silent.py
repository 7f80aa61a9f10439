"""Data-loading inputs that used to give silently wrong results, each test its reproducer,
with what parcl did and what a correct resume does."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
from parcl.errors import ShapeError


@pytest.mark.parametrize("change", ["block_size", "tokens"])
def test_a_text_loader_state_of_other_windows_is_refused(change):
    """``TextLoader.state_dict()`` named the position by window count only, so a state saved
    over windows of 34 tokens loaded into a loader of 40-token windows (or over another
    corpus) with the same number of windows: the resumed epoch went on at batch 1 of
    windows that start elsewhere, and tokens 34..39 of that epoch were never trained on, with
    no error (a ``DataLoader`` refuses another ``batch_size`` for the same reason). Refused
    now, naming the setting; the same loader still resumes."""
    tokens = np.arange(101) % 50
    saved = pc.data.TextLoader(tokens, block_size=34, batch_size=1, shuffle=False)
    first = next(iter(saved))
    state = saved.state_dict()
    other = (pc.data.TextLoader(tokens, block_size=40, batch_size=1, shuffle=False)
             if change == "block_size" else
             pc.data.TextLoader(np.arange(90) % 50, block_size=34, batch_size=1,
                                shuffle=False))
    assert len(other) == len(saved)               # the window count alone cannot tell
    with pytest.raises(ShapeError, match="block_size" if change == "block_size" else "tokens"):
        other.load_state_dict(state)
    assert other.batch_index == 0                 # nothing changed
    again = pc.data.TextLoader(tokens, block_size=34, batch_size=1, shuffle=False)
    again.load_state_dict(state)
    x, _ = next(iter(again))
    np.testing.assert_array_equal(x, next(iter(saved))[0])
    assert x[0, 0] == first[0][0, -1] + 1         # the next window, none skipped


def test_a_text_loader_state_saved_before_the_check_still_loads():
    """States saved without ``block_size``/``num_tokens`` (older runs) are not stranded."""
    tokens = np.arange(101)
    loader = pc.data.TextLoader(tokens, block_size=10, batch_size=2, shuffle=False)
    state = loader.state_dict()
    del state["block_size"], state["num_tokens"]
    state["batch_index"] = 1
    loader.load_state_dict(state)
    assert next(iter(loader))[0][0, 0] == 20


def test_text_batches_do_not_share_memory_with_their_targets():
    """``TextLoader`` yielded ``x`` and ``y`` as two views of one ``(B, T + 1)`` array, so
    ``x[:, 1:]`` *was* ``y[:, :-1]``: corrupting the inputs in place (``x[mask] = unknown``,
    a token-dropout augmentation) silently rewrote the targets too, and the model was
    trained to predict the corrupted tokens. ``DataLoader`` promises that every batch it
    yields is a new array; nanoGPT's ``get_batch`` stacks ``x`` and ``y`` separately. Now two
    arrays, C-contiguous (so a step borrows them without a copy)."""
    tokens = np.arange(1, 41)
    loader = pc.data.TextLoader(tokens, block_size=4, batch_size=3, shuffle=False)
    x, y = next(iter(loader))
    assert not np.shares_memory(x, y)
    assert x.flags.c_contiguous and y.flags.c_contiguous
    x[:] = 0                                      # an in-place augmentation of the inputs
    np.testing.assert_array_equal(y, [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12, 13]])


def test_set_epoch_of_the_resumed_epoch_continues_where_the_checkpoint_stopped():
    """The PyTorch-style resume loop, ``loader.load_state_dict(saved)`` then ``for epoch in
    range(saved_epoch, E): loader.set_epoch(epoch); for batch in loader: ...``, trained the
    interrupted epoch's first batches twice: ``set_epoch`` of the epoch just loaded went back to
    its batch 0. It continues from the loaded batch now; any other ``set_epoch``, or one after
    the loader has moved on, starts that epoch from its first batch as before."""
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    run = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    seen = []
    for epoch in range(2):
        run.set_epoch(epoch)
        for i, (xb,) in enumerate(run):
            seen.append(xb[:, 0].tolist())
            if epoch == 1 and i == 1:
                saved = run.state_dict()            # checkpoint after epoch 1's second batch
    resumed = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(saved)
    again = []
    for epoch in range(saved["epoch"], 2):
        resumed.set_epoch(epoch)
        again.extend(xb[:, 0].tolist() for (xb,) in resumed)
    assert again == seen[5 + 2:]                    # epoch 1's last three batches, once each
    resumed.set_epoch(1)                            # the loader has moved on: a fresh epoch 1
    assert [xb[:, 0].tolist() for (xb,) in resumed] == seen[5:]
    other = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    other.load_state_dict(saved)
    other.set_epoch(0)                              # another epoch: from its first batch
    assert [xb[:, 0].tolist() for (xb,) in other] == seen[:5]


def test_set_epoch_of_an_epoch_the_checkpoint_had_finished_yields_nothing_of_it():
    """A checkpoint taken at an epoch's last batch, the loop's own epoch beside the loader's
    state (``pc.save(..., epoch=epoch, loader=loader.state_dict())``, PyTorch's habit): the
    state points at the next epoch's start, and the resume loop ``for epoch in
    range(saved_epoch, E): loader.set_epoch(epoch)`` went back to batch 0 of the epoch the
    checkpoint had finished, so that whole epoch was trained twice, silently (10 batches
    after the resume where the uninterrupted run had 5 left). The finished epoch's pass is
    empty now and the next epoch follows as in the uninterrupted run."""
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    run = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    seen = []
    for epoch in range(2):
        run.set_epoch(epoch)
        for (xb,) in run:
            seen.append(xb[:, 0].tolist())
            if len(seen) == 5:                      # every 5 steps: here epoch 0's last batch
                saved = {"epoch": epoch, "loader": run.state_dict()}
    resumed = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(saved["loader"])
    again = []
    for epoch in range(saved["epoch"], 2):
        resumed.set_epoch(epoch)
        again.extend(xb[:, 0].tolist() for (xb,) in resumed)
    assert again == seen[5:]                        # epoch 1, once
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["batch_index"] == 0
    resumed.set_epoch(0)                            # the loader has moved on: a fresh epoch 0
    assert [xb[:, 0].tolist() for (xb,) in resumed] == seen[:5]


@pytest.mark.parametrize("block_size", [2.5, 8.0, True, "8"])
def test_a_text_loaders_block_size_that_is_not_an_int_is_refused(block_size):
    """``int(block_size)`` truncated it: ``TextLoader(tokens, block_size=2.5, ...)`` cut
    windows of 2 tokens and ``block_size=True`` windows of 1, with no error (a model built
    for the intended context then trained on shorter ones). Refused now, as a
    ``DataLoader``'s ``batch_size`` is; numpy integers still count."""
    with pytest.raises((TypeError, ShapeError), match="block_size"):
        pc.data.TextLoader(np.arange(30), block_size=block_size, batch_size=2)
    loader = pc.data.TextLoader(np.arange(30), block_size=np.int64(4), batch_size=2)
    assert next(iter(loader))[0].shape == (2, 4)


@pytest.mark.parametrize("val_every", [2.5, 10.0, "10"])
def test_a_corpus_val_every_that_is_not_an_int_is_refused(val_every):
    """``text_corpus`` sent file ``i`` to validation when ``i % val_every == 0``, so
    ``val_every=2.5`` held out every 5th file, the split of ``val_every=5`` (a fifth of the
    files for validation where two in five were asked for), with no error; and
    ``"10"`` failed on a ``<`` between str and int that named nothing. Refused now, naming
    the argument; numpy integers still count."""
    with pytest.raises((TypeError, ShapeError), match="val_every"):
        pc.data.text_corpus(max_chars=50_000, val_every=val_every)
    corpus = pc.data.text_corpus(max_chars=50_000, val_every=np.int64(2))
    assert len(corpus.val_files) >= 1 and len(corpus.train_files) >= 1


@pytest.mark.parametrize("rank,world_size", [(-1, 2), (2, 2), (3, 2), (0, 0)])
def test_distributed_indices_refuses_a_rank_outside_the_world_as_pytorch(rank, world_size):
    """``distributed_indices(order, rank, world_size)`` took ``order[rank::world_size]`` of
    any rank: over 5 samples and 2 ranks, ``rank=-1`` got ``[0]`` (one sample where every
    rank gets 3), ``rank=2`` got ``[2, 4]`` and ``rank=3`` rank 1's ``[3, 0]``, so two
    processes trained the same share, silently; ``world_size=0`` was a ZeroDivisionError.
    PyTorch's ``DistributedSampler`` refuses such a rank ("Invalid rank"); a ``ShapeError``
    naming it now, as ``DataLoader`` gives."""
    import torch.utils.data as torch_data
    if world_size:
        with pytest.raises(ValueError, match="Invalid rank"):
            torch_data.DistributedSampler(range(5), num_replicas=world_size, rank=rank)
    with pytest.raises(ShapeError, match="distributed_indices: (rank|world_size)="):
        pc.data.distributed_indices(np.arange(5), rank=rank, world_size=world_size)
    sampler = torch_data.DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False)
    assert pc.data.distributed_indices(np.arange(5), rank=1, world_size=2).tolist() \
        == list(sampler) == [1, 3, 0]


@pytest.mark.parametrize("stop_after", [7, 5], ids=["mid-epoch", "at-an-epochs-last-batch"])
def test_set_epoch_called_twice_after_a_resume_trains_no_batch_twice(stop_after):
    """Resume code that calls ``loader.set_epoch(saved_epoch)`` right after
    ``load_state_dict`` and a loop that calls it again (``for epoch in range(saved_epoch,
    E): loader.set_epoch(epoch)``): the first call went on from the loaded batch, the second
    started that epoch again from batch 0, so a checkpoint after 2 of epoch 1's 5 batches
    resumed with 5 batches where 3 were left (the first 2 trained twice), and one at epoch
    0's last batch trained all of epoch 0 again, silently. ``DistributedSampler.set_epoch``
    only sets an attribute, so calling it twice is calling it once; so it is here now."""
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    run = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    seen = []
    for epoch in range(2):
        run.set_epoch(epoch)
        for (xb,) in run:
            seen.append(xb[:, 0].tolist())
            if len(seen) == stop_after:
                saved = {"epoch": epoch, "loader": run.state_dict()}
    resumed = pc.data.DataLoader((x,), batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(saved["loader"])
    resumed.set_epoch(saved["epoch"])
    again = []
    for epoch in range(saved["epoch"], 2):
        resumed.set_epoch(epoch)
        again.extend(xb[:, 0].tolist() for (xb,) in resumed)
    assert again == seen[stop_after:]               # 3 batches of epoch 1, or all 5 of it
    resumed.set_epoch(1)                            # the loader has moved on: epoch 1 anew
    resumed.set_epoch(1)
    assert [xb[:, 0].tolist() for (xb,) in resumed] == seen[5:]


def test_a_batch_whose_dataset_raised_is_fetched_again_by_the_next_pass():
    """A pass stopped by its dataset (a transient read error, a Ctrl-C in the collate) and
    iterated again resumes, as an interrupted pass does; but the batch was counted as handed
    out before it was made, so the next pass went on after it: over 10 samples in batches of
    2, a read error at sample 5 and a retry trained [0, 1], [2, 3], [6, 7], [8, 9], and
    samples 4 and 5 were missing from the epoch (and from a ``state_dict()`` taken there),
    silently. The failed batch is fetched again now, as in an uninterrupted run."""
    class Flaky(pc.data.Dataset):
        failed = False

        def __len__(self):
            return 10

        def __getitem__(self, i):
            if i == 5 and not self.failed:
                self.failed = True
                raise OSError("transient read error")
            return np.float32(i)

    loader = pc.data.DataLoader(Flaky(), 2)
    seen = []
    with pytest.raises(OSError, match="transient"):
        for b in loader:
            seen.append(b.tolist())
    state = loader.state_dict()
    assert state["batch_index"] == 2                # the failed batch is still to come
    seen.extend(b.tolist() for b in loader)
    assert seen == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    healthy = Flaky()
    healthy.failed = True
    again = pc.data.DataLoader(healthy, 2)
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == [[4, 5], [6, 7], [8, 9]]
