"""Build the optional compiled engine core (``servegym.engine._core``); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [Extension("servegym.engine._core", ["engine/_core.pyx"], optional=True,
                        extra_compile_args=["-ffp-contract=off"])]
setup(ext_modules=cythonize(extensions, language_level=3))
