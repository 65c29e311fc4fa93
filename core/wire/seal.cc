// SPDX-License-Identifier: Apache-2.0
#include "core/wire/seal.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace kdn::wire {
namespace {

constexpr char kMagic[8] = {'K', 'D', 'N', 'S', 'E', 'A', 'L', '1'};
constexpr char kKeyIdLabel[] = "kdn seal key id v1";
constexpr char kKeyLabel[] = "kdn seal v1";
constexpr size_t kSaltBytes = 16, kTagBytes = 16;
constexpr size_t kMinSecret = 32, kMaxSecret = 4096;

Status Corrupt(const std::string& why) { return Status::Corrupt("sealed chunk: " + why); }

struct CipherCtx {
  EVP_CIPHER_CTX* p = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(p); }
};

}  // namespace

std::optional<std::uint64_t> FramedMessageBytes(const std::uint8_t* p, size_t n) {
  auto u32 = [p](size_t i) {
    std::uint32_t v;
    std::memcpy(&v, p + 4 * i, sizeof v);
    return v;
  };
  if (p == nullptr || n < 8) return std::nullopt;
  const std::uint64_t segments = std::uint64_t{u32(0)} + 1;
  if (segments > 512) return std::nullopt;
  const std::uint64_t table_bytes = (4 * (1 + segments) + 7) / 8 * 8;
  if (table_bytes > n) return std::nullopt;
  std::uint64_t bytes = table_bytes;
  for (std::uint64_t i = 0; i < segments; ++i) bytes += std::uint64_t{u32(1 + i)} * 8;
  return bytes;
}

Result<size_t> EnvelopeBytes(const std::uint8_t* data, size_t size) {
  const std::optional<std::uint64_t> n = FramedMessageBytes(data, size);
  if (!n) return Corrupt("not an envelope (no whole segment table)");
  if (*n > size) return Corrupt("the message runs past the bytes");
  return static_cast<size_t>(*n);
}

size_t EnvelopeBytesIgnoringSeal(const std::uint8_t* data, size_t size) {
  Result<size_t> n = EnvelopeBytes(data, size);
  if (!n.ok() || size - *n != kSealTrailerBytes || std::memcmp(data + *n, kMagic, 8) != 0) return size;
  return *n;
}

bool EndsInSeal(const std::uint8_t* data, size_t size) {
  return size >= kSealTrailerBytes && std::memcmp(data + size - kSealTrailerBytes, kMagic, 8) == 0;
}

ChunkSealer::ChunkSealer(std::string secret) : secret_(std::move(secret)) {
  std::string id_input(kKeyIdLabel);
  id_input += secret_;
  std::uint8_t digest[32];
  unsigned len = 0;
  EVP_Digest(id_input.data(), id_input.size(), digest, &len, EVP_sha256(), nullptr);
  std::memcpy(key_id_.data(), digest, key_id_.size());
  OPENSSL_cleanse(id_input.data(), id_input.size());
}

Result<std::shared_ptr<const ChunkSealer>> ChunkSealer::FromSecret(std::string secret) {
  if (secret.size() < kMinSecret) {
    return Status::InvalidArgument("the secret has " + std::to_string(secret.size()) + " bytes; at least " +
                                   std::to_string(kMinSecret) + " are needed (e.g. head -c 32 /dev/urandom > FILE)");
  }
  if (secret.size() > kMaxSecret) return Status::InvalidArgument("the secret is over 4096 bytes: is it the right file?");
  return std::shared_ptr<const ChunkSealer>(new ChunkSealer(std::move(secret)));
}

Result<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::InvalidArgument("cannot open " + what + ": " + std::strerror(errno));
  struct stat st {};
  std::string bytes;
  Status failed;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    failed = Status::InvalidArgument(what + " is not a regular file");
  } else if ((st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) != 0) {
    failed = Status::InvalidArgument(what + " may be read or written by others: chmod 600 (or 640) it first");
  } else if (st.st_size > static_cast<off_t>(max_bytes)) {
    failed = Status::InvalidArgument(what + " is over " + std::to_string(max_bytes) + " bytes: is it the right file?");
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != bytes.size()) failed = Status::InvalidArgument("cannot read " + what);
  }
  ::close(fd);
  if (!failed.ok()) {
    OPENSSL_cleanse(bytes.data(), bytes.size());
    return failed;
  }
  return bytes;
}

