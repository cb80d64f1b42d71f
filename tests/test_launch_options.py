"""The one option layer: `up --config FILE` (every option kind, unknown keys, the command line on top),
`--save-config` round trips, and `sweep` taking `up`'s launch options. Option values are checked where they land:
the RunSpec and UpOptions that `up` hands to the executor (run_up is replaced by a recorder here; the real runs
are in tests/test_rerun.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import app as cli
from launcher.planning.request import UpResult


class Recorder:
    """Stands in for run_up: keeps what `up` asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, spec: Any, options: Any) -> UpResult:
        self.calls.append((spec, options))
        return UpResult(run_dir=None, exit_code=0, summary=None, plan=None)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr("launcher.execute.up.run_up", recorder)
    return recorder


def up(*args: str) -> None:
    cli.main(["up", *args])


def fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        up(*args)
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


EVERY_KIND = """
epochs = 5                      # int
lr = 0.25                       # float
accept-new-host-keys = true     # bool
model = "resnet18"              # str
host = ["alice@h1", "h2:2222"]  # repeated
env = ["WANDB_MODE=offline"]    # repeated
identity_file = "keys/id_test"  # path
runtime = "auto"                # choice
"""


def test_a_config_file_sets_every_kind_of_option(tmp_path: Path, recorded: Recorder) -> None:
    config = tmp_path / "exp.toml"
    config.write_text(EVERY_KIND)
    up("--config", str(config), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    spec, options = recorded.calls[0]
    assert (spec.epochs, spec.lr, spec.model) == (5, 0.25, "resnet18")
    assert options.accept_new_host_keys is True
    assert [h.text for h in options.hosts] == ["alice@h1", "h2:2222"] and spec.nnodes == 2
    assert spec.extra_env == (("WANDB_MODE", "offline"),)
    assert options.identity_file == Path("keys/id_test") and options.runtime == "auto"
    assert options.provider == "ssh" and options.dry_run


def test_the_command_line_overrides_the_file(tmp_path: Path, recorded: Recorder) -> None:
    config = tmp_path / "exp.toml"
    config.write_text(EVERY_KIND)
    up("--config", str(config), "--epochs", "7", "--host", "bob@h3", "--no-accept-new-host-keys", "--dry-run")
    spec, options = recorded.calls[0]
    assert spec.epochs == 7 and [h.text for h in options.hosts] == ["bob@h3"]
    assert options.accept_new_host_keys is False and spec.lr == 0.25  # what the line left alone stays the file's


@pytest.mark.parametrize("text, message", [
    ("epoch = 3", "unknown key 'epoch': did you mean 'epochs'?"),
    ("dry-run = true", "unknown key 'dry-run'"),  # what this invocation does is not an experiment's option
    ('epochs = "three"', 'epochs = "three": expected an integer'),
    ("lr = true", "lr = true: expected a number"),
    ('detach = "yes"', 'detach = "yes": expected true or false'),
    ('host = "h1"', 'host = "h1": expected a list of strings'),
    ('runtime = "podman"', "runtime = \"podman\": expected one of 'native', 'docker', 'auto'"),
    ('identity-file = ""', "expected a path"),
    ("epochs = ", "not valid TOML"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_key(tmp_path: Path, recorded: Recorder,
                                                              capsys: pytest.CaptureFixture[str], text: str,
                                                              message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text + "\n")
    err = fails(capsys, "--config", str(config), "--dry-run")
    assert f"--config {config}" in err and message in err
    assert recorded.calls == []


def test_a_missing_config_file_is_named(tmp_path: Path, recorded: Recorder,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "--config", str(tmp_path / "nope.toml"))
    assert "nope.toml: no such file" in err


def test_options_from_a_file_are_checked_like_typed_ones(tmp_path: Path, recorded: Recorder,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "exp.toml"
    config.write_text("connect-timeout = 30.0\n")  # host-only: a local run refuses it from a file as from the line
    assert "--connect-timeout has no effect on a run on this machine" in fails(capsys, "--config", str(config))


def test_save_config_round_trips_and_never_writes_env_values(tmp_path: Path, recorded: Recorder) -> None:
    saved = tmp_path / "saved.toml"
    args = ["--host", "alice@h1", "--host", "h2:2222", "--gpus", "3", "--lr", "0.125", "--epochs", "2",
            "--seed", "11", "--accept-new-host-keys", "--runtime", "docker", "--image", "mine:1",
            "--stall-timeout", "40", "--rdzv-port", "29555", "--name", "exp", "-i", str(tmp_path / "key"),
            "--env", "API_TOKEN=s3cret-value"]
    up(*args, "--dry-run", "--save-config", str(saved))
    text = saved.read_text()
    assert "s3cret-value" not in text and "API_TOKEN" in text
    up("--config", str(saved), "--env", "API_TOKEN=s3cret-value", "--dry-run")
    (first_spec, first_options), (again_spec, again_options) = recorded.calls
    assert replace(again_spec, run_id="x") == replace(first_spec, run_id="x")
    assert again_options == first_options


def test_save_config_needs_dry_run_and_writes_nothing_on_bad_input(tmp_path: Path, recorded: Recorder,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "saved.toml"
    assert "add --dry-run" in fails(capsys, "--save-config", str(saved))
    fails(capsys, "--epochs", "0", "--dry-run", "--save-config", str(saved))
    assert not saved.exists()


def test_sweep_takes_every_launch_option_of_up() -> None:
    import typer.main

    cli._register_commands()
    commands = typer.main.get_command(cli.app).commands  # type: ignore[attr-defined]

    def flags(name: str) -> set[str]:
        return {flag for p in commands[name].params for flag in p.opts}

    launch_flags = {"--env", "--registry", "--stall-timeout", "--rdzv-port", "--allow-public-rendezvous",
                    "--provider", "--gpu-name", "--max-price", "--max-cost", "--disk", "--min-reliability",
                    "--ready-timeout", "--down", "--image", "--runtime", "--host", "--identity-file"}
    assert launch_flags <= flags("sweep") and launch_flags <= flags("up")


def test_a_resumed_sweep_asks_for_its_env_values_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.results.sweep import Layout, load_manifest, new_sweep
    from launcher.spec.run_spec import RunSpec

    base = RunSpec(run_id="sweep", nproc_per_node=1, extra_env=(("API_TOKEN", "s3cret"),))
    sweep_dir = new_sweep(base, [Layout(1, 1)], tmp_path, launch={"env_names": ["API_TOKEN"], "host": []})
    assert "s3cret" not in (sweep_dir / "sweep.json").read_text()
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--resume", str(sweep_dir)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "started with --env API_TOKEN" in err
    assert load_manifest(sweep_dir)["entries"][0]["status"] == "pending"  # nothing ran, nothing marked failed
