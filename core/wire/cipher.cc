// SPDX-License-Identifier: Apache-2.0
#include "core/wire/cipher.h"
#include "core/wire/seal.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kdn::wire {
namespace {

constexpr char kKeyIdLabel[] = "kdn at-rest key id v1";
constexpr char kHkdfSalt[] = "kdn at-rest v1";
constexpr char kAadLabel[] = "kdn at-rest v1";
constexpr char kMagic[8] = {'K', 'D', 'N', 'A', 'E', 'S', '1', '\0'};
constexpr size_t kNonceBytes = 12;
constexpr size_t kMaxRingText = 64 * 1024;

Status Corrupt(const std::string& why) { return Status::Corrupt("encrypted chunk: " + why); }

struct CipherCtx {
  EVP_CIPHER_CTX* p = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(p); }
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// EVP takes int lengths: [in, in + n) through `update` in steps of 1 GiB.
template <typename Update>
bool Steps(const std::uint8_t* in, std::uint8_t* out, size_t n, Update update) {
  constexpr size_t kStep = size_t{1} << 30;
  for (size_t at = 0; at < n; at += kStep) {
    int len = 0;
    const int step = static_cast<int>(std::min(kStep, n - at));
    if (update(out + at, &len, in + at, step) != 1 || len != step) return false;
  }
  return true;
}

}  // namespace

KeyId MasterKeyId(const std::uint8_t* master) {
  std::uint8_t input[sizeof kKeyIdLabel - 1 + kMasterKeyBytes];
  std::memcpy(input, kKeyIdLabel, sizeof kKeyIdLabel - 1);
  std::memcpy(input + sizeof kKeyIdLabel - 1, master, kMasterKeyBytes);
  std::uint8_t digest[32];
  unsigned len = 0;
  EVP_Digest(input, sizeof input, digest, &len, EVP_sha256(), nullptr);
  OPENSSL_cleanse(input, sizeof input);
  KeyId id;
  std::memcpy(id.data(), digest, id.size());
  return id;
}

SymmetricKey NamespaceKey(const std::uint8_t* master, const keys::Digest& ns_hash) {
  SymmetricKey out{};
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = kdf ? EVP_KDF_CTX_new(kdf) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(master), kMasterKeyBytes),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(kHkdfSalt), sizeof kHkdfSalt - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<std::uint8_t*>(ns_hash.data()), ns_hash.size()),
      OSSL_PARAM_construct_end()};
  const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, out.data(), out.size(), params) == 1;
  EVP_KDF_CTX_free(ctx);
  EVP_KDF_free(kdf);
  // Without HKDF (a broken OpenSSL) no key: abort rather than encrypt under zeros.
  if (!ok) std::abort();
  return out;
}

std::vector<std::uint8_t> AdditionalData(const chunk::ChunkMeta& m, codec::CodecId encrypted,
                                         const std::uint8_t* header) {
  std::vector<std::uint8_t> a;
  a.reserve(192);
  auto bytes = [&a](const void* p, size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    a.insert(a.end(), b, b + n);
  };
  auto integer = [&bytes](auto v) { bytes(&v, sizeof v); };  // little-endian: the machine's (static_assert in envelope.cc)
  bytes(kAadLabel, sizeof kAadLabel - 1);
  bytes(m.model.data(), m.model.size());
  bytes(m.ns_hash.data(), m.ns_hash.size());
  bytes(m.key.data(), m.key.size());
  integer(static_cast<std::uint16_t>(encrypted));
  integer(static_cast<std::uint16_t>(m.dtype));
  integer(m.layers);
  integer(m.kv_heads);
  integer(m.head_dim);
  integer(m.tokens);
  integer(m.first_position);
  integer(static_cast<std::uint8_t>(m.edited ? 1 : 0));
  bytes(header, kEncryptedHeaderBytes);
  return a;
}

