// SPDX-License-Identifier: Apache-2.0
// kdnd's configuration loader (server/config.h): TOML through toml++, every
// key checked against the keys the format knows and every value against its
// type and range, so a typo stops the node instead of quietly changing what
// it does. toml++ reports syntax errors by exception (Debian builds it with
// exceptions); they are caught here and become Status, so nothing above this
// file sees one.
//
// Secrets: the config file and every token file must be private to their
// owner (no group or other bits), and no error message carries a token's
// value, only where it came from.
//
// Token files are read while parsing, because a token's length and
// uniqueness can only be checked on its value. A relative token_file is
// relative to the config file's directory under LoadConfig, and to the
// current directory under ParseConfig (which has only text, no file).
// Thread-safety: plain functions over their arguments; LoadConfig and
// ParseConfig read files but share no state.
#include "server/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <toml++/toml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <utility>

#include "core/tiers/redis_tier.h"
#include "core/wire/node_client.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;

// Bigger than any sane config; a larger file is a wrong path (a log, say).
constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{1} << 20;
// A token file holds one line; anything bigger is not a token file.
constexpr std::uint64_t kMaxTokenFileBytes = std::uint64_t{64} << 10;
// Short bearer tokens can be guessed; 16 characters is the least we take.
constexpr size_t kMinTokenChars = 16;
// Nor can tokens of few distinct characters ("aaaaaaaaaaaaaaaa").
constexpr size_t kMinTokenDistinct = 5;

