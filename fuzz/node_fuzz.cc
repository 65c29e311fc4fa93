// SPDX-License-Identifier: Apache-2.0
// kdn_node_fuzz: a libFuzzer target for kdnd's handling of calls from
// untrusted clients (server/rpc.cc, server/service.cc): the parameters of every Session method,
// read from the input as a Cap'n Proto message, go through the node's own
// handlers (a local call on a session, as login makes it) against a real
// pass-through chain. Built with -DKDN_FUZZ=ON; run by fuzz/run.
//
// Input: byte 0 picks the method (% 11: lookup, get, put, delete, pin, unpin,
// stats, knowledgePut, knowledgeList, knowledgePin, knowledgeDelete), byte 1 the session's grant (% 3: one namespace, every namespace,
// statistics only); the rest, padded to whole words, is a message read as
// that method's parameters (traversal limit 1M words). Messages that Cap'n
// Proto itself refuses end there (the RPC layer answers those with an
// exception; that is capnp's to fuzz).
//
// The contract, for any input: no crash, no undefined behaviour, no leak, no
// uncaught exception from the handlers (every failure is a typed Error in
// the results), results sized as the request says when the call succeeds,
// and afterwards the node still stores and finds a valid chunk.
//
// KDN_FUZZ_WRITE_SEEDS=DIR kdn_node_fuzz writes valid calls of every method
// into DIR and exits (fuzz/run does this before each run).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/async-io.h>

#include "server/rpc.h"
#include "core/wire/envelope.h"

namespace {

using namespace kdn;
using wire::node::ErrorCode;
using wire::node::Session;

const char kNamespace[] = "tenant-a";

struct World {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  std::unique_ptr<server::NodeService> service;
  server::Grant one, all, stats_only;
  World() {
    server::NodeOptions o;
    store::TierSpec host;
    host.capacity_bytes = 16 << 20;
    o.tiers = {host};
    // Small registry bounds: the fuzzer reaches them, and memory stays bounded.
    o.knowledge.max_documents = 1000;
    o.knowledge.max_keys = 65536;
    service = std::move(server::NodeService::Create(o)).value();
    one.namespaces.insert(keys::NamespaceHash(kNamespace));
    all.all_namespaces = true;
    stats_only.stats = true;
  }
};

World& TheWorld() {
  static World* w = new World();  // lives for the process (libFuzzer never returns)
  return *w;
}

// A valid envelope of a small raw chunk of `ns`.
chunk::Bytes ValidEnvelope(const std::string& ns, std::uint8_t seed) {
  auto c = std::make_shared<chunk::Chunk>();
  c->meta.key[0] = seed;
  c->meta.key[1] = 0x5A;
  c->meta.ns_hash = keys::NamespaceHash(ns);
  c->meta.layers = 1;
  c->meta.kv_heads = 1;
  c->meta.head_dim = 4;
  c->meta.tokens = 2;
  std::vector<std::uint8_t> kv(1 * 2 * 2 * 1 * 4 * 4, seed);
  c->payload = chunk::Payload(kv.data(), kv.size());
  return std::move(wire::EncodeEnvelope(*c)).value();
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kdn_node_fuzz: contract violated: %s\n", what);
    std::abort();
  }
}

// Set while a call is in the handlers: an exception then is theirs (a
// contract violation), not Cap'n Proto's refusal of the message.
bool g_in_handler = false;

template <typename Req>
auto Send(Req& req, kj::WaitScope& ws) {
  g_in_handler = true;
  auto r = req.send().wait(ws);
  g_in_handler = false;
  return r;
}

template <typename Req, typename Params>
void CopyNamespaceAndKeys(Req& req, Params p) {
  req.setNamespace(p.getNamespace());
  req.setKeys(p.getKeys());
}