bool EncryptedKeyId(const chunk::Chunk& c, KeyId* id) {
  if (c.meta.codec != codec::CodecId::kEncrypted || c.meta.device || c.payload.size() < kEncryptionOverhead ||
      std::memcmp(c.payload.data(), kMagic, sizeof kMagic) != 0) {
    return false;
  }
  std::memcpy(id->data(), c.payload.data() + 12, id->size());
  return true;
}

ChunkCipher::~ChunkCipher() {
  for (Master& m : masters_) OPENSSL_cleanse(m.key.data(), m.key.size());
  for (auto& entry : derived_) OPENSSL_cleanse(entry.second.data(), entry.second.size());
}

Result<std::shared_ptr<const ChunkCipher>> ChunkCipher::FromText(std::string text, const std::string& source) {
  std::vector<Master> masters;
  Status failed;
  size_t line_no = 0;
  for (size_t at = 0; at <= text.size() && failed.ok();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    size_t b = at, e = end;
    while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
    at = end + 1;
    if (b == e || text[b] == '#') continue;
    if (e - b != 2 * kMasterKeyBytes) {
      failed = Status::InvalidArgument(source + ": line " + std::to_string(line_no) + " is not a key (64 hex digits, " +
                                       "e.g. from `openssl rand -hex 32`)");
      break;
    }
    Master m;
    for (size_t i = 0; i < kMasterKeyBytes && failed.ok(); ++i) {
      const int hi = HexDigit(text[b + 2 * i]), lo = HexDigit(text[b + 2 * i + 1]);
      if (hi < 0 || lo < 0) {
        failed = Status::InvalidArgument(source + ": line " + std::to_string(line_no) + " is not a key (64 hex digits)");
      } else {
        m.key[i] = static_cast<std::uint8_t>(hi << 4 | lo);
      }
    }
    if (!failed.ok()) {
      OPENSSL_cleanse(m.key.data(), m.key.size());
      break;
    }
    m.id = MasterKeyId(m.key.data());
    if (std::any_of(masters.begin(), masters.end(), [&](const Master& o) { return o.id == m.id; })) {
      failed = Status::InvalidArgument(source + ": line " + std::to_string(line_no) + " repeats a key");
    }
    masters.push_back(m);
    OPENSSL_cleanse(m.key.data(), m.key.size());
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (failed.ok() && masters.empty()) {
    failed = Status::InvalidArgument(source + " holds no key (one per line, 64 hex digits: `openssl rand -hex 32`)");
  }
  if (!failed.ok()) {
    for (Master& m : masters) OPENSSL_cleanse(m.key.data(), m.key.size());
    return failed;
  }
  return std::shared_ptr<const ChunkCipher>(new ChunkCipher(std::move(masters)));
}

Result<std::shared_ptr<const ChunkCipher>> ChunkCipher::FromFile(const std::string& path) {
  const std::string source = "the master key file " + path;
  Result<std::string> text = ReadPrivateFile(path, kMaxRingText, source);
  if (!text.ok()) return text.status();
  return FromText(std::move(text).value(), source);
}

Result<std::shared_ptr<const ChunkCipher>> ChunkCipher::FromEnv(const std::string& variable) {
  const char* value = variable.empty() ? nullptr : std::getenv(variable.c_str());
  if (value == nullptr) {
    return Status::InvalidArgument("the master key variable " + variable + " is not set in the environment");
  }
  if (std::strlen(value) > kMaxRingText) return Status::InvalidArgument("the master key variable " + variable + " is over 64 KiB");
  return FromText(value, "the master key variable " + variable);
}

Result<std::shared_ptr<const ChunkCipher>> ChunkCipher::Load(const std::string& file, const std::string& env_variable) {
  if (!file.empty() && !env_variable.empty()) {
    return Status::InvalidArgument("the master key comes from a file or an environment variable, not both");
  }
  if (!file.empty()) return FromFile(file);
  if (!env_variable.empty()) return FromEnv(env_variable);
  return std::shared_ptr<const ChunkCipher>();
}

const ChunkCipher::Master* ChunkCipher::Find(const KeyId& id) const {
  for (const Master& m : masters_) {
    if (m.id == id) return &m;
  }
  return nullptr;
}

bool ChunkCipher::Holds(const KeyId& id) const { return Find(id) != nullptr; }

size_t ChunkCipher::derived_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return derived_.size();
}

