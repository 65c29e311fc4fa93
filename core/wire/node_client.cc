// SPDX-License-Identifier: Apache-2.0
#include "core/wire/node_client.h"

#include <arpa/inet.h>
#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include <kj/debug.h>

#include "core/wire/rpc.h"

namespace kdn::wire {
namespace {

// Marks a refusal's description, so that IsRefusal knows it from the
// transport's own failures.
constexpr char kRefused[] = "kdnd refused ";

std::string RefusalText(std::string_view call, node::Error::Reader error) {
  std::string why;
  switch (error.getCode()) {
    case node::ErrorCode::UNAUTHENTICATED: why = "bad token"; break;
    case node::ErrorCode::PERMISSION_DENIED: why = "permission denied"; break;
    case node::ErrorCode::UNAVAILABLE: why = "kdnd is draining (shutting down)"; break;
    case node::ErrorCode::INVALID_ARGUMENT: why = "invalid argument"; break;
    case node::ErrorCode::TOO_LARGE: why = "too large"; break;
    case node::ErrorCode::CORRUPT: why = "corrupt"; break;
    case node::ErrorCode::BUSY: why = "busy"; break;
    case node::ErrorCode::NOT_FOUND: why = "not found"; break;
    default: why = "error " + std::to_string(static_cast<int>(error.getCode())); break;
  }
  const std::string message = error.getMessage().cStr();
  if (!message.empty() && error.getCode() != node::ErrorCode::UNAUTHENTICATED) why += ": " + message;
  return std::string(kRefused) + std::string(call) + ": " + why;
}

}  // namespace

Status CheckNodeAddress(std::string_view address, bool listening) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("address '" + std::string(address) + "': " + why);
  };
  if (address.empty()) return bad("empty");
  for (char ch : address) {
    if (static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f) return bad("has a space or a control character");
  }
  if (address.substr(0, 5) == "unix:") {
    const std::string_view path = address.substr(5);
    if (path.empty()) return bad("a unix socket needs a path (unix:/path)");
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return bad("a unix socket's path has at most " + std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
    }
    return Status::Ok();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return bad("no port (want host:port, [v6]:port or unix:/path)");
  std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  std::uint32_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p > 65535) {
    return bad("the port must be a number from " + std::string(listening ? "0" : "1") + " to 65535");
  }
  if (p == 0 && !listening) return bad("port 0 is no port to connect to");
  if (host.empty()) return bad("no host");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("an IPv6 address goes in brackets: [v6]:port");
    in6_addr v6{};
    if (inet_pton(AF_INET6, std::string(host.substr(1, host.size() - 2)).c_str(), &v6) != 1) {
      return bad("not an IPv6 address in the brackets");
    }
    return Status::Ok();
  }
  if (host == "*") return listening ? Status::Ok() : bad("'*' is an address to listen at, not to connect to");
  for (char ch : host) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_')) {
      return bad(ch == ':' ? "an IPv6 address goes in brackets: [v6]:port" : "not a host name or IP address");
    }
  }
  return Status::Ok();
}

std::string TlsServerName(const NodeEndpoint& endpoint) {
  if (!endpoint.tls_server_name.empty()) return endpoint.tls_server_name;
  std::string host = endpoint.address.substr(0, endpoint.address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

Status RefusalStatus(std::string_view call, node::Error::Reader error) {
  Code code = Code::kInternal;
  switch (error.getCode()) {
    case node::ErrorCode::OK: return Status::Ok();
    case node::ErrorCode::INVALID_ARGUMENT: code = Code::kInvalidArgument; break;
    case node::ErrorCode::UNAUTHENTICATED:
    case node::ErrorCode::PERMISSION_DENIED: code = Code::kPermissionDenied; break;
    case node::ErrorCode::TOO_LARGE: code = Code::kTooLarge; break;
    case node::ErrorCode::CORRUPT: code = Code::kCorrupt; break;
    case node::ErrorCode::BUSY: code = Code::kBusy; break;
    case node::ErrorCode::UNAVAILABLE: code = Code::kUnavailable; break;
    case node::ErrorCode::NOT_FOUND: code = Code::kNotFound; break;
    default: break;
  }
  return Status(code, RefusalText(call, error));
}

kj::Exception RefusalException(std::string_view call, node::Error::Reader error) {
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(RefusalText(call, error).c_str()));
}

bool IsRefusal(const kj::Exception& e) { return e.getDescription().startsWith(kRefused); }

std::string DescribeFailure(const kj::Exception& e, std::uint32_t timeout_ms) {
  const std::string d = e.getDescription().cStr();
  if (IsRefusal(e)) return d;
  std::string lower = d;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.find("refused") != std::string::npos) return "connection refused";
  if (e.getType() == kj::Exception::Type::OVERLOADED && lower.find("timed out") != std::string::npos) {
    return "no answer from kdnd within " + std::to_string(timeout_ms) + " ms";
  }
  if (e.getType() == kj::Exception::Type::DISCONNECTED) return "kdnd closed the connection (" + d + ")";
  return "cannot reach kdnd: " + d;
}