// Calls `method` with the message's parameters on a session of `grant`.
void Call(World& w, const server::Grant& grant, unsigned method, capnp::MessageReader& message) {
  Session::Client s = server::MakeSession(*w.service, w.io.provider->getTimer(), grant);
  auto& ws = w.io.waitScope;
  switch (method) {
    case 0: {
      auto p = message.getRoot<Session::LookupParams>();
      auto req = s.lookupRequest();
      req.setNamespace(p.getNamespace());
      req.setRequests(p.getRequests());
      auto r = Send(req, ws);
      if (r.getError().getCode() == ErrorCode::OK) Check(r.getResults().size() == p.getRequests().size(), "lookup results");
      break;
    }
    case 1: {
      auto p = message.getRoot<Session::GetParams>();
      auto req = s.getRequest();
      CopyNamespaceAndKeys(req, p);
      auto r = Send(req, ws);
      if (r.getError().getCode() == ErrorCode::OK) Check(r.getChunks().size() == p.getKeys().size(), "get results");
      for (auto c : r.getChunks()) {
        if (c.isEnvelope()) {
          auto d = c.getEnvelope();
          Check(wire::DecodeEnvelope(d.begin(), d.size(), nullptr).ok(), "a served envelope decodes");
        }
      }
      break;
    }
    case 2: {
      auto p = message.getRoot<Session::PutParams>();
      auto req = s.putRequest();
      req.setNamespace(p.getNamespace());
      req.setEnvelopes(p.getEnvelopes());
      auto r = Send(req, ws);
      if (r.getError().getCode() == ErrorCode::OK) Check(r.getResults().size() == p.getEnvelopes().size(), "put results");
      break;
    }
    case 3: {
      auto p = message.getRoot<Session::DeleteParams>();
      auto req = s.deleteRequest();
      CopyNamespaceAndKeys(req, p);
      Send(req, ws);
      break;
    }
    case 4: {
      auto p = message.getRoot<Session::PinParams>();
      auto req = s.pinRequest();
      CopyNamespaceAndKeys(req, p);
      req.setTtlMs(p.getTtlMs());
      Send(req, ws);
      break;
    }
    case 5: {
      auto p = message.getRoot<Session::UnpinParams>();
      auto req = s.unpinRequest();
      CopyNamespaceAndKeys(req, p);
      Send(req, ws);
      break;
    }
    case 6: {
      auto stats = s.statsRequest();
      auto r = Send(stats, ws);
      Check((r.getError().getCode() == ErrorCode::OK) == grant.stats, "stats follow the grant");
      break;
    }
    case 7: {
      auto p = message.getRoot<Session::KnowledgePutParams>();
      auto req = s.knowledgePutRequest();
      req.setNamespace(p.getNamespace());
      req.setItem(p.getItem());
      Send(req, ws);
      break;
    }
    case 8: {
      auto p = message.getRoot<Session::KnowledgeListParams>();
      auto req = s.knowledgeListRequest();
      req.setNamespace(p.getNamespace());
      auto r = Send(req, ws);
      if (r.getError().getCode() != ErrorCode::OK) Check(r.getItems().size() == 0, "a refused list lists nothing");
      for (auto i : r.getItems()) Check(i.getChunksHeld() <= i.getChunks(), "held chunks are chunks of the document");
      break;
    }
    case 9: {
      auto p = message.getRoot<Session::KnowledgePinParams>();
      auto req = s.knowledgePinRequest();
      req.setNamespace(p.getNamespace());
      req.setDocId(p.getDocId());
      req.setModel(p.getModel());
      req.setPin(p.getPin());
      req.setTtlMs(p.getTtlMs());
      Send(req, ws);
      break;
    }
    default: {
      auto p = message.getRoot<Session::KnowledgeDeleteParams>();
      auto req = s.knowledgeDeleteRequest();
      req.setNamespace(p.getNamespace());
      req.setDocId(p.getDocId());
      req.setModel(p.getModel());
      Send(req, ws);
      break;
    }
  }
}

// The node still stores and finds a valid chunk.
void StillServes(World& w) {
  Session::Client s = server::MakeSession(*w.service, w.io.provider->getTimer(), w.one);
  auto& ws = w.io.waitScope;
  const chunk::Bytes e = ValidEnvelope(kNamespace, 0xEE);
  const keys::Digest ns = keys::NamespaceHash(kNamespace);
  auto put = s.putRequest();
  put.setNamespace(capnp::Data::Reader(ns.data(), ns.size()));
  put.initEnvelopes(1).set(0, capnp::Data::Reader(e.data(), e.size()));
  auto pr = Send(put, ws);
  Check(pr.getError().getCode() == ErrorCode::OK && pr.getResults()[0].getCode() == ErrorCode::OK, "a valid put");
  keys::Digest key{};
  key[0] = 0xEE;
  key[1] = 0x5A;
  auto look = s.lookupRequest();
  look.setNamespace(capnp::Data::Reader(ns.data(), ns.size()));
  look.initRequests(1)[0].initKeys(1).set(0, capnp::Data::Reader(key.data(), key.size()));
  auto lr = Send(look, ws);
  Check(lr.getError().getCode() == ErrorCode::OK && lr.getResults()[0].getPrefix() == 1, "a valid lookup finds it");
}

