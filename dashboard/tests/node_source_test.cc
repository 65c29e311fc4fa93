// SPDX-License-Identifier: Apache-2.0
// NodeSource against a real kdnd (server::Server on a thread of this
// process, on loopback): the snapshots it turns pushes into, with the traffic
// of real runtimes whose tier is that node; refused logins and grants; a
// node that goes away and comes back on the same port; stop.
//
// The reference model's KV comes first: its headers bring gtest's, which
// must come before Qt's keyword macros.
#include "reference_kv.h"
#include "server/config.h"
#include "server/server.h"
#include "core/runtime/runtime.h"
#include "core/engine/kv_views.h"
#include "core/keys/hash.h"

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QScopeGuard>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "node_source.h"

namespace kdn::dash {
namespace {

constexpr const char* kOpsToken = "ops-token-with-stats-0001";
constexpr const char* kTenantToken = "tenant-token-without-stats-0002";
constexpr const char* kNs = "tenant-a";

// A kdnd on a thread of this process, listening on `listen` (port 0: any).
class Kdnd {
 public:
  // With cert and key (PEM files): TLS. `tier_toml`: more keys of the host
  // tier (its quotas, say).
  explicit Kdnd(const std::string& listen, const std::string& cert = "", const std::string& key = "",
                const std::string& tier_toml = "") {
    std::string toml = std::string(R"(
[server]
listen = [")") + listen + R"("]
prefill_us_per_token = 100.0
drain_timeout_ms = 2000
)";
    if (!cert.empty()) toml += "[server.tls]\ncert = \"" + cert + "\"\nkey = \"" + key + "\"\n";
    toml += std::string(R"(
[[tier]]
kind = "host"
capacity = "64MiB"
)" + tier_toml + R"(

[[token]]
token = ")") + kOpsToken + R"("
namespaces = [")" + kNs + R"("]
stats = true
name = "ops"

[[token]]
token = ")" + kTenantToken + R"("
namespaces = [")" + kNs + R"("]
name = "tenant"
)";
    auto config = server::ParseConfig(toml, "node_source_test.toml");
    if (!config.ok()) {
      error_ = "config: " + config.status().message();
      return;
    }
    auto s = server::Server::Create(*config);
    if (!s.ok()) {
      error_ = "create: " + s.status().message();
      return;
    }
    server_ = std::move(s).value();
    thread_ = std::thread([this] { (void)server_->Run(nullptr, false); });
    auto bound = server_->WaitReady();
    if (bound.rpc.empty()) {
      error_ = "kdnd did not bind " + listen;
    } else {
      address_ = bound.rpc[0];
    }
  }
  ~Kdnd() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    server_->Shutdown();
    thread_.join();
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  std::string address_, error_;
};

NodeSourceOptions Options(const std::string& address, const std::string& token) {
  NodeSourceOptions o;
  o.address = address;
  o.token = token;
  o.interval_ms = 50;
  o.reconnect_ms = 100;
  o.timeout_ms = 2000;
  return o;
}

// A runtime whose only tier is the node (8-token chunks).
std::shared_ptr<store::Runtime> RemoteRuntime(const std::string& address) {
  store::StoreOptions o;
  o.chunk_tokens = 8;
  store::TierSpec remote;
  remote.kind = store::TierSpec::Kind::kRemote;
  remote.address = address;
  remote.token = kTenantToken;
  remote.timeout_ms = 2000;
  o.tiers = {remote};
  auto rt = store::Runtime::Create(o, 2);
  return rt.ok() ? std::move(rt).value() : nullptr;
}

Snapshot Last(const QSignalSpy& spy) { return spy.isEmpty() ? Snapshot{} : spy.last().at(0).value<Snapshot>(); }
Source::State LastState(const QSignalSpy& spy) {
  return spy.isEmpty() ? Source::State::kStopped : spy.last().at(0).value<Source::State>();
}
QString LastWhy(const QSignalSpy& spy) { return spy.isEmpty() ? QString() : spy.last().at(1).toString(); }

}  // namespace

class NodeSourceTest : public QObject {
  Q_OBJECT

 private slots:
  void snapshotsShowTheNodesTiersAndTraffic();
  void aWrongTokenIsDisconnectedWithAReason();
  void aTokenWithoutTheStatsGrantIsDisconnectedWithAReason();
  void nobodyListeningIsConnectionRefused();
  void aRestartedNodeIsReconnectedToByItself();
  void afterStopNoSignalArrives();
  void overAUnixSocket();
  void overTlsWithTheNodesCertificateAndName();
  void aSilentNodeIsTakenAsLost();
  void theNodesQuotasReachTheSnapshots();
};

