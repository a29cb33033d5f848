// VISION_TX_VECTOR_CLONES before a function compiles it three times, for AVX-512, AVX2 and any x86-64 CPU, and picks
// the CPU's best when the library loads (GCC's target_clones): vector instructions without -march=native, whose
// binary would fail on an older CPU sharing the cache folder. Elsewhere (clang, macOS, ARM) it is nothing.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define VISION_TX_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VISION_TX_VECTOR_CLONES
#endif
