"""A task's dataset repo card carries what the Hub reads: a pretty name, a task category, a size category and
`dataset_info` (the two float32 Array2D features, each split's example count), and `datasets` loads the repo
folder with exactly those features."""

from __future__ import annotations

from datasets import Array2D, load_dataset
from huggingface_hub import DatasetCard

from zoo.publishing.hub import dataset_folder
from zoo.science.registry import get_task_spec


def test_the_dataset_card_describes_its_splits_and_features(tmp_path):
    task = "teacher-student-d4"  # the smallest splits: 2,000 tasks each
    out, hashes = dataset_folder(task, tmp_path / task)
    data = DatasetCard.load(out / "README.md").data.to_dict()
    spec = get_task_spec(task)
    assert data["pretty_name"].endswith(task) and data["task_categories"] == ["other"]
    assert data["size_categories"] == ["1K<n<10K"]  # 4,000 tasks over its two splits
    info = data["dataset_info"]
    assert {s["name"]: s["num_examples"] for s in info["splits"]} == {s: h["n"] for s, h in hashes.items()}
    shape = [spec.seq_len, spec.d]
    assert info["features"] == [{"name": n, "dtype": {"array2_d": {"shape": shape, "dtype": "float32"}}} for n in "xy"]
    test = load_dataset(str(out), split="test")
    assert test.features["x"] == Array2D(tuple(shape), "float32") and len(test) == hashes["test"]["n"]
