// The pool of freed CPU buffers (kernels/cpu/buffer_pool.h): size classes, reuse within a
// class, the limit (eviction of the oldest, blocks over the limit freed), no pool by default,
// and the CPU backend's buffers going through it.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/buffer_pool.h"

using namespace infoflow;
using cpu::BufferPool;

namespace {
constexpr size_t KiB = 1024;
}

TEST_CASE("buffer pool size classes: at least the size asked, at most a quarter more") {
    CHECK(BufferPool::class_bytes(1) == 64);
    CHECK(BufferPool::class_bytes(1000) == 1024);
    CHECK(BufferPool::class_bytes(64 * KiB) == 64 * KiB);
    CHECK(BufferPool::class_bytes(64 * KiB + 1) == 80 * KiB);
    CHECK(BufferPool::class_bytes(100 * KiB) == 112 * KiB);
    CHECK(BufferPool::class_bytes(1300000) == 1280 * KiB);
    for (size_t b = 64 * KiB; b < 64 * KiB * KiB; b = b * 9 / 8 + 7) {
        const size_t c = BufferPool::class_bytes(b);
        REQUIRE(c >= b);
        REQUIRE(double(c) <= 1.25 * double(b) + 64);
        REQUIRE(c % 64 == 0);
        REQUIRE(BufferPool::class_bytes(c) == c);  // a class is its own class
    }
}

TEST_CASE("buffer pool: no limit keeps nothing") {
    BufferPool pool;
    void* a = pool.take(200 * KiB);
    REQUIRE(a != nullptr);
    std::memset(a, 1, 200 * KiB);
    pool.give(a);
    CHECK(pool.held_bytes() == 0);
    void* b = pool.take(200 * KiB);
    pool.give(b);
    CHECK(pool.reused() == 0);
}

TEST_CASE("buffer pool: a freed block serves the next request of its class, newest first") {
    BufferPool pool;
    pool.set_limit(1 << 20);
    void* a = pool.take(100 * KiB);  // class 112 KiB
    void* b = pool.take(110 * KiB);  // the same class
    REQUIRE(a != b);
    pool.give(a);
    pool.give(b);
    CHECK(pool.held_bytes() == 224 * KiB);
    CHECK(pool.take(105 * KiB) == b);
    CHECK(pool.take(112 * KiB) == a);
    CHECK(pool.reused() == 2);
    CHECK(pool.held_bytes() == 0);
    void* c = pool.take(90 * KiB);  // another class (96 KiB): a new block
    CHECK((c != a && c != b));
    CHECK(pool.reused() == 2);
    for (void* p : {a, b, c}) pool.give(p);
    // Small blocks are never held.
    void* s = pool.take(1000);
    pool.give(s);
    CHECK(pool.held_bytes() == (224 + 96) * KiB);
}

TEST_CASE("buffer pool: the limit evicts the oldest blocks, a block over it is freed") {
    BufferPool pool;
    pool.set_limit(300 * KiB);
    std::vector<void*> p;
    for (int i = 0; i < 3; ++i) p.push_back(pool.take(112 * KiB));
    for (void* q : p) pool.give(q);  // the third evicts the first
    CHECK(pool.held_bytes() == 224 * KiB);
    void* x = pool.take(112 * KiB);
    void* y = pool.take(112 * KiB);
    CHECK(x == p[2]);
    CHECK(y == p[1]);
    void* z = pool.take(112 * KiB);  // nothing left of the class: new (p[0] was freed)
    CHECK(pool.reused() == 2);
    void* big = pool.take(512 * KiB);
    pool.give(big);  // over the limit by itself
    CHECK(pool.held_bytes() == 0);
    for (void* q : {x, y, z}) pool.give(q);
    CHECK(pool.held_bytes() == 224 * KiB);
    pool.set_limit(128 * KiB);  // lowering it frees the oldest at once
    CHECK(pool.held_bytes() == 112 * KiB);
    pool.set_limit(0);
    CHECK(pool.held_bytes() == 0);
    void* w = pool.take(112 * KiB);  // taken with a pool, given back without one: freed
    pool.give(w);
    CHECK(pool.held_bytes() == 0);
}

TEST_CASE("buffer pool: a block taken before the pool existed is freed, not held") {
    BufferPool pool;
    void* a = pool.take(200 * KiB);  // untracked: its size is not a class
    pool.set_limit(1 << 20);
    pool.give(a);
    CHECK(pool.held_bytes() == 0);
}

TEST_CASE("CPU backend buffers go through its pool once one is set") {
    std::unique_ptr<Backend> be = make_cpu_backend(1);
    CHECK(be->buffer_pool().limit == 0);
    be->set_buffer_pool(8 << 20);
    const void* first = nullptr;
    {
        Buffer b = be->alloc(300 * KiB);
        first = b.data();
        std::memset(b.data(), 7, b.bytes());
    }
    CHECK(be->buffer_pool().held == BufferPool::class_bytes(300 * KiB));
    Buffer again = be->alloc(290 * KiB);  // the same class
    CHECK(static_cast<const void*>(again.data()) == first);
    CHECK(again.bytes() == 290 * KiB);
    CHECK(be->buffer_pool().reused == 1);
    CHECK(be->buffer_pool().held == 0);
    CHECK(reinterpret_cast<uintptr_t>(again.data()) % 64 == 0);
}

TEST_CASE("buffer pool: blocks unused for longer than the age given are freed") {
    BufferPool pool;
    pool.set_limit(1 << 20);
    void* a = pool.take(112 * KiB);
    pool.give(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    void* b = pool.take(200 * KiB);
    pool.give(b);
    pool.release_idle(std::chrono::milliseconds(10));  // a is older than that, b is not
    CHECK(pool.held_bytes() == BufferPool::class_bytes(200 * KiB));
    CHECK(pool.take(200 * KiB) == b);
    pool.give(b);
    pool.release_idle(std::chrono::milliseconds(0));
    CHECK(pool.held_bytes() == 0);
}
