"""`cdc-pipeline demo` (issue 15.10): a private folder (fresh mkdtemp 0700, or a given one that is ours and
closed, never a symlink) and a cluster that wants a password on the socket and on 127.0.0.1."""

from __future__ import annotations

import os
import stat

import psycopg
import pytest

from cdc_pipeline.config import ConfigError
from cdc_pipeline.demo import run as demo


def test_demo_folder_is_private_and_cluster_needs_a_password(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(demo.DEMO_DIR_ENV, raising=False)
    root = demo.demo_root()
    try:
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
        assert root != demo.demo_root()  # a fresh one every time, never a fixed name
        cluster, config_path = demo.prepare(root)
        try:
            assert stat.S_IMODE(os.stat(config_path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(cluster.root / "password").st_mode) == 0o600
            assert cluster.password and cluster.password in config_path.read_text()
            for tcp in (False, True):
                without = cluster.dsn("demo", tcp=tcp).replace(f" password={cluster.password}", "")
                with pytest.raises(psycopg.OperationalError, match="password"):
                    psycopg.connect(without + " password=wrong", connect_timeout=5).close()
                with pytest.raises(psycopg.OperationalError):
                    psycopg.connect(without, connect_timeout=5).close()
                psycopg.connect(cluster.dsn("demo", tcp=tcp), connect_timeout=5).close()
            hba = (cluster.data_dir / "pg_hba.conf").read_text()
            rules = [line for line in hba.splitlines() if line.strip() and not line.startswith("#")]
            assert rules and all(line.split()[-1] == "scram-sha-256" for line in rules)
        finally:
            cluster.destroy()
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_a_given_demo_folder_must_be_private_and_real(monkeypatch, tmp_path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(open_dir))
    with pytest.raises(ConfigError, match="open to other users"):
        demo.demo_root()
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(link))
    with pytest.raises(ConfigError, match="symlinks are refused"):
        demo.demo_root()
    fresh = tmp_path / "fresh"
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(fresh))
    assert demo.demo_root() == fresh and stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
