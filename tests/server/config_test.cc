// SPDX-License-Identifier: Apache-2.0
// kdnd's configuration (server/config.h): a full file parses to the values
// it says, an empty-but-valid one to the documented defaults, every kind of
// mistake is refused with a message naming the key (and never the secret),
// files that group or others can read are refused, token files are read
// relative to the config, and sizes parse with their units.
#include "server/config.h"
#include "server/server.h"
#include "kdn/kdn.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace kdn::server {
namespace {

namespace fs = std::filesystem;

constexpr char kSecretA[] = "tenant-a-0123456789abcdef";
constexpr char kSecretB[] = "tenant-b-fedcba9876543210";

// A valid [[token]] to append to texts that test something else.
const std::string kOneToken = std::string("[[token]]\ntoken = \"") + kSecretA + "\"\nnamespaces = [\"a\"]\n";

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Parses `text` and expects an InvalidArgument that names `key` and the
// origin, and does not leak either test secret.
void ExpectRefused(const std::string& text, const std::string& key) {
  SCOPED_TRACE(text);
  auto r = ParseConfig(text, "test.toml");
  ASSERT_FALSE(r.ok()) << "accepted; expected an error naming " << key;
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().message();
  const std::string& m = r.status().message();
  EXPECT_TRUE(Contains(m, key)) << "message does not name " << key << ": " << m;
  EXPECT_TRUE(Contains(m, "test.toml")) << m;
  EXPECT_FALSE(Contains(m, kSecretA)) << m;
  EXPECT_FALSE(Contains(m, kSecretB)) << m;
}

TEST(ServerConfigParse, FullExampleGivesItsValues) {
  const std::string text = std::string(R"(
[server]
listen = ["127.0.0.1:7450", "unix:/run/kdn/kdnd.sock"]
metrics = "127.0.0.1:9450"
kv_events = "tcp://127.0.0.1:5557"
kv_events_topic = "kv-events"
prefill_us_per_token = 150.0
drain_timeout_ms = 2500

[server.tls]
cert = "/etc/kdn/cert.pem"
key = "/etc/kdn/key.pem"

[[tier]]
kind = "host"
capacity = "4GiB"
policy = "s3fifo"
high_watermark = 0.9
low_watermark = 0.8
write_through = true

[[tier]]
kind = "disk"
capacity = 1099511627776
path = "/var/lib/kdn"
policy = "cost"
fsync = false

[[token]]
token = ")") + kSecretA + R"("
namespaces = ["tenant-a", "shared"]
name = "tenant-a"

[[token]]
token = ")" + kSecretB + R"("
namespaces = ["*"]
stats = true
)";
  auto r = ParseConfig(text, "full.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ServerConfig& c = *r;
  EXPECT_EQ(c.listen, (std::vector<std::string>{"127.0.0.1:7450", "unix:/run/kdn/kdnd.sock"}));
  EXPECT_EQ(c.metrics, "127.0.0.1:9450");
  EXPECT_EQ(c.kv_events, "tcp://127.0.0.1:5557");
  EXPECT_EQ(c.kv_events_topic, "kv-events");
  EXPECT_DOUBLE_EQ(c.prefill_us_per_token, 150.0);
  EXPECT_EQ(c.drain_timeout_ms, 2500u);
  EXPECT_TRUE(c.tls.enabled());
  EXPECT_EQ(c.tls.cert_file, "/etc/kdn/cert.pem");
  EXPECT_EQ(c.tls.key_file, "/etc/kdn/key.pem");

  ASSERT_EQ(c.tiers.size(), 2u);
  EXPECT_EQ(c.tiers[0].kind, store::TierSpec::Kind::kHost);
  EXPECT_EQ(c.tiers[0].capacity_bytes, std::uint64_t{4} << 30);
  EXPECT_EQ(c.tiers[0].policy, store::PolicyKind::kS3Fifo);
  EXPECT_DOUBLE_EQ(c.tiers[0].high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(c.tiers[0].low_watermark, 0.8);
  EXPECT_TRUE(c.tiers[0].write_through);
  EXPECT_EQ(c.tiers[1].kind, store::TierSpec::Kind::kDisk);
  EXPECT_EQ(c.tiers[1].capacity_bytes, std::uint64_t{1} << 40);
  EXPECT_EQ(c.tiers[1].path, "/var/lib/kdn");
  EXPECT_EQ(c.tiers[1].policy, store::PolicyKind::kCost);
  EXPECT_FALSE(c.tiers[1].fsync);
  EXPECT_FALSE(c.tiers[1].write_through);
  EXPECT_DOUBLE_EQ(c.tiers[1].high_watermark, 0.95);
  EXPECT_DOUBLE_EQ(c.tiers[1].low_watermark, 0.85);

  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_EQ(c.tokens[0].name, "tenant-a");
  EXPECT_EQ(c.tokens[0].token, kSecretA);
  EXPECT_EQ(c.tokens[0].namespaces, (std::vector<std::string>{"tenant-a", "shared"}));
  EXPECT_FALSE(c.tokens[0].stats);
  EXPECT_EQ(c.tokens[1].name, "token1");  // default: token<index>
  EXPECT_EQ(c.tokens[1].token, kSecretB);
  EXPECT_EQ(c.tokens[1].namespaces, (std::vector<std::string>{"*"}));
  EXPECT_TRUE(c.tokens[1].stats);
}

TEST(ServerConfigParse, OnlyATokenGivesTheDefaults) {
  auto r = ParseConfig(kOneToken, "min.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ServerConfig& c = *r;
  EXPECT_EQ(c.listen, (std::vector<std::string>{"127.0.0.1:7450"}));
  EXPECT_EQ(c.metrics, "");
  EXPECT_EQ(c.kv_events, "");
  EXPECT_EQ(c.kv_events_topic, "");
  EXPECT_EQ(c.prefill_us_per_token, 0.0);
  EXPECT_EQ(c.drain_timeout_ms, 5000u);
  EXPECT_FALSE(c.tls.enabled());
  EXPECT_TRUE(c.tiers.empty());  // the store's default: one host tier of 1 GiB
  ASSERT_EQ(c.tokens.size(), 1u);
  EXPECT_EQ(c.tokens[0].name, "token0");
  EXPECT_FALSE(c.tokens[0].stats);
}

// Encryption at rest (docs/security.md): the master keys' source is a file
// or a variable's name, never the keys; not both at once.
TEST(ServerConfigParse, MasterKeysComeFromAFileOrAVariableNotBoth) {
  const std::string tokens = std::string(kOneToken);
  auto file = ParseConfig("[server]\nencryption_key_file = \"/etc/kdn/keys\"\n" + tokens, "f.toml");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->encryption_key_file, "/etc/kdn/keys");
  EXPECT_EQ(file->encryption_key_env, "");
  auto env = ParseConfig("[server]\nencryption_key_env = \"KDN_MASTER_KEYS\"\n" + tokens, "e.toml");
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->encryption_key_env, "KDN_MASTER_KEYS");
  auto both = ParseConfig(
      "[server]\nencryption_key_file = \"/etc/kdn/keys\"\nencryption_key_env = \"KDN_MASTER_KEYS\"\n" + tokens,
      "b.toml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("encryption_key_env"), std::string::npos) << both.status().message();
  EXPECT_TRUE(ParseConfig(std::string(kOneToken), "min.toml")->encryption_key_file.empty());
}

TEST(ServerConfigParse, TierDefaultsAreTheStoresDefaults) {
  auto r = ParseConfig("[[tier]]\n" + kOneToken, "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tiers.size(), 1u);
  const store::TierSpec& t = r->tiers[0];
  EXPECT_EQ(t.kind, store::TierSpec::Kind::kHost);
  EXPECT_EQ(t.capacity_bytes, std::uint64_t{1} << 30);
  EXPECT_EQ(t.policy, store::PolicyKind::kLru);
  EXPECT_DOUBLE_EQ(t.high_watermark, 0.95);
  EXPECT_DOUBLE_EQ(t.low_watermark, 0.85);
  EXPECT_FALSE(t.write_through);
  EXPECT_TRUE(t.fsync);
}

TEST(ServerConfigParse, IntegersStandForFloatsAndStatsOnlyTokensAreFine) {
  auto r = ParseConfig(std::string("[server]\nprefill_us_per_token = 120\n[[tier]]\nhigh_watermark = 1\n"
                                   "low_watermark = 0.5\n[[token]]\ntoken = \"") +
                           kSecretA + "\"\nstats = true\n",
                       "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->prefill_us_per_token, 120.0);
  EXPECT_DOUBLE_EQ(r->tiers[0].high_watermark, 1.0);
  EXPECT_TRUE(r->tokens[0].namespaces.empty());
  EXPECT_TRUE(r->tokens[0].stats);
}

TEST(ServerConfigErrors, SyntaxErrorNamesOriginAndLine) {
  auto r = ParseConfig("[server]\nlisten = [\"a\"\nmetrics = \"x\"\n", "bad.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "bad.toml:")) << r.status().message();
  // toml++ places the error on line 2 or 3 depending on how far it reads;
  // either is a line, not the start of the file.
  EXPECT_TRUE(Contains(r.status().message(), "bad.toml:2:") || Contains(r.status().message(), "bad.toml:3:"))
      << r.status().message();
}

TEST(ServerConfigErrors, ErrorsCarryTheLineOfTheKey) {
  auto r = ParseConfig("[server]\nmetrics = \"\"\ndrain_timeout_ms = -1\n" + kOneToken, "l.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "l.toml:3: server.drain_timeout_ms")) << r.status().message();
}

TEST(ServerConfigErrors, UnknownKeysAnywhereAreRefused) {
  ExpectRefused("severs = 1\n" + kOneToken, "severs");
  ExpectRefused("[serve]\nlisten = []\n" + kOneToken, "serve");
  ExpectRefused("[server]\nlistne = [\"127.0.0.1:1\"]\n" + kOneToken, "server.listne");
  ExpectRefused("[server.tls]\ncert = \"c\"\nkey = \"k\"\nca = \"x\"\n" + kOneToken, "server.tls.ca");
  ExpectRefused("[[tier]]\ncapacty = \"1GiB\"\n" + kOneToken, "tier[0].capacty");
  ExpectRefused("[[tier]]\n[[tier]]\nkind = \"disk\"\npath = \"/x\"\ncodec = \"raw\"\n" + kOneToken,
                "tier[1].codec");
  ExpectRefused(kOneToken + "namespace = [\"b\"]\n", "token[0].namespace");
}

TEST(ServerConfigErrors, WrongTypesAreRefused) {
  ExpectRefused("server = 1\n" + kOneToken, "server");
  ExpectRefused("[server]\nlisten = \"127.0.0.1:7450\"\n" + kOneToken, "server.listen");
  ExpectRefused("[server]\nlisten = [7450]\n" + kOneToken, "server.listen[0]");
  ExpectRefused("[server]\nmetrics = 9450\n" + kOneToken, "server.metrics");
  ExpectRefused("[server]\nkv_events = true\n" + kOneToken, "server.kv_events");
  ExpectRefused("[server]\nkv_events_topic = []\n" + kOneToken, "server.kv_events_topic");
  ExpectRefused("[server]\nprefill_us_per_token = \"150\"\n" + kOneToken, "server.prefill_us_per_token");
  ExpectRefused("[server]\ndrain_timeout_ms = 1.5\n" + kOneToken, "server.drain_timeout_ms");
  ExpectRefused("[server]\ntls = \"on\"\n" + kOneToken, "server.tls");
  ExpectRefused("[server.tls]\ncert = 1\nkey = \"k\"\n" + kOneToken, "server.tls.cert");
  ExpectRefused("[tier]\nkind = \"host\"\n" + kOneToken, "tier");
  ExpectRefused("[[tier]]\nkind = 1\n" + kOneToken, "tier[0].kind");
  ExpectRefused("[[tier]]\ncapacity = 1.5\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\npolicy = true\n" + kOneToken, "tier[0].policy");
  ExpectRefused("[[tier]]\nhigh_watermark = \"0.9\"\n" + kOneToken, "tier[0].high_watermark");
  ExpectRefused("[[tier]]\nwrite_through = 1\n" + kOneToken, "tier[0].write_through");
  ExpectRefused("[[tier]]\nkind = \"disk\"\npath = \"/x\"\nfsync = \"yes\"\n" + kOneToken, "tier[0].fsync");
  ExpectRefused("[[tier]]\nkind = \"disk\"\npath = 5\n" + kOneToken, "tier[0].path");
  ExpectRefused("token = \"x\"\n", "token");
  ExpectRefused(kOneToken + "stats = \"yes\"\n", "token[0].stats");
  ExpectRefused(kOneToken + "name = 3\n", "token[0].name");
  ExpectRefused("[[token]]\ntoken = 12345678901234567\nnamespaces = [\"a\"]\n", "token[0].token");
  ExpectRefused("[[token]]\ntoken_file = 1\nnamespaces = [\"a\"]\n", "token[0].token_file");
  ExpectRefused(std::string("[[token]]\ntoken = \"") + kSecretA + "\"\nnamespaces = \"a\"\n", "token[0].namespaces");
  ExpectRefused(std::string("[[token]]\ntoken = \"") + kSecretA + "\"\nnamespaces = [1]\n", "token[0].namespaces[0]");
}

TEST(ServerConfigErrors, ServerValuesOutOfRange) {
  ExpectRefused("[server]\nlisten = []\n" + kOneToken, "server.listen");
  ExpectRefused("[server]\nlisten = [\"127.0.0.1:1\", \"\"]\n" + kOneToken, "server.listen[1]");
  ExpectRefused("[server]\nprefill_us_per_token = -1.0\n" + kOneToken, "server.prefill_us_per_token");
  ExpectRefused("[server]\nprefill_us_per_token = nan\n" + kOneToken, "server.prefill_us_per_token");
  ExpectRefused("[server]\ndrain_timeout_ms = 4294967296\n" + kOneToken, "server.drain_timeout_ms");
}

TEST(ServerConfigErrors, TlsNeedsBothFilesOrNeither) {
  ExpectRefused("[server.tls]\ncert = \"/c.pem\"\n" + kOneToken, "server.tls.key");
  ExpectRefused("[server.tls]\nkey = \"/k.pem\"\n" + kOneToken, "server.tls.cert");
  auto none = ParseConfig("[server.tls]\n" + kOneToken, "t.toml");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->tls.enabled());
}

TEST(ServerConfigErrors, CapacityMustBeAPositiveSize) {
  ExpectRefused("[[tier]]\ncapacity = \"4GB\"\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\ncapacity = \"lots\"\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\ncapacity = \"99999999TiB\"\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\ncapacity = -5\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\ncapacity = 0\n" + kOneToken, "tier[0].capacity");
  ExpectRefused("[[tier]]\ncapacity = \"0MiB\"\n" + kOneToken, "tier[0].capacity");
}

TEST(ServerConfigErrors, KindPolicyAndPath) {
  ExpectRefused("[[tier]]\nkind = \"ssd\"\n" + kOneToken, "tier[0].kind");
  ExpectRefused("[[tier]]\nkind = \"remote\"\n" + kOneToken, "tier[0].kind");
  ExpectRefused("[[tier]]\npolicy = \"lfu\"\n" + kOneToken, "tier[0].policy");
  ExpectRefused("[[tier]]\nkind = \"disk\"\n" + kOneToken, "tier[0].path");
  ExpectRefused("[[tier]]\nkind = \"disk\"\npath = \"\"\n" + kOneToken, "tier[0].path");
  // Keys that would do nothing on a host tier are refused, not ignored.
  ExpectRefused("[[tier]]\npath = \"/var/lib/kdn\"\n" + kOneToken, "tier[0].path");
  ExpectRefused("[[tier]]\nfsync = false\n" + kOneToken, "tier[0].fsync");
}

// A redis tier (issue 15): its servers, credentials, TTL, prefix and
// timeout, each as the store's TierSpec takes it.
TEST(ServerConfigParse, RedisTierGivesItsValues) {
  auto r = ParseConfig(std::string("[[tier]]\ncapacity = \"1GiB\"\n"
                                   "[[tier]]\nkind = \"redis\"\naddress = [\"10.0.0.1:7000\", \"10.0.0.2:7001\"]\n"
                                   "user = \"kdn\"\npassword = \"") +
                           kSecretB +
                           "\"\nttl_ms = 3600000\nprefix = \"kv:\"\ntimeout_ms = 250\n"
                           "[[tier]]\nkind = \"redis\"\naddress = \"127.0.0.1:6379\"\n" +
                           kOneToken,
                       "test.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tiers.size(), 3u);
  const store::TierSpec& t = r->tiers[1];
  EXPECT_EQ(t.kind, store::TierSpec::Kind::kRedis);
  EXPECT_EQ(t.address, "10.0.0.1:7000,10.0.0.2:7001");
  EXPECT_EQ(t.user, "kdn");
  EXPECT_EQ(t.token, kSecretB);
  EXPECT_EQ(t.ttl_ms, 3600000u);
  EXPECT_EQ(t.key_prefix, "kv:");
  EXPECT_EQ(t.timeout_ms, 250u);
  // The defaults: no AUTH, no TTL, "kdn:", 2 s; no codec (a node keeps chunks
  // as its clients encoded them).
  const store::TierSpec& d = r->tiers[2];
  EXPECT_EQ(d.address, "127.0.0.1:6379");
  EXPECT_TRUE(d.user.empty());
  EXPECT_TRUE(d.token.empty());
  EXPECT_EQ(d.ttl_ms, 0u);
  EXPECT_EQ(d.key_prefix, "kdn:");
  EXPECT_EQ(d.timeout_ms, 2000u);
  EXPECT_TRUE(d.codec.empty());
}

// Addresses that cannot be listened at are refused by the check, not met
// at start (--check passed "port 99999").
TEST(ServerConfigErrors, AddressesThatCannotBeListenedAtAreRefused) {
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:", "127.0.0.1", ":7450", "::1:7450",
                          "[::1:7450", "[not-v6]:7450", "unix:", "local host:7450"}) {
    ExpectRefused(std::string("[server]\nlisten = [\"") + bad + "\"]\n" + kOneToken, "server.listen");
  }
  const std::string long_path = "unix:/" + std::string(120, 'p');
  ExpectRefused("[server]\nlisten = [\"" + long_path + "\"]\n" + kOneToken, "server.listen");
  ExpectRefused("[server]\nmetrics = \"127.0.0.1:70000\"\n" + kOneToken, "server.metrics");
  for (const char* good : {"127.0.0.1:0", "*:7450", "[::1]:7450", "localhost:7450", "unix:/run/kdn/kdnd.sock"}) {
    auto r = ParseConfig(std::string("[server]\nlisten = [\"") + good + "\"]\nmetrics = \"127.0.0.1\"\n" + kOneToken,
                         "test.toml");
    EXPECT_TRUE(r.ok()) << good << ": " << r.status().message();
  }
}

// Tokens of Unicode spaces, or of one character repeated, were accepted.
TEST(ServerConfigErrors, TokensOfUnicodeSpacesOrFewDistinctCharactersAreRefused) {
  const auto grant = [](const std::string& token) {
    return "[[token]]\ntoken = \"" + token + "\"\nnamespaces = [\"a\"]\n";
  };
  ExpectRefused(grant(std::string(16, 'a')), "token[0].token");
  ExpectRefused(grant("abababababababababab"), "token[0].token");
  ExpectRefused(grant("abcdabcdabcdabcd"), "token[0].token");
  std::string nbsp;  // U+00A0 eight times: 16 bytes, "blank"
  for (int i = 0; i < 8; ++i) nbsp += "\xc2\xa0";
  ExpectRefused(grant(nbsp), "token[0].token");
  std::string ideographic = "token-for-tenant";  // U+3000 inside an otherwise fine token
  ideographic += "\xe3\x80\x80" "0001";
  ExpectRefused(grant(ideographic), "token[0].token");
  EXPECT_TRUE(ParseConfig(grant("abcdeabcdeabcdea"), "test.toml").ok());  // five distinct: taken
}

// Quotas per namespace in a tier (issue 37): namespace = bytes, as an
// integer or a size string; mistakes refused with where they are.
TEST(ServerConfigParse, TierQuotasAreNamespacesAndSizes) {
  auto r = ParseConfig("[[tier]]\nquotas = { \"tenant-a\" = \"4MiB\", \"tenant b\" = 1000 }\n" + kOneToken, "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& q = r->tiers[0].quotas;
  ASSERT_EQ(q.size(), 2u);
  std::map<std::string, std::uint64_t> got;
  for (const auto& e : q) got[e.ns] = e.bytes;
  EXPECT_EQ(got["tenant-a"], std::uint64_t{4} << 20);
  EXPECT_EQ(got["tenant b"], 1000u);
  ExpectRefused("[[tier]]\nquotas = 5\n" + kOneToken, "tier[0].quotas");
  ExpectRefused("[[tier]]\nquotas = { a = -1 }\n" + kOneToken, "tier[0].quotas.a");
  ExpectRefused("[[tier]]\nquotas = { a = \"lots\" }\n" + kOneToken, "tier[0].quotas.a");
  ExpectRefused("[[tier]]\nquotas = { a = true }\n" + kOneToken, "tier[0].quotas.a");
}

// Plaintext off the machine (issue 37, item 4): an RPC listener on a TCP
// address that is not loopback needs TLS or allow_plaintext; /metrics (a
// bearer token) a loopback address unless metrics_public or allow_plaintext.
TEST(ServerConfigParse, ListenersOffTheMachineNeedTlsOrAllowPlaintext) {
  ServerConfig c;
  for (const char* a : {"127.0.0.1:7450", "127.5.6.7:1", "localhost:7450", "[::1]:7450", "unix:/run/kdn/kdnd.sock"}) {
    c.listen = {a};
    EXPECT_TRUE(CheckPlaintext(c).ok()) << a;
  }
  for (const char* a : {"0.0.0.0:7450", "10.1.2.3:7450", "[::]:7450", "kdn.example.com:7450", "*:7450"}) {
    c.listen = {"127.0.0.1:7450", a};
    const Status st = CheckPlaintext(c);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << a;
    EXPECT_NE(st.message().find(a), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("allow_plaintext"), std::string::npos);
  }
  c.tls.cert_file = "cert.pem";
  c.tls.key_file = "key.pem";
  EXPECT_TRUE(CheckPlaintext(c).ok());
  c.tls = {};
  c.allow_plaintext = true;
  EXPECT_TRUE(CheckPlaintext(c).ok());
  c.allow_plaintext = false;
  c.listen = {"127.0.0.1:7450"};
  c.metrics = "0.0.0.0:9450";
  EXPECT_EQ(CheckPlaintext(c).code(), Code::kInvalidArgument);
  c.metrics_public = true;
  EXPECT_TRUE(CheckPlaintext(c).ok());
  auto r = ParseConfig("[server]\nallow_plaintext = true\nmetrics_public = true\n" + kOneToken, "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->allow_plaintext);
  EXPECT_TRUE(r->metrics_public);
  r = ParseConfig(kOneToken, "t.toml");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->allow_plaintext);
  EXPECT_FALSE(r->metrics_public);
}

TEST(ServerConfigErrors, RedisTierMistakes) {
  const std::string redis = "[[tier]]\nkind = \"redis\"\n";
  ExpectRefused(redis + kOneToken, "tier[0].address");
  ExpectRefused(redis + "address = \"localhost\"\n" + kOneToken, "tier[0].address");
  ExpectRefused(redis + "address = \"localhost:0\"\n" + kOneToken, "tier[0].address");
  ExpectRefused(redis + "address = []\n" + kOneToken, "tier[0].address");
  ExpectRefused(redis + "address = 6379\n" + kOneToken, "tier[0].address");
  const std::string a = redis + "address = \"127.0.0.1:6379\"\n";
  ExpectRefused(a + "user = \"kdn\"\n" + kOneToken, "tier[0].user");  // a user needs a password
  ExpectRefused(a + "password = \"" + kSecretB + "\"\npassword_file = \"/etc/kdn/redis\"\n" + kOneToken,
                "tier[0].password");
  ExpectRefused(a + "password = \"\"\n" + kOneToken, "tier[0].password");
  ExpectRefused(a + "password = 7\n" + kOneToken, "tier[0].password");
  ExpectRefused(a + "ttl_ms = -1\n" + kOneToken, "tier[0].ttl_ms");
  ExpectRefused(a + "timeout_ms = 0\n" + kOneToken, "tier[0].timeout_ms");
  ExpectRefused(a + "codec = \"kdn\"\n" + kOneToken, "tier[0].codec");
  ExpectRefused(a + "colour = \"red\"\n" + kOneToken, "tier[0]");
  // Keys that mean nothing on another tier are refused there, not ignored.
  ExpectRefused("[[tier]]\naddress = \"127.0.0.1:6379\"\n" + kOneToken, "tier[0].address");
  ExpectRefused("[[tier]]\nkind = \"disk\"\npath = \"/var/lib/kdn\"\nttl_ms = 5\n" + kOneToken, "tier[0].ttl_ms");
  ExpectRefused("[[tier]]\npassword = \"" + std::string(kSecretB) + "\"\n" + kOneToken, "tier[0].password");
}

TEST(ServerConfigErrors, WatermarksAreFractionsWithLowNotAboveHigh) {
  ExpectRefused("[[tier]]\nhigh_watermark = 0.0\n" + kOneToken, "tier[0].high_watermark");
  ExpectRefused("[[tier]]\nhigh_watermark = 1.5\n" + kOneToken, "tier[0].high_watermark");
  ExpectRefused("[[tier]]\nlow_watermark = -0.1\n" + kOneToken, "tier[0].low_watermark");
  ExpectRefused("[[tier]]\nhigh_watermark = 0.7\nlow_watermark = 0.9\n" + kOneToken, "tier[0].low_watermark");
}

// kdnd's config and the C ABI apply one rule (store::CheckWatermarks, through
// store::ValidateTierSpec): 0 < low <= high <= 1, and a low mark left out
// follows the high one (min(0.85, high)). kdnd refused low == high, and a
// high mark alone below 0.85, which libkdn took.
TEST(ServerConfigParse, WatermarksFollowTheRuleOfEveryFrontEnd) {
  struct Case {
    const char* toml;  // the tier's watermark lines
    float high, low;   // the same as kdn_tier_config (0: unset)
  };
  const Case cases[] = {
      {"high_watermark = 0.8\nlow_watermark = 0.8\n", 0.8f, 0.8f},
      {"high_watermark = 0.8\n", 0.8f, 0.0f},
      {"high_watermark = 1.0\nlow_watermark = 1.0\n", 1.0f, 1.0f},
      {"high_watermark = 0.7\nlow_watermark = 0.9\n", 0.7f, 0.9f},
      {"low_watermark = 0.95\n", 0.0f, 0.95f},
      {"low_watermark = 0.96\n", 0.0f, 0.96f},
      {"high_watermark = 0.5\nlow_watermark = 0.25\n", 0.5f, 0.25f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.toml);
    auto r = ParseConfig("[[tier]]\n" + std::string(c.toml) + kOneToken, "test.toml");

    kdn_tier_config tier = KDN_TIER_CONFIG_INIT;
    tier.kind = KDN_TIER_HOST;
    tier.capacity_bytes = 1 << 20;
    tier.high_watermark = c.high;
    tier.low_watermark = c.low;
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    o.tiers = &tier;
    o.num_tiers = 1;
    kdn_runtime* rt = nullptr;
    const kdn_status st = kdn_runtime_create(&o, &rt);
    EXPECT_EQ(r.ok(), st == KDN_OK) << (r.ok() ? kdn_last_error_message() : r.status().message());
    if (r.ok() && rt != nullptr) {
      kdn_tier_stats ts = KDN_TIER_STATS_INIT;
      ASSERT_EQ(kdn_runtime_get_tier_stats(rt, 0, &ts), KDN_OK);
      EXPECT_NEAR(r->tiers[0].high_watermark, ts.high_watermark, 1e-6);
      EXPECT_NEAR(r->tiers[0].low_watermark, ts.low_watermark, 1e-6);
    }
    kdn_runtime_destroy(rt);
  }
}

TEST(ServerConfigErrors, ANodeWithoutTokensIsRefused) {
  auto r = ParseConfig("[server]\nlisten = [\"127.0.0.1:7450\"]\n", "none.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "none.toml")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "token")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "serve nobody")) << r.status().message();
  ExpectRefused("", "token");
  ExpectRefused("token = []\n", "token");
}

TEST(ServerConfigErrors, EachTokenNeedsExactlyOneValidSecret) {
  const std::string a = std::string("token = \"") + kSecretA + "\"\n";
  ExpectRefused("[[token]]\nnamespaces = [\"a\"]\n", "token[0]");
  ExpectRefused("[[token]]\n" + a + "token_file = \"/etc/kdn/a.token\"\nnamespaces = [\"a\"]\n", "token_file");
  ExpectRefused("[[token]]\ntoken = \"\"\nnamespaces = [\"a\"]\n", "token[0].token");
  ExpectRefused("[[token]]\ntoken_file = \"\"\nnamespaces = [\"a\"]\n", "token[0].token_file");
  ExpectRefused("[[token]]\ntoken = \"short-secret-15\"\nnamespaces = [\"a\"]\n", "token[0].token");
  ExpectRefused("[[token]]\ntoken = \"has a space in the middle\"\nnamespaces = [\"a\"]\n", "token[0].token");
  // The second grant reuses the first one's secret.
  ExpectRefused(kOneToken + "[[token]]\n" + a + "namespaces = [\"b\"]\n", "token[1].token");
  ExpectRefused("[[token]]\n" + a + "namespaces = [\"\"]\n", "token[0].namespaces[0]");
  ExpectRefused("[[token]]\n" + a + "namespaces = []\n", "token[0].namespaces");
  ExpectRefused("[[token]]\n" + a, "token[0].namespaces");  // grants nothing
  ExpectRefused("[[token]]\n" + a + "namespaces = [\"a\"]\nname = \"\"\n", "token[0].name");
  ExpectRefused("[[token]]\n" + a + "namespaces = [\"a\"]\nname = \"x\"\n[[token]]\ntoken = \"" + kSecretB +
                    "\"\nnamespaces = [\"b\"]\nname = \"x\"\n",
                "token[1].name");
  // Exactly 16 characters is enough.
  auto r = ParseConfig("[[token]]\ntoken = \"0123456789abcdef\"\nnamespaces = [\"a\"]\n", "t.toml");
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST(ServerConfigErrors, MessagesNeverCarryTheSecret) {
  // A too-short secret is still a secret someone meant to use.
  const std::string short_secret = "Sh0rtS3cret";
  auto r = ParseConfig("[[token]]\ntoken = \"" + short_secret + "\"\nnamespaces = [\"a\"]\n", "t.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(Contains(r.status().message(), short_secret)) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "11 characters")) << r.status().message();
}

// Real files in a private temporary directory.
class ServerConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "kdn-config-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    std::string path = (dir_ / name).string();
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << content;
    }
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  fs::path dir_;
};

// kdnd --check passed configs that could not start: a disk tier at
// /proc/self, a unix socket in a directory that does not exist. It checks
// them now, and leaves nothing behind.
TEST_F(ServerConfigFiles, CheckRefusesWhatCannotStartAndLeavesNothingBehind) {
  const auto config = [&](const std::string& disk, const std::string& listen) {
    return "[server]\nlisten = [\"" + listen + "\"]\n[[tier]]\nkind = \"disk\"\npath = \"" + disk +
           "\"\ncapacity = \"64MiB\"\n" + kOneToken;
  };
  const std::string sock = "unix:" + (dir_ / "kdnd.sock").string();
  auto ok = ParseConfig(config((dir_ / "new" / "tier").string(), sock), "test.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_TRUE(CheckStartable(*ok).ok()) << CheckStartable(*ok).message();
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  EXPECT_TRUE(fs::is_empty(dir_));

  auto proc = ParseConfig(config("/proc/self", sock), "test.toml");
  ASSERT_TRUE(proc.ok()) << proc.status().message();
  Status st = CheckStartable(*proc);
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(st.message(), "tier[0]")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "/proc/self")) << st.message();

  Write("a-file", "x", 0600);
  auto file = ParseConfig(config((dir_ / "a-file" / "tier").string(), sock), "test.toml");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(CheckStartable(*file).code(), Code::kUnavailable);

  auto nodir = ParseConfig(config((dir_ / "tier").string(), "unix:" + (dir_ / "run" / "kdn" / "kdnd.sock").string()),
                           "test.toml");
  ASSERT_TRUE(nodir.ok());
  st = CheckStartable(*nodir);
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(st.message(), "does not exist")) << st.message();

  // The command says so too, with a non-zero exit.
  const std::string path = Write("proc.toml", config("/proc/self", sock), 0600);
  const std::string cmd = std::string(KDND_PATH) + " --config " + path + " --check > /dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
}

// A first start as server/kdnd.toml.example says: tokens made with `kdnd
// token new --file`, `--check`, then a start that serves until SIGTERM. The
// example failed a newcomer with a raw bind error (its /run/kdn missing):
// a start now checks what --check checks and names the missing directory.
TEST_F(ServerConfigFiles, TheExampleConfigStartsAsItSays) {
  std::string example;
  {
    std::ifstream in(std::string(KDN_SOURCE_DIR) + "/server/kdnd.toml.example");
    ASSERT_TRUE(in) << "server/kdnd.toml.example";
    example.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = example.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    for (size_t i = at; (i = example.find(from, i)) != std::string::npos; i += to.size()) example.replace(i, from.size(), to);
  };
  // Its paths and ports, here: a directory of the test's and ports the kernel picks.
  replace("/var/lib/kdn", (dir_ / "state").string());
  replace("/run/kdn", (dir_ / "run").string());
  replace("127.0.0.1:7450", "127.0.0.1:0");
  replace("127.0.0.1:9450", "127.0.0.1:0");
  const std::string config = Write("kdnd.toml", example, 0600);
  auto run = [](const std::string& cmd, std::string* out) {
    std::FILE* p = ::popen(("{ " + cmd + "; } 2>&1").c_str(), "r");
    char buf[512];
    out->clear();
    while (p && std::fgets(buf, sizeof buf, p)) *out += buf;
    const int rc = p ? ::pclose(p) : -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  const std::string kdnd = KDND_PATH;
  std::string out;
  // A token, printed: 32 hex digits.
  ASSERT_EQ(run(kdnd + " token new", &out), 0) << out;
  EXPECT_EQ(out.size(), 33u) << out;
  EXPECT_EQ(out.find_first_not_of("0123456789abcdef\n"), std::string::npos) << out;
  for (const char* name : {"tenant-a.token", "ops.token"}) {
    const std::string file = (dir_ / name).string();
    ASSERT_EQ(run(kdnd + " token new --file " + file, &out), 0) << out;
    EXPECT_EQ(fs::status(file).permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
    EXPECT_EQ(fs::file_size(file), 33u);
    EXPECT_NE(run(kdnd + " token new --file " + file, &out), 0) << "a token file is never overwritten";
    EXPECT_TRUE(Contains(out, "never overwritten")) << out;
  }
  // Without the socket's directory: --check and a start both say which is missing.
  for (const char* flag : {" --check", ""}) {
    SCOPED_TRACE(flag);
    EXPECT_EQ(run(kdnd + " --config " + config + flag, &out), 2) << out;
    EXPECT_TRUE(Contains(out, (dir_ / "run").string() + " does not exist")) << out;
  }
  fs::create_directories(dir_ / "run");
  ASSERT_EQ(run(kdnd + " --config " + config + " --check", &out), 0) << out;
  // It starts, serves on both addresses, and drains on SIGTERM (exit 0).
  const std::string ready = (dir_ / "ready").string();
  // (Up to 60 s to be ready: sanitizer builds start slowly.)
  const int rc = run(kdnd + " --config " + config + " --ready-file " + ready + " & pid=$!; " +
                         "for i in $(seq 600); do [ -s " + ready + " ] && break; sleep 0.1; done; " +
                         "kill -TERM $pid; wait $pid",
                     &out);
  EXPECT_EQ(rc, 0) << out;
  std::ifstream in(ready);
  std::string addresses((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(Contains(addresses, "rpc 127.0.0.1:")) << addresses;
  EXPECT_TRUE(Contains(addresses, "rpc unix:" + (dir_ / "run" / "kdnd.sock").string())) << addresses;
  EXPECT_TRUE(Contains(addresses, "metrics 127.0.0.1:")) << addresses;
  EXPECT_TRUE(Contains(out, "kdnd: stopped")) << out;
}

TEST_F(ServerConfigFiles, PrivateFileIsLoaded) {
  std::string path = Write("kdnd.toml", "[server]\nmetrics = \"127.0.0.1:9450\"\n" + kOneToken, 0600);
  auto r = LoadConfig(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->metrics, "127.0.0.1:9450");
  EXPECT_EQ(r->tokens.at(0).token, kSecretA);
}

TEST_F(ServerConfigFiles, FileOthersCanReadIsRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0660}) {
    std::string path = Write("kdnd.toml", kOneToken, mode);
    auto r = LoadConfig(path);
    ASSERT_FALSE(r.ok()) << std::oct << mode;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    const std::string& m = r.status().message();
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    EXPECT_TRUE(Contains(m, path)) << m;
    EXPECT_TRUE(Contains(m, octal)) << m;
    EXPECT_TRUE(Contains(m, "chmod 600")) << m;
    EXPECT_FALSE(Contains(m, kSecretA)) << m;
  }
}

TEST_F(ServerConfigFiles, TlsKeyOthersCanReadIsRefusedAndPathsAreTheConfigsFolders) {
  Write("cert.pem", "not checked here", 0644);
  Write("key.pem", "a private key", 0644);
  const std::string path =
      Write("kdnd.toml", "[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n" + kOneToken, 0600);
  auto r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "server.tls.key")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "chmod 600")) << r.status().message();
  ASSERT_EQ(::chmod((dir_ / "key.pem").c_str(), 0600), 0);
  auto ok = LoadConfig(path);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->tls.key_file, (dir_ / "key.pem").string());
  EXPECT_EQ(ok->tls.cert_file, (dir_ / "cert.pem").string());
}

TEST(ServerConfigParse, KvEventFormsAndMetricNames) {
  auto d = ParseConfig(kOneToken, "d.toml");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->kv_events_format, "map");
  EXPECT_EQ(d->kv_events_hashes, "bytes");
  EXPECT_TRUE(d->lmcache_metric_names);
  auto r = ParseConfig("[server]\nkv_events_format = \"array\"\nkv_events_hashes = \"uint64\"\n"
                       "lmcache_metric_names = false\n" + kOneToken, "e.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->kv_events_format, "array");
  EXPECT_EQ(r->kv_events_hashes, "uint64");
  EXPECT_FALSE(r->lmcache_metric_names);
  EXPECT_FALSE(ParseConfig("[server]\nkv_events_format = \"json\"\n" + kOneToken, "f.toml").ok());
  EXPECT_FALSE(ParseConfig("[server]\nkv_events_hashes = \"int\"\n" + kOneToken, "g.toml").ok());
}

TEST(ServerConfigParse, MeasureTiersIsOnByDefaultAndTakesTrueOrFalse) {
  auto d = ParseConfig(kOneToken, "d.toml");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(d->measure_tiers);
  for (bool value : {true, false}) {
    auto r = ParseConfig(std::string("[server]\nmeasure_tiers = ") + (value ? "true" : "false") + "\n" + kOneToken,
                         "m.toml");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->measure_tiers, value);
  }
  for (const char* wrong : {"\"yes\"", "1", "[true]"}) {
    ExpectRefused(std::string("[server]\nmeasure_tiers = ") + wrong + "\n" + kOneToken, "server.measure_tiers");
  }
  auto r = ParseConfig("[server]\nmeasure_tiers = \"false\"\n" + kOneToken, "test.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "test.toml:2: server.measure_tiers: must be true or false, not a string"))
      << r.status().message();
}

TEST_F(ServerConfigFiles, MissingFileIsNotFound) {
  auto r = LoadConfig((dir_ / "absent.toml").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "absent.toml")) << r.status().message();
}

TEST_F(ServerConfigFiles, ErrorsInsideAFileNameIt) {
  std::string path = Write("kdnd.toml", "[server]\nlisten = 1\n" + kOneToken, 0600);
  auto r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), path + ":2: server.listen")) << r.status().message();
}

