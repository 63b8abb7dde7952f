"""Builds rtcattn: the Python package plus the JIT runtime as one plain shared library loaded with ctypes."""
import glob
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
PRODUCT = "rtcattn"
LIB_NAME = f"lib{PRODUCT}_jit.so"
DATA_DIRS = ("op_sources", "csrc_common", "configs")  # kernel text read at run time
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]


def package_version():
    text = open(os.path.join(ROOT, "python", PRODUCT, "__init__.py")).read()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def newest_header_mtime():
    headers = []
    for top in ("jit", "csrc_common", "op_sources"):
        headers += glob.glob(os.path.join(ROOT, top, "**", "*.h"), recursive=True)
    return max((os.path.getmtime(h) for h in headers), default=0.0)


def runtime_sources():
    """jit/runtime/*.cpp (op-agnostic) and jit/ops/<op>/*.cpp (each op's host code)."""
    return sorted(glob.glob(os.path.join("jit", "runtime", "*.cpp")) + glob.glob(os.path.join("jit", "ops", "*", "*.cpp")))


def include_dirs(src):
    """The runtime sees its own headers and csrc_common; an op's host code also sees its kernels'
    folder, op_sources/<op>/, so host and kernels include the same parameter headers by the same names."""
    dirs = [os.path.join(ROOT, "jit", "runtime"), os.path.join(ROOT, "csrc_common")]
    parts = os.path.normpath(src).split(os.sep)
    if parts[:2] == ["jit", "ops"]:
        dirs.append(os.path.join(ROOT, "op_sources", parts[2]))
    return dirs


class BuildRuntime(build_ext):
    """Compiles jit/*.cpp with the host C++ compiler into ONE shared library with no Python ABI
    dependency (it is dlopened by ctypes) and no link-time ROCm/CUDA/torch dependency."""

    def get_ext_filename(self, ext_name):
        if ext_name.endswith(LIB_NAME[:-3]):
            return os.path.join(*ext_name.split(".")[:-1], LIB_NAME)
        return super().get_ext_filename(ext_name)

    def build_extension(self, ext):
        cxx = os.environ.get("CXX", "g++")
        out = self.get_ext_fullpath(ext.name)
        obj_dir = os.path.join(self.build_temp, "jit")
        os.makedirs(obj_dir, exist_ok=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        headers_mtime = newest_header_mtime()

        # The product's name and version reach the runtime as defines: one definition, in the package.
        defines = [f'-DRTC_PRODUCT="{PRODUCT}"', f'-DRTC_VERSION="{package_version()}"']

        def compile_one(src):
            obj = os.path.join(obj_dir, os.path.normpath(src).replace(os.sep, "_")[:-4] + ".o")
            fresh = os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(src), headers_mtime,
                                                                         os.path.getmtime(__file__))
            if not fresh:
                incs = [arg for d in include_dirs(src) for arg in ("-I", d)]
                cmd = [cxx, *CXXFLAGS, *defines, *incs, "-c", src, "-o", obj]
                print(" ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objs = list(pool.map(compile_one, ext.sources))
        cmd = [cxx, "-shared", "-o", out, *objs, "-ldl", "-lpthread"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


class BuildPyWithData(build_py):
    """Copies op_sources/, csrc_common/ and configs/ into rtcattn/_data so a wheel needs no source tree."""

    def run(self):
        super().run()
        for name in DATA_DIRS:
            dst = os.path.join(self.build_lib, "rtcattn", "_data", name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(ROOT, name), dst)


setup(
    name="rtcattn",
    version=package_version(),
    description="bf16 flash-attention forward compiled at run time (hipRTC / NVRTC / clang), cached on disk",
    package_dir={"": "python"},
    packages=find_packages("python"),
    python_requires=">=3.10",
    ext_modules=[Extension("rtcattn.librtcattn_jit",
                           sources=runtime_sources())],
    cmdclass={"build_ext": BuildRuntime, "build_py": BuildPyWithData},
    entry_points={"console_scripts": ["rtcattn = rtcattn.cli:main"]},
    zip_safe=False,
)