void NodeSourceTest::snapshotsShowTheNodesTiersAndTraffic() {
  if (!testing::ModelsPresent()) {
    if (testing::ModelsRequired()) QFAIL("the reference model is missing (KDN_REQUIRE_MODELS=1)");
    QSKIP("the reference model is missing: set KDN_MODELS");
  }
  Kdnd kdnd("127.0.0.1:0");
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSourceOptions o = Options(kdnd.address(), kOpsToken);
  o.namespaces = {kNs};
  o.documents_ms = 100;
  NodeSource src(o);
  QCOMPARE(src.describe(), QString::fromStdString("kdnd " + kdnd.address()));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected, 10000);
  QTRY_VERIFY_WITH_TIMEOUT(!snaps.isEmpty(), 10000);
  QCOMPARE(states.first().at(0).value<Source::State>(), Source::State::kConnecting);
  {
    const Snapshot s = Last(snaps);
    QCOMPARE(s.source, src.describe());
    QCOMPARE(s.tiers.size(), 1);
    QCOMPARE(s.tiers[0].kind, QStringLiteral("host"));
    QCOMPARE(s.tiers[0].capacity_bytes, std::uint64_t{64} << 20);
    QCOMPARE(s.tiers[0].objects, std::uint64_t{0});
    // server.measure_tiers is on by default: the node timed its host tier.
    QVERIFY2(s.tiers[0].limit_bytes_per_s > 0, "the host tier's measured limit did not reach the snapshot");
    QVERIFY(!s.tiers[0].limit_from_loads);  // kdnd's measurement at start
    QCOMPARE(s.tiers[0].io_errors, std::uint64_t{0});
    QCOMPARE(s.stores, std::uint64_t{0});
    QVERIFY(s.time_ms > 0);
    // TTFT saved is a price (server.prefill_us_per_token); no token served yet to read it back from.
    QCOMPARE(s.ttft_basis, Snapshot::TtftBasis::kPriced);
    QCOMPARE(s.prefill_us_per_token, 0.0);
    QVERIFY(!s.reports_decode_failures);  // not in a node's Stats
    QCOMPARE(s.auth_failures, std::uint64_t{0});
  }

  // Real traffic: one runtime stores the reference KV on the node and
  // registers it as a document, another retrieves it from there.
  const testing::ReferenceKv ref = testing::PrefillReference(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog.");
  QVERIFY(ref.tokens.size() >= 16);
  const size_t T = ref.tokens.size();
  const std::span<const std::int32_t> tokens(reinterpret_cast<const std::int32_t*>(ref.tokens.data()), T);
  auto writer = RemoteRuntime(kdnd.address());
  QVERIFY(writer != nullptr);
  std::vector<float> in = ref.canonical;
  store::ViewSpec in_spec;
  in_spec.data = in.data();
  in_spec.size_bytes = in.size() * 4;
  auto in_views = store::ResolvedViews::Resolve(ref.m, std::vector<store::ViewSpec>{in_spec}, T);
  QVERIFY(in_views.ok());
  QVERIFY(writer->Store(ref.m, kNs, ref.Keys(), *in_views).ok());
  QVERIFY(writer->knowledge().Put(ref.m, kNs, "lily.txt", 1, "{}", tokens, *in_views).ok());
  writer->store().chain().Flush();

  auto reader = RemoteRuntime(kdnd.address());
  QVERIFY(reader != nullptr);
  std::vector<float> out(ref.canonical.size(), -7.0f);
  store::ViewSpec out_spec;
  out_spec.data = out.data();
  out_spec.size_bytes = out.size() * 4;
  auto out_views = store::ResolvedViews::Resolve(ref.m, std::vector<store::ViewSpec>{out_spec}, T);
  QVERIFY(out_views.ok());
  auto got = reader->Retrieve(ref.m, kNs, ref.Keys(), *out_views);
  QVERIFY(got.ok());
  const std::uint64_t whole = T / 8 * 8;
  QVERIFY(got->tokens >= whole);

  // A second document, fetched back: its chunks are served (credited to it)
  // and it lists first, most hit, though "lily.txt" sorts before it.
  const testing::ReferenceKv sam = testing::PrefillReference("Sam found a blue shell by the sea and gave it to his sister.");
  const size_t S = sam.tokens.size();
  std::vector<float> sam_kv = sam.canonical;
  store::ViewSpec sam_spec;
  sam_spec.data = sam_kv.data();
  sam_spec.size_bytes = sam_kv.size() * 4;
  auto sam_views = store::ResolvedViews::Resolve(sam.m, std::vector<store::ViewSpec>{sam_spec}, S);
  QVERIFY(sam_views.ok());
  const std::span<const std::int32_t> sam_tokens(reinterpret_cast<const std::int32_t*>(sam.tokens.data()), S);
  QVERIFY(writer->knowledge().Put(sam.m, kNs, "sam.txt", 1, "{}", sam_tokens, *sam_views).ok());
  writer->store().chain().Flush();
  std::vector<std::int32_t> fetched;
  QVERIFY(writer->knowledge().Fetch(sam.m, kNs, "sam.txt", &*sam_views, S, &fetched).ok());
  QCOMPARE(fetched.size(), S);

  QTRY_VERIFY_WITH_TIMEOUT(Last(snaps).loads > 0 && Last(snaps).documents_top.size() == 2 &&
                               Last(snaps).documents_top[0].hits > 0,
                           10000);
  const Snapshot s = Last(snaps);
  QVERIFY(s.stores >= T / 8);
  // The runtime's lookups told the node the tokens they cover: found whole.
  QVERIFY(s.requested_tokens >= whole);
  QVERIFY(s.hit_tokens >= whole);
  QVERIFY(s.hit_tokens <= s.requested_tokens);
  QVERIFY(s.served_tokens >= whole);
  QVERIFY(s.loads >= T / 8);
  QCOMPARE(s.tiers.size(), 1);
  QVERIFY(s.tiers[0].objects >= T / 8);
  QVERIFY(s.tiers[0].used_bytes > 0);
  QVERIFY(s.tiers[0].puts >= T / 8);
  QCOMPARE(s.documents, std::uint64_t{2});
  QCOMPARE(s.documents_top[0].ns, QString::fromLatin1(kNs));
  QCOMPARE(s.documents_top[0].doc_id, QStringLiteral("sam.txt"));
  QCOMPARE(s.documents_top[1].doc_id, QStringLiteral("lily.txt"));
  QCOMPARE(s.documents_top[1].hits, std::uint64_t{0});
  QVERIFY(s.documents_top[1].chunks > 0);
  QCOMPARE(s.documents_top[1].chunks_held, s.documents_top[1].chunks);
  // TTFT saved: the node's hit tokens x its 100 us per token, the price read back.
  QCOMPARE(s.ttft_saved_ms, static_cast<double>(s.served_tokens) * 100.0 / 1000.0);
  QCOMPARE(s.ttft_basis, Snapshot::TtftBasis::kPriced);
  QVERIFY2(std::abs(s.prefill_us_per_token - 100.0) < 1e-9, qPrintable(QString::number(s.prefill_us_per_token)));
  QVERIFY(s.delivery_ms > 0);
  QCOMPARE(s.corrupt_detected, std::uint64_t{0});
  // Cumulative: later snapshots never go back.
  for (int i = 1; i < snaps.size(); ++i) {
    QVERIFY(snaps.at(i).at(0).value<Snapshot>().stores >= snaps.at(i - 1).at(0).value<Snapshot>().stores);
  }
  // A login with a token the node does not know is a refused call: the
  // events' "Auth failures" (a fault) counts it.
  {
    NodeSource stranger(Options(kdnd.address(), "not-a-token-the-node-knows"));
    stranger.start();
    QTRY_VERIFY_WITH_TIMEOUT(stranger.state() == Source::State::kDisconnected, 10000);
    stranger.stop();
  }
  QTRY_VERIFY_WITH_TIMEOUT(Last(snaps).auth_failures >= 1, 10000);
  src.stop();
  QCOMPARE(src.state(), Source::State::kStopped);
}

