// SPDX-License-Identifier: Apache-2.0
#include "core/wire/message_stream.h"

#include <cstring>
#include <utility>
#include <vector>

#include <kj/debug.h>

#include "core/chunk/chunk.h"

namespace kdn::wire {

namespace {

// Cap'n Proto's own limit on segments (serialize.c++).
constexpr std::uint32_t kMaxSegments = 512;

// What a reader owns, constructed before the reader that points into it.
struct ReaderParts {
  kj::Array<kj::ArrayPtr<const capnp::word>> segments;
  std::shared_ptr<void> buffer;
  std::shared_ptr<StreamBuffers> buffers;
};

class OwnedMessageReader final : private ReaderParts, public capnp::SegmentArrayMessageReader {
 public:
  OwnedMessageReader(ReaderParts parts, capnp::ReaderOptions options)
      : ReaderParts(std::move(parts)), capnp::SegmentArrayMessageReader(ReaderParts::segments, options) {}
  ~OwnedMessageReader() override;
};

// The table after its first word, and the sizes it gives.
struct ReadState {
  std::uint32_t first[2] = {0, 0};
  kj::Array<std::uint32_t> rest;
  std::uint64_t words = 0;
  std::shared_ptr<void> buffer;
  std::uint8_t* data = nullptr;
};

}  // namespace

// Friends of StreamBuffers' registry.
class BulkMessageStreamAccess {
 public:
  static void Register(StreamBuffers& b, const std::uint8_t* start, size_t bytes, const std::shared_ptr<void>& owner) {
    b.received_[start] = StreamBuffers::Received{bytes, owner};
  }
  static void Unregister(StreamBuffers& b, const std::uint8_t* start, const std::shared_ptr<void>& owner) {
    auto it = b.received_.find(start);
    if (it == b.received_.end()) return;
    const std::weak_ptr<void>& w = it->second.owner;
    if (!w.owner_before(owner) && !owner.owner_before(w)) b.received_.erase(it);
  }
};

namespace {

OwnedMessageReader::~OwnedMessageReader() {
  if (buffers && buffer) BulkMessageStreamAccess::Unregister(*buffers, static_cast<const std::uint8_t*>(buffer.get()), buffer);
}

}  // namespace

kj::Promise<void> StreamBuffers::WhenRoom() {
  if (held_bytes_ < max_held_bytes_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  room_waiters_.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void StreamBuffers::WakeIfRoom() {
  if (held_bytes_ >= max_held_bytes_ || room_waiters_.empty()) return;
  auto waiters = kj::mv(room_waiters_);
  room_waiters_ = kj::Vector<kj::Own<kj::PromiseFulfiller<void>>>();
  for (auto& w : waiters) w->fulfill();
}

void StreamBuffers::Hold(const void* segment, std::shared_ptr<const void> owner, std::uint64_t bytes) {
  holds_.emplace(segment, Held{std::move(owner), bytes});
  held_bytes_ += bytes;
}

std::shared_ptr<void> StreamBuffers::OwnerOf(const void* p, size_t n) const {
  const auto* b = static_cast<const std::uint8_t*>(p);
  auto it = received_.upper_bound(b);
  if (it == received_.begin()) return nullptr;
  --it;
  if (b + n > it->first + it->second.bytes) return nullptr;
  return it->second.owner.lock();
}

BulkMessageStream::BulkMessageStream(kj::AsyncIoStream& stream, std::shared_ptr<StreamBuffers> buffers,
                                     kj::Timer* timer, std::uint32_t message_timeout_ms)
    : stream_(stream),
      writer_(stream),
      buffers_(std::move(buffers)),
      timer_(timer),
      message_timeout_ms_(message_timeout_ms) {}

kj::Promise<size_t> BulkMessageStream::ReadRest(void* buffer, size_t bytes) {
  auto read = stream_.tryRead(buffer, bytes, bytes);
  if (timer_ == nullptr || message_timeout_ms_ == 0) return read;
  return timer_->timeoutAfter(message_timeout_ms_ * kj::MILLISECONDS, kj::mv(read))
      .catch_([this](kj::Exception&& e) -> kj::Promise<size_t> {
        if (e.getType() == kj::Exception::Type::OVERLOADED) {
          if (buffers_) buffers_->Drop();
          return KJ_EXCEPTION(DISCONNECTED, "a message stopped arriving halfway (message timeout)");
        }
        return kj::mv(e);
      });
}

BulkMessageStream::~BulkMessageStream() {
  // Writes still pending were cancelled with their promises; what they held
  // is released with them. Holds never matched by a write go now.
  if (buffers_) {
    buffers_->holds_.clear();
    buffers_->held_bytes_ = 0;
  }
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BulkMessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd> fdSpace, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word> scratchSpace) {
  // No further message while the replies this peer has not taken yet are
  // at the bound (StreamBuffers::WhenRoom).
  if (buffers_ && buffers_->held_bytes_ >= buffers_->max_held_bytes_) {
    return buffers_->WhenRoom().then([this, fdSpace, options, scratchSpace]() {
      return tryReadMessage(fdSpace, options, scratchSpace);
    });
  }
  auto state = kj::heap<ReadState>();
  auto* s = state.get();
  // A message begins with its first byte; from there the rest (of the
  // first word too) is bounded by the message timeout.
  auto head = stream_.tryRead(s->first, 1, sizeof s->first).then([this, s](size_t n) -> kj::Promise<size_t> {
    if (n == 0 || n == sizeof s->first) return n;
    return ReadRest(reinterpret_cast<std::uint8_t*>(s->first) + n, sizeof s->first - n).then([n](size_t m) {
      return n + m;
    });
  });
  return head
      .then([this, s, options](size_t n) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n == 0) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);  // EOF between messages
        if (n < sizeof s->first) return KJ_EXCEPTION(DISCONNECTED, "Premature EOF.");
        const std::uint32_t count = s->first[0] + 1;
        if (s->first[0] >= kMaxSegments) return KJ_EXCEPTION(FAILED, "Message has too many segments.");
        // The rest of the table: a size per segment after the first, padded to a word.
        const size_t rest = (count & ~1u);  // (count + 1) sizes and the count, rounded up to even, less the two read
        s->rest = kj::heapArray<std::uint32_t>(rest);
        auto table = rest == 0 ? kj::Promise<size_t>(size_t{0}) : ReadRest(s->rest.begin(), rest * 4);
        return table.then([this, s, count, rest, options](size_t got) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
          if (got < rest * 4) return KJ_EXCEPTION(DISCONNECTED, "Premature EOF.");
          s->words = s->first[1];
          for (std::uint32_t i = 1; i < count; ++i) s->words += s->rest[i - 1];
          if (s->words > options.traversalLimitInWords) {
            return KJ_EXCEPTION(FAILED,
                                "Message is too large. To increase the limit on the receiving end, see "
                                "capnp::ReaderOptions.");
          }
          if (buffers_ && !buffers_->authenticated_ && buffers_->pre_auth_limit_bytes_ != 0 &&
              s->words * sizeof(capnp::word) > buffers_->pre_auth_limit_bytes_) {
            buffers_->Drop();
            return KJ_EXCEPTION(DISCONNECTED, "a message larger than the node takes before a login",
                                s->words * sizeof(capnp::word), buffers_->pre_auth_limit_bytes_);
          }
          const size_t bytes = static_cast<size_t>(s->words) * sizeof(capnp::word);
          if (bytes != 0) {
            auto payload = std::make_shared<chunk::Payload>(chunk::Payload::Uninitialized(bytes));
            s->data = payload->data();
            s->buffer = std::shared_ptr<void>(payload, payload->data());
          }
          auto body = bytes == 0 ? kj::Promise<size_t>(size_t{0}) : ReadRest(s->data, bytes);
          return body.then([this, s, count, bytes, options](size_t read) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
            if (read < bytes) return KJ_EXCEPTION(DISCONNECTED, "Premature EOF.");
            ReaderParts parts;
            parts.segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(count);
            const auto* w = reinterpret_cast<const capnp::word*>(s->data);
            for (std::uint32_t i = 0; i < count; ++i) {
              const std::uint32_t size = i == 0 ? s->first[1] : s->rest[i - 1];
              parts.segments[i] = kj::arrayPtr(w, size);
              w += size;
            }
            parts.buffer = s->buffer;
            parts.buffers = buffers_;
            if (buffers_ && s->buffer) BulkMessageStreamAccess::Register(*buffers_, s->data, bytes, s->buffer);
            kj::Own<capnp::MessageReader> reader = kj::heap<OwnedMessageReader>(kj::mv(parts), options);
            return kj::Maybe<capnp::MessageReaderAndFds>(capnp::MessageReaderAndFds{kj::mv(reader), nullptr});
          });
        });
      })
      .attach(kj::mv(state));
}