std::string OctalMode(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Reads a file that only its owner may read. The checks run on the open
// descriptor (fstat), so the file checked is the file read even if the path
// is swapped in between. O_NONBLOCK keeps a FIFO at that path from hanging
// the open; it is refused below as not a regular file.
Result<std::string> ReadPrivateFile(const std::string& path, std::uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    return Status(err == ENOENT ? Code::kNotFound : Code::kInvalidArgument,
                  path + ": cannot open: " + std::strerror(err));
  }
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::InvalidArgument(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": not a regular file");
  if ((st.st_mode & 077) != 0) {
    return Status::InvalidArgument(path + ": mode " + OctalMode(st.st_mode) +
                                   " lets group or others read it, and it holds secrets; chmod 600 " + path);
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return Status::InvalidArgument(path + ": " + std::to_string(st.st_size) + " bytes is too large (at most " +
                                   std::to_string(max_bytes) + ")");
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::InvalidArgument(path + ": cannot read: " + std::strerror(errno));
    if (n == 0) break;  // shrank since fstat: take what is there
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

// 0.85, not std::to_string's 0.850000.
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

// A bearer token travels as one word: whitespace or control characters in
// it are a broken file, never part of a secret.
bool HasSpaceOrControl(std::string_view s) {
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return true;
  }
  return false;
}

std::string_view TypeName(toml::node_type type) {
  switch (type) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

std::string Join(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string s(path);
  s += '.';
  s += key;
  return s;
}

std::string Indexed(std::string_view name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// What one [[token]] came from, to name it when a later check fails.
struct TokenSource {
  toml::source_region where;
  std::string key;  // "token[i].token" or "token[i].token_file"
};

class Parser {
 public:
  Parser(std::string_view origin, fs::path base_dir) : origin_(origin), base_dir_(std::move(base_dir)) {}

  Result<ServerConfig> Parse(std::string_view text) {
    toml::table root;
    try {
      root = toml::parse(text, std::string_view(origin_));
    } catch (const toml::parse_error& e) {
      const toml::source_position& at = e.source().begin;
      std::string where = origin_;
      if (at.line > 0) where += ":" + std::to_string(at.line) + ":" + std::to_string(at.column);
      return Status::InvalidArgument(where + ": " + std::string(e.description()));
    }

    ServerConfig config;
    KDN_RETURN_IF_ERROR(CheckKeys(root, "", {"server", "tier", "token", "knowledge"}));

    auto server = GetTable(root, "", "server");
    if (!server.ok()) return server.status();
    if (*server != nullptr) KDN_RETURN_IF_ERROR(ParseServer(**server, &config));

    auto knowledge = GetTable(root, "", "knowledge");
    if (!knowledge.ok()) return knowledge.status();
    if (*knowledge != nullptr) KDN_RETURN_IF_ERROR(ParseKnowledge(**knowledge, &config.knowledge));

    auto tiers = GetTableArray(root, "tier");
    if (!tiers.ok()) return tiers.status();
    for (size_t i = 0; i < tiers->size(); ++i) {
      store::TierSpec spec;
      KDN_RETURN_IF_ERROR(ParseTier(*(*tiers)[i], Indexed("tier", i), &spec));
      config.tiers.push_back(std::move(spec));
    }

    auto tokens = GetTableArray(root, "token");
    if (!tokens.ok()) return tokens.status();
    if (tokens->empty()) {
      return Status::InvalidArgument(origin_ +
                                     ": token: no [[token]] table; a node without tokens would serve nobody "
                                     "(add [[token]] with token or token_file, and namespaces)");
    }
    std::vector<TokenSource> sources;
    for (size_t i = 0; i < tokens->size(); ++i) {
      TokenGrant grant;
      TokenSource source;
      KDN_RETURN_IF_ERROR(ParseToken(*(*tokens)[i], i, &grant, &source));
      config.tokens.push_back(std::move(grant));
      sources.push_back(std::move(source));
    }
    KDN_RETURN_IF_ERROR(CheckTokensUnique(config.tokens, sources, *tokens));
    return config;
  }

 private:
  std::string At(const toml::source_region& where) const {
    std::string s = origin_;
    if (where.begin.line > 0) s += ":" + std::to_string(where.begin.line);
    return s;
  }

  Status Error(const toml::source_region& where, std::string_view key, std::string_view what,
               Code code = Code::kInvalidArgument) const {
    return Status(code, At(where) + ": " + std::string(key) + ": " + std::string(what));
  }

  Status TypeError(const toml::node& node, std::string_view key, std::string_view want) const {
    return Error(node.source(), key, "must be " + std::string(want) + ", not " + std::string(TypeName(node.type())));
  }

  Status CheckKeys(const toml::table& table, std::string_view path, std::initializer_list<std::string_view> allowed) {
    for (auto&& [key, value] : table) {
      (void)value;
      bool known = false;
      for (std::string_view a : allowed) known = known || key.str() == a;
      if (known) continue;
      std::string list;
      for (std::string_view a : allowed) {
        if (!list.empty()) list += ", ";
        list += a;
      }
      std::string owner = path.empty() ? "the top level" : "[" + std::string(path) + "]";
      return Error(key.source(), Join(path, key.str()), "unknown key (" + owner + " takes " + list + ")");
    }
    return Status::Ok();
  }

  // The getters leave *out alone when the key is absent, so the struct's
  // default stands.
  Result<const toml::table*> GetTable(const toml::table& table, std::string_view path, std::string_view key) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!node->is_table()) return TypeError(*node, Join(path, key), "a table");
    return node->as_table();
  }

  // [[name]] at the top level; absent gives none.
  Result<std::vector<const toml::table*>> GetTableArray(const toml::table& root, std::string_view name) {
    std::vector<const toml::table*> out;
    const toml::node* node = root.get(name);
    if (node == nullptr) return out;
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      return TypeError(*node, name, "an array of tables ([[" + std::string(name) + "]])");
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = (*array)[i];
      if (!element.is_table()) return TypeError(element, Indexed(name, i), "a table ([[" + std::string(name) + "]])");
      out.push_back(element.as_table());
    }
    return out;
  }

  Status GetString(const toml::table& table, std::string_view path, std::string_view key, std::string* out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_string()) return TypeError(*node, Join(path, key), "a string");
    *out = node->as_string()->get();
    return Status::Ok();
  }

  Status GetBool(const toml::table& table, std::string_view path, std::string_view key, bool* out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_boolean()) return TypeError(*node, Join(path, key), "true or false");
    *out = node->as_boolean()->get();
    return Status::Ok();
  }

  // A number: TOML's 1 and 1.0 are different types, and writing one for the
  // other is no mistake worth refusing.
  Status GetNumber(const toml::table& table, std::string_view path, std::string_view key, double* out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    double v;
    if (node->is_floating_point()) {
      v = node->as_floating_point()->get();
    } else if (node->is_integer()) {
      v = static_cast<double>(node->as_integer()->get());
    } else {
      return TypeError(*node, Join(path, key), "a number");
    }
    if (!std::isfinite(v)) return Error(node->source(), Join(path, key), "must be a finite number");
    *out = v;
    return Status::Ok();
  }

  // Bytes: an integer, or a string such as "256MiB". Absent: *out stays.
  Status GetByteSize(const toml::table& table, std::string_view path, std::string_view key, std::uint64_t* out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    if (node->is_string()) {
      auto parsed = ParseBytes(node->as_string()->get());
      if (!parsed.ok()) return Error(node->source(), Join(path, key), parsed.status().message());
      *out = *parsed;
      return Status::Ok();
    }
    if (node->is_integer() && node->as_integer()->get() >= 0) {
      *out = static_cast<std::uint64_t>(node->as_integer()->get());
      return Status::Ok();
    }
    return TypeError(*node, Join(path, key), "bytes (an integer, or a string such as \"256MiB\")");
  }

  Status GetU32(const toml::table& table, std::string_view path, std::string_view key, std::uint32_t* out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_integer()) return TypeError(*node, Join(path, key), "an integer");
    std::int64_t v = node->as_integer()->get();
    if (v < 0 || v > std::int64_t{std::numeric_limits<std::uint32_t>::max()}) {
      return Error(node->source(), Join(path, key),
                   std::to_string(v) + " is out of range (0 to " +
                       std::to_string(std::numeric_limits<std::uint32_t>::max()) + ")");
    }
    *out = static_cast<std::uint32_t>(v);
    return Status::Ok();
  }

  // An array of non-empty strings; *present says whether the key was there.
  Status GetStrings(const toml::table& table, std::string_view path, std::string_view key,
                    std::vector<std::string>* out, bool* present) {
    *present = false;
    const toml::node* node = table.get(key);
    if (node == nullptr) return Status::Ok();
    const toml::array* array = node->as_array();
    if (array == nullptr) return TypeError(*node, Join(path, key), "an array of strings");
    std::vector<std::string> values;
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = (*array)[i];
      std::string name = Indexed(Join(path, key), i);
      if (!element.is_string()) return TypeError(element, name, "a string");
      const std::string& s = element.as_string()->get();
      if (s.empty()) return Error(element.source(), name, "must not be empty");
      values.push_back(s);
    }
    *out = std::move(values);
    *present = true;
    return Status::Ok();
  }

  Status ParseServer(const toml::table& server, ServerConfig* config) {
    const std::string_view path = "server";
    KDN_RETURN_IF_ERROR(CheckKeys(server, path,
                                  {"listen", "metrics", "kv_events", "kv_events_topic", "kv_events_format",
                                   "kv_events_hashes", "lmcache_metric_names", "prefill_us_per_token",
                                   "drain_timeout_ms", "measure_tiers", "secret_file", "encryption_key_file",
                                   "encryption_key_env", "tls", "max_connections",
                                   "max_reply_bytes", "max_inflight_bytes", "pre_auth_max_bytes", "login_timeout_ms", "message_timeout_ms",
                                   "max_login_failures", "max_subscriptions", "max_subscriptions_per_connection",
                                   "max_usage_series", "allow_plaintext", "metrics_public", "kv_events_public"}));
    bool present = false;
    std::vector<std::string> listen;
    KDN_RETURN_IF_ERROR(GetStrings(server, path, "listen", &listen, &present));
    if (present) {
      // A node that listens nowhere serves nobody, like one without tokens.
      if (listen.empty()) {
        return Error(server.get("listen")->source(), "server.listen", "needs at least one address");
      }
      for (const std::string& a : listen) {
        if (Status st = wire::CheckNodeAddress(a, /*listening=*/true); !st.ok()) {
          return Error(server.get("listen")->source(), "server.listen", st.message());
        }
      }
      config->listen = std::move(listen);
    }
    KDN_RETURN_IF_ERROR(GetString(server, path, "metrics", &config->metrics));
    if (!config->metrics.empty()) {
      // A host alone listens at the default port (9450).
      const bool has_port = config->metrics.rfind(':') != std::string::npos && config->metrics.back() != ']';
      if (Status st = wire::CheckNodeAddress(has_port ? config->metrics : config->metrics + ":9450", true); !st.ok()) {
        return Error(server.get("metrics")->source(), "server.metrics", st.message());
      }
    }
    KDN_RETURN_IF_ERROR(GetString(server, path, "kv_events", &config->kv_events));
    KDN_RETURN_IF_ERROR(GetString(server, path, "kv_events_topic", &config->kv_events_topic));
    KDN_RETURN_IF_ERROR(GetString(server, path, "kv_events_format", &config->kv_events_format));
    if (config->kv_events_format != "map" && config->kv_events_format != "array") {
      return Error(server.get("kv_events_format")->source(), "server.kv_events_format",
                   "must be \"map\" (vLLM's current events) or \"array\" (vLLM's older ones)");
    }
    KDN_RETURN_IF_ERROR(GetString(server, path, "kv_events_hashes", &config->kv_events_hashes));
    if (config->kv_events_hashes != "bytes" && config->kv_events_hashes != "uint64") {
      return Error(server.get("kv_events_hashes")->source(), "server.kv_events_hashes",
                   "must be \"bytes\" (the 32-byte keys) or \"uint64\" (their last 8 bytes, as vLLM's default)");
    }
    KDN_RETURN_IF_ERROR(GetBool(server, path, "lmcache_metric_names", &config->lmcache_metric_names));
    KDN_RETURN_IF_ERROR(GetNumber(server, path, "prefill_us_per_token", &config->prefill_us_per_token));
    if (config->prefill_us_per_token < 0) {
      return Error(server.get("prefill_us_per_token")->source(), "server.prefill_us_per_token",
                   "must not be negative (0: not reported)");
    }
    KDN_RETURN_IF_ERROR(GetU32(server, path, "drain_timeout_ms", &config->drain_timeout_ms));
    KDN_RETURN_IF_ERROR(GetBool(server, path, "measure_tiers", &config->measure_tiers));
    KDN_RETURN_IF_ERROR(GetString(server, path, "secret_file", &config->secret_file));
    KDN_RETURN_IF_ERROR(GetString(server, path, "encryption_key_file", &config->encryption_key_file));
    KDN_RETURN_IF_ERROR(GetString(server, path, "encryption_key_env", &config->encryption_key_env));
    if (!config->encryption_key_file.empty() && !config->encryption_key_env.empty()) {
      return Status::InvalidArgument(std::string(path) +
                                     ": encryption_key_file and encryption_key_env: the master keys come from one");
    }
    KDN_RETURN_IF_ERROR(GetBool(server, path, "allow_plaintext", &config->allow_plaintext));
    KDN_RETURN_IF_ERROR(GetBool(server, path, "metrics_public", &config->metrics_public));
    KDN_RETURN_IF_ERROR(GetBool(server, path, "kv_events_public", &config->kv_events_public));
    ServerBounds& b = config->bounds;
    KDN_RETURN_IF_ERROR(GetU32(server, path, "max_connections", &b.max_connections));
    KDN_RETURN_IF_ERROR(GetByteSize(server, path, "max_reply_bytes", &b.max_reply_bytes));
    KDN_RETURN_IF_ERROR(GetByteSize(server, path, "pre_auth_max_bytes", &b.pre_auth_max_bytes));
    KDN_RETURN_IF_ERROR(GetByteSize(server, path, "max_inflight_bytes", &b.max_inflight_bytes));
    KDN_RETURN_IF_ERROR(GetU32(server, path, "login_timeout_ms", &b.login_timeout_ms));
    KDN_RETURN_IF_ERROR(GetU32(server, path, "message_timeout_ms", &b.message_timeout_ms));
    KDN_RETURN_IF_ERROR(GetU32(server, path, "max_login_failures", &b.max_login_failures));
    KDN_RETURN_IF_ERROR(GetU32(server, path, "max_subscriptions", &b.max_subscriptions));
    KDN_RETURN_IF_ERROR(
        GetU32(server, path, "max_subscriptions_per_connection", &b.max_subscriptions_per_connection));
    KDN_RETURN_IF_ERROR(GetU32(server, path, "max_usage_series", &b.max_usage_series));
    for (const auto& [key, zero] : {std::pair<const char*, bool>{"max_reply_bytes", b.max_reply_bytes == 0},
                                    {"max_inflight_bytes", b.max_inflight_bytes < (1u << 20)},
                                    {"pre_auth_max_bytes", b.pre_auth_max_bytes < 1024},
                                    {"login_timeout_ms", b.login_timeout_ms == 0},
                                    {"message_timeout_ms", b.message_timeout_ms == 0},
                                    {"max_login_failures", b.max_login_failures == 0}}) {
      if (zero) {
        return Error(server.get(key)->source(), Join(path, key),
                     std::string(key) == "pre_auth_max_bytes"   ? "must be at least 1KiB (a login fits)"
                     : std::string(key) == "max_inflight_bytes" ? "must be at least 1MiB"
                                                                : "must be more than 0");
      }
    }

    auto tls = GetTable(server, path, "tls");
    if (!tls.ok()) return tls.status();
    if (*tls != nullptr) {
      const toml::table& t = **tls;
      KDN_RETURN_IF_ERROR(CheckKeys(t, "server.tls", {"cert", "key"}));
      KDN_RETURN_IF_ERROR(GetString(t, "server.tls", "cert", &config->tls.cert_file));
      KDN_RETURN_IF_ERROR(GetString(t, "server.tls", "key", &config->tls.key_file));
      // One without the other would either serve plain text where TLS was
      // meant or fail later, far from the cause.
      if (config->tls.cert_file.empty() != config->tls.key_file.empty()) {
        std::string_view missing = config->tls.cert_file.empty() ? "server.tls.cert" : "server.tls.key";
        return Error(t.source(), missing, "missing: TLS needs both cert and key (PEM files), or neither");
      }
    }
    return Status::Ok();
  }

  Status ParseKnowledge(const toml::table& table, KnowledgeConfig* k) {
    const std::string_view path = "knowledge";
    KDN_RETURN_IF_ERROR(CheckKeys(table, path,
                                  {"max_documents", "max_keys_per_document", "max_keys", "max_documents_per_namespace",
                                   "max_keys_per_namespace"}));
    KDN_RETURN_IF_ERROR(GetU32(table, path, "max_documents", &k->max_documents));
    KDN_RETURN_IF_ERROR(GetU32(table, path, "max_keys_per_document", &k->max_keys_per_document));
    KDN_RETURN_IF_ERROR(GetU32(table, path, "max_keys", &k->max_keys));
    KDN_RETURN_IF_ERROR(GetU32(table, path, "max_documents_per_namespace", &k->max_documents_per_namespace));
    KDN_RETURN_IF_ERROR(GetU32(table, path, "max_keys_per_namespace", &k->max_keys_per_namespace));
    // 0 would refuse every document: leave knowledge items unused instead.
    for (auto [key, value] : {std::pair<std::string_view, std::uint32_t>{"max_documents", k->max_documents},
                              std::pair<std::string_view, std::uint32_t>{"max_keys_per_document", k->max_keys_per_document},
                              std::pair<std::string_view, std::uint32_t>{"max_keys", k->max_keys},
                              std::pair<std::string_view, std::uint32_t>{"max_documents_per_namespace",
                                                                         k->max_documents_per_namespace},
                              std::pair<std::string_view, std::uint32_t>{"max_keys_per_namespace",
                                                                         k->max_keys_per_namespace}}) {
      if (value == 0) return Error(table.get(key)->source(), Join(path, key), "must be at least 1");
    }
    if (k->max_keys_per_document > kMaxKeysPerDocument) {
      return Error(table.get("max_keys_per_document")->source(), "knowledge.max_keys_per_document",
                   std::to_string(k->max_keys_per_document) + " is more than a call carries (" +
                       std::to_string(kMaxKeysPerDocument) + ", the protocol's maxKeysPerCall)");
    }
    return Status::Ok();
  }

  // A size in bytes: an integer, or a string such as "4GiB".
  Status GetBytes(const toml::node& node, const std::string& where, std::uint64_t* bytes) {
    if (node.is_string()) {
      auto parsed = ParseBytes(node.as_string()->get());
      if (!parsed.ok()) return Error(node.source(), where, parsed.status().message());
      *bytes = *parsed;
    } else if (node.is_integer()) {
      std::int64_t v = node.as_integer()->get();
      if (v < 0) return Error(node.source(), where, "must not be negative");
      *bytes = static_cast<std::uint64_t>(v);
    } else {
      return TypeError(node, where, "bytes (an integer, or a string such as \"4GiB\")");
    }
    return Status::Ok();
  }

  Status ParseTier(const toml::table& tier, const std::string& path, store::TierSpec* spec) {
    KDN_RETURN_IF_ERROR(CheckKeys(tier, path,
                                  {"kind", "capacity", "path", "policy", "high_watermark", "low_watermark",
                                   "write_through", "fsync", "address", "user", "password", "password_file",
                                   "ttl_ms", "prefix", "timeout_ms", "quotas"}));
    std::string kind = "host";
    KDN_RETURN_IF_ERROR(GetString(tier, path, "kind", &kind));
    if (kind == "host") {
      spec->kind = store::TierSpec::Kind::kHost;
    } else if (kind == "disk") {
      spec->kind = store::TierSpec::Kind::kDisk;
    } else if (kind == "redis") {
      spec->kind = store::TierSpec::Kind::kRedis;
    } else {
      return Error(tier.get("kind")->source(), Join(path, "kind"), "\"" + kind + "\" is not host, disk or redis");
    }
    const bool disk = spec->kind == store::TierSpec::Kind::kDisk;
    const bool redis = spec->kind == store::TierSpec::Kind::kRedis;
    for (std::string_view key : {"address", "user", "password", "password_file", "ttl_ms", "prefix", "timeout_ms"}) {
      if (const toml::node* node = tier.get(key); node != nullptr && !redis) {
        return Error(node->source(), Join(path, key), "only redis tiers take " + std::string(key));
      }
    }
    if (redis) KDN_RETURN_IF_ERROR(ParseRedisTier(tier, path, spec));
    // No codec, as for every tier of a node: chunks are stored as the
    // node's clients encoded them (a client's remote tier with "kdn" sends
    // them compressed, and they stay so in Redis).

    if (const toml::node* node = tier.get("capacity")) {
      std::uint64_t bytes = 0;
      KDN_RETURN_IF_ERROR(GetBytes(*node, Join(path, "capacity"), &bytes));
      if (bytes == 0) return Error(node->source(), Join(path, "capacity"), "must be more than 0 bytes");
      spec->capacity_bytes = bytes;
    }
    // quotas = { "tenant-a" = "4GiB", ... }: the namespaces' quotas in this tier.
    if (const toml::node* node = tier.get("quotas")) {
      const toml::table* quotas = node->as_table();
      if (quotas == nullptr) return TypeError(*node, Join(path, "quotas"), "a table of namespace = bytes");
      for (const auto& [ns, value] : *quotas) {
        const std::string where = Join(Join(path, "quotas"), std::string(ns.str()));
        if (ns.str().empty() || ns.str().size() > 4096) {
          return Error(value.source(), where, "a namespace is 1 to 4096 bytes");
        }
        std::uint64_t bytes = 0;
        KDN_RETURN_IF_ERROR(GetBytes(value, where, &bytes));
        spec->quotas.push_back({std::string(ns.str()), bytes});
      }
    }

    // Keys that mean nothing on a host tier are refused there: whoever
    // wrote them expected them to do something.
    if (const toml::node* node = tier.get("path"); node != nullptr && !disk) {
      return Error(node->source(), Join(path, "path"), "only disk tiers take a path");
    }
    if (const toml::node* node = tier.get("fsync"); node != nullptr && !disk) {
      return Error(node->source(), Join(path, "fsync"), "only disk tiers take fsync");
    }
    KDN_RETURN_IF_ERROR(GetString(tier, path, "path", &spec->path));
    if (disk && spec->path.empty()) {
      const toml::node* node = tier.get("path");
      return Error(node != nullptr ? node->source() : tier.source(), Join(path, "path"),
                   "a disk tier needs a path (the directory it keeps its objects in)");
    }

    std::string policy = "lru";
    KDN_RETURN_IF_ERROR(GetString(tier, path, "policy", &policy));
    if (policy == "lru") {
      spec->policy = store::PolicyKind::kLru;
    } else if (policy == "s3fifo") {
      spec->policy = store::PolicyKind::kS3Fifo;
    } else if (policy == "cost") {
      spec->policy = store::PolicyKind::kCost;
    } else {
      return Error(tier.get("policy")->source(), Join(path, "policy"), "\"" + policy + "\" is not lru, s3fifo or cost");
    }

    KDN_RETURN_IF_ERROR(GetNumber(tier, path, "high_watermark", &spec->high_watermark));
    // Unset, the low mark follows the high one as in the C ABI.
    if (tier.get("low_watermark") == nullptr) spec->low_watermark = store::DefaultLowWatermark(spec->high_watermark);
    KDN_RETURN_IF_ERROR(GetNumber(tier, path, "low_watermark", &spec->low_watermark));
    for (auto [key, value] : {std::pair<std::string_view, double>{"high_watermark", spec->high_watermark},
                              std::pair<std::string_view, double>{"low_watermark", spec->low_watermark}}) {
      if (value > 0 && value <= 1) continue;
      const toml::node* node = tier.get(key);
      return Error(node != nullptr ? node->source() : tier.source(), Join(path, key),
                   Num(value) + " is not in (0, 1] (a fraction of capacity)");
    }
    // The rule of every front end (store::CheckWatermarks): low <= high.
    if (!store::CheckWatermarks(spec->high_watermark, spec->low_watermark).ok()) {
      const toml::node* node = tier.get("low_watermark");
      if (node == nullptr) node = tier.get("high_watermark");
      return Error(node != nullptr ? node->source() : tier.source(), Join(path, "low_watermark"),
                   Num(spec->low_watermark) + " must not be above high_watermark (" + Num(spec->high_watermark) + ")");
    }
    KDN_RETURN_IF_ERROR(GetBool(tier, path, "write_through", &spec->write_through));
    KDN_RETURN_IF_ERROR(GetBool(tier, path, "fsync", &spec->fsync));
    // What every front end checks of a tier (store::ValidateTierSpec).
    if (Status st = store::ValidateTierSpec(*spec); !st.ok()) return Error(tier.source(), path, st.message());
    return Status::Ok();
  }

  // A redis tier's server(s) and credentials: address, a "host:port" string
  // (comma-separated for several seeds) or an array of them; user (ACL) and
  // password or password_file (a file only its owner may read, as token
  // files); ttl_ms, prefix (of every key), timeout_ms (per command).
  Status ParseRedisTier(const toml::table& tier, const std::string& path, store::TierSpec* spec) {
    const toml::node* address = tier.get("address");
    if (address == nullptr) {
      return Error(tier.source(), Join(path, "address"), "a redis tier needs an address (\"host:port\", or several)");
    }
    std::vector<std::string> seeds;
    if (address->is_string()) {
      seeds.push_back(address->as_string()->get());
    } else if (address->is_array()) {
      bool present = false;
      KDN_RETURN_IF_ERROR(GetStrings(tier, path, "address", &seeds, &present));
      if (seeds.empty()) return Error(address->source(), Join(path, "address"), "must name at least one host:port");
    } else {
      return TypeError(*address, Join(path, "address"), "a string or an array of strings (\"host:port\")");
    }
    std::string joined;
    for (const std::string& seed : seeds) joined += (joined.empty() ? "" : ",") + seed;
    auto parsed = store::ParseRedisSeeds(joined);
    if (!parsed.ok()) return Error(address->source(), Join(path, "address"), parsed.status().message());
    spec->address = joined;

    KDN_RETURN_IF_ERROR(GetString(tier, path, "user", &spec->user));
    const toml::node* inline_node = tier.get("password");
    const toml::node* file_node = tier.get("password_file");
    if (inline_node != nullptr && file_node != nullptr) {
      return Error(tier.source(), Join(path, "password"), "has both password and password_file; give at most one");
    }
    // From here on the secret is in hand: messages name where it came from,
    // never what it is.
    if (inline_node != nullptr) {
      if (!inline_node->is_string()) return TypeError(*inline_node, Join(path, "password"), "a string");
      spec->token = inline_node->as_string()->get();
      if (spec->token.empty()) return Error(inline_node->source(), Join(path, "password"), "must not be empty");
    } else if (file_node != nullptr) {
      if (!file_node->is_string()) return TypeError(*file_node, Join(path, "password_file"), "a string");
      const std::string& name = file_node->as_string()->get();
      if (name.empty()) return Error(file_node->source(), Join(path, "password_file"), "must not be empty");
      fs::path file = name;
      if (file.is_relative()) file = base_dir_ / file;
      auto content = ReadPrivateFile(file.string(), kMaxTokenFileBytes);
      if (!content.ok()) {
        return Error(file_node->source(), Join(path, "password_file"), content.status().message(), content.status().code());
      }
      std::string secret = std::move(*content);
      while (!secret.empty() && IsSpace(secret.back())) secret.pop_back();
      if (secret.empty()) return Error(file_node->source(), Join(path, "password_file"), file.string() + " is empty");
      spec->token = std::move(secret);
    }
    if (!spec->user.empty() && spec->token.empty()) {
      return Error(tier.get("user")->source(), Join(path, "user"), "a user needs a password (password or password_file)");
    }
    if (const toml::node* node = tier.get("ttl_ms")) {
      if (!node->is_integer() || node->as_integer()->get() < 0) {
        return TypeError(*node, Join(path, "ttl_ms"), "a non-negative integer (milliseconds; 0: keys never expire)");
      }
      spec->ttl_ms = static_cast<std::uint64_t>(node->as_integer()->get());
    }
    KDN_RETURN_IF_ERROR(GetString(tier, path, "prefix", &spec->key_prefix));
    if (spec->key_prefix.size() > 256) return Error(tier.get("prefix")->source(), Join(path, "prefix"), "longer than 256 bytes");
    KDN_RETURN_IF_ERROR(GetU32(tier, path, "timeout_ms", &spec->timeout_ms));
    if (spec->timeout_ms == 0) return Error(tier.get("timeout_ms")->source(), Join(path, "timeout_ms"), "must be at least 1");
    return Status::Ok();
  }

  Status ParseToken(const toml::table& table, size_t index, TokenGrant* grant, TokenSource* source) {
    const std::string path = Indexed("token", index);
    KDN_RETURN_IF_ERROR(CheckKeys(table, path, {"token", "token_file", "namespaces", "stats", "name"}));
    const toml::node* inline_node = table.get("token");
    const toml::node* file_node = table.get("token_file");
    if (inline_node != nullptr && file_node != nullptr) {
      return Error(table.source(), path, "has both token and token_file; give exactly one");
    }
    if (inline_node == nullptr && file_node == nullptr) {
      return Error(table.source(), path, "needs token or token_file (the bearer token, or a file holding it)");
    }

    // From here on the secret is in hand: messages name where it came from,
    // never what it is.
    if (inline_node != nullptr) {
      source->key = Join(path, "token");
      source->where = inline_node->source();
      if (!inline_node->is_string()) return TypeError(*inline_node, source->key, "a string");
      grant->token = inline_node->as_string()->get();
      KDN_RETURN_IF_ERROR(CheckSecret(grant->token, source->where, source->key, "the token"));
    } else {
      source->key = Join(path, "token_file");
      source->where = file_node->source();
      if (!file_node->is_string()) return TypeError(*file_node, source->key, "a string");
      const std::string& name = file_node->as_string()->get();
      if (name.empty()) return Error(source->where, source->key, "must not be empty");
      fs::path file = name;
      if (file.is_relative()) file = base_dir_ / file;
      auto content = ReadPrivateFile(file.string(), kMaxTokenFileBytes);
      if (!content.ok()) return Error(source->where, source->key, content.status().message(), content.status().code());
      std::string secret = std::move(*content);
      // Editors and `echo` end the file with a newline (maybe \r\n); it is
      // not part of the token.
      while (!secret.empty() && IsSpace(secret.back())) secret.pop_back();
      KDN_RETURN_IF_ERROR(CheckSecret(secret, source->where, source->key, "the token in " + file.string()));
      grant->token = std::move(secret);
    }

    bool present = false;
    KDN_RETURN_IF_ERROR(GetStrings(table, path, "namespaces", &grant->namespaces, &present));
    KDN_RETURN_IF_ERROR(GetBool(table, path, "stats", &grant->stats));
    if (grant->namespaces.empty() && !grant->stats) {
      const toml::node* node = table.get("namespaces");
      return Error(node != nullptr ? node->source() : table.source(), Join(path, "namespaces"),
                   "the token grants nothing: give it namespaces (\"*\" for all) or stats = true");
    }
    grant->name = "token" + std::to_string(index);
    if (const toml::node* node = table.get("name")) {
      KDN_RETURN_IF_ERROR(GetString(table, path, "name", &grant->name));
      if (grant->name.empty()) return Error(node->source(), Join(path, "name"), "must not be empty");
    }
    return Status::Ok();
  }

  // `what` names the secret in messages ("the token", "the token in FILE").
  Status CheckSecret(std::string_view secret, const toml::source_region& where, std::string_view key,
                     const std::string& what) {
    if (secret.empty()) return Error(where, key, what + " is empty");
    if (HasSpaceOrControl(secret)) {
      return Error(where, key, what + " contains whitespace or control characters");
    }
    // Printable ASCII only: a token is one word in a header or a file, and
    // Unicode has spaces of its own (U+00A0, U+3000, ...) that look like
    // nothing and split nothing here.
    for (char c : secret) {
      if (static_cast<unsigned char>(c) > 0x7e) {
        return Error(where, key, what + " has a character outside printable ASCII (Unicode spaces among them)");
      }
    }
    if (secret.size() < kMinTokenChars) {
      return Error(where, key,
                   what + " is too short (" + std::to_string(secret.size()) + " characters; at least " +
                       std::to_string(kMinTokenChars) + ")");
    }
    // Length is no strength when the characters repeat: 16 copies of one
    // character are guessed at once. A random token of 16 hex digits has
    // fewer than kMinTokenDistinct distinct ones once in 200,000.
    bool seen[128] = {};
    size_t distinct = 0;
    for (char c : secret) {
      if (!seen[static_cast<unsigned char>(c)]) ++distinct;
      seen[static_cast<unsigned char>(c)] = true;
    }
    if (distinct < kMinTokenDistinct) {
      return Error(where, key,
                   what + " has only " + std::to_string(distinct) + " distinct characters (at least " +
                       std::to_string(kMinTokenDistinct) + "; make one with: openssl rand -hex 32)");
    }
    return Status::Ok();
  }

  // Two grants with one secret: the node could not tell whose call it is.
  // Two with one name: the logs could not.
  Status CheckTokensUnique(const std::vector<TokenGrant>& tokens, const std::vector<TokenSource>& sources,
                           const std::vector<const toml::table*>& tables) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (tokens[i].token == tokens[j].token) {
          return Error(sources[i].where, sources[i].key,
                       "the same token as " + sources[j].key + " (each grant needs its own token)");
        }
        if (tokens[i].name == tokens[j].name) {
          const toml::node* node = tables[i]->get("name");
          return Error(node != nullptr ? node->source() : tables[i]->source(), Indexed("token", i) + ".name",
                       "\"" + tokens[i].name + "\" is also the name of " + Indexed("token", j));
        }
      }
    }
    return Status::Ok();
  }

  std::string origin_;
  fs::path base_dir_;
};

}  // namespace

