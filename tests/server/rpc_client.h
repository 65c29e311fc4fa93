// SPDX-License-Identifier: Apache-2.0
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
#include "core/wire/envelope.h"
#include "core/wire/node.capnp.h"

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

// ---- Knowledge items (protocol version 2) ----

// A document as a test registers it, and as a list reports it.
struct TestDoc {
  std::string doc_id;
  std::uint64_t version = 1;
  std::string metadata;
  std::uint64_t tokens = 0;
  keys::Digest model{};
  std::vector<keys::Digest> keys;
};
struct ListedDoc {
  std::string doc_id;
  std::uint64_t version = 0;
  std::string metadata;
  std::uint64_t tokens = 0;
  std::vector<std::uint8_t> model;
  std::uint32_t chunks = 0, chunks_held = 0;
  bool pinned = false;
  std::uint64_t pin_expires_ms = 0, registered_ms = 0, hits = 0;
};

inline ErrorCode KnowledgePut(Client& c, Session::Client& s, const std::string& ns, const TestDoc& d) {
  auto req = s.knowledgePutRequest();
  const keys::Digest h = keys::NamespaceHash(ns);
  req.setNamespace(AsData(h));
  auto item = req.initItem();
  item.setDocId(d.doc_id);
  item.setVersion(d.version);
  item.setMetadata(d.metadata);
  item.setTokens(d.tokens);
  item.setModel(AsData(d.model));
  auto list = item.initKeys(static_cast<unsigned>(d.keys.size()));
  for (unsigned i = 0; i < d.keys.size(); ++i) list.set(i, AsData(d.keys[i]));
  return req.send().wait(c.io.waitScope).getError().getCode();
}

// The namespace's documents (empty on an error).
inline ErrorCode KnowledgeList(Client& c, Session::Client& s, const std::string& ns, std::vector<ListedDoc>* out) {
  auto req = s.knowledgeListRequest();
  const keys::Digest h = keys::NamespaceHash(ns);
  req.setNamespace(AsData(h));
  auto r = req.send().wait(c.io.waitScope);
  out->clear();
  for (auto i : r.getItems()) {
    ListedDoc d;
    d.doc_id = i.getDocId();
    d.version = i.getVersion();
    d.metadata = i.getMetadata();
    d.tokens = i.getTokens();
    d.model.assign(i.getModel().begin(), i.getModel().end());
    d.chunks = i.getChunks();
    d.chunks_held = i.getChunksHeld();
    d.pinned = i.getPinned();
    d.pin_expires_ms = i.getPinExpiresMs();
    d.registered_ms = i.getRegisteredMs();
    d.hits = i.getHits();
    out->push_back(std::move(d));
  }
  return r.getError().getCode();
}

inline ErrorCode KnowledgePin(Client& c, Session::Client& s, const std::string& ns, const keys::Digest& model,
                              const std::string& doc_id, bool pin, std::uint64_t ttl_ms, std::uint32_t* pinned = nullptr) {
  auto req = s.knowledgePinRequest();
  const keys::Digest h = keys::NamespaceHash(ns);
  req.setNamespace(AsData(h));
  req.setDocId(doc_id);
  req.setModel(AsData(model));
  req.setPin(pin);
  req.setTtlMs(ttl_ms);
  auto r = req.send().wait(c.io.waitScope);
  if (pinned) *pinned = r.getPinned();
  return r.getError().getCode();
}

inline ErrorCode KnowledgeDelete(Client& c, Session::Client& s, const std::string& ns, const keys::Digest& model,
                                 const std::string& doc_id, std::uint32_t* erased = nullptr) {
  auto req = s.knowledgeDeleteRequest();
  const keys::Digest h = keys::NamespaceHash(ns);
  req.setNamespace(AsData(h));
  req.setDocId(doc_id);
  req.setModel(AsData(model));
  auto r = req.send().wait(c.io.waitScope);
  if (erased) *erased = r.getErased();
  return r.getError().getCode();
}

}  // namespace kdn::server::testing_support
