"""Context parallelism over NCCL on two GPUs of one host (NCCL_NVLS_ENABLE=0): the emulator test's checks
(tests/context_parallel_suite.py: fp64 reference of the whole sequence, the merge's bound against the single call,
repeat bits, the backward's rule) at larger sizes: GQA 16/4, D 128, 4096 tokens, causal zigzag and full
contiguous, bf16, and a causal window in fp16. Skipped only where fewer than two GPUs exist."""
import pytest
import torch

import context_parallel_suite as cps

pytestmark = pytest.mark.gpu

CASES = [
    (True, (-1, -1), "zigzag", "bshd", torch.bfloat16, 4),
    (False, (-1, -1), "contiguous", "bshd", torch.bfloat16, 4),
    (True, (1000, -1), "zigzag", "bhsd", torch.float16, 4),
]
SHAPE = (1, 4096, 16, 128)   # B, S, Hq, D (the fp64 references hold [B, Hq, S, S] scores)


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs of one host")
    return cps.run_ranks(2, "nccl", CASES, SHAPE, tmp_path_factory.mktemp("cp2"), {"NCCL_NVLS_ENABLE": "0"})


@pytest.mark.parametrize("n", range(len(CASES)), ids=[cps.label(c) for c in CASES])
def test_two_gpus_against_fp64_and_the_single_call(ranked, n):
    cps.check_case(2, CASES[n], n, SHAPE, ranked, device="cuda")
