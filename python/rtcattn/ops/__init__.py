"""The ops: one package per op of configs/ops.json (ops/<op>/: stub.py, validate.py, reference.py, bench.py),
and what they share (checks.py: argument checks; schema.py: torch schemas from signatures; backward.py:
autograd). Importing this package imports every op package, which registers its torch ops."""
import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    if _m.ispkg:
        importlib.import_module(f"{__name__}.{_m.name}")