void NodeSourceTest::aWrongTokenIsDisconnectedWithAReason() {
  Kdnd kdnd("127.0.0.1:0");
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSource src(Options(kdnd.address(), "not-a-token-the-node-knows"));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kDisconnected, 10000);
  QCOMPARE(LastState(states), Source::State::kDisconnected);
  qInfo() << "why:" << LastWhy(states);
  QVERIFY2(LastWhy(states).contains(QStringLiteral("bad token")), qPrintable(LastWhy(states)));
  // It keeps trying (and failing) without a snapshot or a change of state.
  QTest::qWait(400);
  QCOMPARE(snaps.size(), 0);
  QCOMPARE(src.state(), Source::State::kDisconnected);
}

void NodeSourceTest::aTokenWithoutTheStatsGrantIsDisconnectedWithAReason() {
  Kdnd kdnd("127.0.0.1:0");
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSource src(Options(kdnd.address(), kTenantToken));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kDisconnected, 10000);
  qInfo() << "why:" << LastWhy(states);
  QVERIFY2(LastWhy(states).contains(QStringLiteral("permission denied")), qPrintable(LastWhy(states)));
  QVERIFY2(LastWhy(states).contains(QStringLiteral("stats grant")), qPrintable(LastWhy(states)));
  QTest::qWait(200);
  QCOMPARE(snaps.size(), 0);
}

