// msl_emu.h: mlxpa's test emulator for the Metal kernels MLX generates
// (mx.fast.metal_kernel). The generated Metal Shading Language source is compiled as C++20
// after this header and run on the CPU: every GPU thread of a threadgroup is one
// std::thread, threadgroups run one after another, and threadgroup_barrier / simd_* are
// std::barrier rendezvous. It checks indexing, masking, reductions and barriers against a
// float64 reference; it says nothing about speed, the Metal compiler or register limits.
//
// Dialect it accepts (what mlxpa's kernels use): `threadgroup` only on array declarations
// inside the kernel (they become function-local statics, shared by the threadgroup that
// runs), simd_* calls reached by all 32 lanes of a simdgroup (else a deadlock, where Metal
// would be undefined), element types float, half and bfloat16_t.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace msl_emu {
using OsThread = std::thread;  // named before `thread` becomes an empty word below
}  // namespace msl_emu

// Address spaces and qualifiers: no meaning on a CPU.
#define device
#define constant
#define thread
#define threadgroup static
#define METAL_FUNC inline

using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;
using half = _Float16;
using float16_t = _Float16;

struct uint3 {
  uint x = 0, y = 0, z = 0;
};

// bfloat16: the top 16 bits of a float32, rounded to nearest even on conversion.
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
      bits = uint16_t((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = uint16_t(u >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };

namespace msl_emu {

constexpr uint kSimdWidth = 32;

// One simdgroup's rendezvous: a slot per lane and a barrier over its live lanes.
struct Simdgroup {
  float slot[kSimdWidth] = {};
  std::unique_ptr<std::barrier<>> sync;
};

// What a running GPU thread knows about itself.
struct Lane {
  uint lane = 0;
  uint simdgroup = 0;
  std::barrier<>* group_sync = nullptr;
  Simdgroup* simdgroups = nullptr;
};

inline thread_local Lane self;

// Every lane publishes x, then each reads all live lanes' values in lane order (the same
// order for every lane, so all lanes get bit-identical results), then a second rendezvous
// keeps the slots until every lane has read them.
template <typename Combine>
inline float simd_all(float x, Combine combine) {
  Simdgroup& s = self.simdgroups[self.simdgroup];
  s.slot[self.lane] = x;
  s.sync->arrive_and_wait();
  float r = s.slot[0];
  for (uint i = 1; i < kSimdWidth; i++) r = combine(r, s.slot[i]);
  s.sync->arrive_and_wait();
  return r;
}

inline float simd_read(float x, uint from) {
  Simdgroup& s = self.simdgroups[self.simdgroup];
  s.slot[self.lane] = x;
  s.sync->arrive_and_wait();
  float r = s.slot[from % kSimdWidth];
  s.sync->arrive_and_wait();
  return r;
}

}  // namespace msl_emu

namespace metal {
using std::abs;
using std::exp;
using std::exp2;
using std::fma;
using std::log;
using std::sqrt;
using std::tanh;
template <typename T>
inline T max(T a, T b) { return a > b ? a : b; }
template <typename T>
inline T min(T a, T b) { return a < b ? a : b; }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
namespace fast {
using std::exp;
using std::exp2;
using std::log;
using std::tanh;
using metal::rsqrt;
}  // namespace fast
namespace precise {
using std::exp;
using std::exp2;
using std::log;
using std::tanh;
}  // namespace precise

inline float simd_sum(float x) {
  return msl_emu::simd_all(x, [](float a, float b) { return a + b; });
}
inline float simd_max(float x) {
  return msl_emu::simd_all(x, [](float a, float b) { return b > a ? b : a; });
}
inline float simd_min(float x) {
  return msl_emu::simd_all(x, [](float a, float b) { return b < a ? b : a; });
}
inline float simd_shuffle(float x, ushort lane) { return msl_emu::simd_read(x, lane); }
inline float simd_shuffle_xor(float x, ushort mask) {
  return msl_emu::simd_read(x, msl_emu::self.lane ^ mask);
}
inline float simd_broadcast_first(float x) { return msl_emu::simd_read(x, 0); }
inline void threadgroup_barrier(mem_flags) { msl_emu::self.group_sync->arrive_and_wait(); }
inline void simdgroup_barrier(mem_flags) {
  msl_emu::self.simdgroups[msl_emu::self.simdgroup].sync->arrive_and_wait();
}
}  // namespace metal
using namespace metal;

namespace msl_emu {

// The [[attribute]] arguments a kernel may ask for.
struct ThreadAttrs {
  uint3 thread_position_in_grid, thread_position_in_threadgroup,
      threadgroup_position_in_grid, threadgroups_per_grid, threads_per_threadgroup,
      threads_per_grid;
  uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup,
      thread_index_in_simdgroup, simdgroups_per_threadgroup, threads_per_simdgroup;
};

inline uint ceil_div(uint a, uint b) { return (a + b - 1) / b; }

// Run `body` over a grid of `grid` threads in threadgroups of `group` threads (MLX's
// dispatchThreads: the last threadgroup along an axis may be partial).
inline void dispatch(uint3 grid, uint3 group,
                     const std::function<void(const ThreadAttrs&)>& body) {
  const uint3 groups{ceil_div(grid.x, group.x), ceil_div(grid.y, group.y),
                     ceil_div(grid.z, group.z)};
  for (uint gz = 0; gz < groups.z; gz++) {
    for (uint gy = 0; gy < groups.y; gy++) {
      for (uint gx = 0; gx < groups.x; gx++) {
        const uint3 origin{gx * group.x, gy * group.y, gz * group.z};
        const uint3 size{std::min(group.x, grid.x - origin.x),
                         std::min(group.y, grid.y - origin.y),
                         std::min(group.z, grid.z - origin.z)};
        const uint n = size.x * size.y * size.z;
        const uint num_simd = ceil_div(n, kSimdWidth);
        std::barrier<> group_sync(n);
        std::vector<Simdgroup> simd(num_simd);
        for (uint s = 0; s < num_simd; s++) {
          simd[s].sync = std::make_unique<std::barrier<>>(std::min(kSimdWidth, n - s * kSimdWidth));
        }
        std::vector<OsThread> threads;
        threads.reserve(n);
        for (uint i = 0; i < n; i++) {
          const uint3 local{i % size.x, (i / size.x) % size.y, i / (size.x * size.y)};
          ThreadAttrs a{};
          a.thread_position_in_grid = {origin.x + local.x, origin.y + local.y, origin.z + local.z};
          a.thread_position_in_threadgroup = local;
          a.threadgroup_position_in_grid = {gx, gy, gz};
          a.threadgroups_per_grid = groups;
          a.threads_per_threadgroup = size;
          a.threads_per_grid = grid;
          a.thread_index_in_threadgroup = i;
          a.simdgroup_index_in_threadgroup = i / kSimdWidth;
          a.thread_index_in_simdgroup = i % kSimdWidth;
          a.simdgroups_per_threadgroup = num_simd;
          a.threads_per_simdgroup = kSimdWidth;
          threads.emplace_back([&, a] {
            self = Lane{a.thread_index_in_simdgroup, a.simdgroup_index_in_threadgroup,
                        &group_sync, simd.data()};
            body(a);
          });
        }
        for (auto& t : threads) t.join();
      }
    }
  }
}

}  // namespace msl_emu
