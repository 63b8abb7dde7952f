// The gfx942 kernel's scheduler: the work item of a workgroup (a q block of one (batch, head), whole or one
// part of a tail split; packed: a q block of one (sequence, head), the highest q blocks first), its q rows and
// its K/V blocks.
#pragma once
#include "platform.h"
#include "attn_params.h"
#include "isa_gfx942.h"
#include "gfx942/params.h"
#include "gfx942/tiles.h"

namespace g942 {

struct Work {
  int b, h, bh, q0, rows;  // q rows [q0, q0 + rows) of (b, h)
  int kb0, kb1;            // kv blocks of this workgroup
  int part;                // -1: whole item, written to O; else split part index (partials)
  int fb, fe;              // RTC_MASK: blocks [fb, fe) every row sees fully (unmasked steps)
};

// Identity except on gfx90a, whose compiler keeps these division results in VGPRs (isa_ext.h).
RTC_DEVICE void make_uniform(Work& w) {
  w.b = uniform_i32(w.b);
  w.h = uniform_i32(w.h);
  w.bh = uniform_i32(w.bh);
  w.q0 = uniform_i32(w.q0);
  w.rows = uniform_i32(w.rows);
  w.kb0 = uniform_i32(w.kb0);
  w.kb1 = uniform_i32(w.kb1);
  w.part = uniform_i32(w.part);
  w.fb = uniform_i32(w.fb);
  w.fe = uniform_i32(w.fe);
}

// Whole items first (XCD swizzle: the hardware deals workgroup i to XCD i % 8, so we hand XCD x
// a run of consecutive items, i.e. the q blocks of the same heads, which then share its L2).
RTC_DEVICE Work find_work(const Gfx942Params& p) {
  const int i = blockIdx.x;
  Work w;
  int item;
  w.part = -1;
  if (i < p.n_prefix) {
    item = i < p.n_swz ? (i & 7) * (p.n_swz >> 3) + (i >> 3) : i;
  } else {
    const int k = i - p.n_prefix, j = k / p.split_g;
    w.part = k;
    item = p.n_prefix + j;
  }
  w.bh = item / p.nqb;
  w.b = w.bh / p.heads;
  w.h = w.bh - w.b * p.heads;
  w.q0 = item_q0(p, item);
  w.rows = p.seq_q - w.q0 < kQRows ? p.seq_q - w.q0 : kQRows;
  // The item's own blocks; a split part takes its share of them (possibly none).
  const KvSpan sp = kv_span(p, w.q0, w.rows, GFX942_KV_ROWS, RTC_MASK);
  const int n = sp.end - sp.begin, g = w.part >= 0 ? (i - p.n_prefix) % p.split_g : 0;
  w.kb0 = sp.begin + (w.part >= 0 ? (int)((rtc_i64)g * n / p.split_g) : 0);
  w.kb1 = w.part >= 0 ? sp.begin + (int)((rtc_i64)(g + 1) * n / p.split_g) : sp.end;
  w.fb = sp.full_begin;
  w.fe = sp.full_end;
  // Identity except on gfx90a, whose compiler keeps these division results in VGPRs (isa_ext.h).
  // Written out, not make_uniform(w): the call moves clang 19's SGPR count of the dense kernel.
  w.b = uniform_i32(w.b);
  w.h = uniform_i32(w.h);
  w.bh = uniform_i32(w.bh);
  w.q0 = uniform_i32(w.q0);
  w.rows = uniform_i32(w.rows);
  w.kb0 = uniform_i32(w.kb0);
  w.kb1 = uniform_i32(w.kb1);
  w.part = uniform_i32(w.part);
  w.fb = uniform_i32(w.fb);
  w.fe = uniform_i32(w.fe);
  return w;
}

// Packed sequences: workgroup i runs q block nqb - 1 - i / (B*H) of (b, h) = i % (B*H). The high q
// blocks exist only in the longest sequences (and see the most keys under a causal mask), so the
// longest work starts first without the host reading a length; a block past its sequence's end has
// rows <= 0 and exits. No split, no swizzle (a swizzle would deal the longest items to one XCD).
// Masks and kv blocks follow the sequence's own lengths: all its keys, whatever max_seqlen_k says.
RTC_DEVICE Work find_packed_work(const Gfx942Params& p, Seq& seq) {
  const int i = blockIdx.x, bhn = p.batch * p.heads, from_last = i / bhn;
  Work w;
  w.part = -1;
  w.bh = i - from_last * bhn;
  w.b = w.bh / p.heads;
  w.h = w.bh - w.b * p.heads;
  w.q0 = (p.nqb - 1 - from_last) * kQRows;
  seq = seq_of(p, w.b);
  w.rows = seq.len_q - w.q0 < kQRows ? seq.len_q - w.q0 : kQRows;
  const KvSpan sp = kv_span(seq_view(p, seq), w.q0, w.rows, GFX942_KV_ROWS, RTC_MASK);
  w.kb0 = sp.begin;
  w.kb1 = sp.end;
  w.fb = sp.full_begin;
  w.fe = sp.full_end;
  make_uniform(w);
  return w;
}

}  // namespace g942
