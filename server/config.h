// SPDX-License-Identifier: Apache-2.0
// kdnd's configuration: a TOML file (toml++), read once at start. It names
// where the node listens, its tiers, the bearer tokens and what each grants,
// TLS, metrics and KV events. A file that others can read (any group or
// other permission bit) is refused: it holds tokens. Token files likewise.
//
//   [server]
//   listen = ["127.0.0.1:7450", "unix:/run/kdn/kdnd.sock"]   # default ["127.0.0.1:7450"]
//   metrics = "127.0.0.1:9450"          # /metrics and /healthz over HTTP; "" = off
//   kv_events = "tcp://127.0.0.1:5557"  # ZeroMQ PUB of vLLM-style KV events; "" = off
//   kv_events_topic = "kv-events"        # default ""
//   kv_events_format = "map"             # map (vLLM now) | array (vLLM before PR #42892)
//   kv_events_hashes = "bytes"           # bytes (32-byte keys) | uint64 (their last 8 bytes)
//   kv_events_public = false             # true: subscribers need no token (else ZeroMQ PLAIN, a stats token)
//   lmcache_metric_names = true          # /metrics also under LMCache's names
//   prefill_us_per_token = 150.0         # for TTFT saved (hit tokens x this); 0 = not reported
//   drain_timeout_ms = 5000
//   measure_tiers = true                 # time each tier's read rate once at start (server/tier_limits.h)
//   secret_file = "/etc/kdn/secret"      # the deployment secret (>= 32 bytes, mode 600): redis and disk tiers seal
//                                        # what they store and take back only what is sealed (wire/seal.h);
//                                        # every envelope a get sends carries the node's seal
//   encryption_key_file = "/etc/kdn/keys"  # master keys (mode 600, one per line, 64 hex digits, the first
//                                        # encrypts): disk and redis tiers encrypt what they store (wire/cipher.h)
//   encryption_key_env = "KDN_MASTER_KEYS" # or: the environment variable holding them (not both)
//   [server.tls]                          # optional: both files, PEM
//   cert = "/etc/kdn/cert.pem"
//   key = "/etc/kdn/key.pem"
//
//   [[tier]]                              # highest first; default one host tier of 1 GiB
//   kind = "host"                         # host | disk
//   capacity = "4GiB"                     # bytes, or with KiB/MiB/GiB/TiB (or K/M/G/T) suffix
//   path = "/var/lib/kdn"                 # disk only (required there)
//   policy = "lru"                        # lru | s3fifo | cost
//   high_watermark = 0.95
//   low_watermark = 0.85
//   write_through = false
//   fsync = true                          # disk only
//
//   [knowledge]                           # documents registered on the node (wire/node.capnp, version 2)
//   max_documents = 100000                # beyond it, knowledgePut gets busy
//   max_keys_per_document = 65536         # at most maxKeysPerCall; beyond it, tooLarge
//   max_keys = 4194304                    # keys of all documents together; beyond it, busy
//
//   [[token]]
//   token = "..."                         # the bearer token itself, or:
//   token_file = "/etc/kdn/tenant-a.token"  # a file holding it (trailing newline stripped)
//   namespaces = ["tenant-a"]             # what it may read and write ("*" = every namespace)
//   stats = true                          # may read the node's statistics (default false)
//   name = "tenant-a"                     # for logs; default "token<N>"
//
// Unknown keys are errors (a typo must not silently change what the node
// does). Every error names the file, the key and, where toml++ gives one,
// the line.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/engine/kv_store.h"
#include "core/util/status.h"

