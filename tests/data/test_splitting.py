"""Pure split functions: assign_splits, roles, queries_without_positive, stable_rank_key."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from recallk.data.splitting import SPLITS, assign_splits, queries_without_positive, roles, stable_rank_key
from recallk.errors import InputError

DEFAULT = {"train": 0.5, "val": 0.25, "gallery": 0.25}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def toy(per_label: dict[str, int], tag: str = "") -> pd.DataFrame:
    """``n`` distinct files per label; image_id ``<label>/<i><tag>``, sha256 from the id."""
    rows = [(f"{lab}/{i}{tag}", lab, sha(f"{lab}/{i}{tag}")) for lab, n in per_label.items() for i in range(n)]
    return pd.DataFrame(rows, columns=["image_id", "label", "sha256"])


def assign(frame: pd.DataFrame, strategy: str = "per_class", protocol: str = "query_gallery",
           fractions: dict[str, float] = DEFAULT, seed: int = 0) -> pd.Series:
    return assign_splits(frame, strategy=strategy, protocol=protocol, fractions=fractions, seed=seed)


TEN_LABELS = {f"c{i}": 12 for i in range(10)}


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("strategy", ["per_class", "class_disjoint"])
def test_same_seed_same_assignment_different_seed_differs(strategy):
    frame = toy(TEN_LABELS)
    first = assign(frame, strategy, seed=3)
    assert first.tolist() == assign(frame.copy(), strategy, seed=3).tolist()
    # Row order of the input does not matter either: assignment follows content, not position.
    shuffled = frame.sample(frac=1.0, random_state=1)
    assert assign(shuffled, strategy, seed=3).sort_index().tolist() == first.tolist()
    assert assign(frame, strategy, seed=4).tolist() != first.tolist()


def test_stable_rank_key_is_a_pure_function_of_seed_and_key():
    assert stable_rank_key(0, "a") == stable_rank_key(0, "a")
    assert stable_rank_key(0, "a") != stable_rank_key(1, "a")
    assert stable_rank_key(0, "a")[1] == "a"  # the key breaks ties


# ---------------------------------------------------------------- class_disjoint


@pytest.mark.parametrize("n_labels, train_fraction, expected_train_labels", [
    (10, 0.5, 5),    # exact half
    (10, 0.25, 3),   # 2.5 rounds half up
    (7, 0.5, 4),     # 3.5 rounds half up
    (3, 0.0, 0),     # no training labels at all
    (4, 0.6, 2),     # 2.4 rounds down
])
def test_class_disjoint_whole_labels_on_one_side(n_labels, train_fraction, expected_train_labels):
    rest = (1.0 - train_fraction) / 2
    frame = toy({f"lab{i}": 6 for i in range(n_labels)})
    split = assign(frame, "class_disjoint", fractions={"train": train_fraction, "val": rest, "gallery": rest})
    side = split.eq("train").groupby(frame["label"]).agg(["all", "any"])
    assert (side["all"] == side["any"]).all(), "a label is on both sides of the train/eval border"
    assert int(side["all"].sum()) == expected_train_labels


def test_class_disjoint_eval_labels_split_into_val_and_gallery():
    frame = toy(TEN_LABELS)
    split = assign(frame, "class_disjoint")
    for label, s in split.groupby(frame["label"]):
        if not s.eq("train").any():
            # 12 units, val share 0.5 of eval -> 6 val, 6 gallery
            assert s.value_counts().to_dict() == {"val": 6, "gallery": 6}, label


@pytest.mark.parametrize("seed", range(5))
def test_class_disjoint_single_image_eval_label_goes_to_gallery(seed):
    frame = toy({"big1": 8, "big2": 8, "solo": 1})
    split = assign(frame, "class_disjoint", fractions={"train": 0.0, "val": 0.5, "gallery": 0.5}, seed=seed)
    assert split[frame["label"].eq("solo")].tolist() == ["gallery"]


# ---------------------------------------------------------------- per_class


@pytest.mark.parametrize("n, fractions, expected", [
    (20, DEFAULT, {"train": 10, "val": 5, "gallery": 5}),                               # exact
    (10, DEFAULT, {"train": 5, "val": 3, "gallery": 2}),                                # 2.5 val -> cumulative 7.5 -> 8
    (7, DEFAULT, {"train": 4, "val": 1, "gallery": 2}),                                 # 3.5 -> 4; 5.25 -> 5
    (3, {"train": 0.0, "val": 0.5, "gallery": 0.5}, {"val": 2, "gallery": 1}),          # 1.5 rounds half up
    (3, {"train": 0.0, "val": 0.9, "gallery": 0.1}, {"val": 2, "gallery": 1}),          # 2.7 -> 3, one gallery kept
    (4, {"train": 1.0, "val": 0.0, "gallery": 0.0}, {"train": 4}),                      # all train
    (5, {"train": 0.2, "val": 0.8, "gallery": 0.0}, {"train": 1, "val": 4}),            # no gallery wanted
    (2, {"train": 0.0, "val": 0.5, "gallery": 0.5}, {"val": 1, "gallery": 1}),          # one of each
])
def test_per_class_counts_use_cumulative_rounding(n, fractions, expected):
    frame = toy({"a": n, "b": n})
    split = assign(frame, "per_class", fractions=fractions)
    for label in ("a", "b"):
        counts = split[frame["label"].eq(label)].value_counts().to_dict()
        assert counts == expected, label


def test_per_class_counts_are_per_label():
    frame = toy({"small": 4, "large": 40})
    split = assign(frame, "per_class")
    assert split[frame["label"].eq("small")].value_counts().to_dict() == {"train": 2, "val": 1, "gallery": 1}
    assert split[frame["label"].eq("large")].value_counts().to_dict() == {"train": 20, "val": 10, "gallery": 10}


@pytest.mark.parametrize("strategy", ["per_class", "class_disjoint"])
@pytest.mark.parametrize("seed", range(4))
def test_identical_files_within_a_label_share_a_split(strategy, seed):
    frame = toy(TEN_LABELS)
    dup = frame.copy()
    dup["image_id"] = dup["image_id"] + "-copy"  # same bytes, new name
    both = pd.concat([frame, dup], ignore_index=True)
    split = assign(both, strategy, seed=seed)
    n = len(frame)
    assert split[:n].tolist() == split[n:].tolist()


# ---------------------------------------------------------------- stability


def moved(before: pd.Series, after: pd.Series, frame: pd.DataFrame) -> pd.Series:
    """Number of existing images per label whose split changed."""
    changed = before.ne(after[: len(before)].to_numpy())
    return changed.groupby(frame["label"]).sum()


@pytest.mark.parametrize("strategy, boundaries", [
    ("per_class", 2),       # train|val and val|gallery cuts inside every label
    ("class_disjoint", 1),  # val|gallery cut inside eval labels (train labels are fixed)
])
@pytest.mark.parametrize("seed", range(6))
def test_adding_one_image_per_label_moves_at_most_one_per_cut(strategy, boundaries, seed):
    old = toy({f"c{i}": 9 + i for i in range(8)})
    new = pd.concat([old, toy({f"c{i}": 1 for i in range(8)}, tag="-new")], ignore_index=True)
    before, after = assign(old, strategy, seed=seed), assign(new, strategy, seed=seed)
    assert moved(before, after, old).max() <= boundaries


@pytest.mark.parametrize("seed", range(6))
def test_adding_a_label_moves_at_most_one_existing_label(seed):
    old = toy({f"c{i}": 5 for i in range(9)})
    new = pd.concat([old, toy({"c_new": 5})], ignore_index=True)
    before = assign(old, "class_disjoint", seed=seed).eq("train").groupby(old["label"]).all()
    after = assign(new, "class_disjoint", seed=seed).eq("train").groupby(new["label"]).all()
    assert int((before != after[before.index]).sum()) <= 1


@pytest.mark.parametrize("seed", range(6))
def test_bulk_additions_never_reshuffle_existing_images(seed):
    """Adding 50% more images: existing images keep their relative order across train < val < gallery."""
    old = toy({f"c{i}": 20 for i in range(5)})
    new = pd.concat([old, toy({f"c{i}": 10 for i in range(5)}, tag="-new")], ignore_index=True)
    before, after = assign(old, seed=seed), assign(new, seed=seed)
    order = {s: i for i, s in enumerate(SPLITS)}
    for label, idx in old.groupby("label").groups.items():
        ranked = sorted(idx, key=lambda i: stable_rank_key(seed, old.loc[i, "sha256"]))
        levels_before = [order[before[i]] for i in ranked]
        levels_after = [order[after[i]] for i in ranked]
        assert levels_before == sorted(levels_before), label
        assert levels_after == sorted(levels_after), label
    # most existing images stay where they were (10 new per label shift each cut by <= 5)
    assert before.ne(after[: len(old)].to_numpy()).mean() < 0.5


# ---------------------------------------------------------------- given


def test_given_copies_the_split_column():
    frame = toy({"a": 3}).assign(split=["gallery", "train", "val"])
    split = assign(frame, "given")
    assert split.tolist() == ["gallery", "train", "val"]
    split[0] = "train"
    assert frame.loc[0, "split"] == "gallery", "the result must be a copy"


def test_given_without_split_column_is_a_user_error():
    with pytest.raises(InputError, match=r"`split.strategy: given` needs a `split` column"):
        assign(toy({"a": 3}), "given")


# ---------------------------------------------------------------- protocols and roles


@pytest.mark.parametrize("strategy", ["per_class", "class_disjoint"])
def test_leave_one_out_puts_every_eval_image_in_gallery_with_both_roles(strategy):
    frame = toy(TEN_LABELS)
    split = assign(frame, strategy, protocol="leave_one_out")
    assert set(split) == {"train", "gallery"}
    assert split.eq("train").sum() == assign(frame, strategy).eq("train").sum()  # same train share
    query, gallery = roles(split, "leave_one_out")
    assert query.tolist() == gallery.tolist() == split.eq("gallery").tolist()


@pytest.mark.parametrize("split, protocol, query, gallery", [
    (["train", "val", "gallery"], "query_gallery", [False, True, False], [False, False, True]),  # plain
    (["train", "val", "gallery"], "leave_one_out", [False, True, True], [False, True, True]),    # eval = both
    (["train", "train"], "query_gallery", [False, False], [False, False]),                       # nothing to score
])
def test_roles(split, protocol, query, gallery):
    q, g = roles(pd.Series(split), protocol)
    assert q.tolist() == query and g.tolist() == gallery


@pytest.mark.parametrize("labels, split, protocol, expected", [
    # val query of "b" has no gallery image of "b"
    (["a", "a", "b"], ["val", "gallery", "val"], "query_gallery", [False, False, True]),
    # every query has a positive
    (["a", "a", "b", "b"], ["val", "gallery", "val", "gallery"], "query_gallery", [False] * 4),
    # leave_one_out: a lone image of "b" has only itself
    (["a", "a", "b"], ["gallery", "gallery", "gallery"], "leave_one_out", [False, False, True]),
    # a train image of "b" is not a gallery positive
    (["b", "b"], ["train", "val"], "query_gallery", [False, True]),
])
def test_queries_without_positive(labels, split, protocol, expected):
    query, gallery = roles(pd.Series(split), protocol)
    assert queries_without_positive(pd.Series(labels), query, gallery).tolist() == expected
