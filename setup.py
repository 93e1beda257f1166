"""The wheel carries the project's templates and static files inside the `dashboard` package.

They live at the top of the checkout (templates/, static/), where the settings find them; an
installed package has no checkout, so the build copies them to dashboard/assets/, which
shiftlog/settings.py reads when there is no manage.py beside the apps. Everything else about the
package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ASSETS = ("templates", "static")


class BuildWithAssets(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        for name in ASSETS:
            target = Path(self.build_lib) / "dashboard" / "assets" / name
            shutil.copytree(here / name, target, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithAssets})
