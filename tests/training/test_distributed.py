"""recallk.training.distributed on one process (the DDP runs are in test_lightning.py): rows put back in order, a
sampler's repeats dropped, and every way the rows can fail to cover the validation set named in one InputError."""

from __future__ import annotations

import pytest

from extras import extra

torch = extra("torch", "torch")

from recallk.errors import InputError  # noqa: E402
from recallk.training import distributed  # noqa: E402

HINT = "Check the loader."


def gathered(batches: list[tuple[list[int], list[float]]], total: int):
    emb, idx, problem = distributed.local_rows([torch.tensor(v).reshape(-1, 1) for _, v in batches],
                                               [torch.tensor(i) for i, _ in batches])
    return distributed.gather_rows(emb, idx, problem, total, HINT)


def test_rows_come_back_in_order_without_the_samplers_repeats():
    # what a DistributedSampler hands one rank of a padded round, in any order: rows 0 and 1 repeated at the end
    rows = gathered([([3, 1], [30.0, 10.0]), ([2, 0, 0, 1], [20.0, 0.0, 0.0, 10.0])], total=4)
    assert rows.flatten().tolist() == [0.0, 10.0, 20.0, 30.0]


@pytest.mark.parametrize("batches, total, message", [
    ([([0, 1], [0.0, 1.0])], 3, "cover 2 of the 3 validation rows (2 rows sent; missing rows 2): every row must arrive "
                                "once per evaluation. Check the loader."),
    ([([0, 1, 5], [0.0, 1.0, 2.0])], 2, "carry row numbers outside the validation set's 0 .. 1: [5] (3 rows sent). "
                                        "Check the loader."),
    ([([0, 1], [0.0])], 2, "cannot be gathered: rank 0: it gave 1 embeddings but 2 row numbers. Check the loader."),
    ([([0.0, 1.0], [0.0, 1.0])], 2, "cannot be gathered: rank 0: its row numbers are float32, not integers."),
])
def test_rows_that_do_not_cover_the_set_are_one_error(batches, total, message):
    with pytest.raises(InputError) as caught:
        gathered(batches, total)
    assert message in str(caught.value)


def test_a_problem_in_rank_zeros_scoring_is_raised_as_it_is():
    def fails():
        raise InputError("the evaluator's message")

    with pytest.raises(InputError, match="^the evaluator's message$"):
        distributed.on_rank_zero(fails)
