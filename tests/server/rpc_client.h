// What the server tests share: a client of a node on the test's thread (its
// event loop is the thread's), and envelopes of the reference model's KV.
#pragma once

#include <capnp/rpc-twoparty.h>
#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <memory>
#include <string>
#include <vector>

#include "reference_kv.h"
#include "wire/envelope.h"
#include "wire/node.capnp.h"

namespace kdn::server::testing_support {

using wire::node::ErrorCode;
using wire::node::KdnNode;
using wire::node::Session;

// The test thread's event loop (one per thread), shared by its clients.
inline kj::AsyncIoContext& ThreadIo() {
  static thread_local kj::AsyncIoContext io = kj::setupAsyncIo();
  return io;
}

// A client on the test's thread.
struct Client {
  explicit Client(const std::string& address)
      : io(ThreadIo()),
        stream(io.provider->getNetwork().parseAddress(address).wait(io.waitScope)->connect().wait(io.waitScope)),
        rpc(kj::heap<capnp::TwoPartyClient>(*stream)),
        node(rpc->bootstrap().castAs<KdnNode>()) {}

  // A session, or null with the error's code.
  kj::Maybe<Session::Client> Login(const std::string& token, ErrorCode* code = nullptr) {
    auto req = node.loginRequest();
    req.setToken(token);
    auto r = req.send().wait(io.waitScope);
    if (code) *code = r.getError().getCode();
    if (r.getError().getCode() != ErrorCode::OK) return nullptr;
    return r.getSession();
  }
  Session::Client MustLogin(const std::string& token) {
    ErrorCode code;
    auto s = Login(token, &code);
    EXPECT_EQ(code, ErrorCode::OK);
    return KJ_ASSERT_NONNULL(s);
  }

  kj::AsyncIoContext& io;
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyClient> rpc;
  KdnNode::Client node;
};

inline capnp::Data::Reader AsData(const keys::Digest& d) { return {d.data(), d.size()}; }

// One chunk of real KV as an envelope: tokens [begin, begin + n) of `r`.
struct Envelope {
  keys::Digest key;
  chunk::Bytes bytes;
};
inline Envelope MakeEnvelope(const testing::ReferenceKv& r, const std::string& ns, std::uint32_t begin, std::uint32_t n,
                      const keys::Digest& prev = {}) {
  EXPECT_LE(begin + n, r.tokens.size()) << "a slice past the text's end";
  keys::ChunkKeyer keyer(0, ns, r.m.fingerprint);
  const keys::Digest key =
      keyer.Key(prev, std::span<const std::int32_t>(reinterpret_cast<const std::int32_t*>(r.tokens.data()) + begin, n));
  auto c = std::make_shared<chunk::Chunk>();
  c->meta.key = key;
  c->meta.model = r.m.fingerprint;
  c->meta.ns_hash = keys::NamespaceHash(ns);
  c->meta.dtype = 0;
  c->meta.layers = 5;
  c->meta.kv_heads = 4;
  c->meta.head_dim = 8;
  c->meta.tokens = n;
  c->meta.first_position = begin;
  // Canonical bytes of the slice: per layer and k|v, tokens [begin, begin + n).
  const size_t T = r.tokens.size(), row = 32;
  std::vector<float> slice;
  for (size_t lk = 0; lk < 10; ++lk) {
    slice.insert(slice.end(), r.canonical.begin() + static_cast<std::ptrdiff_t>((lk * T + begin) * row),
                 r.canonical.begin() + static_cast<std::ptrdiff_t>((lk * T + begin + n) * row));
  }
  c->payload = chunk::Payload(reinterpret_cast<const std::uint8_t*>(slice.data()), slice.size() * 4);
  auto bytes = wire::EncodeEnvelope(*c);
  EXPECT_TRUE(bytes.ok());
  return {key, std::move(bytes).value()};
}


}  // namespace kdn::server::testing_support
