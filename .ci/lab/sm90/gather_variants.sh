#!/usr/bin/env bash
# Lab: the paged gather of the sm90 kernel (sm90/producer.h, sm90/pipeline.h) under sed variants, each in a fresh
# process and cache, on paged_once.py's shapes (SHAPES, default "3,128,1024,16"); a variant that hangs is cut at 15 s.
# The files are restored at the end. A variant is "file|sed expression". The expressions edit the warpgroup gather:
# apply .ci/lab/sm90/paged_gather_warpgroup.patch (git apply) first.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/python
P=op_sources/attention_fwd/sm90/producer.h; L=op_sources/attention_fwd/sm90/pipeline.h; X=csrc_common/ptx_sm90.h
cp "$P" /tmp/producer.h.orig; cp "$L" /tmp/pipeline.h.orig; cp "$X" /tmp/ptx_sm90.h.orig
python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
declare -A V=(
  [base]=''
  [sync_arrive]="$P|s/^  cp_async_mbar_arrive_noinc(bar);/  cp_async_wait_all(); fence_proxy_async_smem(); mbar_arrive(bar);/"
  [no_consumer_fence]="$L|s/^  if (kGatherable \&\& sm.gathered) fence_proxy_async_smem();//"
  [no_copies]="$P|s/^      cp_async_16_zfill(/      if (0) cp_async_16_zfill(/"
  [sync_copy]="$P|s/^      cp_async_16_zfill(\(.*\), src, ok ? 16u : 0u);/      { uint4 w = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0); asm volatile(\"st.shared.v4.u32 [%0], {%1, %2, %3, %4};\" ::\"r\"(\1), \"r\"(w.x), \"r\"(w.y), \"r\"(w.z), \"r\"(w.w) : \"memory\"); }/; s/^  cp_async_mbar_arrive_noinc(bar);/  fence_proxy_async_smem(); mbar_arrive(bar);/"
  [no_hint]="$X|s/cp.async.cg.shared.global.L2::128B/cp.async.cg.shared.global/"
  [ca]="$X|s/cp.async.cg.shared.global.L2::128B \[%0\], \[%1\], 16, %2;/cp.async.ca.shared.global [%0], [%1], 16, %2;/"
  [warp_sync_bar]="$P|s/^    named_sync(gather_bar(), gather_threads());/    __syncwarp(); asm volatile(\"barrier.sync %0, %1;\" ::\"r\"(gather_bar()), \"r\"(gather_threads()) : \"memory\");/"
  [no_shfl]="$P|s/__shfl_sync(0xffffffffu, lane_page, k)/(k + 0 * lane_page)/"
  [lockstep]="$P|s/^        ps.advance();$/        ps.advance(); named_sync(gather_bar(), gather_threads());/"
  [syncwarp_q]="$P|s/^      qs.advance();$/      __syncwarp(); qs.advance();/"
  [no_table]="$P|/key >> p.page_shift/s/^  return ld_global_nc_s32(p.a.block_table/  return k; (void)(p.a.block_table/"
)
for name in ${VARIANTS:-base no_consumer_fence no_copies no_table}; do
  cp /tmp/producer.h.orig "$P"; cp /tmp/pipeline.h.orig "$L"; cp /tmp/ptx_sm90.h.orig "$X"
  if [ -n "${V[$name]}" ]; then f=${V[$name]%%|*}; e=${V[$name]#*|}; sed -i "$e" "$f"
    cmp -s "$f" "/tmp/$(basename "$f").orig" && { echo "$name: sed changed nothing"; continue; }; fi
  for s in ${SHAPES:-3,128,1024,16}; do
    echo -n "$name [$s]: "; RTCATTN_CACHE_DIR=$(mktemp -d) timeout 15 python3 .ci/lab/sm90/paged_once.py 128 ${s//,/ } 2>&1 | tail -1
    echo " rc ${PIPESTATUS[0]}"
  done
done
cp /tmp/producer.h.orig "$P"; cp /tmp/pipeline.h.orig "$L"; cp /tmp/ptx_sm90.h.orig "$X"
