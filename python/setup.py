"""Build hooks of the kvbridge package (metadata is in pyproject.toml).

build_py does two things beyond copying kvbridge/:

- records the directory of the installed libkvbridge in kvbridge/_installed.py
  (generated in the build folder, never in the source tree), so the installed
  package loads that library without KVBRIDGE_LIB. The directory is
  KVBRIDGE_LIBDIR if set (it must hold libkvbridge.so.0), else
  `pkg-config --variable=libdir kvbridge` (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig
  for a prefix pkg-config does not search). Without either, nothing is
  recorded and the package falls back to the system library path.
- copies ../compat (python/compat, the drop-in modules such as mooncake/) as
  data into kvbridge/compat/ when that folder exists. That folder is not on
  sys.path: a user opts in by putting kvbridge.compat_path() on PYTHONPATH
  (docs/python.md), so it never shadows a real package by accident.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libkvbridge.so.0"


def _installed_libdir():
    explicit = os.environ.get("KVBRIDGE_LIBDIR")
    if explicit:
        d = os.path.abspath(explicit)
        if not os.path.exists(os.path.join(d, SONAME)):
            sys.exit(f"kvbridge: KVBRIDGE_LIBDIR={explicit} holds no {SONAME}")
        return d
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "kvbridge"],
                           capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"kvbridge: pkg-config not usable ({e}); no library path recorded")
        return None
    d = r.stdout.strip()
    if r.returncode != 0 or not d:
        print("kvbridge: pkg-config knows no kvbridge (install the C library first, "
              "or set PKG_CONFIG_PATH / KVBRIDGE_LIBDIR); no library path recorded")
        return None
    d = os.path.normpath(d)
    if not os.path.exists(os.path.join(d, SONAME)):
        print(f"kvbridge: warning: {d} (from pkg-config) holds no {SONAME}")
    return d


def _ignore(_dir, names):
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "kvbridge")
        libdir = _installed_libdir()
        with open(os.path.join(pkg, "_installed.py"), "w", encoding="utf-8") as f:
            f.write('"""Written by setup.py at build time: where the installed '
                    'libkvbridge is."""\n\n')
            f.write(f"LIBDIR = {libdir!r}\n")
        compat = os.path.join(HERE, "compat")
        dst = os.path.join(pkg, "compat")
        if os.path.exists(dst):
            shutil.rmtree(dst)
        if os.path.isdir(compat):
            shutil.copytree(compat, dst, ignore=_ignore)


setup(cmdclass={"build_py": BuildPy})
