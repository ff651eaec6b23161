#pragma once
// A test suite over the trained pycoder-moe of ../shared/models/pycoder-moe: the model loaded
// once for the suite, its transformers references and its held-out routing traces; each test
// skips with a message where the shared data is absent.
#include <gtest/gtest.h>

#include <string>

#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"

namespace ms::test {

class PycoderSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = shared_path("models/pycoder-moe");
    if (dir.empty()) return;
    model_ = load_model(dir).release();
    ref_ = new TensorStore(TensorStore::open(dir + "/reference.safetensors"));
    routes_ = new TensorStore(TensorStore::open(dir + "/routes.safetensors"));
  }
  static void TearDownTestSuite() {  // the next suite of the binary loads its own
    delete model_;
    delete ref_;
    delete routes_;
    model_ = nullptr, ref_ = nullptr, routes_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "models/pycoder-moe not found: set MOESTREAM_SHARED to the shared/ folder";
  }
  static inline Model* model_ = nullptr;
  static inline TensorStore* ref_ = nullptr;     // reference.safetensors
  static inline TensorStore* routes_ = nullptr;  // routes.safetensors
};

}  // namespace ms::test
