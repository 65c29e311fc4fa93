// SPDX-License-Identifier: Apache-2.0
// BulkMessageStream (core/wire/message_stream.h) over a kj pipe: it reads
// what Cap'n Proto's own stream writes (and the reverse), keeps received
// buffers findable while their message lives, holds external segments until
// written, and refuses what Cap'n Proto refuses.
#include "core/wire/message_stream.h"

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/serialize-async.h>
#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/wire/chunk.capnp.h"

namespace kdn::wire {
namespace {

// A message whose root is a ChunkEnvelope with `n` payload bytes in one
// piece, filled with a pattern of `seed`; segments of `first_words` words.
std::unique_ptr<capnp::MallocMessageBuilder> Message(size_t n, std::uint8_t seed, unsigned first_words = 1024) {
  auto m = std::make_unique<capnp::MallocMessageBuilder>(first_words, capnp::AllocationStrategy::FIXED_SIZE);
  auto e = m->initRoot<schema::ChunkEnvelope>();
  e.setVersionMajor(1);
  auto piece = e.initPayload(1).init(0, static_cast<unsigned>(n));
  for (size_t i = 0; i < n; ++i) piece[i] = static_cast<std::uint8_t>(seed + i * 13);
  return m;
}

bool HasPattern(capnp::Data::Reader d, size_t n, std::uint8_t seed) {
  if (d.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    if (d[i] != static_cast<std::uint8_t>(seed + i * 13)) return false;
  }
  return true;
}

struct Pipe {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  std::shared_ptr<StreamBuffers> buffers = std::make_shared<StreamBuffers>();
  BulkMessageStream bulk{*pipe.ends[0], buffers};
  capnp::AsyncIoMessageStream plain_stream{*pipe.ends[1]};
  capnp::MessageStream& plain = plain_stream;  // Cap'n Proto's own framing
};

TEST(BulkMessageStream, ReadsWhatCapnProtoWritesAndKeepsItsBufferFindableWhileTheMessageLives) {
  Pipe p;
  // One segment, many segments (a small first segment grows by fixed
  // steps), and a message of 6 MiB (a buffer of huge pages).
  struct Case {
    size_t bytes;
    unsigned first_words;
  };
  for (const Case c : {Case{100, 1024}, Case{50000, 64}, Case{6 << 20, 1024}}) {
    auto m = Message(c.bytes, static_cast<std::uint8_t>(c.bytes));
    const size_t segments = m->getSegmentsForOutput().size();
    auto write = p.plain.writeMessage(*m);
    auto read = p.bulk.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr).wait(p.io.waitScope);
    write.wait(p.io.waitScope);
    auto& got = KJ_ASSERT_NONNULL(read);
    auto piece = got.reader->getRoot<schema::ChunkEnvelope>().getPayload()[0];
    EXPECT_TRUE(HasPattern(piece, c.bytes, static_cast<std::uint8_t>(c.bytes))) << c.bytes;
    EXPECT_GE(segments, c.first_words == 64 ? 2u : 1u);
    std::shared_ptr<void> owner = p.buffers->OwnerOf(piece.begin(), piece.size());
    ASSERT_NE(owner, nullptr) << c.bytes;
    EXPECT_EQ(p.buffers->OwnerOf(piece.begin(), piece.size() + (std::size_t{1} << 30)), nullptr);  // past its end
    EXPECT_EQ(p.buffers->received(), 1u);
    got.reader = nullptr;
    EXPECT_EQ(p.buffers->received(), 0u);
    EXPECT_EQ(p.buffers->OwnerOf(piece.begin(), piece.size()), nullptr);
    // The bytes stay with whoever took the owner.
    EXPECT_TRUE(HasPattern(piece, c.bytes, static_cast<std::uint8_t>(c.bytes)));
  }
}

TEST(BulkMessageStream, AnExternalSegmentIsHeldUntilItsMessageIsWritten) {
  Pipe p;
  const size_t n = 3 << 20;
  auto data = std::make_shared<std::vector<capnp::word>>(n / sizeof(capnp::word));
  auto* bytes = reinterpret_cast<std::uint8_t*>(data->data());
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 7 + 1);
  std::weak_ptr<std::vector<capnp::word>> alive = data;

  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<schema::ChunkEnvelope>();
  auto pieces = e.initPayload(1);
  pieces.adopt(0, capnp::Orphanage::getForMessageContaining(e).referenceExternalData(capnp::Data::Reader(bytes, n)));
  p.buffers->Hold(bytes, data);
  p.buffers->Hold(bytes + 8, std::make_shared<int>(0));  // a segment no message starts at: kept
  data = nullptr;
  EXPECT_EQ(p.buffers->holds(), 2u);