SymmetricKey ChunkCipher::KeyFor(const Master& m, const keys::Digest& ns_hash) const {
  const std::pair<KeyId, keys::Digest> at{m.id, ns_hash};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = derived_.find(at);
    if (it != derived_.end()) return it->second;
  }
  const SymmetricKey key = NamespaceKey(m.key.data(), ns_hash);
  std::lock_guard<std::mutex> lock(mu_);
  if (derived_.size() >= kMaxDerivedKeys) {
    for (auto& entry : derived_) OPENSSL_cleanse(entry.second.data(), entry.second.size());
    derived_.clear();
  }
  derived_.emplace(at, key);
  return key;
}

Result<chunk::ChunkRef> ChunkCipher::Encrypt(const chunk::Chunk& in) const {
  if (in.meta.codec == codec::CodecId::kEncrypted) return Status::InvalidArgument("encrypting a chunk encrypted already");
  if (in.meta.device) return Status::InvalidArgument("encrypting a chunk in device memory");
  const Master& m = masters_.front();
  const size_t n = in.payload.size();
  auto out = std::make_shared<chunk::Chunk>();
  out->meta = in.meta;
  out->meta.codec = codec::CodecId::kEncrypted;
  try {
    out->payload = chunk::Payload::Uninitialized(n + kEncryptionOverhead);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "encrypted chunk: no memory for " + std::to_string(n) + " bytes");
  }
  std::uint8_t* header = out->payload.data();
  std::memset(header, 0, kEncryptedHeaderBytes);
  std::memcpy(header, kMagic, sizeof kMagic);
  const auto inner = static_cast<std::uint16_t>(in.meta.codec);
  std::memcpy(header + 8, &inner, sizeof inner);
  std::memcpy(header + 12, m.id.data(), m.id.size());
  std::uint8_t* nonce = header + 20;
  if (RAND_bytes(nonce, static_cast<int>(kNonceBytes)) != 1) {
    return Status::Internal("encrypted chunk: no random bytes for a nonce");
  }
  const std::vector<std::uint8_t> aad = AdditionalData(in.meta, in.meta.codec, header);
  SymmetricKey key = KeyFor(m, in.meta.ns_hash);
  CipherCtx ctx;
  int len = 0;
  bool ok = ctx.p != nullptr && EVP_EncryptInit_ex(ctx.p, EVP_aes_256_gcm(), nullptr, key.data(), nonce) == 1;
  OPENSSL_cleanse(key.data(), key.size());
  ok = ok && EVP_EncryptUpdate(ctx.p, nullptr, &len, aad.data(), static_cast<int>(aad.size())) == 1;
  std::uint8_t* body = header + kEncryptedHeaderBytes;
  ok = ok && Steps(in.payload.data(), body, n, [&](std::uint8_t* o, int* l, const std::uint8_t* i, int k) {
         return EVP_EncryptUpdate(ctx.p, o, l, i, k);
       });
  std::uint8_t none[16];
  ok = ok && EVP_EncryptFinal_ex(ctx.p, none, &len) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kEncryptionTagBytes), body + n) == 1;
  if (!ok) return Status::Internal("encrypted chunk: AES-256-GCM failed");
  return chunk::ChunkRef(std::move(out));
}

