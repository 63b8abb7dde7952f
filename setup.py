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
# `build_ext --sanitize DIR` (what .ci/sanitize runs): the runtime with ASan + UBSan, any UB report fatal
# (compile and link flags); -O1 (the later -O wins) compiles in half the time of -O2 with them.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
SANITIZE_CXXFLAGS = SANITIZE_FLAGS + ["-g", "-O1"]


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
    return sorted(glob.glob(os.path.join("jit", "runtime", "*.cpp"))
                  + glob.glob(os.path.join("jit", "ops", "*", "*.cpp")))


def include_dirs(src):
    """The runtime sees its own headers and csrc_common; an op's host code also sees its kernels'
    folder, op_sources/<op>/, so host and kernels include the same parameter headers by the same names."""
    dirs = [os.path.join(ROOT, "jit", "runtime"), os.path.join(ROOT, "csrc_common")]
    parts = os.path.normpath(src).split(os.sep)
    if parts[:2] == ["jit", "ops"]:
        dirs.append(os.path.join(ROOT, "op_sources", parts[2]))
    return dirs


def mirror_package(sanitize_dir):
    """A copy of python/rtcattn under SANITIZE_DIR/python whose kernel data (_data/*) links back to this
    tree, so importing it loads the library built next to it and the kernel text of the checkout."""
    src = os.path.join(ROOT, "python", PRODUCT)
    dst = os.path.join(sanitize_dir, "python", PRODUCT)
    keep = os.path.join(dst, LIB_NAME)
    if os.path.isdir(dst):
        for name in os.listdir(dst):
            path = os.path.join(dst, name)
            if path != keep:
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    shutil.copytree(src, dst, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_data", "_cache"))
    os.makedirs(os.path.join(dst, "_data"))
    for name in DATA_DIRS:
        os.symlink(os.path.join(ROOT, name), os.path.join(dst, "_data", name))


class BuildRuntime(build_ext):
    """Compiles jit/*.cpp with the host C++ compiler into ONE shared library with no Python ABI
    dependency (it is dlopened by ctypes) and no link-time ROCm/CUDA/torch dependency.

    --sanitize DIR builds it with ASan + UBSan instead, into DIR/python/rtcattn (a copy of the package,
    see mirror_package), objects in DIR/obj; the in-place build is left alone."""

    user_options = build_ext.user_options + [
        ("sanitize=", None, "build an ASan+UBSan runtime into a copy of the package under this dir")]

    def initialize_options(self):
        super().initialize_options()
        self.sanitize = None

    def get_ext_filename(self, ext_name):
        if ext_name.endswith(LIB_NAME[:-3]):
            return os.path.join(*ext_name.split(".")[:-1], LIB_NAME)
        return super().get_ext_filename(ext_name)

    def build_extension(self, ext):
        cxx = os.environ.get("CXX", "g++")
        out = self.get_ext_fullpath(ext.name)
        obj_dir = os.path.join(self.build_temp, "jit")
        cxxflags, ldflags = CXXFLAGS, []
        if self.sanitize:
            sanitize_dir = os.path.abspath(self.sanitize)
            mirror_package(sanitize_dir)
            out = os.path.join(sanitize_dir, "python", PRODUCT, LIB_NAME)
            obj_dir = os.path.join(sanitize_dir, "obj")
            cxxflags, ldflags = CXXFLAGS + SANITIZE_CXXFLAGS, SANITIZE_FLAGS
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
                cmd = [cxx, *cxxflags, *defines, *incs, "-c", src, "-o", obj]
                print(" ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objs = list(pool.map(compile_one, ext.sources))
        cmd = [cxx, "-shared", *ldflags, "-o", out, *objs, "-ldl", "-lpthread"]
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
    description="flash attention (prefill, decode, backward) compiled at run time (hipRTC / NVRTC / clang)",
    package_dir={"": "python"},
    packages=find_packages("python"),
    python_requires=">=3.10",
    ext_modules=[Extension("rtcattn.librtcattn_jit",
                           sources=runtime_sources())],
    cmdclass={"build_ext": BuildRuntime, "build_py": BuildPyWithData},
    entry_points={"console_scripts": ["rtcattn = rtcattn.tools.cli:main"]},
    extras_require={"transformers": ["transformers>=5.0"]},  # for rtcattn.integrations.transformers
    zip_safe=False,
)