  auto write = p.bulk.writeMessage(m);
  EXPECT_FALSE(alive.expired());  // taken by the write, not released
  EXPECT_EQ(p.buffers->holds(), 1u);
  auto read = p.plain.readMessage().wait(p.io.waitScope);  // the other end takes every byte
  write.wait(p.io.waitScope);
  EXPECT_EQ(p.buffers->holds(), 1u);
  EXPECT_TRUE(alive.expired());  // released once written
  capnp::Data::Reader got = read->getRoot<schema::ChunkEnvelope>().getPayload()[0];
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(got[i], static_cast<std::uint8_t>(i * 7 + 1)) << i;
}

TEST(BulkMessageStream, WhatIsHeldIsBoundedAndFreedAsMessagesAreWritten) {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  auto buffers = std::make_shared<StreamBuffers>(64 << 10);
  BulkMessageStream bulk(*pipe.ends[0], buffers);
  capnp::AsyncIoMessageStream plain_stream(*pipe.ends[1]);
  capnp::MessageStream& plain = plain_stream;
  std::vector<std::shared_ptr<std::vector<capnp::word>>> blocks;
  capnp::MallocMessageBuilder m;
  auto pieces = m.initRoot<schema::ChunkEnvelope>().initPayload(4);
  for (unsigned i = 0; i < 4; ++i) {
    auto block = std::make_shared<std::vector<capnp::word>>(2048);  // 16 KiB
    ASSERT_TRUE(buffers->CanHold(16 << 10));
    pieces.adopt(i, capnp::Orphanage::getForMessageContaining(pieces)
                        .referenceExternalData(capnp::Data::Reader(reinterpret_cast<const std::uint8_t*>(block->data()), 16 << 10)));
    buffers->Hold(block->data(), block, 16 << 10);
    blocks.push_back(std::move(block));
  }
  EXPECT_EQ(buffers->held_bytes(), std::uint64_t{64} << 10);
  EXPECT_FALSE(buffers->CanHold(8));  // full
  EXPECT_TRUE(buffers->CanHold(0));
  auto write = bulk.writeMessage(m);
  auto read = plain.readMessage().wait(io.waitScope);
  write.wait(io.waitScope);
  EXPECT_EQ(buffers->held_bytes(), 0u);
  EXPECT_TRUE(buffers->CanHold(64 << 10));
  EXPECT_FALSE(buffers->CanHold(48 << 10, 32 << 10));  // with what a writer is about to hold
}

TEST(BulkMessageStream, HoldsOfAStreamThatGoesAreReleased) {
  auto p = std::make_unique<Pipe>();
  auto owner = std::make_shared<int>(7);
  std::weak_ptr<int> alive = owner;
  std::shared_ptr<StreamBuffers> buffers = p->buffers;
  buffers->Hold(owner.get(), std::move(owner));
  p.reset();
  EXPECT_TRUE(alive.expired());
  EXPECT_EQ(buffers->holds(), 0u);
}

TEST(BulkMessageStream, RefusesWhatCapnProtoRefusesAndReportsTheEnds) {
  // A clean end between messages: none.
  {
    Pipe p;
    p.pipe.ends[1]->shutdownWrite();
    auto r = p.bulk.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr).wait(p.io.waitScope);
    EXPECT_TRUE(r == nullptr);
  }
  struct Case {
    const char* what;
    std::vector<std::uint32_t> words;  // written as they are, then the end
    kj::Exception::Type type;
  };
  const Case cases[] = {
      {"an end inside the table", {0}, kj::Exception::Type::DISCONNECTED},
      {"an end inside the body", {0, 4, 1, 2}, kj::Exception::Type::DISCONNECTED},
      {"an end inside the rest of the table", {2, 1}, kj::Exception::Type::DISCONNECTED},
      {"513 segments", {512, 1}, kj::Exception::Type::FAILED},
      {"more words than the limit", {0, 1u << 30}, kj::Exception::Type::FAILED},
  };
  for (const Case& c : cases) {
    Pipe p;
    p.pipe.ends[1]->write(c.words.data(), c.words.size() * 4).wait(p.io.waitScope);
    p.pipe.ends[1]->shutdownWrite();
    capnp::ReaderOptions o;
    o.traversalLimitInWords = 1 << 20;
    auto r = p.bulk.tryReadMessage(nullptr, o, nullptr);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { r.wait(p.io.waitScope); })) {
      EXPECT_EQ(e->getType(), c.type) << c.what << ": " << e->getDescription().cStr();
    } else {
      ADD_FAILURE() << c.what << ": read";
    }
    EXPECT_EQ(p.buffers->received(), 0u) << c.what;
  }
}

}  // namespace
}  // namespace kdn::wire