void WriteSeed(const std::string& dir, int n, std::uint8_t method, std::uint8_t grant, capnp::MessageBuilder& b) {
  auto words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  std::ofstream f(dir + "/seed-" + std::to_string(n), std::ios::binary);
  f.put(static_cast<char>(method));
  f.put(static_cast<char>(grant));
  f.write(reinterpret_cast<const char*>(bytes.begin()), static_cast<std::streamsize>(bytes.size()));
}

void WriteSeeds(const std::string& dir) {
  const keys::Digest ns = keys::NamespaceHash(kNamespace);
  const capnp::Data::Reader nsd(ns.data(), ns.size());
  keys::Digest key{};
  key[1] = 0x5A;
  const capnp::Data::Reader kd(key.data(), key.size());
  int n = 0;
  for (std::uint8_t grant = 0; grant < 3; ++grant) {
    {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::LookupParams>();
      p.setNamespace(nsd);
      auto r = p.initRequests(2);
      r[0].initKeys(2).set(0, kd);
      r[0].getKeys().set(1, kd);
      r[0].setTokens(16);
      r[1].initKeys(1).set(0, kd);
      WriteSeed(dir, n++, 0, grant, b);
    }
    {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::GetParams>();
      p.setNamespace(nsd);
      p.initKeys(2).set(0, kd);
      p.getKeys().set(1, kd);
      WriteSeed(dir, n++, 1, grant, b);
    }
    for (std::uint8_t seed = 0; seed < 3; ++seed) {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::PutParams>();
      p.setNamespace(nsd);
      const chunk::Bytes e = ValidEnvelope(seed == 2 ? "tenant-b" : kNamespace, seed);
      p.initEnvelopes(1).set(0, capnp::Data::Reader(e.data(), e.size()));
      WriteSeed(dir, n++, 2, grant, b);
    }
    for (std::uint8_t method = 3; method <= 5; ++method) {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::PinParams>();  // delete, pin, unpin share the leading fields
      p.setNamespace(nsd);
      p.initKeys(1).set(0, kd);
      p.setTtlMs(1000);
      WriteSeed(dir, n++, method, grant, b);
    }
    {
      capnp::MallocMessageBuilder b;
      b.initRoot<Session::StatsParams>();
      WriteSeed(dir, n++, 6, grant, b);
    }
    keys::Digest model{};
    model[0] = 0x3C;
    const capnp::Data::Reader md(model.data(), model.size());
    {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::KnowledgePutParams>();
      p.setNamespace(nsd);
      auto item = p.initItem();
      item.setDocId("doc-1");
      item.setVersion(1);
      item.setMetadata("{}");
      item.setTokens(2);
      item.setModel(md);
      item.initKeys(2).set(0, kd);
      item.getKeys().set(1, kd);
      WriteSeed(dir, n++, 7, grant, b);
    }
    {
      capnp::MallocMessageBuilder b;
      b.initRoot<Session::KnowledgeListParams>().setNamespace(nsd);
      WriteSeed(dir, n++, 8, grant, b);
    }
    {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::KnowledgePinParams>();
      p.setNamespace(nsd);
      p.setDocId("doc-1");
      p.setModel(md);
      p.setPin(true);
      p.setTtlMs(1000);
      WriteSeed(dir, n++, 9, grant, b);
    }
    {
      capnp::MallocMessageBuilder b;
      auto p = b.initRoot<Session::KnowledgeDeleteParams>();
      p.setNamespace(nsd);
      p.setDocId("doc-1");
      p.setModel(md);
      WriteSeed(dir, n++, 10, grant, b);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("KDN_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  if (size < 2) return 0;
  World& w = TheWorld();
  const unsigned method = data[0] % 11;
  const server::Grant& grant = data[1] % 3 == 0 ? w.one : data[1] % 3 == 1 ? w.all : w.stats_only;
  std::vector<capnp::word> words((size - 2 + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  if (!words.empty()) std::memcpy(words.data(), data + 2, size - 2);
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::ReaderOptions o;
    o.traversalLimitInWords = 1 << 20;
    o.nestingLimit = 16;
    capnp::FlatArrayMessageReader message(kj::ArrayPtr<const capnp::word>(words.data(), words.size()), o);
    // A message Cap'n Proto refuses (framing, bounds) throws while being
    // read: that is where this input ends. The handlers themselves never
    // throw: their failures are typed errors, checked above.
    Call(w, grant, method, message);
  });
  KJ_IF_MAYBE(e, failure) {
    if (g_in_handler) std::fprintf(stderr, "%s\n", e->getDescription().cStr());
    Check(!g_in_handler, "a handler threw instead of returning a typed error");
  }
  StillServes(w);
  return 0;
}
