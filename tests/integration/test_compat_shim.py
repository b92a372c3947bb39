"""The `mooncake.store` and `mooncake.engine` shim (plugins/mooncake-compat): ours where no real
`mooncake` package is
installed, upstream's own where it is (never shadowed); its wheel carries the .pth hook."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "mooncake-compat"
pytestmark = pytest.mark.timeout(120)


def run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": f"{PLUGIN}:{ROOT}", "PATH": "/usr/bin:/bin",
                            "GLOG_minloglevel": "2"})
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_without_upstream_mooncake_store_is_ours() -> None:
    out = run("import mooncake_compat.hook as h; h.install(lambda name, path: None)\n"
              "from mooncake.store import MooncakeDistributedStore, ReplicateConfig, "
              "SoftPinAction\n"
              "import mooncake.store, mooncake_cli.compat.store as ours\n"
              "assert mooncake.store is ours and SoftPinAction.ENABLE == 1\n"
              "print(MooncakeDistributedStore.__module__)\n"
              "from mooncake.engine import TransferEngine\n"
              "import mooncake.engine, mooncake_cli.compat.engine as engine\n"
              "assert mooncake.engine is engine\n"
              "print(TransferEngine.__module__)\n"
              "try:\n    import mooncake.mooncake_connector_v1\nexcept ImportError:\n"
              "    print('nothing else')")
    assert out.splitlines() == ["mooncake_cli.compat.store", "mooncake_cli.compat.engine",
                                "nothing else"]


def test_a_real_mooncake_package_is_never_shadowed(tmp_path: Path) -> None:
    fake = tmp_path / "mooncake"  # stands for upstream's wheel, whether installed here or not
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "store.py").write_text("WHO = 'upstream'\n")
    (fake / "engine.py").write_text("WHO = 'upstream engine'\n")
    out = run(f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
              "import mooncake_compat.hook as h; h.install()\n"
              "import mooncake.store, mooncake.engine\n"
              "print(mooncake.store.WHO, mooncake.engine.WHO, sep=',')")
    assert out == "upstream,upstream engine"


def test_the_wheel_installs_the_hook(tmp_path: Path) -> None:
    src = tmp_path / "src"  # built from a copy: the build leaves nothing in the tree
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), str(src)], capture_output=True, text=True,
                       timeout=110)
    assert p.returncode == 0, p.stderr[-2000:]
    wheel = next(tmp_path.glob("mooncake_compat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "mooncake_compat.pth" in names and "mooncake_compat/hook.py" in names
    pth = zipfile.ZipFile(wheel).read("mooncake_compat.pth").decode()
    assert pth.startswith("import mooncake_compat.hook") and "install()" in pth
