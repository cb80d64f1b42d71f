"""Where the API key comes from, how `ddpctl vast login` stores it, and the two Vast commands."""

from __future__ import annotations

import json
import os
import stat

import pytest
import typer
from typer.testing import CliRunner

from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast import apikey
from launcher.places.vast.commands import register
from launcher.places.vast.errors import ApiKeyMissing

KEY = "sk-login-0a1b2c3d4e5f"


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    return tmp_path


def test_precedence_env_then_vastai_file_then_ours(config_home, monkeypatch):
    with pytest.raises(ApiKeyMissing) as err:
        apikey.load_api_key()
    assert "VAST_API_KEY" in str(err.value) and "ddpctl vast login" in str(err.value)
    assert "\n" not in str(err.value)
    apikey.save_api_key("ours")
    assert apikey.load_api_key() == "ours"
    vastai = config_home / "vastai" / "vast_api_key"
    vastai.parent.mkdir()
    vastai.write_text("theirs\n")
    assert apikey.load_api_key() == "theirs"
    monkeypatch.setenv("VAST_API_KEY", " from-env ")
    assert apikey.load_api_key() == "from-env"


def test_an_empty_vastai_file_falls_through(config_home):
    (config_home / "vastai").mkdir()
    (config_home / "vastai" / "vast_api_key").write_text("\n")
    apikey.save_api_key("ours")
    assert apikey.load_api_key() == "ours"


def test_save_writes_mode_0600_even_with_a_permissive_umask(config_home):
    old = os.umask(0)
    try:
        path = apikey.save_api_key(KEY)
        path2 = apikey.save_api_key(KEY + "x")  # replaces the old key atomically
    finally:
        os.umask(old)
    assert path == path2 == config_home / "ddpctl" / "vast_api_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == KEY + "x\n"
    assert [p.name for p in path.parent.iterdir()] == ["vast_api_key"]  # no temporary file left


@pytest.mark.parametrize("bad", ["", "   ", "two words"])
def test_save_refuses_an_empty_or_spaced_key(config_home, bad):
    with pytest.raises(ApiKeyMissing):
        apikey.save_api_key(bad)
    assert not (config_home / "ddpctl" / "vast_api_key").exists()


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    register(app)
    return app


def test_login_reads_stdin_verifies_and_never_echoes(config_home, monkeypatch):
    with VastStandIn(api_key=KEY) as standin:
        monkeypatch.setenv("DDPCTL_VAST_URL", standin.url)
        result = CliRunner().invoke(_app(), ["vast", "login"], input=KEY + "\n")
        assert result.exit_code == 0, result.output
        assert KEY not in result.output
        path = config_home / "ddpctl" / "vast_api_key"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == KEY
        bad = CliRunner().invoke(_app(), ["vast", "login"], input="sk-wrong\n")
        assert bad.exit_code != 0 and "rejected the API key" in str(bad.exception)
        assert path.read_text().strip() == KEY  # a rejected key does not replace the good one
        assert standin.validation_failures() == []


def test_offers_command_json_and_table(config_home, monkeypatch):
    offers = [make_offer(1, 101, dph_base=0.30, gpu_name="RTX 3080"),
              make_offer(2, 102, dph_base=0.10, gpu_name="RTX 3080", storage_cost=3.6),
              make_offer(3, 103, dph_base=0.05, gpu_name="RTX 4090")]
    with VastStandIn(api_key=KEY, offers=offers) as standin:
        monkeypatch.setenv("DDPCTL_VAST_URL", standin.url)
        monkeypatch.setenv("VAST_API_KEY", KEY)
        out = CliRunner().invoke(_app(), ["offers", "--gpu-name", "RTX_3080", "--disk", "100", "--json"])
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)
        # offer 2 is cheaper per hour but its disk costs 3.6 $/GB/month: 100 GB add 0.5 $/hour
        assert [r["id"] for r in rows] == [1, 2]
        assert rows[1]["hourly_price"] == pytest.approx(0.10 + 3.6 * 100 / 720)
        table = CliRunner().invoke(_app(), ["offers", "--gpu-name", "RTX 3080", "--max-price", "0.4", "--disk",
                                            "100"], env={"COLUMNS": "200"})
        assert table.exit_code == 0, table.output
        assert "0.3208" in table.output and "0.6000" not in table.output  # offer 2 costs too much with the disk
        assert standin.validation_failures() == []
        assert KEY not in out.output + table.output
