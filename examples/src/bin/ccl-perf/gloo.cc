// ccl-perf --backend gloo: a C interface to Gloo's all-reduce algorithms
// for gloo.rs. Every function catches Gloo's exceptions and returns a
// message instead (errors are values on the Rust side).

#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

void say(char* err, size_t len, const char* what) {
  if (err != nullptr && len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
}

}  // namespace

struct CclGlooCtx {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
};

struct CclGlooAlgo {
  std::unique_ptr<gloo::Algorithm> algo;
};

extern "C" {

// Connects `size` ranks through the file store in directory `store` (which
// must exist on every rank), each listening on `host`; null on error.
CclGlooCtx* ccl_gloo_connect(int rank, int size, const char* store, const char* host, int timeout_ms, char* err,
                             size_t len) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::milliseconds(timeout_ms));
    gloo::rendezvous::FileStore fs(store);
    ctx->connectFullMesh(fs, dev);
    return new CclGlooCtx{ctx};
  } catch (const std::exception& e) {
    say(err, len, e.what());
  }
  return nullptr;
}

void ccl_gloo_close(CclGlooCtx* c) { delete c; }

// A sum all-reduce of `count` floats at `buf`, in place: algorithm 0 ring
// chunked, 1 halving-doubling, 2 ring, 3 bcube. Null on error.
CclGlooAlgo* ccl_gloo_all_reduce_new(CclGlooCtx* c, float* buf, int count, int which, char* err, size_t len) {
  try {
    std::vector<float*> ptrs{buf};
    std::unique_ptr<gloo::Algorithm> a;
    switch (which) {
      case 0: a.reset(new gloo::AllreduceRingChunked<float>(c->ctx, ptrs, count)); break;
      case 1: a.reset(new gloo::AllreduceHalvingDoubling<float>(c->ctx, ptrs, count)); break;
      case 2: a.reset(new gloo::AllreduceRing<float>(c->ctx, ptrs, count)); break;
      case 3: a.reset(new gloo::AllreduceBcube<float>(c->ctx, ptrs, count)); break;
      default: say(err, len, "unknown algorithm"); return nullptr;
    }
    return new CclGlooAlgo{std::move(a)};
  } catch (const std::exception& e) {
    say(err, len, e.what());
  }
  return nullptr;
}

// Runs one all-reduce; 0, or -1 with a message.
int ccl_gloo_run(CclGlooAlgo* a, char* err, size_t len) {
  try {
    a->algo->run();
    return 0;
  } catch (const std::exception& e) {
    say(err, len, e.what());
  }
  return -1;
}

void ccl_gloo_all_reduce_free(CclGlooAlgo* a) { delete a; }

// The largest of every rank's `v` (`max` 1) or their sum (`max` 0), in
// place; 0, or -1 with a message.
int ccl_gloo_fold(CclGlooCtx* c, double* v, int max, char* err, size_t len) {
  try {
    auto fn = max ? gloo::ReductionFunction<double>::max : gloo::ReductionFunction<double>::sum;
    gloo::AllreduceRing<double>(c->ctx, std::vector<double*>{v}, 1, fn).run();
    return 0;
  } catch (const std::exception& e) {
    say(err, len, e.what());
  }
  return -1;
}

// Waits for every rank; 0, or -1 with a message.
int ccl_gloo_barrier(CclGlooCtx* c, char* err, size_t len) {
  try {
    gloo::BarrierAllToAll(c->ctx).run();
    return 0;
  } catch (const std::exception& e) {
    say(err, len, e.what());
  }
  return -1;
}

}  // extern "C"
