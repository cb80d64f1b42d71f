"""The strategies' parts that run in this process: write-up 5's model, the exact two-stage split, the options
and the refusals (what each strategy needs, in one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.models import MnistCnn, SmallMnistCnn, build_model, two_stages
from trainer.strategies.options import (
    StrategyOptions,
    parse_average_every,
    parse_devices,
    refusal,
    threads_per_process,
)
from trainer.strategies.split import SplitModel

# --- write-up 5's model ------------------------------------------------------------------------------------


def test_writeup5_model_has_the_parameters_its_layers_imply() -> None:
    model = build_model("mnist-cnn-small", (1, 28, 28))
    # conv 1->8 k5, conv 8->16 k5, fc 64->120, fc 120->10, each with its biases
    expected = (1 * 8 * 5 * 5 + 8) + (8 * 16 * 5 * 5 + 16) + (64 * 120 + 120) + (120 * 10 + 10)
    assert expected == 12_434
    assert sum(p.numel() for p in model.parameters()) == expected
    assert isinstance(model, SmallMnistCnn) and model.conv2_drop.p == 0.2
    features = model.features(torch.zeros(3, 1, 28, 28))
    assert features.flatten(1).shape == (3, 64)
    out = model(torch.zeros(3, 1, 28, 28))
    assert out.shape == (3, 10) and torch.allclose(out.exp().sum(dim=1), torch.ones(3))  # log-probabilities


def test_writeup5_model_refuses_images_too_small_for_its_pooling() -> None:
    from trainer.errors import TrainerError

    with pytest.raises(TrainerError, match="at least 22x22"):
        build_model("mnist-cnn-small", (1, 16, 16))


# --- the two-stage split -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mnist-cnn", "mnist-cnn-small"])
def test_split_model_gives_the_unsplit_models_loss_and_gradients(name: str) -> None:
    torch.manual_seed(5)
    whole = build_model(name, (1, 28, 28))
    torch.manual_seed(5)
    split_inner = build_model(name, (1, 28, 28))
    split = SplitModel(split_inner, (torch.device("cpu"), torch.device("cpu")))
    images, labels = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))

    losses, grads = [], []
    for model in (whole, split):
        model.train()
        torch.manual_seed(11)  # the same dropout masks for both
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        losses.append(loss.detach())
        named = (model.model if model is split else model).named_parameters()
        grads.append({n: p.grad.clone() for n, p in named if p.grad is not None})

    assert torch.equal(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys() == dict(whole.named_parameters()).keys()
    for key in grads[0]:
        assert torch.equal(grads[0][key], grads[1][key]), key
    assert split.state_dict().keys() == whole.state_dict().keys()  # snapshots compare across strategies
    assert sum(1 for _ in split.parameters()) == sum(1 for _ in whole.parameters())  # none listed twice


def test_split_stages_share_the_models_parameters() -> None:
    model = MnistCnn()
    first, second = two_stages(model)
    model_ids = {id(p) for p in model.parameters()}
    stage_ids = [{id(p) for p in stage.parameters()} for stage in (first, second)]
    assert stage_ids[0] | stage_ids[1] == model_ids and not stage_ids[0] & stage_ids[1]
    model.eval()
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(second(first(x)), model(x))


def test_split_model_loads_an_unsplit_state_dict() -> None:
    source = MnistCnn()
    split = SplitModel(MnistCnn(), (torch.device("cpu"), torch.device("cpu")))
    split.load_state_dict(source.state_dict())
    for key, value in source.state_dict().items():
        assert torch.equal(split.state_dict()[key], value)


# --- options and refusals ----------------------------------------------------------------------------------


def test_option_parsers() -> None:
    assert parse_devices("cpu,cpu") == ("cpu", "cpu")
    assert parse_devices("0, cuda:1") == ("cuda:0", "cuda:1")
    assert parse_average_every("epoch") == "epoch" and parse_average_every("end") == "end"
    assert parse_average_every("25") == 25
    for bad in ("0", "-3", "sometimes"):
        with pytest.raises(ValueError, match="positive number of steps"):
            parse_average_every(bad)
    with pytest.raises(ValueError, match="not a device"):
        parse_devices("gpu0")


TORCHRUN_2 = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}
TWO_NODES = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}


@pytest.mark.parametrize(
    ("options", "env", "gpus", "needs"),
    [
        (StrategyOptions("spawn", processes=2), TWO_NODES, 0, "its own processes on one node"),
        (StrategyOptions("hogwild", processes=2), TORCHRUN_2, 0, "its own processes on one node"),
        (StrategyOptions("spawn", processes=4), {}, 2, "needs 4 GPUs, this node has 2"),
        (StrategyOptions("dp"), {}, 0, "dp needs a GPU"),
        (StrategyOptions("dp", devices=("cpu",)), {}, 1, "for nodes without GPUs"),
        (StrategyOptions("dp"), TORCHRUN_2, 2, "one process per node"),
        (StrategyOptions("mp"), {}, 1, "mp needs two GPUs, this node has 1"),
        (StrategyOptions("mp", devices=("cpu",)), {}, 0, "takes two devices"),
        (StrategyOptions("mp", devices=("cuda:0", "cuda:3")), {}, 2, "--devices cuda:3"),
        (StrategyOptions("mp", devices=("cpu", "cpu")), TORCHRUN_2, 0, "use --strategy ddp-mp"),
        (StrategyOptions("ddp-mp"), TORCHRUN_2, 2, "need 4, it has 2"),
        (StrategyOptions("ddp-mp", devices=("cuda:0", "cuda:1")), TORCHRUN_2, 4, "only cpu,cpu"),
        (StrategyOptions("local-sgd"), {}, 0, "at least 2"),
    ],
)  # fmt: skip
def test_refusals_say_what_the_strategy_needs(
    options: StrategyOptions, env: dict[str, str], gpus: int, needs: str
) -> None:
    reason = refusal(options, env, gpus)
    assert reason is not None and needs in reason and "\n" not in reason


@pytest.mark.parametrize(
    ("options", "env", "gpus"),
    [
        (StrategyOptions("ddp"), TWO_NODES, 0),
        (StrategyOptions("spawn"), {}, 0),
        (StrategyOptions("spawn", processes=2), {"WORLD_SIZE": "1"}, 2),  # as torchrun's one worker
        (StrategyOptions("hogwild", processes=5), {}, 0),
        (StrategyOptions("dp", devices=("cpu",)), {}, 0),
        (StrategyOptions("dp"), {}, 1),
        (StrategyOptions("mp", devices=("cpu", "cpu")), {}, 0),
        (StrategyOptions("mp"), {}, 2),
        (StrategyOptions("ddp-mp"), TORCHRUN_2, 4),
        (StrategyOptions("ddp-mp", devices=("cpu", "cpu")), TWO_NODES, 0),
        (StrategyOptions("local-sgd", average_every="end"), TWO_NODES, 0),
    ],
)  # fmt: skip
def test_runnable_requests_are_not_refused(options: StrategyOptions, env: dict[str, str], gpus: int) -> None:
    assert refusal(options, env, gpus) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "ddp", "--devices", "cpu"], "--devices applies to --strategy dp/mp/ddp-mp, not ddp"),
        (["--strategy", "mp", "--processes", "2"], "--processes applies to --strategy spawn/hogwild"),
        (["--strategy", "hogwild", "--average-every", "5"], "--average-every applies to --strategy local-sgd"),
        (["--strategy", "local-sgd", "--average-every", "often"], "'often' is not a positive number"),
        (["--strategy", "hogwild", "--processes", "0"], "--processes"),
        (["--strategy", "mpi"], "--strategy"),
    ],
)  # fmt: skip
def test_bad_strategy_options_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from trainer.__main__ import parse_command_line

    with pytest.raises(SystemExit) as exit_info:
        parse_command_line([*args, "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_threads_per_process_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.strategies import options as options_module

    monkeypatch.setattr(options_module, "node_cores", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_per_process(StrategyOptions(), 4) == 4  # the node's cores shared out
    assert threads_per_process(StrategyOptions(), 32) == 1
    assert threads_per_process(StrategyOptions(threads_per_process=3), 4) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torchrun's, or the user's: honoured
    assert threads_per_process(StrategyOptions(), 4) == 2
    assert threads_per_process(StrategyOptions(threads_per_process=5), 4) == 5