Result<ServerConfig> ParseConfig(std::string_view toml_text, std::string_view origin) {
  return Parser(origin, fs::path()).Parse(toml_text);
}

Result<ServerConfig> LoadConfig(const std::string& path) {
  auto text = ReadPrivateFile(path, kMaxConfigBytes);
  if (!text.ok()) return text.status();
  fs::path dir = fs::path(path).parent_path();
  auto config = Parser(path, dir).Parse(*text);
  if (!config.ok() || !config->tls.enabled()) return config;
  // TLS files relative to the configuration's folder; the private key must
  // be the owner's alone, as the file itself.
  for (std::string* f : {&config->tls.cert_file, &config->tls.key_file}) {
    if (fs::path(*f).is_relative()) *f = (dir / *f).string();
  }
  auto key = ReadPrivateFile(config->tls.key_file, kMaxConfigBytes);
  if (!key.ok()) return Status(key.status().code(), "server.tls.key: " + key.status().message());
  return config;
}

namespace {

// Whether files can be created in `dir` (an existing directory): an
// unnamed temporary file (O_TMPFILE), or where the file system has none, a
// named one removed at once.
Status ProbeDirectory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return Status::Ok();
  }
  int err = errno;
  if (err == EOPNOTSUPP || err == EISDIR || err == EINVAL) {
    std::string name = (dir / ".kdnd-check-XXXXXX").string();
    fd = ::mkstemp(name.data());
    if (fd >= 0) {
      ::close(fd);
      ::unlink(name.c_str());
      return Status::Ok();
    }
    err = errno;
  }
  return Status(Code::kUnavailable, "cannot create files in " + dir.string() + ": " + std::strerror(err));
}