void NodeSourceTest::nobodyListeningIsConnectionRefused() {
  std::string address;
  {
    Kdnd kdnd("127.0.0.1:0");  // a port that was free a moment ago
    QVERIFY2(kdnd.ok(), kdnd.error().c_str());
    address = kdnd.address();
  }
  NodeSource src(Options(address, kOpsToken));
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kDisconnected, 10000);
  QVERIFY2(LastWhy(states).contains(QStringLiteral("connection refused")), qPrintable(LastWhy(states)));
}

void NodeSourceTest::aRestartedNodeIsReconnectedToByItself() {
  auto kdnd = std::make_unique<Kdnd>("127.0.0.1:0");
  QVERIFY2(kdnd->ok(), kdnd->error().c_str());
  const std::string address = kdnd->address();
  NodeSource src(Options(address, kOpsToken));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected && snaps.size() >= 2, 10000);

  kdnd->Stop();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kDisconnected, 10000);
  qInfo() << "why:" << LastWhy(states);
  QVERIFY2(!LastWhy(states).isEmpty(), "a disconnection says why");
  const qsizetype before = snaps.size();
  QTest::qWait(300);  // while it is down: retries, no snapshots
  QCOMPARE(snaps.size(), before);
  QCOMPARE(src.state(), Source::State::kDisconnected);

  kdnd.reset();
  QElapsedTimer since_restart;
  since_restart.start();
  kdnd = std::make_unique<Kdnd>(address);  // the same port again
  QVERIFY2(kdnd->ok(), kdnd->error().c_str());
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected, 10000);
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() > before + 1, 10000);
  // From the new node: up for less than since its restart (the old one had
  // been up longer than that).
  QVERIFY(Last(snaps).uptime_ms <= static_cast<std::uint64_t>(since_restart.elapsed()));
  QCOMPARE(LastState(states), Source::State::kConnected);
  src.stop();
}

void NodeSourceTest::afterStopNoSignalArrives() {
  Kdnd kdnd("127.0.0.1:0");
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSource src(Options(kdnd.address(), kOpsToken));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() >= 3, 10000);
  QElapsedTimer t;
  t.start();
  src.stop();
  QVERIFY2(t.elapsed() < 2000, "stop() returns promptly");
  QCOMPARE(src.state(), Source::State::kStopped);
  QCOMPARE(LastState(states), Source::State::kStopped);
  const qsizetype snapshots = snaps.size(), changes = states.size();
  QTest::qWait(400);  // pushes come every 50 ms: any queued or late one would show
  QCOMPARE(snaps.size(), snapshots);
  QCOMPARE(states.size(), changes);

  // It can start again.
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() > snapshots, 10000);
  QCOMPARE(src.state(), Source::State::kConnected);
}

void NodeSourceTest::overAUnixSocket() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::string address = "unix:" + dir.filePath(QStringLiteral("kdnd.sock")).toStdString();
  Kdnd kdnd(address);
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSource src(Options(address, kOpsToken));
  QSignalSpy snaps(&src, &Source::snapshot);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected && !snaps.isEmpty(), 10000);
  QCOMPARE(Last(snaps).tiers.size(), 1);
  QCOMPARE(Last(snaps).source, QString::fromStdString("kdnd " + address));
}

