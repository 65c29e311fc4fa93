// SPDX-License-Identifier: Apache-2.0
// Static-model rANS over bytes; formats and contracts in rans.h, state math in
// kernels/common/rans.h.
#include "core/codec/rans.h"

#include <cmath>
#include <queue>
#include <utility>
#include <string>

#include "kernels/common/rans.h"

namespace kdn::codec::rans {
namespace {

using kernels::kRansLow;

Status CheckLanes(std::uint32_t lanes) {
  if (lanes < 1 || lanes > kMaxLanes) {
    return Status::InvalidArgument("rans: lanes must be in [1, " + std::to_string(kMaxLanes) + "], got " +
                                   std::to_string(lanes));
  }
  return Status::Ok();
}

// Code-length change (in bits, times the count) of moving a symbol's
// frequency from f to f + 1 (a saving) or f to f - 1 (a cost).
double GainUp(std::uint64_t count, std::uint32_t f) {
  return static_cast<double>(count) * std::log2(static_cast<double>(f + 1) / static_cast<double>(f));
}
double CostDown(std::uint64_t count, std::uint32_t f) {
  return static_cast<double>(count) * std::log2(static_cast<double>(f) / static_cast<double>(f - 1));
}

void PutVarint(std::uint32_t v, std::vector<std::uint8_t>* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<std::uint8_t>(v));
}

// Reads a varint of at most `max_bytes` bytes with no overlong form.
bool GetVarint(std::span<const std::uint8_t> data, std::size_t* pos, std::size_t max_bytes, std::uint32_t* v) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < max_bytes; ++i) {
    if (*pos >= data.size()) return false;
    const std::uint8_t b = data[(*pos)++];
    value |= static_cast<std::uint32_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      if (b == 0 && i > 0) return false;  // overlong
      *v = value;
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::uint64_t> Histogram(std::span<const std::uint8_t> symbols) {
  std::vector<std::uint64_t> counts(kMaxAlphabet, 0);
  for (std::uint8_t s : symbols) ++counts[s];
  while (!counts.empty() && counts.back() == 0) counts.pop_back();
  return counts;
}

Result<FreqTable> BuildTable(std::span<const std::uint64_t> counts, std::uint32_t scale_bits) {
  if (scale_bits < 1 || scale_bits > kMaxScaleBits) {
    return Status::InvalidArgument("rans: scale_bits must be in [1, 15], got " + std::to_string(scale_bits));
  }
  const std::size_t n = counts.size();
  if (n < 1 || n > kMaxAlphabet) {
    return Status::InvalidArgument("rans: alphabet size must be in [1, 256], got " + std::to_string(n));
  }
  const std::uint32_t total_slots = 1u << scale_bits;
  std::uint64_t total = 0;
  std::size_t present = 0;
  for (std::uint64_t c : counts) {
    if (__builtin_add_overflow(total, c, &total)) return Status::InvalidArgument("rans: counts overflow");
    present += c != 0;
  }
  if (present > total_slots) {
    return Status::InvalidArgument("rans: " + std::to_string(present) + " symbols do not fit 2^" +
                                   std::to_string(scale_bits) + " slots");
  }

  FreqTable t;
  t.scale_bits = scale_bits;
  t.freq.assign(n, 0);
  if (total == 0) {
    t.freq[0] = static_cast<std::uint16_t>(total_slots);
  } else {
    std::vector<std::uint32_t> f(n, 0);
    std::int64_t sum = 0;
    const long double scale = static_cast<long double>(total_slots) / static_cast<long double>(total);
    for (std::size_t s = 0; s < n; ++s) {
      if (counts[s] == 0) continue;
      long double x = std::floor(static_cast<long double>(counts[s]) * scale + 0.5L);
      if (x < 1) x = 1;
      if (x > total_slots) x = total_slots;
      f[s] = static_cast<std::uint32_t>(x);
      sum += f[s];
    }
    // Fix the sum one unit at a time where it costs the fewest coded bits
    // (ties: the lowest symbol), keeping candidates in a heap: O(n log n).
    using Entry = std::pair<double, std::size_t>;  // (priority, symbol)
    auto worse = [](const Entry& a, const Entry& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    };
    if (sum < static_cast<std::int64_t>(total_slots)) {
      std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> up(worse);
      for (std::size_t s = 0; s < n; ++s) {
        if (counts[s] != 0) up.emplace(GainUp(counts[s], f[s]), s);
      }
      for (; sum < static_cast<std::int64_t>(total_slots); ++sum) {
        const std::size_t s = up.top().second;
        up.pop();
        ++f[s];
        up.emplace(GainUp(counts[s], f[s]), s);
      }
    } else if (sum > static_cast<std::int64_t>(total_slots)) {
      // Least cost first: the priority is the negated cost.
      std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> down(worse);
      for (std::size_t s = 0; s < n; ++s) {
        if (f[s] > 1) down.emplace(-CostDown(counts[s], f[s]), s);
      }
      for (; sum > static_cast<std::int64_t>(total_slots); --sum) {
        // present <= total_slots < sum guarantees some f > 1.
        const std::size_t s = down.top().second;
        down.pop();
        --f[s];
        if (f[s] > 1) down.emplace(-CostDown(counts[s], f[s]), s);
      }
    }
    for (std::size_t s = 0; s < n; ++s) t.freq[s] = static_cast<std::uint16_t>(f[s]);
  }
  t.cum.assign(n + 1, 0);
  for (std::size_t s = 0; s < n; ++s) t.cum[s + 1] = t.cum[s] + t.freq[s];
  return t;
}

Status ValidateTable(const FreqTable& t) {
  if (t.scale_bits < 1 || t.scale_bits > kMaxScaleBits) return Status::InvalidArgument("rans: bad scale_bits");
  const std::size_t n = t.freq.size();
  if (n < 1 || n > kMaxAlphabet) return Status::InvalidArgument("rans: bad alphabet size");
  if (t.cum.size() != n + 1 || t.cum[0] != 0) return Status::InvalidArgument("rans: bad cum size");
  for (std::size_t s = 0; s < n; ++s) {
    if (t.cum[s + 1] != t.cum[s] + t.freq[s]) return Status::InvalidArgument("rans: cum is not the prefix sum");
  }
  if (t.cum[n] != (1u << t.scale_bits)) return Status::InvalidArgument("rans: frequencies do not sum to 2^scale");
  return Status::Ok();
}

void SerializeTable(const FreqTable& t, std::vector<std::uint8_t>* out) {
  out->push_back(static_cast<std::uint8_t>(t.scale_bits));
  PutVarint(static_cast<std::uint32_t>(t.freq.size()), out);
  for (std::uint16_t f : t.freq) PutVarint(f, out);
}

Result<FreqTable> ParseTable(std::span<const std::uint8_t> data, std::size_t* consumed) {
  std::size_t pos = 0;
  if (data.empty()) return Status::Corrupt("rans table: empty");
  FreqTable t;
  t.scale_bits = data[pos++];
  if (t.scale_bits < 1 || t.scale_bits > kMaxScaleBits) {
    return Status::Corrupt("rans table: bad scale_bits " + std::to_string(t.scale_bits));
  }
  std::uint32_t n = 0;
  if (!GetVarint(data, &pos, 2, &n)) return Status::Corrupt("rans table: truncated or bad alphabet size");
  if (n < 1 || n > kMaxAlphabet) return Status::Corrupt("rans table: bad alphabet size " + std::to_string(n));
  const std::uint32_t total_slots = 1u << t.scale_bits;
  t.freq.resize(n);
  t.cum.assign(n + 1, 0);
  for (std::uint32_t s = 0; s < n; ++s) {
    std::uint32_t f = 0;
    if (!GetVarint(data, &pos, 3, &f)) return Status::Corrupt("rans table: truncated or bad frequency");
    if (f > total_slots) return Status::Corrupt("rans table: frequency above 2^scale");
    t.freq[s] = static_cast<std::uint16_t>(f);
    t.cum[s + 1] = t.cum[s] + f;  // <= 256 * 2^15: no overflow
  }
  if (t.cum[n] != total_slots) {
    return Status::Corrupt("rans table: frequencies sum to " + std::to_string(t.cum[n]) + ", not " +
                           std::to_string(total_slots));
  }
  if (consumed != nullptr) *consumed = pos;
  return t;
}

std::vector<std::uint8_t> BuildSlotTable(const FreqTable& t) {
  std::vector<std::uint8_t> slots(std::size_t{1} << t.scale_bits, 0);
  for (std::size_t s = 0; s < t.freq.size(); ++s) {
    for (std::uint32_t k = t.cum[s]; k < t.cum[s + 1]; ++k) slots[k] = static_cast<std::uint8_t>(s);
  }
  return slots;
}

Result<std::vector<std::uint8_t>> Encode(std::span<const std::uint8_t> symbols, const FreqTable& t,
                                         std::uint32_t lanes) {
  KDN_RETURN_IF_ERROR(ValidateTable(t));
  KDN_RETURN_IF_ERROR(CheckLanes(lanes));
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    const std::uint8_t s = symbols[i];
    if (s >= t.freq.size() || t.freq[s] == 0) {
      return Status::InvalidArgument("rans: symbol " + std::to_string(s) + " at " + std::to_string(i) +
                                     " has no frequency in the table");
    }
  }
  const std::size_t cap = std::size_t{kernels::kRansStateBytes} * lanes +
                          symbols.size() * kernels::rans_max_bytes_per_symbol(t.scale_bits);
  std::vector<std::uint8_t> buf(cap);
  std::uint8_t* const end = buf.data() + cap;
  std::uint8_t* ptr = end;
  std::uint32_t state[kMaxLanes];
  for (std::uint32_t l = 0; l < lanes; ++l) state[l] = kRansLow;
  for (std::size_t i = symbols.size(); i-- > 0;) {
    const std::uint8_t s = symbols[i];
    std::uint32_t& x = state[i % lanes];
    x = kernels::rans_enc_renorm(x, t.freq[s], t.scale_bits, ptr);
    x = kernels::rans_enc_put(x, t.cum[s], t.freq[s], t.scale_bits);
  }
  for (std::uint32_t l = lanes; l-- > 0;) kernels::rans_enc_flush(state[l], ptr);
  return std::vector<std::uint8_t>(ptr, end);
}