TEST_F(ServerConfigFiles, TokenFileIsReadRelativeToTheConfigAndItsNewlineStripped) {
  Write("a.token", std::string(kSecretA) + "\n", 0600);
  Write("b.token", std::string(kSecretB) + "\r\n", 0400);
  std::string path = Write("kdnd.toml",
                           "[[token]]\ntoken_file = \"a.token\"\nnamespaces = [\"a\"]\n"
                           "[[token]]\ntoken_file = \"" +
                               (dir_ / "b.token").string() + "\"\nnamespaces = [\"b\"]\n",
                           0600);
  // From another directory, so "a.token" can only be found next to the config.
  auto r = LoadConfig(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tokens.size(), 2u);
  EXPECT_EQ(r->tokens[0].token, kSecretA);
  EXPECT_EQ(r->tokens[1].token, kSecretB);
}

TEST_F(ServerConfigFiles, TokenFileOthersCanReadIsRefused) {
  std::string token = Write("a.token", std::string(kSecretA) + "\n", 0640);
  std::string path = Write("kdnd.toml", "[[token]]\ntoken_file = \"a.token\"\nnamespaces = [\"a\"]\n", 0600);
  auto r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_TRUE(Contains(m, "token[0].token_file")) << m;
  EXPECT_TRUE(Contains(m, token)) << m;
  EXPECT_TRUE(Contains(m, "0640")) << m;
  EXPECT_TRUE(Contains(m, "chmod 600")) << m;
  EXPECT_FALSE(Contains(m, kSecretA)) << m;
}

