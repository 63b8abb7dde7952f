"""Code-object checks of the gfx942 fast kernel: all six dense variants per arch compile with no scratch, <= 64 KiB
LDS, 512 threads, 2 waves/SIMD."""
import shutil

import pytest

from rtcattn.tools import coreport

ARCHS = [a for a, tool in (("gfx942", "clang++-19"), ("gfx90a", "clang++-19")) if shutil.which(tool)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", coreport.axis_values("round_mode"))
@pytest.mark.parametrize("mask", coreport.axis_values("mask"))
def test_code_object(arch, mode, mask):
    r = coreport.report(arch, mode, mask)
    n = r.notes
    tag = f"{arch} {mode} {mask}: {n}"
    assert 0 < n["group_segment_fixed_size"] <= 64 * 1024, tag
    assert n["max_flat_workgroup_size"] == 512, tag
    assert r.waves_per_simd >= 2, f"2 waves/SIMD not achievable: {tag}"
    assert r.loop["has_mfma16_bf16"], tag
    # The KV loop holds one wave's 96 QK + 96 PV MFMAs and the two barriers of the schedule.
    assert r.loop["mfma"] == 192 and r.loop["s_barrier"] == 2, (tag, r.loop)
    # Only the last kv block masks scores, and it is peeled: the steady-state loop selects nothing.
    assert r.loop["cndmask"] == 0, (tag, r.loop)
    # SGPR spills into VGPR lanes (hipRTC 5.2 for gfx90a keeps a few) touch no memory: not counted.
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    if mask != "none":
        # Blocks fully inside every row's window run the unmasked loop, instruction for instruction as
        # counted in the unmasked variant; the blocks a window cuts have their own loop with the selects.
        plain = coreport.report(arch, mode, "none").loop
        keys = ("mfma", "valu", "trans", "cndmask", "lds", "vmem", "s_barrier")
        assert {k: r.loop[k] for k in keys} == {k: plain[k] for k in keys}, (tag, r.loop, plain)
        m = r.masked_loop
        assert m["mfma"] == 192 and m["s_barrier"] == 2 and m["cndmask"] >= 48, (tag, m)


def _branch(addr, op, target):
    return (addr, op, str(((target - addr - 4) // 4) & 0xFFFF))


def test_kv_loop_is_the_natural_loop_not_a_layout_jump():
    # Entry jumps to a block placed last, which jumps back into straight-line code: a backward branch
    # that is no loop, and whose address range holds more MFMAs (the peeled ones) than the loop.
    insts = [_branch(0x00, "s_branch", 0x24), (0x04, "v_mfma_f32_16x16x16_bf16", "v[0:3]"),
             (0x08, "v_mfma_f32_16x16x16_bf16", "v[4:7]"), (0x0C, "v_exp_f32_e32", "v8, v8"),
             _branch(0x10, "s_cbranch_scc1", 0x08), (0x14, "v_mfma_f32_16x16x16_bf16", "v[0:3]"),
             (0x18, "v_mfma_f32_16x16x16_bf16", "v[0:3]"), (0x1C, "s_endpgm", ""), (0x20, "v_mov_b32_e32", "v1, 0"),
             (0x24, "v_mov_b32_e32", "v2, 0"), _branch(0x28, "s_branch", 0x04)]
    body = coreport.kv_loop(insts)
    assert [a for a, _, _ in body] == [0x08, 0x0C, 0x10]
    c = coreport.count(body)
    assert c["mfma"] == 1 and c["trans"] == 1 and c["cndmask"] == 0


def test_kv_loop_includes_a_second_latch_placed_after_the_loop():
    # The refill block sits past the first latch and jumps back one instruction before its target.
    insts = [(0x00, "s_nop", "0"), (0x04, "v_mfma_f32_16x16x16_bf16", "v[0:3]"), _branch(0x08, "s_cbranch_scc0", 0x14),
             _branch(0x0C, "s_cbranch_scc1", 0x04), (0x10, "s_endpgm", ""),
             (0x14, "buffer_load_dword", "v1, s[0:3], s4 offen lds"), _branch(0x18, "s_branch", 0x00)]
    body = coreport.kv_loop(insts)
    assert [a for a, _, _ in body] == [0x00, 0x04, 0x08, 0x0C, 0x14, 0x18]
    assert coreport.count(body)["lds_dma"] == 1


# ---- packed sequences (varlen) and paged KV --------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kv", ["varlen", "paged"])
@pytest.mark.parametrize("mode", coreport.axis_values("round_mode"))
@pytest.mark.parametrize("mask", coreport.axis_values("mask"))
def test_packed_code_object(arch, kv, mode, mask):
    """Real compiles (gfx942: clang 19; gfx90a: hipRTC 5.2 first) of the packed variants: no scratch or VGPR
    spills, the dense occupancy, and the same MFMA loop. Varlen's loop is the dense loop instruction for
    instruction; paged adds only the per-page resource of group B's K refill (scalar work, no VALU mask)."""
    r = coreport.report(arch, mode, mask, kv)
    n = r.notes
    tag = f"{arch} {kv} {mode} {mask}: {n}"
    assert n["private_segment_fixed_size"] == 0 and n["vgpr_spill_count"] == 0, f"scratch or VGPR spills: {tag}"
    assert n["max_flat_workgroup_size"] == 512 and r.waves_per_simd >= 2, tag
    dense = coreport.report(arch, mode, mask, "dense").loop
    keys = ("mfma", "trans", "lds", "s_barrier")
    assert {k: r.loop[k] for k in keys} == {k: dense[k] for k in keys}, (tag, r.loop, dense)
    if kv == "varlen":
        assert all(r.loop[k] == dense[k] for k in ("valu", "cndmask", "vmem")), (tag, r.loop, dense)
    else:
        # The page lookup: one block-table load, and the division by page_size, whose reciprocal runs on
        # the VALU (gfx90a's compiler also keeps the resource selects there: 3 v_cndmask, ~25 VALU).
        assert r.loop["vmem"] <= dense["vmem"] + 1 and r.loop["cndmask"] <= 3, (tag, r.loop, dense)
        assert r.loop["valu"] <= dense["valu"] + 32, (tag, r.loop, dense)
