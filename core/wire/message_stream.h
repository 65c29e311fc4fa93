// SPDX-License-Identifier: Apache-2.0
// How kdnd's RPC (wire/node.capnp) moves its messages over a byte stream, so
// that a chunk crosses each end without a copy of its own: Cap'n Proto's
// standard framing (a segment table, then the segments), read and written
// with two differences from capnp::AsyncIoMessageStream.
//
// - Reading: each message is read into one buffer of the chunk payloads'
//   allocator (chunk::Payload: pages of their own, huge pages from 4 MiB),
//   not malloc's heap, where a message larger than glibc's mmap threshold
//   (32 MiB: a chunk of an 8B model) was mapped afresh and faulted in 4 KiB
//   at a time for every message. While the message lives, OwnerOf() hands out
//   that buffer, so a reader can keep an envelope's payload where it arrived
//   (wire::DecodeEnvelope with an owner) instead of copying it out.
// - Writing: a writer that puts memory of its own into a message
//   (capnp::Orphanage::referenceExternalData: a stored envelope, an encoded
//   one) asks the stream to Hold() its owner; the stream keeps it until the
//   message whose segment starts there has been written (or the stream is
//   gone), which is exactly as long as Cap'n Proto reads it.
//
// The checks are Cap'n Proto's own: at most 512 segments, and no more words
// than ReaderOptions::traversalLimitInWords (refused before anything is
// allocated); a stream that ends inside a message is DISCONNECTED. No file
// descriptors travel (kdnd's connections carry none).
// Thread-safety: a stream and its Buffers belong to the event loop thread
// that reads and writes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include <capnp/serialize-async.h>
#include <kj/async-io.h>
#include <kj/timer.h>
#include <kj/vector.h>

namespace kdn::wire {

// What the stream shares with the code that builds and reads its messages
// (the connection's calls): it may outlive the stream (a capability kept
// after its connection closed), and then holds and finds nothing.
class StreamBuffers {
 public:
  // At most `max_held_bytes` held at once (CanHold): a writer that finds no
  // room copies into its message instead, or (a server's replies) holds
  // anyway: the stream reads no further message while the held bytes are
  // at the bound (a peer that does not read what it asked for stops being
  // read), until writes take them.
  explicit StreamBuffers(std::uint64_t max_held_bytes = std::uint64_t{1} << 30) : max_held_bytes_(max_held_bytes) {}
  // Whether `bytes` more may be held now, beside `pending` a writer is about
  // to hold for the same message.
  bool CanHold(std::uint64_t bytes, std::uint64_t pending = 0) const {
    return held_bytes_ + pending + bytes <= max_held_bytes_;
  }
  // Keeps `owner` (`bytes` of memory) until a message with a segment
  // starting at `segment` has been written, or the stream is destroyed.
  void Hold(const void* segment, std::shared_ptr<const void> owner, std::uint64_t bytes = 0);
  // The buffer of a received message holding [p, p + n), while that message
  // lives; null when [p, p + n) is in none.
  std::shared_ptr<void> OwnerOf(const void* p, size_t n) const;
  // Holds not yet written (a stream that was destroyed dropped its own),
  // and the bytes they keep: a writer bounds what it holds per connection
  // (a message the RPC system never writes, a call cancelled, say, keeps
  // its holds until the connection goes).
  // The largest message (in bytes) the stream reads until Authenticated()
  // (0: no limit of its own, only ReaderOptions'): a server's connection
  // takes no large message from a client that has not logged in.
  void SetPreAuthLimit(std::uint64_t bytes) { pre_auth_limit_bytes_ = bytes; }
  // Resolves once fewer than max_held_bytes are held (at once when so).
  kj::Promise<void> WhenRoom();
  void Authenticated() { authenticated_ = true; }
  bool authenticated() const { return authenticated_; }
  // Who closes the connection (its owner, a server) when a bound says so:
  // the stream (a message too large before a login, one that stopped
  // halfway) or a call (too many failed logins) calls Drop().
  void SetDropper(std::function<void()> dropper) { dropper_ = std::move(dropper); }
  void Drop() {
    if (dropper_) std::exchange(dropper_, nullptr)();
  }
  size_t holds() const { return holds_.size(); }
  std::uint64_t held_bytes() const { return held_bytes_; }
  size_t received() const { return received_.size(); }

 private:
  friend class BulkMessageStream;
  friend class BulkMessageStreamAccess;
  struct Received {
    size_t bytes;
    std::weak_ptr<void> owner;
  };
  struct Held {
    std::shared_ptr<const void> owner;
    std::uint64_t bytes;
  };
  std::multimap<const void*, Held> holds_;
  std::uint64_t held_bytes_ = 0;
  const std::uint64_t max_held_bytes_;
  std::map<const std::uint8_t*, Received> received_;  // by the buffer's start
  std::uint64_t pre_auth_limit_bytes_ = 0;
  bool authenticated_ = false;
  std::function<void()> dropper_;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> room_waiters_;
  void WakeIfRoom();
};

class BulkMessageStream final : public capnp::MessageStream {
 public:
  // With `timer`, a message whose first bytes arrived must arrive whole
  // within `message_timeout_ms`, or the read fails (DISCONNECTED): a peer
  // that stops halfway does not hold the connection.
  BulkMessageStream(kj::AsyncIoStream& stream, std::shared_ptr<StreamBuffers> buffers, kj::Timer* timer = nullptr,
                    std::uint32_t message_timeout_ms = 0);
  ~BulkMessageStream();
  using capnp::MessageStream::tryReadMessage;
  using capnp::MessageStream::writeMessage;
  using capnp::MessageStream::writeMessages;

  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(kj::ArrayPtr<kj::AutoCloseFd> fdSpace,
                                                                    capnp::ReaderOptions options,
                                                                    kj::ArrayPtr<capnp::word> scratchSpace) override;
  kj::Promise<void> writeMessage(kj::ArrayPtr<const int> fds,
                                 kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

  const std::shared_ptr<StreamBuffers>& buffers() const { return buffers_; }

 private:
  // The holds of a message's segments, taken out of the registry.
  kj::Array<std::shared_ptr<const void>> TakeHolds(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

  // The rest of a message that began: bounded by the message timeout.
  kj::Promise<size_t> ReadRest(void* buffer, size_t bytes);

  kj::AsyncIoStream& stream_;
  capnp::AsyncIoMessageStream writer_;
  std::shared_ptr<StreamBuffers> buffers_;
  kj::Timer* timer_ = nullptr;
  std::uint32_t message_timeout_ms_ = 0;
};

}  // namespace kdn::wire