kj::Array<std::shared_ptr<const void>> BulkMessageStream::TakeHolds(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  if (!buffers_ || buffers_->holds_.empty()) return nullptr;
  kj::Vector<std::shared_ptr<const void>> taken;
  for (const auto& seg : segments) {
    auto it = buffers_->holds_.find(seg.begin());
    if (it == buffers_->holds_.end()) continue;
    taken.add(std::move(it->second.owner));
    buffers_->held_bytes_ -= it->second.bytes;
    buffers_->holds_.erase(it);
  }
  buffers_->WakeIfRoom();
  return taken.releaseAsArray();
}

kj::Promise<void> BulkMessageStream::writeMessage(kj::ArrayPtr<const int> fds,
                                                  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  auto holds = TakeHolds(segments);
  return writer_.writeMessage(fds, segments).attach(kj::mv(holds));
}

kj::Promise<void> BulkMessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  kj::Vector<kj::Array<std::shared_ptr<const void>>> holds;
  for (const auto& m : messages) holds.add(TakeHolds(m));
  return writer_.writeMessages(messages).attach(kj::mv(holds));
}

kj::Maybe<int> BulkMessageStream::getSendBufferSize() { return writer_.getSendBufferSize(); }

kj::Promise<void> BulkMessageStream::end() { return writer_.end(); }

}  // namespace kdn::wire
