"""``aiostream_hf.torch.TimedLoader``: the share of each training step spent waiting for
data. The rules run on a clock the test moves; a real DataLoader over a stream checks
that the wrapper stands where the loader was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch.utils.data  # noqa: E402

import aiostream_hf as ash  # noqa: E402
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet  # noqa: E402
from aiostream_hf.torch import StreamDataset, TimedLoader  # noqa: E402

pytestmark = pytest.mark.torch


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _batches(clock: _Clock, waits: list[float]) -> Iterator[int]:
    """A loader whose i-th batch takes ``waits[i]`` seconds to come."""
    for i, wait in enumerate(waits):
        clock.t += wait
        yield i


def test_each_steps_wait_share() -> None:
    clock = _Clock()
    waits, works = [1.0, 0.0, 3.0], [1.0, 2.0, 1.0]
    loader = TimedLoader(_batches(clock, waits), window=2, clock=clock)
    assert loader.statistics().wait_share is None  # no step ended
    shares = []
    for i, batch in enumerate(loader):
        assert batch == i
        clock.t += works[i]  # the step's work
        if i:  # the step before ended when this batch was asked for
            shares.append(loader.statistics().last_wait_share)
    s = loader.statistics()
    assert shares == [0.5, 0.0]
    assert s.steps == 3
    assert (s.waited, s.worked) == (4.0, 4.0)  # the last step ends with the loop
    assert s.wait_share == 0.5
    assert s.last_wait_share == 0.75
    # over the last two steps, by time: waited 0 + 3 of 2 + 4 s (not a mean of shares)
    assert s.recent_wait_share == pytest.approx(3 / 6)


def test_a_loop_left_early_keeps_the_wait_of_its_last_step() -> None:
    clock = _Clock()
    loader = TimedLoader(_batches(clock, [2.0, 5.0]), clock=clock)
    for _ in loader:
        clock.t += 1.0
        break
    s = loader.statistics()
    assert (s.steps, s.waited, s.worked, s.wait_share) == (1, 2.0, 0.0, None)


def test_the_figures_add_up_over_epochs_and_the_window_is_bounded() -> None:
    clock = _Clock()
    loader = TimedLoader([0, 1, 2, 3], window=3, clock=clock)
    for _ in range(2):
        for _ in loader:
            clock.t += 1.0
    s = loader.statistics()
    assert s.steps == 8
    assert (s.waited, s.worked, s.wait_share) == (0.0, 8.0, 0.0)
    assert len(loader._recent) == 3


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_a_bad_window_is_refused(window: object) -> None:
    with pytest.raises(ash.SourceError, match="window"):
        TimedLoader([], window=window)  # type: ignore[arg-type]


def test_it_stands_where_a_dataloader_was(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    make_text_parquet(make_repo(root, "org/t", {}) / "train.parquet", rows=40, row_group_size=10)
    with HubServer(root) as hub:
        ds = StreamDataset("hf://datasets/org/t", endpoint=hub.endpoint)
        loader = TimedLoader(torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0))
        ids = [int(i) for batch in loader for i in batch["id"]]
    s = loader.statistics()
    assert sorted(ids) == list(range(40))
    assert s.steps == 5
    assert s.wait_share is not None
    assert 0.0 <= s.wait_share <= 1.0
    assert loader.batch_size == 8  # the loader's own attributes
    assert ds.statistics().stalls.seconds > 0  # the stream of this process, num_workers=0