NodeConnection::NodeConnection(kj::Own<kj::AsyncIoStream>&& stream)
    : stream_(kj::mv(stream)),
      buffers_(std::make_shared<StreamBuffers>()),
      messages_(*stream_, buffers_),
      network_(messages_, capnp::rpc::twoparty::Side::CLIENT, RpcReaderOptions()),
      rpc_(capnp::makeRpcClient(network_)),
      node_(rpc_.bootstrap(capnp::MallocMessageBuilder().getRoot<capnp::rpc::twoparty::VatId>().asReader())
                .castAs<node::KdnNode>()),
      session_(nullptr) {}

Result<std::unique_ptr<NodeConnector>> NodeConnector::Create(NodeEndpoint endpoint) {
  if (endpoint.address.empty()) return Status::InvalidArgument("no kdnd address given");
  if (Status st = CheckNodeAddress(endpoint.address); !st.ok()) return Status::InvalidArgument("kdnd " + st.message());
  if (endpoint.token.empty()) return Status::InvalidArgument("no token given to log in to kdnd with");
  std::unique_ptr<NodeConnector> c(new NodeConnector(std::move(endpoint)));
  const std::string& ca = c->endpoint_.tls_ca_file;
  if (ca.empty()) return c;
  std::ifstream in(ca);
  std::ostringstream pem;
  pem << in.rdbuf();
  if (!in || pem.str().empty()) return Status::InvalidArgument("cannot read the TLS CA file " + ca);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
                c->trusted_ = kj::heap<kj::TlsCertificate>(kj::StringPtr(pem.str().c_str()));
                kj::TlsContext::Options o;
                o.useSystemTrustStore = false;
                o.trustedCertificates = kj::arrayPtr(c->trusted_.get(), 1);
                c->tls_ = kj::heap<kj::TlsContext>(kj::mv(o));
              })) {
    return Status::InvalidArgument("bad TLS CA file " + ca + ": " + e->getDescription().cStr());
  }
  c->server_name_ = kj::heapString(TlsServerName(c->endpoint_).c_str());
  return c;
}

kj::Promise<kj::Own<NodeConnection>> NodeConnector::Connect(kj::Network& network) {
  return network.parseAddress(endpoint_.address)
      .then([](kj::Own<kj::NetworkAddress>&& addr) { return addr->connect().attach(kj::mv(addr)); })
      .then([this](kj::Own<kj::AsyncIoStream>&& stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        if (tls_.get() != nullptr) return tls_->wrapClient(kj::mv(stream), server_name_);
        return kj::mv(stream);
      })
      .then([this](kj::Own<kj::AsyncIoStream>&& stream) {
        auto conn = kj::heap<NodeConnection>(kj::mv(stream));
        auto req = conn->node_.loginRequest();
        req.setToken(endpoint_.token);
        return req.send().then(
            [conn = kj::mv(conn)](capnp::Response<node::KdnNode::LoginResults>&& r) mutable -> kj::Own<NodeConnection> {
              if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(RefusalException("login", r.getError()));
              conn->session_ = r.getSession();
              return kj::mv(conn);
            });
      });
}

}  // namespace kdn::wire