// A redis password from a file, as token files: relative to the config, its
// newline stripped, and refused when others can read it.
TEST_F(ServerConfigFiles, RedisPasswordFile) {
  Write("redis.pass", std::string(kSecretB) + "\n", 0600);
  const std::string config = "[[tier]]\nkind = \"redis\"\naddress = \"127.0.0.1:6379\"\nuser = \"kdn\"\n"
                             "password_file = \"redis.pass\"\n" + kOneToken;
  std::string path = Write("kdnd.toml", config, 0600);
  auto r = LoadConfig(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tiers.size(), 1u);
  EXPECT_EQ(r->tiers[0].token, kSecretB);
  EXPECT_EQ(r->tiers[0].user, "kdn");

  ASSERT_EQ(::chmod((dir_ / "redis.pass").c_str(), 0644), 0);
  r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_TRUE(Contains(m, "tier[0].password_file")) << m;
  EXPECT_TRUE(Contains(m, "0644")) << m;
  EXPECT_TRUE(Contains(m, "chmod 600")) << m;
  EXPECT_FALSE(Contains(m, kSecretB)) << m;
}

TEST_F(ServerConfigFiles, BadTokenFilesAreRefused) {
  std::string path = Write("kdnd.toml", "[[token]]\ntoken_file = \"t.token\"\nnamespaces = [\"a\"]\n", 0600);
  // Missing.
  auto r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "token[0].token_file")) << r.status().message();
  // Only a newline.
  Write("t.token", "\n", 0600);
  r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "empty")) << r.status().message();
  // Too short, and not echoed.
  Write("t.token", "tiny-secret\n", 0600);
  r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "too short")) << r.status().message();
  EXPECT_FALSE(Contains(r.status().message(), "tiny-secret")) << r.status().message();
  // Two lines: not one token.
  Write("t.token", std::string(kSecretA) + "\n" + kSecretB + "\n", 0600);
  r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "token[0].token_file")) << r.status().message();
  EXPECT_FALSE(Contains(r.status().message(), kSecretA)) << r.status().message();
  // A directory.
  fs::create_directory(dir_ / "t.token.d");
  std::string dir_path = Write("dir.toml", "[[token]]\ntoken_file = \"t.token.d\"\nnamespaces = [\"a\"]\n", 0600);
  r = LoadConfig(dir_path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "token[0].token_file")) << r.status().message();
}

