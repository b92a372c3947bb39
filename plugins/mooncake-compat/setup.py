"""Ships mooncake_compat.pth next to the package (site-packages), so the import hook is in
place at interpreter start (see mooncake_compat/hook.py)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "mooncake_compat.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).with_name(PTH)), str(Path(self.build_lib) / PTH))


setup(cmdclass={"build_py": BuildWithPth})
