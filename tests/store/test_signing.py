"""The recorder's signature over a run's launch claim: made with this user's private key, checked
against it."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import pytest

from bisect_repro.store import signing

META = {
    "format": 1,
    "target": "/home/me/recipe.py:build",
    "config": {"lr": 0.1, "seed": 0},
    "launch": {
        "argv": ["bisect-repro"],
        "cwd": "/home/me",
        "code": {"kind": "recipe", "path": "/home/me/recipe.py", "sha256": "0" * 64},
    },
    "environment": {"env.OMP_NUM_THREADS": "2", "torch.get_num_threads": 2},
    "options": {"steps": 10},
}


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def signed(meta: dict) -> dict:
    signature = signing.sign(meta)
    assert signature is not None
    return {**meta, "signature": signature}


def test_a_signed_claim_verifies_and_the_key_is_private(config_home: Path) -> None:
    meta = signed(META)
    assert signing.verify(meta)
    key = config_home / "bisect-repro" / "signing.key"
    assert (
        stat.S_IMODE(key.stat().st_mode) == 0o600
        and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    )
    assert signing.sign(META) == meta["signature"]  # the same key is used again, not a new one


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(target="os:system"),
        lambda m: m["config"].update(lr=0.2),
        lambda m: m["launch"].update(cwd="/tmp"),
        lambda m: m["launch"]["code"].update(sha256="1" * 64),
        lambda m: m["environment"].update({"env.PYTHONPATH": "/tmp"}),
        lambda m: m.update(distributed={"world_size": 64}),
        lambda m: m["signature"].update(mac="0" * 64),
        lambda m: m.pop("signature"),
    ],
)
def test_any_change_to_what_decides_a_replay_breaks_the_signature(
    config_home: Path, change
) -> None:
    meta = copy.deepcopy(signed(META))
    change(meta)
    assert not signing.verify(meta)


def test_what_does_not_decide_a_replay_may_change(config_home: Path) -> None:
    meta = copy.deepcopy(signed(META))
    meta["options"]["steps"] = 20
    meta["environment"]["torch.get_num_threads"] = 4
    meta["resumes"] = [{"step": 5}]
    assert signing.verify(meta)


def test_another_users_key_does_not_verify(
    config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = signed(META)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other"))
    assert not signing.verify(meta)


def test_a_key_others_can_read_or_a_link_is_not_trusted(config_home: Path, tmp_path: Path) -> None:
    meta = signed(META)
    key = config_home / "bisect-repro" / "signing.key"
    os.chmod(key, 0o644)
    assert not signing.verify(meta) and signing.sign(META) is None
    os.chmod(key, 0o600)
    moved = tmp_path / "elsewhere.key"
    key.rename(moved)
    key.symlink_to(moved)
    assert not signing.verify(meta) and signing.sign(META) is None


def test_no_key_can_be_made_and_the_run_is_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    # a file where the folder would be
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "file"))
    assert signing.sign(META) is None and not signing.verify(
        {**META, "signature": {"key": "00", "mac": "00"}}
    )


def test_processes_making_the_key_at_once_all_sign_with_the_one_that_won(config_home: Path) -> None:
    import subprocess
    import sys

    code = (
        "from bisect_repro.store import signing; import json; "
        "print(json.dumps(signing.sign({'target': 'x'})))"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    signatures = {process.communicate(timeout=120)[0].strip() for process in processes}
    assert len(signatures) == 1 and "null" not in signatures, signatures
    # no temporary file left
    assert [p.name for p in (config_home / "bisect-repro").iterdir()] == ["signing.key"]
