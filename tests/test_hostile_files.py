"""Hostile or careless files on disk: Accelerate config files and run log folders. Refused at once with the file
named, or read with bounds (never hanging, never following a link out of the folder, never reading a device);
real files, links and FIFOs in temp folders, real launches where the point is a launch."""

from __future__ import annotations

import time

import psutil
import pytest

from notebook_launcher import LaunchArgumentError, notebook_launcher
from notebook_launcher.accelerate_config import MAX_ALIASES, MAX_CONFIG_BYTES


def no_children_left():
    assert psutil.Process().children(recursive=True) == []


def returns_rank():
    import torch.distributed as dist

    return dist.get_rank()


# -- Accelerate config files ----------------------------------------------------------------------------------------
ALIAS_BOMB = "".join(['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
                     + [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 10)]) + "debug: *l9\n"


@pytest.mark.parametrize("where", ["config_file=", "Accelerate's default file"])
def test_a_yaml_alias_bomb_under_debug_fails_at_once_naming_the_file(where, tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(ALIAS_BOMB)
    keywords = {"config_file": str(config)} if where == "config_file=" else {}
    started = time.monotonic()
    with pytest.raises(LaunchArgumentError, match=rf"more than {MAX_ALIASES} YAML aliases") as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu", **keywords)
    assert time.monotonic() - started < 5  # it took 84 s to expand (a bound, not a benchmark)
    assert str(config) in str(caught.value)
    no_children_left()


@pytest.mark.parametrize("content, says", [
    (b"debug: true\nname: caf\xe9\n", "is not UTF-8 text (b'\\xe9' at offset 21): save it as UTF-8"),
    (b"debug: [true, false]\n", "says debug: list, not true or false"),
    (b"- debug\n- true\n", "holds a list, not the mapping of settings"),
    (b"debug: true\nother: [\n", "is not valid YAML"),
    (b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1) + b"debug: true\n", "is over 256 KB"),
])
def test_a_config_file_that_is_not_a_config_is_named_with_what_is_wrong(content, says, tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    config = tmp_path / "accelerate config.yaml"
    config.write_bytes(content)
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu", config_file=str(config))
    assert f"the Accelerate config file {config} {says}" in str(caught.value)
    assert not isinstance(caught.value.__cause__, UnicodeDecodeError)
    no_children_left()


def test_a_config_file_with_a_few_aliases_still_reads(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("defaults: &on true\ndebug: *on\nmixed_precision: 'no'\n")
    from notebook_launcher.accelerate_config import resolve_debug

    assert resolve_debug(None, str(config)) is True
    config.write_text("debug: false\n")
    assert resolve_debug(None, str(config)) is False
