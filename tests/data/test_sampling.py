"""Training batches fixed by (seed, epoch): the same whatever the workers or processes, and resumable mid-epoch."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from vision_tx.data.sampling import EpochSampler, ResumableLoader, SeededSamples, batch_draw, grouped_by_orientation


class RandomlyAugmented(Dataset):
    """Item ``i`` is ``(i, a draw from torch's generator)``: what a random augmentation of image ``i`` depends on."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(torch.rand(()))


def batches(loader: ResumableLoader, count: int | None = None) -> list[tuple[list[int], list[float]]]:
    out = []
    for indices, draws in loader:
        out.append((indices.tolist(), draws.tolist()))
        if len(out) == count:
            break
    return out


def test_batches_do_not_depend_on_workers_or_on_the_process_generator() -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    in_process = batches(ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3))
    assert torch.equal(torch.get_rng_state(), state)  # reading data drew nothing from the process's generator
    torch.manual_seed(1)
    with_workers = batches(ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3, num_workers=2))
    assert in_process == with_workers and len(in_process) == 5
    assert sorted(i for indices, _ in in_process for i in indices) == list(range(20))
    assert batches(ResumableLoader(RandomlyAugmented(), batch_size=4, seed=4)) != in_process


def test_each_epoch_has_its_own_order_and_draws() -> None:
    loader = ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3)
    first = batches(loader)
    loader.sampler.set_epoch(1)
    second = batches(loader)
    assert first != second and sorted(sum((b[0] for b in second), [])) == list(range(20))


def test_processes_take_blocks_of_the_global_batch_as_gradient_accumulation_would() -> None:
    one = [list(EpochSampler(RandomlyAugmented(), batch_size=2, seed=5))[i : i + 2] for i in range(0, 20, 2)]
    ranks = [list(EpochSampler(RandomlyAugmented(), batch_size=2, seed=5, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 10
    for step in range(5):  # global batch of 4: one process's micro-batches 2 * step and 2 * step + 1
        assert (
            ranks[0][2 * step : 2 * step + 2] == one[2 * step]
            and ranks[1][2 * step : 2 * step + 2] == one[2 * step + 1]
        )
    uneven = [list(EpochSampler(RandomlyAugmented(), batch_size=3, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(uneven[0]) == len(uneven[1]) == 9  # three global batches of 6; the last 2 images dropped


def test_a_new_loader_resumes_after_the_batches_served() -> None:
    uninterrupted = ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3)
    uninterrupted.sampler.set_epoch(2)
    head = batches(uninterrupted, count=2)
    state = uninterrupted.state_dict()
    assert state == {"epoch": 2, "batches": 2}
    rest = batches(uninterrupted)[2:]

    resumed = ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(2)  # Lightning sets the epoch before iterating
    assert len(resumed) == 5 and batches(resumed) == rest and head + rest == batches(uninterrupted)
    assert resumed.state_dict() == {"epoch": 2, "batches": 5}

    at_epoch_end = ResumableLoader(RandomlyAugmented(), batch_size=4, seed=3)
    at_epoch_end.load_state_dict({"epoch": 2, "batches": 5})
    at_epoch_end.sampler.set_epoch(3)  # the saved epoch was over: the next one starts from its beginning
    assert len(batches(at_epoch_end)) == 5


def test_grouping_by_orientation_makes_runs_of_one_orientation_and_keeps_every_row() -> None:
    portrait = torch.tensor([True, False, False, True, True, False, True, False, False])
    keys = torch.stack([torch.tensor([0, 1, 3, 2, 4, 5, 6, 7, 8]), torch.arange(9) + 100], 1)
    grouped = grouped_by_orientation(keys, portrait, group=2)
    # runs as the queues fill: portrait (0, 3), landscape (1, 2), portrait (4, 6), landscape (5, 7); left: 8
    assert grouped[:, 0].tolist() == [0, 3, 1, 2, 4, 6, 5, 7, 8]
    assert grouped[:, 1].tolist() == [100, 102, 101, 103, 104, 106, 105, 107, 108]  # each row whole


def test_a_batch_shares_its_draw_and_one_orientation_as_gradient_accumulation_would() -> None:
    portrait = [i % 3 == 0 for i in range(20)]  # 7 portrait images, 13 landscape
    one = list(EpochSampler(RandomlyAugmented(), batch_size=2, seed=5, portrait=portrait))
    ranks = [
        list(EpochSampler(RandomlyAugmented(), batch_size=2, seed=5, num_replicas=2, rank=r, portrait=portrait))
        for r in (0, 1)
    ]
    micro_batches = [one[i : i + 2] for i in range(0, 20, 2)]
    for step in range(5):
        assert ranks[0][2 * step : 2 * step + 2] == micro_batches[2 * step]
        assert ranks[1][2 * step : 2 * step + 2] == micro_batches[2 * step + 1]
    mixed = 0
    for batch in micro_batches:
        assert batch[0][2] == batch[1][2]  # one batch draw per batch
        mixed += portrait[batch[0][0]] != portrait[batch[1][0]]
    assert mixed <= 1  # only the run left over at the end mixes the two
    assert len({batch[0][2] for batch in micro_batches}) == 10
    assert not {batch[0][2] for batch in micro_batches} & {key[1] for key in one}  # not any image's own seed
    assert sorted(key[0] for key in one) == list(range(20))


def test_seeded_samples_hand_each_read_its_batch_draw() -> None:
    class ReadsTheDraw(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> int | None:
            return batch_draw()

    samples = SeededSamples(ReadsTheDraw())
    assert samples[(1, 7)] is None and samples[(0, 7, 12345)] == 12345
    assert batch_draw() is None  # not left behind for a read outside the loader