Result<std::shared_ptr<const ChunkSealer>> ChunkSealer::FromFile(const std::string& path) {
  Result<std::string> secret = ReadPrivateFile(path, kMaxSecret, "the secret file " + path);
  if (!secret.ok()) return secret.status();
  Result<std::shared_ptr<const ChunkSealer>> s = FromSecret(std::move(secret).value());
  if (!s.ok()) return Status(s.status().code(), path + ": " + s.status().message());
  return s;
}

Status ChunkSealer::Tag(const std::uint8_t* salt, const std::uint8_t* envelope, size_t n, std::uint8_t* tag) const {
  std::uint8_t input[sizeof kKeyLabel - 1 + kSaltBytes];
  std::memcpy(input, kKeyLabel, sizeof kKeyLabel - 1);
  std::memcpy(input + sizeof kKeyLabel - 1, salt, kSaltBytes);
  std::uint8_t key[32];
  unsigned key_len = 0;
  if (HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()), input, sizeof input, key, &key_len) ==
      nullptr) {
    return Status::Internal("sealed chunk: HMAC failed");
  }
  static const std::uint8_t kIv[12] = {};
  CipherCtx ctx;
  bool ok = ctx.p != nullptr && EVP_EncryptInit_ex(ctx.p, EVP_aes_256_gcm(), nullptr, key, kIv) == 1;
  OPENSSL_cleanse(key, sizeof key);
  int len = 0;
  constexpr size_t kStep = size_t{1} << 30;  // EVP takes int lengths
  for (size_t at = 0; ok && at < n; at += kStep) {
    ok = EVP_EncryptUpdate(ctx.p, nullptr, &len, envelope + at, static_cast<int>(std::min(kStep, n - at))) == 1;
  }
  std::uint8_t none[16];
  ok = ok && EVP_EncryptFinal_ex(ctx.p, none, &len) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes), tag) == 1;
  return ok ? Status::Ok() : Status::Internal("sealed chunk: AES-GCM failed");
}

Status ChunkSealer::Seal(const std::uint8_t* envelope, size_t n, std::uint8_t* trailer) const {
  std::memcpy(trailer, kMagic, 8);
  std::memcpy(trailer + 8, key_id_.data(), 8);
  if (RAND_bytes(trailer + 16, static_cast<int>(kSaltBytes)) != 1) return Status::Internal("sealed chunk: no random bytes");
  return Tag(trailer + 16, envelope, n, trailer + 32);
}

Status ChunkSealer::Open(const std::uint8_t* data, size_t size, size_t* envelope_bytes) const {
  Result<size_t> n = EnvelopeBytes(data, size);
  if (!n.ok()) return n.status();
  if (size == *n) return Corrupt("not sealed (this tier takes only chunks sealed with its secret)");
  if (size - *n != kSealTrailerBytes) return Corrupt("bytes after the envelope are not a seal");
  KDN_RETURN_IF_ERROR(Check(data, *n, data + *n, kSealTrailerBytes));
  *envelope_bytes = *n;
  return Status::Ok();
}

Status ChunkSealer::Check(const std::uint8_t* bytes, size_t n, const std::uint8_t* t, size_t trailer_size) const {
  if (trailer_size == 0) return Corrupt("not sealed (a secret was given: only chunks sealed with it are taken)");
  if (trailer_size != kSealTrailerBytes || std::memcmp(t, kMagic, 8) != 0) return Corrupt("the seal is not one");
  if (std::memcmp(t + 8, key_id_.data(), 8) != 0) return Corrupt("sealed with another secret");
  std::uint8_t tag[kTagBytes];
  KDN_RETURN_IF_ERROR(Tag(t + 16, bytes, n, tag));
  if (CRYPTO_memcmp(tag, t + 32, kTagBytes) != 0) return Corrupt("the seal does not match its bytes (forged or damaged)");
  return Status::Ok();
}

}  // namespace kdn::wire
