"""Build step for the one compiled part of lmforge: Word2Vec's per-pair training loop (src/lmforge/embeddings/_sgns.c).

Everything else is in pyproject.toml. The extension is optional: when no C compiler is available the install still
succeeds, and Word2Vec's exact mode says so and names the fast mode (``--mode fast``), which needs no compiler.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Compiler flags by compiler family; a failed build is a warning, not a failed install."""

    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "msvc":
            ext.extra_compile_args = ["/O2"]
        else:
            # no -ffast-math (linking with it would change floating point for the whole process) and no
            # -march=native (the file must run on another CPU): the source is written to vectorise without them
            ext.extra_compile_args = ["-O3", "-std=c99", "-fno-math-errno"]
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001 - any compiler failure
            print(f"warning: could not compile {ext.name} ({err}); Word2Vec's exact mode will be unavailable, "
                  "its fast mode works without it")


setup(
    ext_modules=[Extension("lmforge.embeddings._sgns", ["src/lmforge/embeddings/_sgns.c"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