// A kdnd serving TLS: reached when its certificate is trusted and named;
// the wrong name, or a CA file that cannot be read, is a disconnection
// that says why.
void NodeSourceTest::overTlsWithTheNodesCertificateAndName() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::string cert = dir.filePath(QStringLiteral("cert.pem")).toStdString();
  const std::string key = dir.filePath(QStringLiteral("key.pem")).toStdString();
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=kdnd.test "
      "-addext subjectAltName=DNS:kdnd.test -keyout " + key + " -out " + cert + " > /dev/null 2>&1";
  QVERIFY2(std::system(cmd.c_str()) == 0, "openssl could not make a certificate");
  QVERIFY(QFile::setPermissions(QString::fromStdString(key), QFile::ReadOwner | QFile::WriteOwner));
  Kdnd kdnd("127.0.0.1:0", cert, key);
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());

  NodeSourceOptions o = Options(kdnd.address(), kOpsToken);
  o.tls_ca_file = cert;
  o.tls_server_name = "kdnd.test";
  NodeSource trusted(o);
  QSignalSpy snaps(&trusted, &Source::snapshot);
  trusted.start();
  QTRY_VERIFY_WITH_TIMEOUT(trusted.state() == Source::State::kConnected && !snaps.isEmpty(), 10000);
  QCOMPARE(Last(snaps).tiers.size(), 1);
  trusted.stop();

  o.tls_server_name = "other.test";
  NodeSource misnamed(o);
  QSignalSpy misnamed_states(&misnamed, &Source::stateChanged);
  QSignalSpy misnamed_snaps(&misnamed, &Source::snapshot);
  misnamed.start();
  QTRY_VERIFY_WITH_TIMEOUT(misnamed.state() == Source::State::kDisconnected, 10000);
  qInfo() << "why:" << LastWhy(misnamed_states);
  QVERIFY(!LastWhy(misnamed_states).isEmpty());
  QCOMPARE(misnamed_snaps.size(), 0);

  o.tls_server_name = "kdnd.test";
  o.tls_ca_file = dir.filePath(QStringLiteral("missing.pem")).toStdString();
  NodeSource unreadable(o);
  QSignalSpy unreadable_states(&unreadable, &Source::stateChanged);
  unreadable.start();
  QTRY_VERIFY_WITH_TIMEOUT(unreadable.state() == Source::State::kDisconnected, 10000);
  QVERIFY2(LastWhy(unreadable_states).contains(QStringLiteral("TLS CA file")), qPrintable(LastWhy(unreadable_states)));

  // Plain TCP to a TLS node gets nowhere either.
  NodeSource plain(Options(kdnd.address(), kOpsToken));
  QSignalSpy plain_snaps(&plain, &Source::snapshot);
  plain.start();
  QTRY_VERIFY_WITH_TIMEOUT(plain.state() == Source::State::kDisconnected, 10000);
  QCOMPARE(plain_snaps.size(), 0);
}

// A kdnd process that stops answering (SIGSTOP) keeps its connection open
// but pushes nothing: the source gives it up after 4 x interval + timeout,
// and is back once the process runs again (SIGCONT).
void NodeSourceTest::aSilentNodeIsTakenAsLost() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const QString config = dir.filePath(QStringLiteral("kdnd.toml"));
  const QString ready = dir.filePath(QStringLiteral("ready"));
  {
    QFile f(config);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QStringLiteral("[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[token]]\ntoken = \"%1\"\nnamespaces = [\"%2\"]\nstats = true\n")
                .arg(QString::fromLatin1(kOpsToken), QString::fromLatin1(kNs))
                .toUtf8());
  }
  QVERIFY(QFile::setPermissions(config, QFile::ReadOwner | QFile::WriteOwner));
  QProcess kdnd;
  kdnd.setProcessChannelMode(QProcess::ForwardedChannels);
  kdnd.start(QStringLiteral(KDND_PATH), {QStringLiteral("--config"), config, QStringLiteral("--ready-file"), ready});
  QVERIFY2(kdnd.waitForStarted(10000), "kdnd did not start");
  QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(ready), 20000);
  auto guard = qScopeGuard([&] {
    if (kdnd.state() == QProcess::NotRunning) return;
    ::kill(static_cast<pid_t>(kdnd.processId()), SIGCONT);
    kdnd.kill();
    kdnd.waitForFinished(10000);
  });
  QFile r(ready);
  QVERIFY(r.open(QIODevice::ReadOnly));
  std::string address;  // the line "rpc <address>"
  for (const QByteArray& line : r.readAll().split('\n')) {
    if (line.startsWith("rpc ")) address = line.mid(4).trimmed().toStdString();
  }
  QVERIFY(!address.empty());

  NodeSourceOptions o = Options(address, kOpsToken);
  o.timeout_ms = 500;  // silent for 4 x 50 + 500 ms: lost
  NodeSource src(o);
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected && !snaps.isEmpty(), 10000);

  const auto pid = static_cast<pid_t>(kdnd.processId());
  QCOMPARE(::kill(pid, SIGSTOP), 0);
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kDisconnected, 10000);
  qInfo() << "why:" << LastWhy(states);
  QVERIFY2(LastWhy(states).contains(QStringLiteral("no statistics")), qPrintable(LastWhy(states)));
  const qsizetype before = snaps.size();
  QCOMPARE(::kill(pid, SIGCONT), 0);
  QTRY_VERIFY_WITH_TIMEOUT(src.state() == Source::State::kConnected, 10000);
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() > before, 10000);
  src.stop();
  kdnd.terminate();
  QVERIFY(kdnd.waitForFinished(10000));
  QCOMPARE(kdnd.exitCode(), 0);
}