// `path`'s nearest existing ancestor (itself when it exists), which must be
// a directory.
Result<fs::path> NearestDirectory(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return Status(Code::kUnavailable, path.string() + ": " + ec.message());
  while (!fs::exists(p, ec)) {
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  if (!fs::is_directory(p, ec)) return Status(Code::kUnavailable, p.string() + " is not a directory");
  return p;
}

}  // namespace

Status CheckStartable(const ServerConfig& config) {
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    const store::TierSpec& t = config.tiers[i];
    if (t.kind != store::TierSpec::Kind::kDisk) continue;
    const std::string what = "tier[" + std::to_string(i) + "] (disk, path " + t.path + ")";
    Result<fs::path> dir = NearestDirectory(t.path);
    if (!dir.ok()) return Status(Code::kUnavailable, what + ": " + dir.status().message());
    if (Status st = ProbeDirectory(*dir); !st.ok()) return Status(Code::kUnavailable, what + ": " + st.message());
  }
  for (const std::string& a : config.listen) {
    if (a.rfind("unix:", 0) != 0) continue;
    const fs::path dir = fs::path(a.substr(5)).parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir.empty() ? fs::path(".") : dir, ec)) {
      return Status(Code::kUnavailable, "server.listen " + a + ": the directory " + dir.string() +
                                                   " does not exist (create it, owned by kdnd's user)");
    }
    if (Status st = ProbeDirectory(dir.empty() ? fs::path(".") : dir); !st.ok()) {
      return Status(Code::kUnavailable, "server.listen " + a + ": " + st.message());
    }
  }
  return Status::Ok();
}

