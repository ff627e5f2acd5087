"""What the tests share: the repository's paths, child Python processes, the C test programs."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
XEMEM = os.path.join(ROOT, "xemem")


@pytest.fixture(scope="session", autouse=True)
def environment():
    """The broker and the library the runner (python/test.sh) set up."""
    for name in ("CLOWDER_XEMEM_SOCKET", "CLOWDER_LIBXPMEM"):
        if not os.environ.get(name):
            pytest.exit(f"{name} is not set: run python/test.sh", returncode=2)


def child(code):
    """A Python child process running `code` (dedented) with clowder importable as here, with
    pipes to its stdin and stdout in text mode, line-buffered."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], env=env, text=True, bufsize=1,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def finished(process, timeout=60):
    """The child's remaining output, after checking it exited with status 0."""
    out, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"child exited with {process.returncode}: {out}"
    return out


@pytest.fixture(scope="session")
def c_program(tmp_path_factory):
    """Builds xemem/tests/NAME.c against the built libxpmem; returns its path."""
    directory = tmp_path_factory.mktemp("c")
    build = os.path.join(XEMEM, "build")

    def build_program(name):
        path = str(directory / name)
        if not os.path.exists(path):
            subprocess.run(["cc", "-O2", "-std=gnu11", "-I", os.path.join(build, "include"), "-o", path,
                            os.path.join(XEMEM, "tests", name + ".c"), "-L", os.path.join(build, "lib"),
                            "-Wl,-rpath," + os.path.join(build, "lib"), "-lxpmem"], check=True)
        return path

    return build_program
