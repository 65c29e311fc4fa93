// SPDX-License-Identifier: Apache-2.0
// A client of Redis and Redis Cluster (or Valkey) over Debian's hiredis
// (0.14, which has no cluster support: the cluster logic is here): CRC16
// key slots, the slot map from CLUSTER SLOTS, MOVED and ASK redirects, a
// refresh of the map when a node fails or a redirect says it is stale, a few
// connections per node, AUTH (a password, or an ACL user and password).
//
// Every call is a batch: its commands are pipelined, one pipeline per node
// they go to (sent to every node first, then the replies read), and each
// key gets its own outcome in input order. A node that is down, failing over
// or slower than the timeouts costs that node's keys an error
// (kUnavailable, kTimeout) within the timeouts, never a hang, and never an
// exception; the next call finds the new map.
// Thread-safety: a Client may be used from any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace kdn::redis {

struct Options {
  // "host:port" of one node or more (of a cluster: any of its nodes; the
  // rest are learned). Whether it is a cluster is asked (CLUSTER SLOTS; a
  // server without cluster mode is one node holding every slot).
  std::vector<std::string> seeds;
  std::string user;      // ACL user; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  std::uint32_t connect_timeout_ms = 500;
  std::uint32_t command_timeout_ms = 2000;  // per pipeline (one node's replies)
  std::uint32_t connections_per_node = 4;   // callers beyond it wait for one
  // A reply larger than this is a protocol error (Redis' own limit on a
  // value, proto-max-bulk-len, is 512 MiB by default), and so is one of more
  // than two million objects: a broken or hostile server cannot make the
  // client hold more.
  std::uint64_t max_reply_bytes = (std::uint64_t{512} << 20) + 64;
};

// What the client met so far (monotonic).
struct Counters {
  std::uint64_t commands = 0;           // sent (each pipelined command counts)
                                        // (a retry again; not the client's own AUTH, ASKING, CLUSTER SLOTS)
  std::uint64_t moved = 0, ask = 0;     // redirects followed
  std::uint64_t slot_map_refreshes = 0;
  std::uint64_t connects = 0, connect_failures = 0;
  std::uint64_t timeouts = 0;           // pipelines that ran out of time (connection dropped)
  std::uint64_t io_errors = 0;          // connections lost or refused mid-pipeline
  std::uint64_t server_errors = 0;      // error replies other than redirects
};

// A value read: its bytes stay valid while `owner` (the reply) lives.
struct Value {
  const std::uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

struct KeyValue {
  std::string_view key;
  std::span<const std::uint8_t> value;
};

// The slot of a key (CRC16/XMODEM of the key, or of its {hash tag}, mod 16384).
std::uint16_t KeySlot(std::string_view key);

class Client {
 public:
  // Connects to a seed (the first that answers), authenticates, reads the
  // slot map. kUnavailable when no seed answers; kInvalidArgument for a
  // malformed seed or a refused AUTH (with the server's message).
  static Result<std::unique_ptr<Client>> Connect(const Options& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool cluster() const;
  // The distinct master nodes ("host:port") of the current slot map.
  std::vector<std::string> masters() const;

  // EXISTS key: per key, whether it is there.
  std::vector<Result<bool>> Exists(std::span<const std::string_view> keys);
  // STRLEN key: per key, whether it holds a non-empty string (a value of
  // another type is the server's WRONGTYPE error): a probe that a value of
  // another type cannot pass for a stored one, at EXISTS' cost.
  std::vector<Result<bool>> HoldsString(std::span<const std::string_view> keys);
  // GET key: per key, its value, or nullopt when absent.
  std::vector<Result<std::optional<Value>>> Get(std::span<const std::string_view> keys);
  // SET key value [PX ttl_ms] (ttl_ms 0: none): per item, done or why not.
  std::vector<Status> Set(std::span<const KeyValue> items, std::uint64_t ttl_ms = 0);
  // DEL key: per key, whether it was there.
  std::vector<Result<bool>> Del(std::span<const std::string_view> keys);

  Counters counters() const;

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::redis
