"""Build hooks (the rest of the configuration is setup.cfg): the native front end.

``pegasus-cloudio-transfer`` is compiled from ``native/pegasus_cloudio_transfer.c`` (C99, libc
only) into the scripts directory, beside the Python drop-in ``pegasus-cloudio-transfer-py`` it
execs; the wheel is then tagged ``py3-none-<platform>`` (any Python 3, this machine's
platform). Without a working C compiler (``$CC``, else the one Python was built with, else
``cc``) the build warns and installs the Python script under both names, in a pure
``py3-none-any`` wheel, as before the front end existed.
"""

import os
import shlex
import shutil
import subprocess
import sysconfig

from setuptools import setup
from distutils.command.build_scripts import build_scripts  # setuptools' copy (import setuptools first)

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

SOURCE = os.path.join("native", "pegasus_cloudio_transfer.c")
COMMAND, PYTHON_SCRIPT = "pegasus-cloudio-transfer", "pegasus-cloudio-transfer-py"
FLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra"]


def compile_front_end(out):
    """Compile SOURCE to ``out``, static if the C library allows; None, or why it failed."""
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    why = "no compiler"
    for link in (["-static"], []):
        try:
            done = subprocess.run([*compiler, *FLAGS, *link, "-o", out, SOURCE], capture_output=True, text=True,
                                  timeout=300)
        except (OSError, subprocess.SubprocessError) as err:
            return f"{compiler[0]}: {err}"
        if done.returncode == 0:
            return None
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return why


class BuildScripts(build_scripts):
    def run(self):
        super().run()
        target = os.path.join(self.build_dir, COMMAND)
        problem = compile_front_end(target)
        self.distribution.native_front_end = problem is None
        if problem:
            self.warn(f"cannot compile the native {COMMAND} ({problem}); installing the Python drop-in "
                      f"under that name: the node stager's hand-off then starts Python on every job step")
            shutil.copy2(os.path.join(self.build_dir, PYTHON_SCRIPT), target)


class BdistWheel(bdist_wheel):
    def get_tag(self):
        tag = super().get_tag()
        if not getattr(self.distribution, "native_front_end", False):
            return tag
        platform = self.plat_name if self.plat_name_supplied else sysconfig.get_platform()
        return "py3", "none", platform.replace("-", "_").replace(".", "_")


setup(cmdclass={"build_scripts": BuildScripts, "bdist_wheel": BdistWheel})
