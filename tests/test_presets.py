"""Presets: RunSpec fields of the reference experiments, user overrides winning, reference figures kept."""

from __future__ import annotations

import pytest

from launcher.errors import SpecError
from launcher.spec.presets import PRESETS, apply_preset, get_preset
from launcher.spec.run_spec import RunSpec


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_makes_a_valid_spec_and_runs_on_synthetic_data(name: str) -> None:
    spec = RunSpec(run_id="x", **apply_preset(name))
    assert spec.batch_size == 32 and spec.save_every == 1
    synthetic = RunSpec(run_id="x", **apply_preset(name, dataset="synthetic"))
    assert synthetic.dataset == "synthetic" and synthetic.model == spec.model


def test_presets_carry_the_reference_set_ups() -> None:
    mnist = RunSpec(run_id="x", **apply_preset("mnist"))
    assert (mnist.model, mnist.dataset, mnist.lr) == ("mnist-cnn", "mnist", 0.01)
    cifar = RunSpec(run_id="x", **apply_preset("cifar10-resnet18"))
    assert (cifar.model, cifar.dataset, cifar.lr, cifar.epochs) == ("resnet18", "cifar10", 0.01, 10)
    cpu = RunSpec(run_id="x", **apply_preset("mnist-cpu"))
    assert (cpu.epochs, cpu.lr, cpu.backend) == (20, 0.1, "gloo")


def test_reference_figures_are_the_write_ups() -> None:
    assert get_preset("mnist").reference.steps_per_epoch == {1: 1875, 2: 938, 4: 469}
    assert get_preset("mnist").reference.acc_drop_points == {4: 6.0}
    cifar = get_preset("cifar10-resnet18").reference
    assert (cifar.time_ratio[2], cifar.val_acc[1], cifar.val_acc[2]) == (0.55, 0.72, 0.71)
    cpu = get_preset("mnist-cpu").reference
    assert cpu.train_minutes == {1: 12.2, 2: 9.4} and cpu.train_acc[1] == 0.976
    assert cpu.to_json()["train_minutes"] == {"1": 12.2, "2": 9.4}


def test_explicit_options_win_and_none_means_not_given() -> None:
    fields = apply_preset("mnist", epochs=2, lr=None, dataset="synthetic")
    assert (fields["epochs"], fields["lr"], fields["dataset"]) == (2, 0.01, "synthetic")
    assert apply_preset(None, epochs=1, lr=None) == {"epochs": 1}


def test_unknown_preset_is_a_one_line_error_listing_the_presets() -> None:
    with pytest.raises(SpecError) as info:
        apply_preset("imagenet")
    message = str(info.value)
    assert "\n" not in message and "'imagenet'" in message
    assert all(name in message for name in PRESETS)