Result<std::uint64_t> ParseBytes(std::string_view text) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  if (text.empty()) return Status::InvalidArgument("an empty string is not a size");
  size_t i = 0;
  std::uint64_t n = 0;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (n > (kMax - digit) / 10) return Status::InvalidArgument(quoted + " is too large (overflows 64 bits)");
    n = n * 10 + digit;
  }
  if (i == 0) return Status::InvalidArgument(quoted + " is not a size (a whole number of bytes, e.g. \"4GiB\")");
  std::string_view suffix = text.substr(i);
  // "4 GiB" reads as well as "4GiB".
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  static constexpr std::pair<std::string_view, int> kSuffixes[] = {
      {"", 0},     {"K", 10},   {"KiB", 10}, {"M", 20}, {"MiB", 20},
      {"G", 30},   {"GiB", 30}, {"T", 40},   {"TiB", 40},
  };
  for (const auto& [name, shift] : kSuffixes) {
    if (suffix != name) continue;
    if (n > (kMax >> shift)) return Status::InvalidArgument(quoted + " is too large (overflows 64 bits)");
    return n << shift;
  }
  // KB, MB and the like are refused rather than guessed: they mean powers of
  // 1000 to some and of 1024 to others.
  return Status::InvalidArgument(quoted + " has an unknown unit \"" + std::string(suffix) +
                                 "\" (use KiB, MiB, GiB, TiB or K, M, G, T, all powers of 1024)");
}

}  // namespace kdn::server
