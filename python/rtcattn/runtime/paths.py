"""Where rtcattn finds its kernel text, manifest and shipped cache at run time (installed wheel or source tree)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # rtcattn/, one above this engine's folder
# setup.py copies op_sources/, csrc_common/ and configs/ here, so a wheel needs no source tree.
INSTALLED_DATA_DIR = PACKAGE_DIR / "_data"
# python/rtcattn/../.. is the repository root when running from a checkout.
SOURCE_TREE_DIR = PACKAGE_DIR.parent.parent
DATA_SUBDIRS = ("op_sources", "csrc_common", "configs")


def _has_data(root: Path) -> bool:
    return (root / "configs" / "ops.json").is_file() and (root / "op_sources").is_dir()


_found: list = []  # the root once found: every call of an op asks for the manifest, so it is looked up once


def data_root() -> Path:
    """The directory holding op_sources/, csrc_common/ and configs/; installed data wins over a checkout."""
    if _found:
        return _found[0]
    candidates = [INSTALLED_DATA_DIR, SOURCE_TREE_DIR]
    for root in candidates:
        if _has_data(root):
            _found.append(root)
            return root
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"rtcattn kernel data not found: looked for configs/ops.json and op_sources/ in {tried}; "
        "reinstall the package or run from a complete source tree")


def op_sources_dir() -> Path:
    return data_root() / "op_sources"


def csrc_common_dir() -> Path:
    return data_root() / "csrc_common"


def configs_dir() -> Path:
    return data_root() / "configs"


def manifest_path() -> Path:
    return configs_dir() / "ops.json"


def package_cache_dir() -> Path:
    """Read-only code-object cache shipped inside the package (filled by `warm --cache-dir` at image build)."""
    return PACKAGE_DIR / "_cache"
