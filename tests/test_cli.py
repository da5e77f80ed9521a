import subprocess
import sys

from gpumm.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for word in ("maxwell", "blackwell", "h200", "NVLink-C2C", "256G"):
        assert word in out


def test_demo_pmm(capsys):
    assert main(["demo", "--pmm", "--ops", "2000", "--vidmem", "256MiB"]) == 0
    out = capsys.readouterr().out
    assert "evicted that root" in out and "OutOfMemoryError" in out


def test_demo_replays_the_shipped_trace(capsys):
    assert main(["demo", "--vidmem", "64MiB"]) == 0
    out = capsys.readouterr().out
    for word in ("gpumm", "caching", "rmm-pool", "cupy", "buddy", "driver", "min cap.",
                 "gpumm holds", "numpy writes all of it"):
        assert word in out


def test_bad_device_is_a_clear_error(capsys):
    assert main(["demo", "--device", "k80"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "gpumm", "info"], capture_output=True, text=True)
    assert r.returncode == 0 and "hopper" in r.stdout


def test_stub_matches_extension():
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "gpumm._core"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
