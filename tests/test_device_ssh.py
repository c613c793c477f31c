"""The ssh target against a real OpenSSH server on loopback, and its faults."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgebert.bench import bench
from edgebert.targets import BenchError

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(not os.path.exists(SSHD) or not shutil.which("ssh"),
                                reason="sshd/ssh not installed (apt-get install openssh-server; .ci/setup-system)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (the sessions our sshd forked), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it exited meanwhile
        return b""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A throwaway sshd on a free loopback port, key login only; yields the bench kwargs to reach it."""
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "id.pub", d / "authorized_keys")
    os.chmod(d / "authorized_keys", 0o600)
    port = _free_port()
    sftp = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                             "/usr/libexec/sftp-server") if os.path.exists(p)), "internal-sftp")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PidFile {d}/sshd.pid\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp {sftp}\n")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    log = open(d / "sshd.log", "w")  # noqa: SIM115  sshd writes to it until teardown
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=log)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited: {(d / 'sshd.log').read_text()}")
            time.sleep(0.1)
    kwargs = {"target": f"ssh://{getpass.getuser()}@127.0.0.1:{port}", "ssh_key": str(d / "id"),
              "ssh_options": [f"UserKnownHostsFile={d}/known_hosts"], "remote_python": sys.executable,
              "remote_dir": str(d / "remote"), "warmup": 2, "runs": 10}
    yield {"kwargs": kwargs, "pid": proc.pid, "dir": d, "port": port}
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def test_ssh_runs_the_harness_remotely(tiny, sshd, tmp_path):
    out = tmp_path / "results.json"
    other = sshd["dir"] / "remote" / "bench-another-run"  # a bench of someone else's on the same board
    other.mkdir(parents=True)
    (other / "result.json").write_text("{}")
    report = bench(tiny["bundle"], json_out=out, logits=True, **sshd["kwargs"])
    assert report["complete"] and out.exists()
    runs = report["runs"]
    assert [r["model"]["file"] for r in runs] == ["model.onnx", "model.tflite"]
    for r in runs:
        assert r["complete"] and r["target"].startswith("ssh://") and not r["emulated"]
        assert r["model"]["manifest_verified"] and r["accuracy"] == pytest.approx(tiny["accuracy"])
        np.testing.assert_allclose(r["logits"], tiny["reference"], atol=1e-4)
    # each run worked in a folder of its own and removed it: the other bench's files are as they were
    assert list((sshd["dir"] / "remote").iterdir()) == [other] and (other / "result.json").read_text() == "{}"


def test_connection_refused(tiny, sshd, tmp_path):
    kwargs = dict(sshd["kwargs"], target=f"ssh://{getpass.getuser()}@127.0.0.1:{_free_port()}")
    with pytest.raises(BenchError, match="connection refused") as e:
        bench(tiny["bundle"] / "model.onnx", json_out=tmp_path / "r.json", **kwargs)
    assert "\n" not in str(e.value) and not (tmp_path / "r.json").exists()


def test_link_dropped_mid_run(tiny, sshd, tmp_path):
    """Kill the ssh session (and the harness under it) while the timed runs are going."""
    def cut():
        deadline = time.time() + 60
        while time.time() < deadline:
            if any(b"device_tests\x00run" in _cmdline(p) for p in _children(sshd["pid"])):
                time.sleep(0.5)
                for p in _children(sshd["pid"]):
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.1)
    killer = threading.Thread(target=cut)
    killer.start()
    kwargs = dict(sshd["kwargs"], runs=None)
    with pytest.raises(BenchError, match="connection lost|killed by") as e:
        bench(tiny["bundle"] / "model.onnx", duration=20, json_out=tmp_path / "r.json", **kwargs)
    killer.join()
    assert "no results" in str(e.value) and not (tmp_path / "r.json").exists()


def test_timeout(tiny, sshd, tmp_path):
    with pytest.raises(BenchError, match="timed out after 2 s during timed runs"):
        bench(tiny["bundle"] / "model.onnx", duration=60, timeout=2, json_out=tmp_path / "r.json",
              **dict(sshd["kwargs"], runs=None))
    assert not (tmp_path / "r.json").exists()


def test_remote_disk_full(tiny, sshd, tmp_path):
    mnt = tmp_path / "tiny-disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the disk-full check is untested")
    try:
        with pytest.raises(BenchError, match="remote disk full"):
            bench(tiny["bundle"], json_out=tmp_path / "r.json", **dict(sshd["kwargs"], remote_dir=str(mnt)))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert not (tmp_path / "r.json").exists()


def test_remote_without_numpy_names_the_fix(tiny, sshd, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(BenchError, match=r"cannot import numpy .*pip install numpy"):
        bench(tiny["bundle"] / "model.onnx", **dict(sshd["kwargs"], remote_python=str(bare / "bin" / "python")))


def test_remote_model_differs_from_manifest(tiny, sshd, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny["bundle"], bundle)
    with open(bundle / "model.tflite", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BenchError, match="model.tflite is .* bytes but the manifest says"):
        bench(bundle, fmt="tflite", **sshd["kwargs"])
