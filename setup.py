"""Build the compiled engine (``servegym.engine.engine``) and the admission kernels (``servegym.policies.kernels``),
in Cython's pure-Python mode; everything else is in pyproject.toml.

The extensions are optional: without a working C compiler the package installs anyway and runs the same episodes
on the same source interpreted (``servegym.engine.compiled_available()`` says which one runs).
"""

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """``build_ext`` that turns a failed compile into a warning (setuptools' ``optional`` does not cover every
    failure, editable installs included)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # any build failure: the Python engine takes over
            self._skipped(error)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            self._skipped(error)

    @staticmethod
    def _skipped(error: Exception) -> None:
        print(f"WARNING: servegym's compiled engine was not built ({error}); the same source will run as Python: the "
              "same episodes, several times slower", file=sys.stderr)


# Floats as Python computes them (no fused multiply-add); integer overflow wraps, as numpy's.
extensions = [Extension(name, [source], optional=True, extra_compile_args=["-ffp-contract=off", "-fwrapv"])
              for name, source in (("servegym.engine.engine", "engine/engine.py"),
                                   ("servegym.policies.kernels", "policies/kernels.py"))]
setup(ext_modules=cythonize(extensions, language_level=3), cmdclass={"build_ext": OptionalBuildExt})
