"""Lab: small calls of the sm90 kernels with the soft cap and ALiBi (prefill dense and paged, decode, backward) for
compute-sanitizer (`compute-sanitizer --tool memcheck python3 .ci/lab/score_mod_sanitize.py`)."""
import sys

import torch

sys.path.insert(0, "tests")
import score_mod_suite as sms

case = ("both_window", 0.9, "batch", (9, 3))
sms.check_dense("sm90", "cuda", case, d=128, sq=70, sk=130)
sms.check_packed("sm90", "cuda", case, d=64, page=16)
sms.check_kvcache("sm90_decode", "cuda", case, d=128, sq=4, paged=True)
sms.check_backward_dense("sm90", "cuda", case, d=128, sq=70, sk=130)
torch.cuda.synchronize()
print("ok")