TEST_F(ServerConfigFiles, TokenFileAndInlineTokenMayNotShareASecret) {
  Write("a.token", std::string(kSecretA) + "\n", 0600);
  std::string path =
      Write("kdnd.toml", kOneToken + "[[token]]\ntoken_file = \"a.token\"\nnamespaces = [\"b\"]\n", 0600);
  auto r = LoadConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "token[1].token_file")) << r.status().message();
  EXPECT_FALSE(Contains(r.status().message(), kSecretA)) << r.status().message();
}

TEST_F(ServerConfigFiles, ParseConfigReadsAbsoluteTokenFiles) {
  std::string token = Write("a.token", std::string(kSecretA) + "\n", 0600);
  auto r = ParseConfig("[[token]]\ntoken_file = \"" + token + "\"\nnamespaces = [\"a\"]\n", "text");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tokens.at(0).token, kSecretA);
}

TEST(ServerConfigBytes, PlainNumbersAndEveryUnit) {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"1048576", 1048576},
      {"1K", 1024},
      {"1KiB", 1024},
      {"512MiB", std::uint64_t{512} << 20},
      {"3M", std::uint64_t{3} << 20},
      {"4GiB", std::uint64_t{4} << 30},
      {"4G", std::uint64_t{4} << 30},
      {"2TiB", std::uint64_t{2} << 40},
      {"7T", std::uint64_t{7} << 40},
      {"4 GiB", std::uint64_t{4} << 30},
      {"18446744073709551615", UINT64_MAX},
      {"16777215TiB", std::uint64_t{16777215} << 40},
  };
  for (const Case& c : cases) {
    auto r = ParseBytes(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().message();
    EXPECT_EQ(*r, c.bytes) << c.text;
  }
}

TEST(ServerConfigBytes, MalformedAndOverflowingSizesAreRefused) {
  for (const char* text : {"", "GiB", "-1", "4.5GiB", "4GB", "4KB", "4gib", "4 GiBs", " 4GiB", "4Gi", "0x10",
                           "18446744073709551616", "16777216TiB", "17179869184G", "99999999999999999999999"}) {
    auto r = ParseBytes(text);
    EXPECT_FALSE(r.ok()) << '"' << text << "\" parsed as " << (r.ok() ? *r : 0);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << text;
      EXPECT_FALSE(r.status().message().empty()) << text;
    }
  }
  auto over = ParseBytes("16777216TiB");
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(Contains(over.status().message(), "too large")) << over.status().message();
}

}  // namespace
}  // namespace kdn::server
