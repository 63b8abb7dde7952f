// The C library's math functions that emulated kernels and the emulator's ISA semantics call, declared here
// instead of through <math.h>: in C++ that header is libstdc++'s <cmath> (its overloads, <type_traits>, the special
// functions), a quarter of an emulator build's parse. These are the same C functions <math.h> declares, with the
// same linkage, so GCC and clang treat them as the same builtins (fmaxf / fmaf / fabsf inline as with <math.h>).
// A kernel that needs another one adds it here; the build names any that is missing.
#pragma once

extern "C" {
float exp2f(float) noexcept;
float log2f(float) noexcept;
float logf(float) noexcept;
float fmaxf(float, float) noexcept;
float fminf(float, float) noexcept;
float fmaf(float, float, float) noexcept;
float fabsf(float) noexcept;
float ldexpf(float, int) noexcept;
double ldexp(double, int) noexcept;
}

#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
