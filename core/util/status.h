// SPDX-License-Identifier: Apache-2.0
// Expected failures as values. Status carries a code (mirroring kdn_status)
// and a human message; Result<T> is a value or a Status.
// Thread-safety: plain values; no shared state.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kdn {

enum class Code : int {
  kOk = 0,
  kInvalidArgument = -1,
  kNotFound = -2,
  kBusy = -3,  // overloaded or full for now: retry later
  kUnavailable = -4,
  kCorrupt = -5,
  kUnsupported = -6,
  kNoMemory = -7,
  kInternal = -8,
  kTimeout = -9,         // a wait ran out of time; the operation goes on
  kCancelled = -10,      // the operation was cancelled
  kVersion = -11,        // a struct of a caller built against another version
  kBufferTooSmall = -12, // an output buffer is too small (the call says how much is needed)
  // Two codes of kdnd's service that kdn.h has no status for yet: they
  // never leave a node as such (the RPC layer sends them as the schema's
  // typed errors) and the C shim reports them as KDN_ERR_UNAVAILABLE and
  // KDN_ERR_INVALID_ARGUMENT should one reach it (capi/src/shim.h AbiStatus).
  kPermissionDenied = -13,  // the caller's grant does not cover it
  kTooLarge = -14,          // beyond a bound the receiver enforces
};
// The last code: a new one goes below it and becomes this (the C shim checks
// every code down to it against kdn.h's statuses, capi/src/shim.h).
inline constexpr Code kLowestCode = Code::kTooLarge;

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Corrupt(std::string m) { return {Code::kCorrupt, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status Busy(std::string m) { return {Code::kBusy, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
  static Status TooLarge(std::string m) { return {Code::kTooLarge, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}     // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace kdn

// Returns early from a function returning Status or Result<T> on failure.
#define KDN_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::kdn::Status kdn_status_tmp_ = (expr);  \
    if (!kdn_status_tmp_.ok()) return kdn_status_tmp_; \
  } while (0)
