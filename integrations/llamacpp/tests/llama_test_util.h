// SPDX-License-Identifier: Apache-2.0
// What the llama.cpp tests share: a session on the reference model's GGUF.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "llama_session.h"

namespace kdn::llamacpp {

// A session over the GGUF the build made (or `gguf`: KDN_GGUF_SWA_PATH, its
// sliding-window variant), null (and a test failure) if it does not load.
inline std::unique_ptr<Session> OpenReference(bool flash_attn, bool f16, const char* gguf = KDN_GGUF_PATH) {
  SessionOptions o;
  o.gguf = gguf;
  o.backend_dir = KDN_LLAMACPP_LIBDIR;
  o.flash_attn = flash_attn;
  o.f16_cache = f16;
  auto s = Session::Load(o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

}  // namespace kdn::llamacpp
