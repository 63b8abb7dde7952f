// The global-memory ranges a launch may touch, read from its parameter block.
#pragma once
#include <stdint.h>
#include <vector>
#include "workgroup.h"

namespace rtc_emu {

inline void add_range(std::vector<Range>& out, const void* base, unsigned long long bytes) {
  if (!base || bytes == 0) return;
  const uintptr_t lo = (uintptr_t)base;
  out.push_back(Range{lo, lo + (uintptr_t)bytes});
}

// The elements a strided [B, S, H, D] view reaches (strides may be zero or negative).
inline void add_view(std::vector<Range>& out, const void* base, size_t elem, long long b, long long s,
                     long long h, long long d, long long sb, long long ss, long long sh) {
  if (!base || b <= 0 || s <= 0 || h <= 0 || d <= 0) return;
  long long lo = 0, hi = d - 1;
  const long long ext[3][2] = {{b, sb}, {s, ss}, {h, sh}};
  for (const auto& e : ext) {
    const long long span = (e[0] - 1) * e[1];
    (span < 0 ? lo : hi) += span;
  }
  add_range(out, (const char*)base + lo * (long long)elem, (unsigned long long)(hi - lo + 1) * elem);
}

// Attention parameter blocks (q, k, v, o, lse, workspace with their strides and sizes) name their
// tensors; detected by their fields so this header needs no kernel header.
template <class P>
auto param_ranges(const P& p, std::vector<Range>& out, int)
    -> decltype(p.q, p.k, p.v, p.o, p.lse, p.workspace, p.q_sb, p.seq_q, p.seq_k, p.head_dim, void()) {
  add_view(out, p.q, sizeof(*p.q), p.batch, p.seq_q, p.heads, p.head_dim, p.q_sb, p.q_ss, p.q_sh);
  add_view(out, p.k, sizeof(*p.k), p.batch, p.seq_k, p.heads, p.head_dim, p.k_sb, p.k_ss, p.k_sh);
  add_view(out, p.v, sizeof(*p.v), p.batch, p.seq_k, p.heads, p.head_dim, p.v_sb, p.v_ss, p.v_sh);
  add_view(out, p.o, sizeof(*p.o), p.batch, p.seq_q, p.heads, p.head_dim, p.o_sb, p.o_ss, p.o_sh);
  if (p.lse) add_range(out, p.lse, (unsigned long long)p.batch * p.heads * p.seq_q * sizeof(float));
  if (p.workspace) add_range(out, p.workspace, (unsigned long long)p.workspace_bytes);
}

template <class P>
void param_ranges(const P&, std::vector<Range>&, long) {}

// Raw global accesses through the ISA wrappers must fall inside a registered range (when the
// launch has any); an error names the kernel, lane and address.
inline void check_global(const void* p, size_t bytes, const char* what) {
  const Workgroup* wg = t_cur->wg;
  if (wg->n_ranges == 0) return;
  const uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < wg->n_ranges; ++i)
    if (a >= wg->ranges[i].lo && a + bytes <= wg->ranges[i].hi && a + bytes >= a) return;
  fail("%s of %zu bytes at global address %p is outside every tensor of the launch", what, bytes, p);
}

}  // namespace rtc_emu
