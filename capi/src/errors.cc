// SPDX-License-Identifier: Apache-2.0
// The C ABI: versions, status strings and the thread's last error message.
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

uint32_t kdn_version_number(void) { return KDN_VERSION_NUMBER; }

const char* kdn_version(void) {
#define KDN_STR2(x) #x
#define KDN_STR(x) KDN_STR2(x)
  return KDN_STR(KDN_VERSION_MAJOR) "." KDN_STR(KDN_VERSION_MINOR) "." KDN_STR(KDN_VERSION_PATCH);
}

const char* kdn_status_string(kdn_status status) {
  switch (status) {
    case KDN_OK: return "KDN_OK";
    case KDN_ERR_INVALID_ARGUMENT: return "KDN_ERR_INVALID_ARGUMENT";
    case KDN_ERR_NOT_FOUND: return "KDN_ERR_NOT_FOUND";
    case KDN_ERR_BUSY: return "KDN_ERR_BUSY";
    case KDN_ERR_UNAVAILABLE: return "KDN_ERR_UNAVAILABLE";
    case KDN_ERR_CORRUPT: return "KDN_ERR_CORRUPT";
    case KDN_ERR_UNSUPPORTED: return "KDN_ERR_UNSUPPORTED";
    case KDN_ERR_NO_MEMORY: return "KDN_ERR_NO_MEMORY";
    case KDN_ERR_INTERNAL: return "KDN_ERR_INTERNAL";
    case KDN_ERR_TIMEOUT: return "KDN_ERR_TIMEOUT";
    case KDN_ERR_CANCELLED: return "KDN_ERR_CANCELLED";
    case KDN_ERR_VERSION: return "KDN_ERR_VERSION";
    case KDN_ERR_BUFFER_TOO_SMALL: return "KDN_ERR_BUFFER_TOO_SMALL";
    default: return "KDN_ERR_UNKNOWN";
  }
}

const char* kdn_last_error_message(void) { return g_last_error.c_str(); }

}  // extern "C"