Status Decode(std::span<const std::uint8_t> bytes, const FreqTable& t, std::size_t count, std::uint8_t* out,
              std::uint32_t lanes) {
  KDN_RETURN_IF_ERROR(ValidateTable(t));
  const std::vector<std::uint8_t> slots = BuildSlotTable(t);
  return Decode(bytes, t, slots, count, out, lanes);
}

Status Decode(std::span<const std::uint8_t> bytes, const FreqTable& t, std::span<const std::uint8_t> slots,
              std::size_t count, std::uint8_t* out, std::uint32_t lanes) {
  KDN_RETURN_IF_ERROR(ValidateTable(t));
  KDN_RETURN_IF_ERROR(CheckLanes(lanes));
  if (slots.size() != (std::size_t{1} << t.scale_bits)) return Status::InvalidArgument("rans: bad slot table");
  if (count > 0 && out == nullptr) return Status::InvalidArgument("rans: null output");
  const std::size_t head = std::size_t{kernels::kRansStateBytes} * lanes;
  if (bytes.size() < head) return Status::Corrupt("rans: stream shorter than its states");
  const std::uint8_t* ptr = bytes.data();
  const std::uint8_t* const end = bytes.data() + bytes.size();
  std::uint32_t state[kMaxLanes];
  for (std::uint32_t l = 0; l < lanes; ++l) {
    state[l] = kernels::rans_dec_read_state(ptr);
    ptr += kernels::kRansStateBytes;
    if (!kernels::rans_state_valid(state[l])) return Status::Corrupt("rans: initial state out of range");
  }
  const std::uint32_t sb = t.scale_bits;
  std::size_t i = 0;
  while (i < count) {
    const std::uint32_t n = count - i < lanes ? static_cast<std::uint32_t>(count - i) : lanes;
    for (std::uint32_t l = 0; l < n; ++l, ++i) {
      std::uint32_t x = state[l];
      const std::uint8_t s = slots[kernels::rans_dec_slot(x, sb)];
      out[i] = s;
      x = kernels::rans_dec_advance(x, t.cum[s], t.freq[s], sb);
      if (!kernels::rans_dec_renorm(x, ptr, end)) return Status::Corrupt("rans: stream truncated");
      state[l] = x;
    }
  }
  if (ptr != end) return Status::Corrupt("rans: trailing bytes after the last symbol");
  for (std::uint32_t l = 0; l < lanes; ++l) {
    if (state[l] != kRansLow) return Status::Corrupt("rans: final state mismatch");
  }
  return Status::Ok();
}

}  // namespace kdn::codec::rans