namespace kdn::server {

struct TokenGrant {
  std::string name;
  std::string token;                    // the secret (never logged)
  std::vector<std::string> namespaces;  // "*" grants every namespace
  bool stats = false;
};

struct TlsConfig {
  std::string cert_file, key_file;  // both empty: no TLS
  bool enabled() const { return !cert_file.empty(); }
};

// wire/node.capnp's maxKeysPerCall (registry.cc checks that they agree): the
// most keys a document may have.
inline constexpr std::uint32_t kMaxKeysPerDocument = 65536;

// Bounds of the node's registry of knowledge items (server/registry.h). It
// costs about 200 bytes per key (the document's copy, the distinct copy,
// the key's entry in the chunk -> documents index) and 300 per document
// beyond its strings, so the defaults bound it near 0.8 GiB.
// Each namespace (tenant) has bounds of its own within the node's, so that
// one tenant filling its share refuses nobody else (a node of one tenant
// sets them to the node's).
struct KnowledgeConfig {
  std::uint32_t max_documents = 100000;
  std::uint32_t max_keys_per_document = kMaxKeysPerDocument;
  std::uint32_t max_keys = 4194304;
  std::uint32_t max_documents_per_namespace = 25000;
  std::uint32_t max_keys_per_namespace = 1048576;
};

// What kdnd allows each client, so that no client, hostile or broken, can
// take the node from the others ([server] keys of the same names; each
// bound hit is counted in /metrics).
struct ServerBounds {
  // Connections held at once; past it a new one is closed as it comes
  // (kdn_connections_refused_total). 0: the file descriptor limit less 64.
  std::uint32_t max_connections = 0;
  // Bytes of envelopes in one get's reply; the keys past it are answered
  // missing (kdn_replies_capped_total).
  std::uint64_t max_reply_bytes = std::uint64_t{256} << 20;
  // Bytes of replies a connection may have queued and not yet sent (a
  // client that does not read); past it its next get waits, and its
  // requests are not read while their calls wait (Cap'n Proto's flow
  // limit, the same number of bytes of calls in flight).
  std::uint64_t max_inflight_bytes = std::uint64_t{256} << 20;
  // The largest message a connection may send before it logs in.
  std::uint64_t pre_auth_max_bytes = std::uint64_t{64} << 10;
  // A connection that has not logged in by then is closed; so is one whose
  // message stops arriving halfway for this long.
  std::uint32_t login_timeout_ms = 60000;
  std::uint32_t message_timeout_ms = 60000;
  // Failed logins on one connection: each answered later than the last
  // (100 ms, doubling to 2 s), and past this many the connection is closed.
  std::uint32_t max_login_failures = 8;
  // Statistics subscriptions open at once, on the node and per connection;
  // past either, subscribeStats is refused with busy.
  std::uint32_t max_subscriptions = 256;
  std::uint32_t max_subscriptions_per_connection = 4;
  // (namespace, model) pairs with kdn_usage_* series of their own on
  // /metrics; the rest add up under namespace="other", model="other".
  std::uint32_t max_usage_series = 64;
};

struct ServerConfig {
  std::vector<std::string> listen = {"127.0.0.1:7450"};  // kj addresses: "host:port", "unix:/path"
  std::string metrics = "";     // "host:port" for HTTP /metrics and /healthz; empty: off
  std::string kv_events = "";   // ZeroMQ endpoint to bind a PUB socket; empty: off
  std::string kv_events_topic;
  std::string kv_events_format = "map";     // "map" or "array"
  std::string kv_events_hashes = "bytes";   // "bytes" or "uint64"
  bool lmcache_metric_names = true;
  double prefill_us_per_token = 0;
  std::uint32_t drain_timeout_ms = 5000;
  // Each host and disk tier's read rate, measured once before the node
  // serves (under a second), reported as the tier's delivery limit.
  bool measure_tiers = true;
  std::string secret_file;  // empty: none (a redis tier serves what its server holds; said once at start)
  // Master keys for encryption at rest (service.h NodeOptions): a file, or
  // the name of an environment variable; never the keys themselves.
  std::string encryption_key_file, encryption_key_env;
  // Listening on a TCP address that is not loopback without [server.tls]
  // (tokens and KV would cross the network in clear), or serving /metrics
  // on one (its bearer token in clear): refused at start unless set.
  bool allow_plaintext = false;
  // /metrics without a token. Unset, a scrape must carry
  // "Authorization: Bearer <token>" of a token with the stats grant (the
  // page has every tenant's counts and names); /healthz needs none.
  bool metrics_public = false;
  // KV events without a token. Unset, a subscriber must log in with
  // ZeroMQ's PLAIN mechanism, a token with the stats grant as its password
  // (the events name every tenant's chunk keys); others are refused at the
  // handshake (server/kv_events.h KvEventOptions::authorize).
  bool kv_events_public = false;
  ServerBounds bounds;
  TlsConfig tls;
  std::vector<store::TierSpec> tiers;  // empty: one host tier of 1 GiB
  std::vector<TokenGrant> tokens;
  KnowledgeConfig knowledge;
};

// Parses TOML text; `origin` names it in errors.
Result<ServerConfig> ParseConfig(std::string_view toml_text, std::string_view origin);
// Reads and parses a file. A config or token file that group or others can
// read is refused with kInvalidArgument, naming the file and its mode.
Result<ServerConfig> LoadConfig(const std::string& path);
// What parsing cannot see and a start would fail on (kdnd --check runs it),
// checked without leaving anything behind: each disk tier's directory (or,
// before it exists, its nearest existing parent) is a directory this
// process can create files in, and so is each unix socket's directory.
// kUnavailable naming the tier or address and the reason.
Status CheckStartable(const ServerConfig& config);
// "4GiB", "512MiB", "1048576" -> bytes.
Result<std::uint64_t> ParseBytes(std::string_view text);

}  // namespace kdn::server