// A node whose host tier gives tenant-a a quota of four 4 KiB pages: the
// snapshots carry that quota (Stats.quotas, protocol 5) with what the node
// counts: the tenant's bytes and chunks within the quota, and the chunks its
// own puts evicted to stay within it.
void NodeSourceTest::theNodesQuotasReachTheSnapshots() {
  Kdnd kdnd("127.0.0.1:0", "", "", std::string("quotas = { \"") + kNs + "\" = \"16KiB\" }\nhigh_watermark = 1.0\nlow_watermark = 1.0\n");
  QVERIFY2(kdnd.ok(), kdnd.error().c_str());
  NodeSource src(Options(kdnd.address(), kOpsToken));
  QSignalSpy snaps(&src, &Source::snapshot);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(!snaps.isEmpty(), 10000);
  {
    const Snapshot s = Last(snaps);
    QCOMPARE(s.quotas.size(), 1);  // configured: there before any chunk
    QCOMPARE(s.quotas[0].ns, QString::fromLatin1(kNs));
    QCOMPARE(s.quotas[0].tier, s.tiers[0].name);
    QCOMPARE(s.quotas[0].tier_index, 0);
    QCOMPARE(s.quotas[0].quota_bytes, std::uint64_t{16} << 10);
    QCOMPARE(s.quotas[0].used_bytes, std::uint64_t{0});
  }

  // Sixteen one-chunk prompts of a small model (2 layers, 2 KV heads of 4
  // dims, 8 tokens: a chunk within one page).
  store::ModelKv model;
  keys::ModelIdentity id;
  id.layers = 2;
  id.kv_heads = 2;
  id.head_dim = id.rotary_dim = 4;
  id.fingerprint = "dashboard-quotas";
  model.fingerprint = keys::ModelFingerprint(id);
  model.shape = {2, 2, 4, 4};
  std::vector<float> kv(2 * 2 * 8 * 2 * 4);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i) + 0.5f;
  store::ViewSpec spec;
  spec.data = kv.data();
  spec.size_bytes = kv.size() * 4;
  auto views = store::ResolvedViews::Resolve(model, std::vector<store::ViewSpec>{spec}, 8);
  QVERIFY(views.ok());
  auto writer = RemoteRuntime(kdnd.address());
  QVERIFY(writer != nullptr);
  constexpr int kPrompts = 16;
  for (int i = 0; i < kPrompts; ++i) {
    std::vector<std::int32_t> t(8);
    for (int j = 0; j < 8; ++j) t[static_cast<size_t>(j)] = 1 + i * 8 + j;
    store::TokenKeys k;
    k.tokens = t;
    QVERIFY(writer->Store(model, kNs, k, *views).ok());
    writer->store().chain().Flush();
  }
  QTRY_VERIFY_WITH_TIMEOUT(!Last(snaps).quotas.isEmpty() && Last(snaps).quotas[0].quota_evictions > 0, 10000);
  const Snapshot s = Last(snaps);
  QCOMPARE(s.quotas.size(), 1);
  const QuotaSample& q = s.quotas[0];
  QCOMPARE(q.ns, QString::fromLatin1(kNs));
  QVERIFY(q.used_bytes > 0);
  QVERIFY(q.used_bytes <= q.quota_bytes);
  QVERIFY(q.objects > 0);
  QCOMPARE(q.objects + q.quota_evictions, std::uint64_t{kPrompts});  // each chunk held or evicted by its own
  QCOMPARE(q.room_evictions, std::uint64_t{0});
  QCOMPARE(q.refused, std::uint64_t{0});
  src.stop();
}

}  // namespace kdn::dash

QTEST_GUILESS_MAIN(kdn::dash::NodeSourceTest)
#include "node_source_test.moc"