Result<chunk::ChunkRef> ChunkCipher::Decrypt(const chunk::ChunkRef& in, bool in_place) const {
  if (in->meta.codec != codec::CodecId::kEncrypted) return in;
  KeyId id;
  if (!EncryptedKeyId(*in, &id)) return Corrupt("its payload is not one (no header)");
  const std::uint8_t* header = in->payload.data();
  std::uint16_t inner, zero;
  std::memcpy(&inner, header + 8, sizeof inner);
  std::memcpy(&zero, header + 10, sizeof zero);
  if (zero != 0 || inner == static_cast<std::uint16_t>(codec::CodecId::kEncrypted) ||
      inner > static_cast<std::uint16_t>(codec::CodecId::kEncrypted)) {
    return Corrupt("its header names no codec it can hold");
  }
  const Master* m = Find(id);
  if (m == nullptr) return Corrupt("encrypted under a master key this runtime does not hold");
  const size_t n = in->payload.size() - kEncryptionOverhead;
  const std::uint8_t* body = header + kEncryptedHeaderBytes;
  auto out = std::make_shared<chunk::Chunk>();
  out->meta = in->meta;
  out->meta.codec = static_cast<codec::CodecId>(inner);
  std::uint8_t* to = nullptr;
  if (in_place) {
    to = const_cast<std::uint8_t*>(body);
    out->payload = chunk::Payload::Adopt(to, n, std::const_pointer_cast<chunk::Chunk>(in));
  } else {
    try {
      out->payload = chunk::Payload::Uninitialized(n);
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoMemory, "encrypted chunk: no memory for " + std::to_string(n) + " bytes");
    }
    to = out->payload.data();
  }
  const std::vector<std::uint8_t> aad = AdditionalData(in->meta, out->meta.codec, header);
  SymmetricKey key = KeyFor(*m, in->meta.ns_hash);
  CipherCtx ctx;
  int len = 0;
  bool ok = ctx.p != nullptr && EVP_DecryptInit_ex(ctx.p, EVP_aes_256_gcm(), nullptr, key.data(), header + 20) == 1;
  OPENSSL_cleanse(key.data(), key.size());
  ok = ok && EVP_DecryptUpdate(ctx.p, nullptr, &len, aad.data(), static_cast<int>(aad.size())) == 1;
  ok = ok && Steps(body, to, n, [&](std::uint8_t* o, int* l, const std::uint8_t* i, int k) {
         return EVP_DecryptUpdate(ctx.p, o, l, i, k);
       });
  if (!ok) return Status::Internal("encrypted chunk: AES-256-GCM failed");
  // The tag is copied out first: in place, the plaintext is written up to it.
  std::uint8_t tag[kEncryptionTagBytes];
  std::memcpy(tag, body + n, sizeof tag);
  std::uint8_t none[16];
  if (EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_SET_TAG, static_cast<int>(sizeof tag), tag) != 1 ||
      EVP_DecryptFinal_ex(ctx.p, none, &len) != 1) {
    return Corrupt("its tag does not match (damaged or forged bytes, or a description that is not its own)");
  }
  return chunk::ChunkRef(std::move(out));
}

Result<chunk::ChunkRef> ToRest(const chunk::ChunkRef& chunk, const ChunkCipher* cipher) {
  if (cipher == nullptr || chunk->meta.codec == codec::CodecId::kEncrypted) return chunk;
  return cipher->Encrypt(*chunk);
}

std::uint64_t AtRestPayloadBytes(const chunk::Chunk& chunk, const ChunkCipher* cipher) {
  const bool adds = cipher != nullptr && chunk.meta.codec != codec::CodecId::kEncrypted;
  return chunk.payload.size() + (adds ? kEncryptionOverhead : 0);
}

Result<chunk::ChunkRef> FromRest(const chunk::ChunkRef& chunk, const ChunkCipher* cipher, bool pass_through,
                                 bool in_place) {
  if (chunk->meta.codec != codec::CodecId::kEncrypted) return chunk;
  KeyId id;
  if (cipher == nullptr || !EncryptedKeyId(*chunk, &id) || !cipher->Holds(id)) {
    if (pass_through) return chunk;
    return cipher == nullptr ? Corrupt("this runtime has no master key (encryption_key_file) to open it")
                             : Corrupt("encrypted under a master key this runtime does not hold");
  }
  // A node decrypts a copy: what does not open is kept as it was.
  Result<chunk::ChunkRef> open = cipher->Decrypt(chunk, in_place && !pass_through);
  if (!open.ok() && pass_through) return chunk;
  return open;
}

}  // namespace kdn::wire
